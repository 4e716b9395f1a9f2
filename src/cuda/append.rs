//! `append_paged_kv` on the GPU: the new tokens' K and V rows of a ragged batch written into their
//! pages by one kernel (`kernels/append_paged.cuh`), after exactly the checks of the host version
//! ([`crate::paged::validate_append`]): a bad table or an overlapping write is an error before
//! anything is launched. [`Engine::append_paged_kv`] uploads the index arrays on each call (a
//! small allocation), so it is not meant for capture in a CUDA graph; [`Engine::plan_append`]
//! checks a batch and uploads them once, and [`AppendPlan::run`] (or
//! [`AppendPlan::run_fp8`]) then launches with no allocation and no synchronisation, so it can be
//! captured and replayed (new rows and cache contents in the same buffers). Either way the append
//! is ordered on the caller's stream before the attention that reads the pages.

use super::buffers::DeviceTensor;
use super::engine::Engine;
use super::error::CudaError;
use super::fp8::{DeviceFp8Tensor, DeviceKvScales};
use super::launch::{launch_1d, Launch1d};
use super::memory;
use super::paged::{cache_strides, CacheBuffer, CacheElements, DevicePagedKv};
use super::pages::KernelPages;
use crate::codegen::{self, AppendParams, APPEND_THREADS, APPEND_WIDE_TOKEN_THREADS};
use crate::dtype::fp8::Fp8Format;
use crate::dtype::DType;
use crate::paged::{validate_append, PageTable, PagedKvLayout};
use crate::problem::InvalidProblem;
use crate::Error;
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr};
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

    /// Checks an append of `append_indptr`'s new tokens under `table` (everything
    /// [`append_paged_kv`](Self::append_paged_kv) checks but the buffers) and uploads its index
    /// arrays on `stream`, for [`AppendPlan::run`] or [`AppendPlan::run_fp8`].
    pub fn plan_append(
        &self,
        stream: &Arc<CudaStream>,
        layout: &PagedKvLayout,
        table: &PageTable,
        append_indptr: &[i32],
    ) -> Result<AppendPlan, Error> {
        // The rows the plan will take; a negative count is refused by the checks below.
        let total_new = usize::try_from(*append_indptr.last().unwrap_or(&0)).unwrap_or(0);
        let rows = |dim: usize| {
            let len = total_new
                .saturating_mul(layout.num_kv_heads)
                .saturating_mul(dim);
            (layout.dtype, len)
        };
        let (dqk, dvo) = (layout.head_dims.qk(), layout.head_dims.vo());
        validate_append(layout, table, append_indptr, rows(dqk), rows(dvo))?;
        if layout.dtype.size_bytes() != 2 {
            return Err(Error::Unsupported {
                backend: "cuda",
                what: format!("an append of {} rows", layout.dtype),
                supported: "f16, bf16".into(),
            });
        }
        AppendPlan::upload(self, stream, layout, table, append_indptr)
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
        let plan = AppendPlan::upload(self, stream, layout, table, append_indptr)?;
        plan.run_cache(stream, (k_new, v_new), cache, scales)
    }
}

/// A token's 16-byte chunks (K and V rows, every KV head) that the append kernel splits exactly.
const APPEND_MAX_TOKEN_CHUNKS: usize = 1 << 20;

/// New tokens from which the append kernel takes its wide launch (`append::run_wide`: 64 threads
/// a token, each loading 4 of its chunks before it writes) instead of its narrow one (one chunk a
/// thread): from here the wide launch still has 2^18 threads, about two per thread slot of an
/// H100 or H200, and copies faster (H100: 2.61 -> 2.72 TB/s f16, 1.95 -> 2.14 e4m3 at 16 x 1024
/// tokens), while below it the narrow launch keeps decode-sized appends (one token a request)
/// spread over more CTAs (the wide one took 2.4 -> 2.5 us f16, 2.7 -> 3.0 us e4m3 at 64 tokens).
/// Measured with `attnforge bench --suite paged --all --filter append-`.
const APPEND_WIDE_FROM_TOKENS: usize = 4096;

/// One checked append batch on the device ([`Engine::plan_append`]): the layout, the kernel and
/// the index arrays it reads (new-token indptr, each request's length, the kernels' page table).
pub struct AppendPlan {
    layout: PagedKvLayout,
    /// `None` when the batch appends nothing (nothing is launched).
    kernel: Option<CudaFunction>,
    total_new: usize,
    batch_size: usize,
    /// The kernels' page size and page strides (`KernelPages`).
    kernel_pages: (usize, i64, i64),
    append_indptr: CudaSlice<i32>,
    kv_len: CudaSlice<i32>,
    page_indptr: CudaSlice<i32>,
    page_indices: CudaSlice<i32>,
}

impl AppendPlan {
    /// Uploads the index arrays of a validated append (table and `append_indptr` checked against
    /// `layout`, rows of two bytes), on `stream`.
    fn upload(
        engine: &Engine,
        stream: &Arc<CudaStream>,
        layout: &PagedKvLayout,
        table: &PageTable,
        append_indptr: &[i32],
    ) -> Result<AppendPlan, Error> {
        let total_new = *append_indptr.last().unwrap_or(&0) as usize;
        let elements = total_new * layout.num_kv_heads;
        // The kernel splits a token's chunk index into head and chunk with an f32 reciprocal,
        // exact below 2^20 chunks (`TokenDst` in kernels/append_paged.cuh).
        let token_chunks =
            layout.num_kv_heads * (layout.head_dims.qk() + layout.head_dims.vo()) / 8;
        if token_chunks >= APPEND_MAX_TOKEN_CHUNKS {
            return Err(InvalidProblem::new(
                "num_kv_heads",
                format!(
                    "is {}: a token's K and V rows are {token_chunks} chunks of 8 elements, and the append kernel takes fewer than {APPEND_MAX_TOKEN_CHUNKS}",
                    layout.num_kv_heads
                ),
            )
            .into());
        }
        // The kernel forms an element's offset within its token's slot in 32 bits.
        for is_k in [true, false] {
            let (_, _, _, head_stride) = cache_strides(layout, is_k);
            let dim = if is_k {
                layout.head_dims.qk()
            } else {
                layout.head_dims.vo()
            };
            let slot_extent = (layout.num_kv_heads as i64 - 1) * head_stride + dim as i64;
            if slot_extent > i64::from(i32::MAX) {
                return Err(InvalidProblem::new(
                    "num_kv_heads",
                    format!(
                        "is {}: a token's rows span {slot_extent} elements of a page, more than the append kernel's 32-bit offsets",
                        layout.num_kv_heads
                    ),
                )
                .into());
            }
        }
        let kernel = if elements == 0 {
            None
        } else {
            Some(engine.fixed_kernel(codegen::render_append)?)
        };
        let kv_len: Vec<i32> = table
            .kv_lens(layout.page_size)
            .iter()
            .map(|&l| l as i32)
            .collect();
        // The driver allocates nothing of size 0: an empty array is uploaded as one entry.
        let upload = |data: &[i32], what: &str| {
            memory::upload(stream, if data.is_empty() { &[0] } else { data }, what)
        };
        let pages = KernelPages::new(layout, table)?;
        Ok(AppendPlan {
            layout: *layout,
            kernel,
            total_new,
            batch_size: table.batch_size(),
            kernel_pages: (pages.page_size, pages.k_page_stride, pages.v_page_stride),
            append_indptr: upload(append_indptr, "append_indptr")?,
            kv_len: upload(&kv_len, "kv_len")?,
            page_indptr: upload(&pages.table.kv_page_indptr, "kv_page_indptr")?,
            page_indices: upload(&pages.table.kv_page_indices, "kv_page_indices")?,
        })
    }

    /// The layout the plan writes.
    pub fn layout(&self) -> &PagedKvLayout {
        &self.layout
    }

    /// Tokens appended per run.
    pub fn total_new(&self) -> usize {
        self.total_new
    }

    /// Writes the new rows `k_new`, `v_new` (the layout's dtype, `[total_new, num_kv_heads,
    /// head_dim]` each, contiguous) into a cache of the layout's dtype on `stream`, after
    /// checking the rows and buffers against the plan. No allocation, no synchronisation: safe
    /// to capture in a CUDA graph.
    pub fn run(
        &self,
        stream: &Arc<CudaStream>,
        k_new: &DeviceTensor,
        v_new: &DeviceTensor,
        cache: DevicePagedKvMut<'_>,
    ) -> Result<(), Error> {
        self.run_cache(stream, (k_new, v_new), cache, &())
    }

    /// [`run`](Self::run) into an fp8 cache: the new rows quantised with `scales` as
    /// [`Engine::append_paged_kv_fp8`] quantises them.
    pub fn run_fp8(
        &self,
        stream: &Arc<CudaStream>,
        (k_new, v_new): (&DeviceTensor, &DeviceTensor),
        cache: DevicePagedKvMut<'_, DeviceFp8Tensor>,
        scales: &DeviceKvScales,
    ) -> Result<(), Error> {
        self.run_cache(stream, (k_new, v_new), cache, scales)
    }

    /// The run into either kind of cache buffer: the rows against the plan, the buffers and
    /// scales against the layout, then one launch.
    fn run_cache<B: CacheBuffer>(
        &self,
        stream: &Arc<CudaStream>,
        (k_new, v_new): (&DeviceTensor, &DeviceTensor),
        cache: DevicePagedKvMut<'_, B>,
        scales: &B::Scales,
    ) -> Result<(), Error> {
        let layout = &self.layout;
        let rows = self.total_new * layout.num_kv_heads;
        for (name, t, dim) in [
            ("k_new", k_new, layout.head_dims.qk()),
            ("v_new", v_new, layout.head_dims.vo()),
        ] {
            if t.dtype() != layout.dtype || t.len() != rows * dim {
                return Err(InvalidProblem::new(
                    name,
                    format!(
                        "holds {} {} elements; the plan appends {} tokens of {} heads x {dim} {}",
                        t.len(),
                        t.dtype(),
                        self.total_new,
                        layout.num_kv_heads,
                        layout.dtype
                    ),
                )
                .into());
            }
        }
        let cache = cache.as_ref();
        let first = match cache {
            DevicePagedKv::Separate { k, .. } | DevicePagedKv::Combined(k) => k,
        };
        let (k_buf, v_buf) = cache.checked(layout, B::appended(first, layout))?;
        let elements = k_buf.elements(stream, layout, scales)?;
        self.launch(
            stream,
            (k_new.device_address(stream), v_new.device_address(stream)),
            (k_buf.device_address(stream), v_buf.device_address(stream)),
            elements,
        )
    }

    /// Launches the append kernel over checked arguments: new rows at device addresses `new`
    /// (K, V; the layout's dtype), cache buffers at `cache` read as `elements` say.
    fn launch(
        &self,
        stream: &Arc<CudaStream>,
        (k_new, v_new): (u64, u64),
        (k_cache, v_cache): (u64, u64),
        elements: CacheElements,
    ) -> Result<(), Error> {
        let Some(kernel) = &self.kernel else {
            return Ok(());
        };
        let layout = &self.layout;
        let (elem, fp8) = (elements.bytes, elements.fp8);
        let (h, dqk, dvo) = (
            layout.num_kv_heads,
            layout.head_dims.qk(),
            layout.head_dims.vo(),
        );
        let (k_base, _, k_token, k_head) = cache_strides(layout, true);
        let (v_base, _, v_token, v_head) = cache_strides(layout, false);
        let (page_size, k_page, v_page) = self.kernel_pages;
        let ptr = |s: &CudaSlice<i32>| s.device_ptr(stream).0;
        let token_chunks = h * (dqk + dvo) / 8;
        let wide = self.total_new >= APPEND_WIDE_FROM_TOKENS;
        let params = AppendParams {
            k_new,
            v_new,
            k_cache: k_cache + k_base as u64 * elem,
            v_cache: v_cache + v_base as u64 * elem,
            append_indptr: ptr(&self.append_indptr),
            kv_len: ptr(&self.kv_len),
            page_indptr: ptr(&self.page_indptr),
            page_indices: ptr(&self.page_indices),
            k_page_stride: k_page,
            v_page_stride: v_page,
            k_token_stride: k_token,
            v_token_stride: v_token,
            k_head_stride: k_head,
            v_head_stride: v_head,
            total_new: self.total_new as i32,
            batch_size: self.batch_size as i32,
            num_kv_heads: h as i32,
            k_chunks: (dqk / 8) as i32,
            v_chunks: (dvo / 8) as i32,
            page_shift: page_size.trailing_zeros() as i32,
            page_mask: (page_size - 1) as i32,
            new_bf16: i32::from(layout.dtype == DType::Bf16),
            k_scale: fp8.map_or(0, |(_, s)| s.k),
            v_scale: fp8.map_or(0, |(_, s)| s.v),
            fp8_format: match fp8 {
                None => 0,
                Some((Fp8Format::E4m3, _)) => 1,
                Some((Fp8Format::E5m2, _)) => 2,
            },
            scale_head_stride: fp8.map_or(0, |(_, s)| s.head_stride),
            token_chunks: token_chunks as i32,
            wide: i32::from(wide),
        };
        // The kernel numbers its CTAs' threads in 32 bits (`append::run_wide`).
        let blocks = if wide {
            self.total_new
                .saturating_mul(APPEND_WIDE_TOKEN_THREADS as usize)
                .div_ceil(APPEND_THREADS as usize)
        } else {
            self.total_new
                .saturating_mul(token_chunks.div_ceil(APPEND_THREADS as usize))
        };
        let blocks = u32::try_from(blocks)
            .ok()
            .filter(|&b| u64::from(b) * u64::from(APPEND_THREADS) <= u64::from(u32::MAX))
            .ok_or_else(|| CudaError::Buffer {
                name: "k_new",
                reason: format!(
                    "{} new tokens need {blocks} blocks, more than one launch numbers in 32 bits",
                    self.total_new
                ),
            })?;
        // SAFETY: the kernel takes one AppendParams, which is repr(C) without padding and whose
        // CUDA twin asserts the same field sizes; the table and append_indptr were validated
        // against the layout when the plan was made (every page id in range, every new token
        // inside its request's pages, no two writes to one slot), the cache buffers were checked
        // to hold the layout's pages and the new rows to hold total_new tokens; the index arrays
        // are the plan's and outlive the launch on `stream` (a plan dropped after it frees them
        // in stream order on the stream it was made on).
        unsafe {
            launch_1d(
                stream,
                kernel,
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
