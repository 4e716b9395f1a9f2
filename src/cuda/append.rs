//! `append_paged_kv` on the GPU: the new tokens' K and V rows of a ragged batch written into their
//! pages by one kernel (`kernels/append_paged.cuh`), after exactly the checks of the host version
//! ([`crate::paged::validate_append`]): a bad table or an overlapping write is an error before
//! anything is launched. The index arrays are uploaded on each call (a small allocation), so this
//! step is not meant for capture in a CUDA graph; it is ordered on the caller's stream before the
//! attention that reads the pages.

use super::buffers::DeviceTensor;
use super::engine::Engine;
use super::error::CudaError;
use super::launch::{launch_1d, Launch1d};
use super::memory;
use super::paged::{cache_strides, CacheBuffer, CacheElements, DevicePagedKv};
use super::pages::KernelPages;
use crate::codegen::{self, AppendParams, APPEND_THREADS};
use crate::dtype::fp8::Fp8Format;
use crate::dtype::DType;
use crate::paged::{validate_append, PageTable, PagedKvLayout};
use crate::Error;
use cudarc::driver::{CudaStream, DevicePtr};
use std::sync::Arc;

/// The cache buffers on the device, writable, as the layout's storage says (device tensors of
/// the layout's dtype, or fp8 codes).
#[derive(Debug)]
pub enum DevicePagedKvMut<'a, B = DeviceTensor> {
    /// K and V in two buffers.
    Separate {
        /// The K pages.
        k: &'a mut B,
        /// The V pages.
        v: &'a mut B,
    },
    /// One buffer `[pages, 2, ...]`.
    Combined(&'a mut B),
}

impl<B> DevicePagedKvMut<'_, B> {
    /// The same buffers, read-only.
    pub fn as_ref(&self) -> DevicePagedKv<'_, B> {
        match self {
            DevicePagedKvMut::Separate { k, v } => DevicePagedKv::Separate { k, v },
            DevicePagedKvMut::Combined(kv) => DevicePagedKv::Combined(kv),
        }
    }
}

impl Engine {
    /// Writes `k_new` (`[total_new, num_kv_heads, head_dim_qk]`, contiguous) and `v_new` into the
    /// cache on `stream`: request `r`'s new tokens `append_indptr[r] .. append_indptr[r+1]` become
    /// its last positions under `table` (the table after the append, as on the host). No
    /// synchronisation.
    #[allow(clippy::too_many_arguments)]
    pub fn append_paged_kv(
        &self,
        stream: &Arc<CudaStream>,
        layout: &PagedKvLayout,
        table: &PageTable,
        append_indptr: &[i32],
        k_new: &DeviceTensor,
        v_new: &DeviceTensor,
        cache: DevicePagedKvMut<'_>,
    ) -> Result<(), Error> {
        self.append_to_cache(
            stream,
            layout,
            table,
            append_indptr,
            (k_new, v_new),
            cache,
            &(),
        )
    }

    /// The append into either kind of cache buffer (quantising with `scales` into fp8 codes):
    /// the host version's checks except for the values themselves, the rows' dtype, the buffers
    /// and scales against `layout`, then one launch.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn append_to_cache<B: CacheBuffer>(
        &self,
        stream: &Arc<CudaStream>,
        layout: &PagedKvLayout,
        table: &PageTable,
        append_indptr: &[i32],
        (k_new, v_new): (&DeviceTensor, &DeviceTensor),
        cache: DevicePagedKvMut<'_, B>,
        scales: &B::Scales,
    ) -> Result<(), Error> {
        validate_append(
            layout,
            table,
            append_indptr,
            (k_new.dtype(), k_new.len()),
            (v_new.dtype(), v_new.len()),
        )?;
        if layout.dtype.size_bytes() != 2 {
            return Err(Error::Unsupported {
                backend: "cuda",
                what: B::append_unsupported(layout.dtype),
                supported: "f16, bf16".into(),
            });
        }
        let cache = cache.as_ref();
        let first = match cache {
            DevicePagedKv::Separate { k, .. } | DevicePagedKv::Combined(k) => k,
        };
        let (k_buf, v_buf) = cache.checked(layout, B::appended(first, layout))?;
        let elements = k_buf.elements(stream, layout, scales)?;
        self.launch_append(
            stream,
            layout,
            table,
            append_indptr,
            (k_new.device_address(stream), v_new.device_address(stream)),
            (k_buf.device_address(stream), v_buf.device_address(stream)),
            elements,
        )
    }

    /// Launches the append kernel over validated arguments: new rows at device addresses
    /// `new` (K, V; the layout's dtype), cache buffers at `cache` read as `elements` say.
    #[allow(clippy::too_many_arguments)]
    fn launch_append(
        &self,
        stream: &Arc<CudaStream>,
        layout: &PagedKvLayout,
        table: &PageTable,
        append_indptr: &[i32],
        (k_new, v_new): (u64, u64),
        (k_cache, v_cache): (u64, u64),
        elements: CacheElements,
    ) -> Result<(), Error> {
        let (elem, fp8) = (elements.bytes, elements.fp8);
        let total_new = *append_indptr.last().unwrap_or(&0) as usize;
        let (h, dqk, dvo) = (
            layout.num_kv_heads,
            layout.head_dims.qk(),
            layout.head_dims.vo(),
        );
        let threads_needed = total_new * h * (dqk + dvo) / 8;
        if threads_needed == 0 {
            return Ok(());
        }
        let kernel = self.fixed_kernel(codegen::render_append)?;
        let kv_len: Vec<i32> = table
            .kv_lens(layout.page_size)
            .iter()
            .map(|&l| l as i32)
            .collect();
        // On the launch's stream: their stream-ordered frees then follow the kernel.
        let upload = |data: &[i32], what: &str| memory::upload(stream, data, what);
        let append_indptr_d = upload(append_indptr, "append_indptr")?;
        let kv_len_d = upload(&kv_len, "kv_len")?;
        let pages = KernelPages::new(layout, table)?;
        let page_indptr_d = upload(&pages.table.kv_page_indptr, "kv_page_indptr")?;
        let page_indices_d = upload(&pages.table.kv_page_indices, "kv_page_indices")?;
        let (k_base, _, k_token, k_head) = cache_strides(layout, true);
        let (v_base, _, v_token, v_head) = cache_strides(layout, false);
        let (k_page, v_page) = (pages.k_page_stride, pages.v_page_stride);
        let ptr = |s: &cudarc::driver::CudaSlice<i32>| s.device_ptr(stream).0;
        let params = AppendParams {
            k_new,
            v_new,
            k_cache: k_cache + k_base as u64 * elem,
            v_cache: v_cache + v_base as u64 * elem,
            append_indptr: ptr(&append_indptr_d),
            kv_len: ptr(&kv_len_d),
            page_indptr: ptr(&page_indptr_d),
            page_indices: ptr(&page_indices_d),
            k_page_stride: k_page,
            v_page_stride: v_page,
            k_token_stride: k_token,
            v_token_stride: v_token,
            k_head_stride: k_head,
            v_head_stride: v_head,
            total_new: total_new as i32,
            batch_size: table.batch_size() as i32,
            num_kv_heads: h as i32,
            k_chunks: (dqk / 8) as i32,
            v_chunks: (dvo / 8) as i32,
            page_shift: pages.page_size.trailing_zeros() as i32,
            page_mask: (pages.page_size - 1) as i32,
            new_bf16: i32::from(layout.dtype == DType::Bf16),
            k_scale: fp8.map_or(0, |(_, s)| s.k),
            v_scale: fp8.map_or(0, |(_, s)| s.v),
            fp8_format: match fp8 {
                None => 0,
                Some((Fp8Format::E4m3, _)) => 1,
                Some((Fp8Format::E5m2, _)) => 2,
            },
            scale_head_stride: fp8.map_or(0, |(_, s)| s.head_stride),
        };
        let blocks = threads_needed.div_ceil(APPEND_THREADS as usize);
        let blocks = u32::try_from(blocks).map_err(|_| CudaError::Buffer {
            name: "k_new",
            reason: format!("{total_new} new tokens need {blocks} blocks, more than a grid holds"),
        })?;
        // SAFETY: the kernel takes one AppendParams, which is repr(C) without padding and whose
        // CUDA twin asserts the same field sizes; the table and append_indptr were validated
        // against the layout (every page id in range, every new token inside its request's
        // pages, no two writes to one slot), the cache buffers hold the layout's pages and the
        // new rows hold total_new tokens; the index arrays live until the end of this function
        // and are freed in stream order (on `stream`), after the kernel.
        unsafe {
            launch_1d(
                stream,
                &kernel,
                Launch1d {
                    blocks,
                    threads: APPEND_THREADS,
                    smem_bytes: 0,
                },
                &params,
                || "attnforge_append_paged_kv".into(),
            )
        }?;
        Ok(())
    }
}
