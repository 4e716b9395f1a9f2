//! The kernel parameter block: one Rust definition that yields both the `#[repr(C)]` struct the
//! launcher fills and the CUDA struct the kernel reads, with offset checks compiled into the
//! kernel so the two can never drift apart.
//!
//! The block is the fixed fields ([`PrefillParams`]) followed by the variant's own parameters
//! (`VariantParams`), whose layout depends on the variant and is computed by [`VariantLayout`].
//! Neither struct has padding between fields (the fixed one by a const assertion, the variant
//! one because its 8-byte fields come first), so equal field sizes and an equal total size,
//! which the generated CUDA asserts, imply equal offsets: NVRTC has no `offsetof` without
//! toolkit headers, and this check needs none.

use crate::problem::{ParamType, ParamValue};
use std::fmt::Write;

macro_rules! kernel_params {
    ($(#[$doc:meta])* $name:ident { $($(#[$fdoc:meta])* $field:ident : $rty:ty => $cty:literal,)* }) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default)]
        pub struct $name {
            $($(#[$fdoc])* pub $field: $rty,)*
        }

        // The block is copied byte for byte: it must have no padding (uninitialised bytes).
        const _: () = assert!(0 $(+ std::mem::size_of::<$rty>())* == std::mem::size_of::<$name>());

        impl $name {
            /// (field name, CUDA type, byte offset) of every field, in order.
            pub fn cuda_fields() -> Vec<(&'static str, &'static str, usize)> {
                vec![$((stringify!($field), $cty, std::mem::offset_of!($name, $field)),)*]
            }

            /// The CUDA definition of the struct on its own, with checks of every field's size
            /// and of the total size (no padding anywhere, so equal sizes mean equal offsets).
            pub fn standalone_cuda_struct() -> String {
                let fields = Self::cuda_fields();
                let mut s = format!("struct {} {{\n", stringify!($name));
                for (name, ty, _) in &fields {
                    let _ = writeln!(s, "  {ty} {name};");
                }
                s.push_str("};\n");
                for (i, (name, _, offset)) in fields.iter().enumerate() {
                    let end = fields.get(i + 1).map_or(std::mem::size_of::<$name>(), |f| f.2);
                    let _ = writeln!(
                        s,
                        "static_assert(sizeof({}::{name}) == {}, \"size of {name}\");",
                        stringify!($name),
                        end - offset
                    );
                }
                let _ = writeln!(
                    s,
                    "static_assert(sizeof({0}) == {1}, \"size of {0}\");",
                    stringify!($name),
                    std::mem::size_of::<$name>()
                );
                s
            }
        }
    };
}

/// A CUDA tensor map (`CUtensorMap`): 128 opaque bytes the driver encodes
/// (`cuda::tma`), 64-byte aligned in the parameter block (CUDA's `TmaMap`); zero when unused.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TmaMap(pub [u64; 16]);

/// The alignment of the prefill parameter block: that of its tensor maps.
pub const PARAM_BLOCK_ALIGN: usize = 64;

kernel_params! {
    /// Fixed parameters of the prefill kernel. Pointers are device addresses; strides are in
    /// elements. The tensor maps come first, at offsets that are multiples of 64.
    PrefillParams {
        /// K as a `[tokens, kv heads, head_dim_qk]` tensor map (boxes of 64 elements by 64
        /// tokens, 128-byte swizzle), when `kv_tma` is set.
        k_tmap: TmaMap => "TmaMap",
        /// V likewise, over `head_dim_vo`.
        v_tmap: TmaMap => "TmaMap",
        /// Q, `[total_qo, num_qo_heads, head_dim_qk]` view.
        q: u64 => "const void*",
        /// K view.
        k: u64 => "const void*",
        /// V view.
        v: u64 => "const void*",
        /// O, contiguous.
        o: u64 => "void*",
        /// LSE `[total_qo, num_qo_heads]` or null.
        lse: u64 => "float*",
        /// Query indptr (`batch + 1`).
        qo_indptr: u64 => "const int*",
        /// KV indptr (`batch + 1`).
        kv_indptr: u64 => "const int*",
        /// Work items, two `int4` per CTA: (request, query tile, kv head, kv chunk), then the
        /// request's (first query token, query length, first key row, key length).
        work: u64 => "const int4*",
        /// Packed custom mask or null.
        custom_mask: u64 => "const unsigned char*",
        /// Byte offset of each request's mask segment or null.
        mask_indptr: u64 => "const long long*",
        /// Split-KV workspace: per (token, query head, chunk) the chunk's normalised output
        /// (`head_dim_vo` floats); null when the KV range is not split.
        partial_o: u64 => "float*",
        /// Split-KV workspace: per (token, query head, chunk) the chunk's natural-log LSE.
        partial_lse: u64 => "float*",
        /// Paged KV: prefix sums of the pages per request (`batch + 1`); null when ragged.
        kv_page_indptr: u64 => "const int*",
        /// Paged KV: page ids, in token order per request; null when ragged.
        kv_page_indices: u64 => "const int*",
        /// Q token stride.
        q_stride_token: i64 => "long long",
        /// Q head stride.
        q_stride_head: i64 => "long long",
        /// K token stride.
        k_stride_token: i64 => "long long",
        /// K head stride.
        k_stride_head: i64 => "long long",
        /// V token stride.
        v_stride_token: i64 => "long long",
        /// V head stride.
        v_stride_head: i64 => "long long",
        /// O token stride.
        o_stride_token: i64 => "long long",
        /// O head stride.
        o_stride_head: i64 => "long long",
        /// Paged KV: elements between consecutive pages of K; 0 when ragged. K/V token strides
        /// are then the strides within a page.
        k_page_stride: i64 => "long long",
        /// Paged KV: elements between consecutive pages of V (differs from K's when the head
        /// dims differ and K and V are separate); 0 when ragged.
        v_page_stride: i64 => "long long",
        /// Query heads.
        num_qo_heads: i32 => "int",
        /// Query heads per KV head.
        group_size: i32 => "int",
        /// `FastDivisor::new(group_size).magic`: divides packed rows by the group size.
        group_div_magic: u32 => "unsigned",
        /// `FastDivisor::new(group_size).shift`.
        group_div_shift: i32 => "int",
        /// Sliding window (keys left of the diagonal).
        window_left: i32 => "int",
        /// Power of two applied to q before an f16-accumulated dot product (1 otherwise).
        q_prescale: f32 => "float",
        /// Factor from the accumulated dot product to the scaled logit `s`.
        post_scale: f32 => "float",
        /// `post_scale * LOG2E`, used when the variant has no transform.
        scale_log2: f32 => "float",
        /// Keys per KV chunk when the KV range is split across CTAs (a multiple of the KV
        /// tile), 0 when it is not.
        kv_chunk: i32 => "int",
        /// Chunk slots per (token, query head) in the workspace.
        max_chunks: i32 => "int",
        /// Query tokens of the batch (rows of the merge).
        total_qo: i32 => "int",
        /// Requests in the batch.
        batch_size: i32 => "int",
        /// Paged KV: log2(page size); 0 when ragged.
        page_shift: i32 => "int",
        /// Paged KV: page size - 1 (the slot mask); 0 when ragged.
        page_mask: i32 => "int",
        /// 1 when whole K/V tiles are copied through `k_tmap` and `v_tmap` (kernels that can:
        /// `KernelSpec::copies_kv_by_tma`), 0 otherwise.
        kv_tma: u64 => "unsigned long long",
        /// fp8 K/V: the K scales (f32, one per tensor or one per KV head); null otherwise.
        k_scale: u64 => "const float*",
        /// fp8 K/V: the V scales, counted as `k_scale`; null otherwise.
        v_scale: u64 => "const float*",
        /// fp8 K/V: entries between the scales of consecutive KV heads: 0 (one scale per tensor)
        /// or 1 (one per head).
        kv_scale_head_stride: i32 => "int",
        /// Keeps the struct a multiple of 8 bytes without implicit padding.
        reserved_fp8: i32 => "int",
    }
}

const _: () = assert!(std::mem::offset_of!(PrefillParams, v_tmap) % PARAM_BLOCK_ALIGN == 0);

kernel_params! {
    /// Parameters of the paged-KV append kernel (`append_paged.cuh`). Pointers are device
    /// addresses; strides are in elements of the cache (bytes for an fp8 cache).
    AppendParams {
        /// New K rows, contiguous `[total_new, num_kv_heads, head_dim_qk]`.
        k_new: u64 => "const void*",
        /// New V rows, contiguous `[total_new, num_kv_heads, head_dim_vo]`.
        v_new: u64 => "const void*",
        /// K pages (element 0 of KV head 0 of page 0).
        k_cache: u64 => "void*",
        /// V pages.
        v_cache: u64 => "void*",
        /// New tokens per request, prefix sums (`batch + 1`).
        append_indptr: u64 => "const int*",
        /// Keys per request after the append (`batch`).
        kv_len: u64 => "const int*",
        /// Pages per request, prefix sums (`batch + 1`).
        page_indptr: u64 => "const int*",
        /// Page ids.
        page_indices: u64 => "const int*",
        /// Elements between pages of K.
        k_page_stride: i64 => "long long",
        /// Elements between pages of V.
        v_page_stride: i64 => "long long",
        /// Elements between tokens within a page of K.
        k_token_stride: i64 => "long long",
        /// Elements between tokens within a page of V.
        v_token_stride: i64 => "long long",
        /// Elements between heads of K.
        k_head_stride: i64 => "long long",
        /// Elements between heads of V.
        v_head_stride: i64 => "long long",
        /// New tokens of the batch.
        total_new: i32 => "int",
        /// Requests.
        batch_size: i32 => "int",
        /// KV heads.
        num_kv_heads: i32 => "int",
        /// 16-byte chunks per K head row (head_dim_qk / 8).
        k_chunks: i32 => "int",
        /// 16-byte chunks per V head row.
        v_chunks: i32 => "int",
        /// log2(page size).
        page_shift: i32 => "int",
        /// Page size - 1.
        page_mask: i32 => "int",
        /// 1 when the new rows are bf16, 0 when f16.
        new_bf16: i32 => "int",
        /// fp8 cache: the K scales (f32, one per tensor or one per KV head); null otherwise.
        k_scale: u64 => "const float*",
        /// fp8 cache: the V scales, counted as `k_scale`; null otherwise.
        v_scale: u64 => "const float*",
        /// The cache's format: `KV_FP8_NONE` (0, a copy), `KV_FP8_E4M3` (1) or `KV_FP8_E5M2`
        /// (2) of `fp8.cuh`.
        fp8_format: i32 => "int",
        /// fp8 cache: entries between the scales of consecutive KV heads (0 or 1).
        scale_head_stride: i32 => "int",
        /// 16-byte chunks of one new token's K and V rows, every KV head:
        /// `num_kv_heads * (k_chunks + v_chunks)`.
        token_chunks: i32 => "int",
        /// 1: the wide launch (64 threads a new token, several chunks a thread); 0: the narrow
        /// one (one chunk a thread).
        wide: i32 => "int",
    }
}

kernel_params! {
    /// Parameters of the public merge kernel (`merge_states.cuh`). Pointers are device
    /// addresses; strides are in elements. State 0 of (row, head) is read at `v0`/`s0`, state
    /// `c >= 1` at `v1`/`s1` plus `c - 1` state strides.
    MergeParams {
        /// o of state 0.
        v0: u64 => "const void*",
        /// o of state 1 (the states after it follow at `v_stride_state`).
        v1: u64 => "const void*",
        /// LSE of state 0 (f32).
        s0: u64 => "const float*",
        /// LSE of state 1.
        s1: u64 => "const float*",
        /// The merged o.
        v_out: u64 => "void*",
        /// The merged LSE (f32).
        s_out: u64 => "float*",
        /// Elements between rows of a state's o.
        v_stride_row: i64 => "long long",
        /// Elements between states of o (from state 1 on).
        v_stride_state: i64 => "long long",
        /// Elements between heads of o.
        v_stride_head: i64 => "long long",
        /// Elements between rows of a state's LSE.
        s_stride_row: i64 => "long long",
        /// Elements between states of the LSE (from state 1 on).
        s_stride_state: i64 => "long long",
        /// Elements between heads of the LSE.
        s_stride_head: i64 => "long long",
        /// Elements between rows of the merged o.
        out_stride_row: i64 => "long long",
        /// Elements between heads of the merged o.
        out_stride_head: i64 => "long long",
        /// Elements between rows of the merged LSE (heads are contiguous).
        s_out_stride_row: i64 => "long long",
        /// Rows (tokens).
        rows: i32 => "int",
        /// Heads per row.
        heads: i32 => "int",
        /// States per (row, head), at least 1.
        num_states: i32 => "int",
        /// Elements of o per (row, head), even.
        head_dim: i32 => "int",
        /// Element type of o: 0 f16, 1 bf16, 2 f32.
        dtype: i32 => "int",
        /// Keeps the struct a multiple of 8 bytes without implicit padding.
        reserved: i32 => "int",
    }
}

/// Byte layout of a variant's parameter struct.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VariantLayout {
    /// (name, type, offset) per field.
    pub fields: Vec<(String, ParamType, usize)>,
    /// Size in bytes, padded to the alignment.
    pub size: usize,
    /// Alignment in bytes.
    pub align: usize,
}

/// Name of the filler field of a variant without parameters (C++ structs are never empty).
const EMPTY_FIELD: &str = "unused_";

fn type_size(t: ParamType) -> usize {
    match t {
        ParamType::F32 | ParamType::I32 => 4,
        ParamType::F32Ptr | ParamType::I32Ptr => 8,
    }
}

impl VariantLayout {
    /// Lays out `params`: 8-byte fields first, then 4-byte ones, each group in declaration
    /// order, so no field needs padding. `fields` stays in declaration order.
    pub fn new(params: &[(String, ParamType)]) -> VariantLayout {
        let decls: Vec<(String, ParamType)> = if params.is_empty() {
            vec![(EMPTY_FIELD.to_string(), ParamType::I32)]
        } else {
            params.to_vec()
        };
        let mut placement: Vec<usize> = (0..decls.len()).collect();
        placement.sort_by_key(|&i| std::cmp::Reverse(type_size(decls[i].1)));
        let mut offsets = vec![0usize; decls.len()];
        let mut offset = 0usize;
        for &i in &placement {
            offsets[i] = offset;
            offset += type_size(decls[i].1);
        }
        let align = decls.iter().map(|(_, t)| type_size(*t)).max().unwrap_or(4);
        let fields = decls
            .into_iter()
            .zip(offsets)
            .map(|((n, t), o)| (n, t, o))
            .collect();
        VariantLayout {
            fields,
            size: offset.next_multiple_of(align),
            align,
        }
    }

    /// The CUDA definition of `struct VariantParams`, fields in placement order, with checks of
    /// every field's size and of the total size.
    pub fn cuda_struct(&self) -> String {
        let mut placed: Vec<&(String, ParamType, usize)> = self.fields.iter().collect();
        placed.sort_by_key(|f| f.2);
        let mut s = String::from("struct VariantParams {\n");
        for (name, ty, _) in &placed {
            let _ = writeln!(s, "  {} {};", ty.cuda_type(), name);
        }
        s.push_str("};\n");
        for (name, ty, _) in &placed {
            let _ = writeln!(
                s,
                "static_assert(sizeof(VariantParams::{name}) == {}, \"size of variant {name}\");",
                type_size(*ty)
            );
        }
        let _ = writeln!(
            s,
            "static_assert(sizeof(VariantParams) == {}, \"size of VariantParams\");",
            self.size
        );
        s
    }

    /// Packs values (device addresses already substituted for arrays, as `ptrs`, in order of the
    /// pointer fields) into the struct's bytes.
    pub fn pack(&self, values: &[ParamValue], ptrs: &[u64]) -> Vec<u8> {
        let mut bytes = vec![0u8; self.size];
        let mut ptrs = ptrs.iter();
        for ((_, _, offset), value) in self.fields.iter().zip(values) {
            let raw: Vec<u8> = match value {
                ParamValue::F32(x) => x.to_le_bytes().to_vec(),
                ParamValue::I32(x) => x.to_le_bytes().to_vec(),
                ParamValue::F32Array(_) | ParamValue::I32Array(_) => {
                    ptrs.next().copied().unwrap_or(0).to_le_bytes().to_vec()
                }
            };
            bytes[*offset..*offset + raw.len()].copy_from_slice(&raw);
        }
        bytes
    }
}

/// The whole parameter block: fixed part, then the variant struct at its alignment.
#[derive(Clone, Debug)]
pub struct ParamBlockLayout {
    /// Offset of the variant struct.
    pub variant_offset: usize,
    /// Total size.
    pub size: usize,
    /// The variant layout.
    pub variant: VariantLayout,
}

impl ParamBlockLayout {
    /// The layout for a variant.
    pub fn new(variant: VariantLayout) -> ParamBlockLayout {
        let fixed = std::mem::size_of::<PrefillParams>();
        let fixed_align = PARAM_BLOCK_ALIGN;
        let variant_offset = fixed.next_multiple_of(variant.align);
        let size = (variant_offset + variant.size).next_multiple_of(fixed_align.max(variant.align));
        ParamBlockLayout {
            variant_offset,
            size,
            variant,
        }
    }

    /// The CUDA definition of `struct PrefillParams` (after `VariantParams`) with checks of
    /// every field's size and of the total size.
    pub fn cuda_struct(&self) -> String {
        let mut s = String::from("struct PrefillParams {\n");
        for (name, ty, _) in PrefillParams::cuda_fields() {
            let _ = writeln!(s, "  {ty} {name};");
        }
        s.push_str("  VariantParams variant;\n};\n");
        let fields = PrefillParams::cuda_fields();
        for (i, (name, _, offset)) in fields.iter().enumerate() {
            let end = fields.get(i + 1).map_or(self.variant_offset, |f| f.2);
            let _ = writeln!(
                s,
                "static_assert(sizeof(PrefillParams::{name}) == {}, \"size of {name}\");",
                end - offset
            );
        }
        let _ = writeln!(
            s,
            "static_assert(sizeof(PrefillParams) == {}, \"size of PrefillParams\");",
            self.size
        );
        s
    }

    /// The bytes of the block.
    pub fn pack(&self, fixed: &PrefillParams, variant_bytes: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0u8; self.size];
        // SAFETY: PrefillParams is repr(C) plain data (integers and floats) with no padding (a
        // const assertion above checks it), so all size_of::<PrefillParams>() bytes are
        // initialised.
        let fixed_bytes = unsafe {
            std::slice::from_raw_parts(
                (fixed as *const PrefillParams).cast::<u8>(),
                std::mem::size_of::<PrefillParams>(),
            )
        };
        bytes[..fixed_bytes.len()].copy_from_slice(fixed_bytes);
        bytes[self.variant_offset..self.variant_offset + variant_bytes.len()]
            .copy_from_slice(variant_bytes);
        bytes
    }
}
