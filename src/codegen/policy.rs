//! `PrefillPolicy`: the tuning choices of one prefill kernel, computed once from its
//! [`KernelSpec`] and rendered into the generated source as `policy::` constants.
//!
//! The prefill template (`kernels/prefill*.cuh`) never derives a choice itself: it reads these
//! constants, so every choice is visible to Rust, to unit tests and to `attnforge compile
//! --explain NAME`, which prints them per kernel. Each choice says in one sentence why it exists;
//! `docs/kernel-design.md` records what each measured. A choice that is a matter of speed is
//! measured with `attnforge bench` planned against the alternative (A B B A order, one process);
//! a choice that is a matter of registers with `attnforge compile --log` (spills, serialized
//! wgmma).
//!
//! The static asserts in the template check the combinations the code relies on; they derive
//! nothing.

use super::spec::{KernelSpec, KvCache};
use super::variant::VariantCode;
use crate::dtype::DType;
use crate::problem::{MaskKind, QkAccum};
use std::fmt::Write;

/// Declares the policy struct, its rendering and its explanation from one list, so that a field,
/// its `policy::` constant and its description cannot drift apart.
macro_rules! policies {
    ($($(#[doc = $doc:literal])+ $field:ident: $ty:ty => $constant:literal $($class:ident)?,)+) => {
        /// The tuning choices of one prefill kernel (module docs).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
        pub struct PrefillPolicy {
            $($(#[doc = $doc])+ pub $field: $ty,)+
        }

        impl PrefillPolicy {
            /// `(constant, value, description)` for every choice, in declaration order (the classes
            /// of kernels the choices are made for included).
            pub fn explain(&self) -> Vec<(&'static str, String, String)> {
                vec![$((
                    $constant,
                    self.$field.to_string(),
                    {
                        let why = [$($doc),+].iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ");
                        if stringify!($($class)?) == "class" { format!("(a class, not rendered) {why}") } else { why }
                    },
                ),)+]
            }

            /// The `namespace policy { ... }` block of the generated source: every choice but the
            /// classes (marked `class`), which only the choices are derived from.
            pub fn render(&self) -> String {
                let mut out = String::from("namespace policy {\n");
                $(if stringify!($($class)?) != "class" {
                    let _ = writeln!(out, "constexpr {} {} = {};", cuda_type::<$ty>(), $constant, self.$field);
                })+
                out.push_str("}  // namespace policy\n");
                out
            }
        }
    };
}

/// The CUDA spelling of a policy field's type.
fn cuda_type<T: 'static>() -> &'static str {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<bool>() {
        "bool"
    } else {
        "int"
    }
}

policies! {
    /// Whole K/V tiles of a ragged two-buffer wgmma kernel arrive by the tensor memory accelerator
    /// (one thread issues the boxes on the buffer's mbarrier) when the launch passes tensor maps,
    /// instead of every thread's cp.async copies; a tile that reaches past the request's keys is
    /// still copied by cp.async. Not paged: one box per page lost to the copies. The
    /// warp-specialised tile's producer copies every whole tile so.
    tma_kv: bool => "TMA_KV",
    /// Tile 0's P V waits for its V rows separately, after S = Q K^T (one more barrier): only the
    /// rows layout can, and only its 32-row warps gained.
    first_v_late: bool => "FIRST_V_LATE",
    /// A built-in transform takes the raw accumulator with post_scale folded into its parameters
    /// (one FMUL per logit fewer): f16 QK, and f32 QK on wgmma; mma.sync f32-QK kernels lost with it.
    transform_from_acc: bool => "TRANSFORM_FROM_ACC",
    /// Unmasked sub-tiles within the variant's small (or short) form take it factored into the
    /// softmax's exponents: where the transform is taken from the accumulator.
    factored_small_form: bool => "FACTORED_SMALL_FORM",
    /// The tile's output accumulators and 64-key logits fill a thread's registers: head dim 128
    /// over 64-key sub-tiles, two warpgroups on wgmma or 32-row warps on mma.sync.
    accumulator_bound: bool => "ACCUMULATOR_BOUND" class,
    /// The logits take more than the accumulators and the causal mask (an index-dependent
    /// transform, a variant's mask, a window or custom mask) in an accumulator-bound tile: such
    /// kernels compute smaller pieces and re-derive loop values where used, or ptxas spills.
    heavy_logits: bool => "HEAVY_LOGITS" class,
    /// The KV loop reads the request's bounds from a per-warp slot of shared memory instead of
    /// holding them in registers: the accumulator-bound mma.sync kernels ptxas spilled without it.
    bounds_in_shared: bool => "BOUNDS_IN_SHARED",
    /// With bounds_in_shared, the query tile's first and last token are in the slot too (masked
    /// kernels, whose tile test reads them).
    tokens_in_shared: bool => "TOKENS_IN_SHARED",
    /// Keys per f32-QK piece of a sub-tile (S = Q K^T to O += P V): 32 with heavy logits, so that
    /// 32 keys' logits are live rather than 64; the whole sub-tile otherwise.
    f32_piece: u32 => "F32_PIECE",
    /// f16 QK: a sub-tile that needs its float logits widens them all at once (one softmax update,
    /// one P V) on wgmma tiles of one m64 tile per warpgroup whose logits are not heavy and need no
    /// index-dependent transform: faster than 32-key pieces with the soft-cap, equal without.
    f16_float_whole_sub: bool => "F16_FLOAT_WHOLE_SUB" class,
    /// f16 QK: keys per float piece of a sub-tile that needs its float logits (the whole sub-tile,
    /// else 32, else 16 with heavy logits on mma.sync).
    f16_float_piece: u32 => "F16_FLOAT_PIECE",
    /// f16 QK on wgmma with whole float sub-tiles: both paths (packed f16 and float) meet before
    /// one P V, so the choice between them is each warp's own vote rather than a warpgroup barrier.
    f16_warp_choice: bool => "F16_WARP_CHOICE",
    /// A sub-tile is done with its K rows before its P V (f32 QK, and f16 QK whose paths meet
    /// before P V): with one K/V buffer, the next tile's K rows then load during P V.
    k_free_before_pv: bool => "K_FREE_BEFORE_PV",
    /// f16 QK with warp choice at head dim 256: every sub-tile widens its accumulators first and
    /// runs the f32-QK step, so the exponents interleave with the P V products (faster at head dim
    /// 256, slower at 64 and 128).
    f16_widen_first: bool => "F16_WIDEN_FIRST",
    /// The sub-tile loop recomputes the rows' coordinates where its logits use them, from a fresh
    /// lane id, rather than holding them through the loop (register pressure).
    loop_rows_fresh: bool => "LOOP_ROWS_FRESH",
    /// A two-warpgroup f16-QK kernel with heavy logits derives its warpgroup's Q descriptor in each
    /// sub-tile rather than holding it through the loop (register pressure; not with sinks, where
    /// it spilled).
    q_desc_in_loop: bool => "Q_DESC_IN_LOOP",
    /// The row sums of the online softmax come from the tensor cores (P as f16 times ones) rather
    /// than f32 adds: 32-row warps with f16 inputs (bf16 only at head dim 64) unmasked or causal,
    /// and the plain f32-QK head-dim-128 wgmma kernels over a paged cache: where it measured faster.
    sum_by_mma: bool => "SUM_BY_MMA",
    /// The softmax forms a sub-tile's exponents after the rescale branch: the plain f32-QK
    /// head-dim-128 two-warpgroup kernels that add their row sums in f32 (otherwise ptxas
    /// serialized their wgmma for lack of registers, and the ragged f16 ones measured faster).
    softmax_exp_after_rescale: bool => "SOFTMAX_EXP_AFTER_RESCALE",
    /// The epilogue reloads the request's query length instead of holding it through the loop:
    /// the f16-QK causal paged two-warpgroup kernels, which otherwise spilled it.
    epilogue_reloads_qo_len: bool => "EPILOGUE_RELOADS_QO_LEN",
    /// A custom mask's bits are read as whole words per row for the sub-tile (wgmma's two rows a
    /// thread) rather than one bit per element (mma.sync's four rows, where the words spilled).
    custom_mask_words: bool => "CUSTOM_MASK_WORDS",
    /// An fp8 cache's codes are expanded (dequantised in shared memory after the tile's products)
    /// in an unrolled loop: the key-split (decode) tiles, whose few accumulators leave room for
    /// the unrolled loop's addresses and codes; the others keep a rolled loop, with which the
    /// head-dim-128 accumulator-bound kernels spill less (`attnforge compile --filter
    /// paged_e4m3` prints registers and spills).
    fp8_expand_unrolled: bool => "FP8_EXPAND_UNROLLED",
    /// An fp8 cache's K and V fragments are read straight from the codes and decoded in
    /// registers, with no expansion into f16/bf16 rows (kernels/prefill_fp8_fragments.cuh): the
    /// key-split (decode) tiles with f32 QK at head dim 128, whose products read each code once.
    /// Their K/V buffers then hold the codes alone, one byte an element (`KernelSpec::smem_bytes`).
    fp8_fragments: bool => "FP8_FRAGMENTS",
    /// The warpgroup index is made warp-uniform for ptxas (f16 QK: its Q descriptors stay in
    /// uniform registers); with f32 QK the same serialized the wgmma products.
    uniform_warpgroup: bool => "UNIFORM_WARPGROUP",
}

impl PrefillPolicy {
    /// The choices for the kernel `spec` describes.
    pub fn of(spec: &KernelSpec) -> PrefillPolicy {
        let t = spec.tile;
        let code = VariantCode::of(&spec.variant);
        let has_transform = code.transform.is_some();
        let transform_from_acc_available = code.transform_from_acc.is_some();
        let has_small = code.small.is_some();
        let has_vmask = code.mask.is_some();
        let qk16 = spec.qk_accum == QkAccum::F16;
        let bf16 = spec.input_dtype == DType::Bf16;
        let paged = spec.kv == KvCache::Paged;
        let vo = spec.head_dims.vo();
        let mask = spec.mask;
        let none_or_causal = matches!(mask, MaskKind::None | MaskKind::Causal);

        let transform_from_acc = qk16 || t.wgmma;
        let accumulator_bound = vo == 128
            && t.kv_sub == 64
            && if t.wgmma {
                t.num_warps == 8
            } else {
                t.mma_q == 2
            };
        let heavy_logits = accumulator_bound
            && ((has_transform && !(transform_from_acc && transform_from_acc_available))
                || has_vmask
                || matches!(mask, MaskKind::SlidingWindow | MaskKind::Custom));
        let bounds_in_shared = accumulator_bound
            && !t.wgmma
            && !has_transform
            && !has_vmask
            && if qk16 {
                mask == MaskKind::SlidingWindow
            } else if bf16 {
                mask == MaskKind::Causal && !paged
            } else {
                paged && none_or_causal
            };
        let f16_float_whole_sub =
            t.wgmma && t.mma_q == 1 && !heavy_logits && !has_vmask && (!has_transform || has_small);
        let f16_float_piece = if f16_float_whole_sub {
            t.kv_sub
        } else if t.kv_sub % 32 == 0 && (t.wgmma || !heavy_logits) {
            32
        } else {
            16
        };
        let f16_warp_choice = t.wgmma && qk16 && f16_float_whole_sub;
        // The class the row-sum and exponent-order choices were measured on: f32 QK, head dim
        // 128, no transform, unmasked or over a paged cache, on wgmma.
        let plain_wgmma_d128 =
            t.wgmma && !qk16 && vo == 128 && !has_transform && (mask == MaskKind::None || paged);
        // The warp-specialised softmax rescales the row sums before the output (prefill_ws.cuh).
        let sum_by_mma = !t.warp_specialized
            && (t.mma_q >= 2 || (plain_wgmma_d128 && paged))
            && (!bf16 || vo <= 64)
            && none_or_causal;
        PrefillPolicy {
            tma_kv: t.wgmma && !paged && (t.kv_stages == 2 || t.warp_specialized),
            first_v_late: !t.split_keys && t.mma_q >= 2,
            transform_from_acc,
            factored_small_form: has_small && transform_from_acc,
            accumulator_bound,
            heavy_logits,
            bounds_in_shared,
            tokens_in_shared: bounds_in_shared && mask != MaskKind::None,
            f32_piece: if heavy_logits { 32 } else { t.kv_sub },
            f16_float_whole_sub,
            f16_float_piece,
            f16_warp_choice,
            k_free_before_pv: !qk16 || f16_warp_choice,
            f16_widen_first: f16_warp_choice && vo == 256,
            loop_rows_fresh: heavy_logits || bounds_in_shared,
            q_desc_in_loop: accumulator_bound && t.wgmma && qk16 && heavy_logits,
            sum_by_mma,
            softmax_exp_after_rescale: accumulator_bound
                && plain_wgmma_d128
                && !sum_by_mma
                && none_or_causal,
            epilogue_reloads_qo_len: f16_warp_choice
                && accumulator_bound
                && paged
                && mask == MaskKind::Causal,
            custom_mask_words: mask == MaskKind::Custom && t.wgmma,
            fp8_expand_unrolled: spec.kv_fp8.is_some() && t.split_keys,
            fp8_fragments: spec.kv_fp8.is_some()
                && t.split_keys
                && !t.wgmma
                && !qk16
                && spec.head_dims.qk() == 128
                && vo == 128,
            uniform_warpgroup: qk16,
        }
    }

    /// Bytes of shared memory the choices add to the tile's buffers: one mbarrier (8 bytes) per
    /// K/V buffer with [`tma_kv`](Self::tma_kv); with [`bounds_in_shared`](Self::bounds_in_shared)
    /// each warp's slot, 8 bytes, or 16 with [`tokens_in_shared`](Self::tokens_in_shared).
    pub fn smem_bytes(&self, num_warps: u32) -> u32 {
        let tma_barriers = if self.tma_kv { 2 * 8 } else { 0 };
        let bounds = match (self.bounds_in_shared, self.tokens_in_shared) {
            (false, _) => 0,
            (true, false) => num_warps * 8,
            (true, true) => num_warps * 16,
        };
        tma_barriers + bounds
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codegen::{compile_matrix, render, TileConfig, VariantSpec};
    use crate::problem::HeadDims;

    fn spec(tile: &str, qk_accum: QkAccum, mask: MaskKind, kv: KvCache) -> KernelSpec {
        KernelSpec {
            input_dtype: DType::F16,
            output_dtype: DType::F16,
            qk_accum,
            head_dims: HeadDims::new(128, 128).unwrap(),
            mask,
            variant: VariantSpec::None,
            kv,
            kv_fp8: None,
            tile: TileConfig::parse(tile).unwrap(),
        }
    }

    #[test]
    fn every_choice_is_rendered_and_explained() {
        let s = spec("w8q1kv64g", QkAccum::F32, MaskKind::Causal, KvCache::Ragged);
        let policy = s.policy();
        let block = policy.render();
        let source = render(&s).source;
        let classes = ["ACCUMULATOR_BOUND", "HEAVY_LOGITS", "F16_FLOAT_WHOLE_SUB"];
        for (constant, value, why) in policy.explain() {
            assert!(!why.is_empty(), "{constant} says why");
            let rendered = block.contains(&format!(" {constant} = {value};"));
            let read = source.contains(&format!("policy::{constant}"));
            if classes.contains(&constant) {
                assert!(!rendered && !read, "{constant} is a class, not rendered");
            } else {
                assert!(
                    rendered && read,
                    "{constant} is rendered and read by the template"
                );
            }
        }
    }

    #[test]
    fn headline_kernels_take_the_measured_choices() {
        let ragged = spec("w8q1kv64g", QkAccum::F32, MaskKind::Causal, KvCache::Ragged).policy();
        assert!(ragged.tma_kv && ragged.accumulator_bound && !ragged.heavy_logits);
        assert!(ragged.transform_from_acc && !ragged.sum_by_mma && !ragged.bounds_in_shared);
        let paged = spec("w8q1kv64g", QkAccum::F32, MaskKind::Causal, KvCache::Paged).policy();
        assert!(!paged.tma_kv && paged.sum_by_mma && !paged.softmax_exp_after_rescale);
        let f16 = spec("w8q1kv64g", QkAccum::F16, MaskKind::Causal, KvCache::Paged).policy();
        assert!(f16.f16_warp_choice && f16.epilogue_reloads_qo_len && !f16.f16_widen_first);
        let window = spec(
            "w8q1kv64g",
            QkAccum::F32,
            MaskKind::SlidingWindow,
            KvCache::Ragged,
        )
        .policy();
        assert!(window.heavy_logits && window.f32_piece == 32 && window.loop_rows_fresh);
        let sm80 = spec(
            "w4q2kv64",
            QkAccum::F16,
            MaskKind::SlidingWindow,
            KvCache::Ragged,
        )
        .policy();
        assert!(sm80.bounds_in_shared && sm80.tokens_in_shared && sm80.first_v_late);
        assert_eq!(sm80.smem_bytes(4), 4 * 16);
    }

    #[test]
    fn the_template_invariants_hold_over_the_matrix() {
        for s in compile_matrix() {
            let p = s.policy();
            let t = s.tile;
            assert!(!p.tokens_in_shared || p.bounds_in_shared, "{s}");
            assert!(
                !p.f16_warp_choice || (!p.sum_by_mma && p.f16_float_piece == t.kv_sub),
                "{s}"
            );
            assert!(t.kv_sub % p.f32_piece == 0 && p.f32_piece % 16 == 0, "{s}");
            assert!(t.kv_stages == 2 || p.f32_piece == t.kv_sub, "{s}");
            assert!(!p.first_v_late || !t.split_keys, "{s}");
            assert!(!p.tma_kv || (t.wgmma && s.kv == KvCache::Ragged), "{s}");
        }
    }
}
