//! Paged attention on the GPU: batch decode and batch paged prefill over a paged KV cache.
//!
//! [`PagedPlan::new`] takes a validated [`PagedAttention`] (so every page id is inside the
//! cache), picks the kernel (the key-split tile for decode, a row tile for paged prefill: the
//! same generated kernel as ragged prefill, with paged K/V loads), the KV split, and uploads the
//! page table. [`PagedPlan::run_on`] checks the buffers and launches on the caller's stream with
//! no allocation and no synchronisation, so it can be captured in a CUDA graph. A captured graph
//! replays the plan's batch shape (lengths, split, work list); between replays the caller may
//! write new K/V contents and new queries into the same buffers and rewrite the page ids with
//! [`PagedPlan::update_page_indices`] (same pages per request, checked against the cache).
//! Different lengths need a new plan (and a new capture), or a graph-stable plan ([`graph`]).
//!
//! Caches of the layout's dtype and of fp8 codes (`super::fp8`) share one run, one append and one
//! run on host tensors, written once over [`CacheBuffer`], the trait that holds what differs
//! between the two kinds of buffer (element check and size, scales, host copies).

use super::append::DevicePagedKvMut;
use super::buffers::DeviceTensor;
use super::engine::Engine;
use super::error::{CudaError, DriverContext};
use super::graph::capture_graph;
use super::pages::KernelPages;
use super::plan::{upload, KernelPlan, KvAddress, PageAddress, PlanOptions, ScaleAddress};
use super::prefill::{check_buffer, check_view_alignment, qo_address};
use super::schedule::KvSplit;
use crate::codegen::{KernelSpec, KvCache};
use crate::dtype::fp8::Fp8Format;
use crate::dtype::DType;
use crate::paged::{KvStorage, PageTable, PagedAttention, PagedKv, PagedKvLayout};
use crate::problem::{AttentionProblem, InvalidProblem};
use crate::tensor::HostTensor;
use crate::{AttentionOutput, Error};
use cudarc::driver::{CudaSlice, CudaStream};
use std::sync::Arc;

mod graph;

pub use graph::PagedGraphCapacity;

/// The cache buffers on the device, as the layout's storage says: device tensors of the
/// layout's dtype, or fp8 codes (`DevicePagedKv<'_, DeviceFp8Tensor>`, read through
/// [`super::DeviceFp8Kv`]).
#[derive(Debug)]
pub enum DevicePagedKv<'a, B = DeviceTensor> {
    /// K and V in two buffers, each `[pages, ...]` in the layout's order.
    Separate {
        /// The K pages.
        k: &'a B,
        /// The V pages.
        v: &'a B,
    },
    /// One buffer `[pages, 2, ...]`: K then V within each page.
    Combined(&'a B),
}

impl<B> Clone for DevicePagedKv<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for DevicePagedKv<'_, B> {}

impl<'a, B> DevicePagedKv<'a, B> {
    /// The buffers holding K and V (the same one twice when combined), after checking that they
    /// match `layout`: its storage, and in each buffer `want` elements with room for all its
    /// pages.
    pub(crate) fn checked(
        self,
        layout: &PagedKvLayout,
        want: B::Element,
    ) -> Result<(&'a B, &'a B), CudaError>
    where
        B: CacheBuffer,
    {
        match (layout.storage, self) {
            (KvStorage::Separate, DevicePagedKv::Separate { k, v }) => {
                k.check("k_cache", want, layout.k_buffer_len())?;
                v.check("v_cache", want, layout.v_buffer_len())?;
                Ok((k, v))
            }
            (KvStorage::Combined, DevicePagedKv::Combined(kv)) => {
                kv.check("kv_cache", want, layout.k_buffer_len())?;
                Ok((kv, kv))
            }
            (storage, _) => Err(CudaError::Buffer {
                name: "kv_cache",
                reason: format!(
                    "the layout stores K and V {}, the buffers passed do not",
                    storage.name()
                ),
            }),
        }
    }
}

/// The device cache over one (combined) or two (separate) buffers.
pub(crate) fn device_cache<B>(buffers: &[B]) -> DevicePagedKv<'_, B> {
    match buffers {
        [k, v] => DevicePagedKv::Separate { k, v },
        [kv] => DevicePagedKv::Combined(kv),
        _ => unreachable!("a cache has one or two buffers"),
    }
}

/// [`device_cache`], writable.
pub(crate) fn device_cache_mut<B>(buffers: &mut [B]) -> DevicePagedKvMut<'_, B> {
    match buffers {
        [k, v] => DevicePagedKvMut::Separate { k, v },
        [kv] => DevicePagedKvMut::Combined(kv),
        _ => unreachable!("a cache has one or two buffers"),
    }
}

/// How the kernels read a cache's elements: their size in bytes and, for fp8 codes, the format
/// and the scales.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CacheElements {
    pub bytes: u64,
    pub fp8: Option<(Fp8Format, ScaleAddress)>,
}

/// A device buffer that holds a paged cache's pages: a [`DeviceTensor`] of the layout's dtype
/// or fp8 codes ([`super::DeviceFp8Tensor`]). The attention run ([`PagedPlan::run_cache`]), the
/// append (`Engine::append_to_cache`) and the run on host tensors ([`Engine::paged_host`]) are
/// written once over it.
pub(crate) trait CacheBuffer: Sized {
    /// The host buffer it is uploaded from and overwritten with.
    type Host;
    /// What each element is: a dtype, an fp8 format.
    type Element: Copy;
    /// What dequantises the elements: nothing for the layout's dtype, the scales for fp8 codes.
    type Scales;

    /// A device copy of `host`, ordered on `stream`.
    fn upload(stream: &Arc<CudaStream>, host: &Self::Host) -> Result<Self, CudaError>;
    /// A buffer of `host`'s size and element type, every element NaN.
    fn nan_like(stream: &Arc<CudaStream>, host: &Self::Host) -> Result<Self, CudaError>;
    /// Overwrites the buffer with `host` in place, ordered on `stream`.
    fn write(&mut self, stream: &Arc<CudaStream>, host: &Self::Host) -> Result<(), CudaError>;
    /// `host` with every value negated: decoy contents of the same size and element type.
    fn negated(host: &Self::Host) -> Self::Host;
    /// Checks that the buffer holds `want` elements, at least `need` of them; `name` names the
    /// buffer in the error.
    fn check(&self, name: &'static str, want: Self::Element, need: usize) -> Result<(), CudaError>;
    /// The device address, for kernel parameters.
    fn device_address(&self, stream: &Arc<CudaStream>) -> u64;
    /// The kernels' view of the elements (a checked buffer of the cache `layout`, whose
    /// `scales` are checked against it here).
    fn elements(
        &self,
        stream: &Arc<CudaStream>,
        layout: &PagedKvLayout,
        scales: &Self::Scales,
    ) -> Result<CacheElements, CudaError>;
    /// The element `plan` reads, or the error of a plan made for the other kind of cache.
    fn planned(plan: &PagedPlan) -> Result<Self::Element, Error>;
    /// The element an append into a cache of `layout` whose first buffer is `first` expects.
    fn appended(first: &Self, layout: &PagedKvLayout) -> Self::Element;
    /// What an append of `dtype` rows into such a cache is, in the error when the append
    /// kernel does not take them.
    fn append_unsupported(dtype: DType) -> String;
    /// Downloads the buffer and compares it with `host` element by element (NaN equal to NaN in
    /// a float buffer, codes bit for bit): the first difference as (index, device value, host
    /// value, count of differences), or `None`.
    fn first_difference(
        &self,
        stream: &Arc<CudaStream>,
        host: &Self::Host,
    ) -> Result<Option<(usize, String, String, usize)>, CudaError>;
}

impl CacheBuffer for DeviceTensor {
    type Host = HostTensor;
    type Element = DType;
    type Scales = ();

    fn upload(stream: &Arc<CudaStream>, host: &HostTensor) -> Result<Self, CudaError> {
        DeviceTensor::upload(stream, host)
    }

    fn nan_like(stream: &Arc<CudaStream>, host: &HostTensor) -> Result<Self, CudaError> {
        DeviceTensor::nan(stream, host.dtype(), host.len())
    }

    fn write(&mut self, stream: &Arc<CudaStream>, host: &HostTensor) -> Result<(), CudaError> {
        DeviceTensor::write(self, stream, host)
    }

    fn negated(host: &HostTensor) -> HostTensor {
        negated(host)
    }

    fn first_difference(
        &self,
        stream: &Arc<CudaStream>,
        host: &HostTensor,
    ) -> Result<Option<(usize, String, String, usize)>, CudaError> {
        let (device, host) = (self.download(stream)?.to_f32_vec(), host.to_f32_vec());
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        Ok(first_of(
            device.iter().zip(&host).map(|(&a, &b)| (same(a, b), a, b)),
            |x| format!("{x:e}"),
        ))
    }

    fn check(&self, name: &'static str, want: DType, need: usize) -> Result<(), CudaError> {
        check_buffer(name, self, want, need)
    }

    fn device_address(&self, stream: &Arc<CudaStream>) -> u64 {
        DeviceTensor::device_address(self, stream)
    }

    fn elements(
        &self,
        _: &Arc<CudaStream>,
        layout: &PagedKvLayout,
        (): &(),
    ) -> Result<CacheElements, CudaError> {
        Ok(CacheElements {
            bytes: layout.dtype.size_bytes() as u64,
            fp8: None,
        })
    }

    fn planned(plan: &PagedPlan) -> Result<DType, Error> {
        match plan.kv_fp8 {
            Some(format) => Err(Error::Unsupported {
                backend: "cuda",
                what: format!("a cache of the problem's dtype for a plan over {format} pages"),
                supported: "run_fp8_on with the fp8 cache the plan was made for".into(),
            }),
            None => Ok(plan.layout.dtype),
        }
    }

    fn appended(_: &Self, layout: &PagedKvLayout) -> DType {
        layout.dtype
    }

    fn append_unsupported(dtype: DType) -> String {
        format!("a {dtype} cache")
    }
}

/// A paged attention problem prepared for one engine.
pub struct PagedPlan {
    plan: KernelPlan,
    /// The cache's fp8 format, `None` for pages of the problem's dtype.
    kv_fp8: Option<Fp8Format>,
    layout: PagedKvLayout,
    table: PageTable,
    /// The kernels' page size and page strides (`pages`).
    kernel_pages: (usize, i64, i64),
    page_indptr: CudaSlice<i32>,
    page_indices: CudaSlice<i32>,
    /// Graph-stable plans only: the capacity their buffers are sized for.
    graph: Option<PagedGraphCapacity>,
}

/// Element strides of K (`true`) or V in the cache, read off the layout's own address function
/// so that host and device can never disagree: (offset of head 0's element 0 in page 0, page,
/// token within a page, head).
pub(crate) fn cache_strides(layout: &PagedKvLayout, is_k: bool) -> (usize, i64, i64, i64) {
    let at = |page, slot, head| {
        if is_k {
            layout.k_index(page, slot, head, 0)
        } else {
            layout.v_index(page, slot, head, 0)
        }
    };
    let base = at(0, 0, 0);
    let step = |x: usize| (x - base) as i64;
    (
        base,
        step(at(1, 0, 0)),
        step(at(0, 1, 0)),
        step(at(0, 0, 1)),
    )
}

impl PagedPlan {
    /// Plans `paged` on `engine`: kernel choice, compilation, KV split, uploads.
    pub fn new(engine: &Engine, paged: &PagedAttention) -> Result<PagedPlan, Error> {
        PagedPlan::with_options(engine, paged, PlanOptions::default())
    }

    /// [`new`](Self::new) with the planner's choices (tile, KV split) replaced where `options`
    /// say.
    pub fn with_options(
        engine: &Engine,
        paged: &PagedAttention,
        options: PlanOptions,
    ) -> Result<PagedPlan, Error> {
        PagedPlan::with_kv_fp8(engine, paged, None, options)
    }

    /// [`with_options`](Self::with_options) over a cache of `kv_fp8` codes (`None`: of the
    /// problem's dtype); an fp8 plan runs with [`run_fp8_on`](Self::run_fp8_on).
    pub fn with_kv_fp8(
        engine: &Engine,
        paged: &PagedAttention,
        kv_fp8: Option<Fp8Format>,
        options: PlanOptions,
    ) -> Result<PagedPlan, Error> {
        let problem = paged.problem();
        // K and V are read through the cache layout, whose rows are whole 16-byte chunks.
        check_view_alignment("q", &problem.q_view)?;
        let table = paged.table().clone();
        let kp = KernelPages::new(paged.layout(), &table)?;
        Ok(PagedPlan {
            plan: KernelPlan::with_kv_fp8(engine, problem, KvCache::Paged, kv_fp8, options)?,
            kv_fp8,
            layout: *paged.layout(),
            kernel_pages: (kp.page_size, kp.k_page_stride, kp.v_page_stride),
            page_indptr: upload(engine, &kp.table.kv_page_indptr, "kv_page_indptr")?,
            page_indices: upload(engine, &kp.table.kv_page_indices, "kv_page_indices")?,
            table,
            graph: None,
        })
    }

    /// The cache's fp8 format, `None` for pages of the problem's dtype.
    pub fn kv_fp8(&self) -> Option<Fp8Format> {
        self.kv_fp8
    }

    /// The kernel this plan runs.
    pub fn spec(&self) -> &KernelSpec {
        &self.plan.spec
    }

    /// The planned problem (its K/V views describe the gathered tensors).
    pub fn problem(&self) -> &AttentionProblem {
        &self.plan.problem
    }

    /// The cache layout the plan reads.
    pub fn layout(&self) -> &PagedKvLayout {
        &self.layout
    }

    /// The page table as of the last [`update_page_indices`](Self::update_page_indices).
    pub fn table(&self) -> &PageTable {
        &self.table
    }

    /// CTAs per launch of the attention kernel.
    pub fn num_ctas(&self) -> u32 {
        self.plan.num_work
    }

    /// How the KV range is split across CTAs, if it is.
    pub fn kv_split(&self) -> Option<KvSplit> {
        self.plan.split
    }

    /// Replaces the page ids in place (the device buffer keeps its address, so a captured graph
    /// reads the new ones). `indices` must have the plan's length and ids inside the cache; the
    /// copy is ordered on `stream` before later launches there.
    pub fn update_page_indices(
        &mut self,
        stream: &Arc<CudaStream>,
        indices: &[i32],
    ) -> Result<(), Error> {
        let mut table = self.table.clone();
        if indices.len() != table.kv_page_indices.len() {
            return Err(InvalidProblem::new(
                "kv_page_indices",
                format!(
                    "has {} ids; the plan's table has {} (a new page count needs a new plan)",
                    indices.len(),
                    table.kv_page_indices.len()
                ),
            )
            .into());
        }
        table.kv_page_indices = indices.to_vec();
        table.validate(self.layout.page_size, self.layout.num_pages)?;
        // The same pages per request: the kernels' table keeps its length.
        let kernel_indices = KernelPages::new(&self.layout, &table)?
            .table
            .kv_page_indices;
        if !kernel_indices.is_empty() {
            stream
                .memcpy_htod(&kernel_indices, &mut self.page_indices)
                .during("updating kv_page_indices")?;
        }
        self.table = table;
        Ok(())
    }

    /// [`run_on`](Self::run_on) the engine's stream.
    pub fn run(
        &self,
        engine: &Engine,
        q: &DeviceTensor,
        cache: DevicePagedKv<'_>,
        o: &mut DeviceTensor,
        lse: Option<&mut DeviceTensor>,
    ) -> Result<(), Error> {
        self.run_on(engine.stream(), q, cache, o, lse)
    }

    /// Launches on `stream`: `q` in the problem's query view, the cache in the plan's layout,
    /// `o` contiguous `[total_qo, num_qo_heads, head_dim_vo]`, `lse` (if given) `[total_qo,
    /// num_qo_heads]` f32. No allocation, no synchronisation: safe to capture in a CUDA graph.
    pub fn run_on(
        &self,
        stream: &Arc<CudaStream>,
        q: &DeviceTensor,
        cache: DevicePagedKv<'_>,
        o: &mut DeviceTensor,
        lse: Option<&mut DeviceTensor>,
    ) -> Result<(), Error> {
        self.run_cache(stream, q, cache, &(), o, lse)
    }

    /// [`run_on`](Self::run_on) over either kind of cache buffer, dequantised by `scales`: checks
    /// that the plan was made for that kind, then the buffers and scales against the layout.
    pub(crate) fn run_cache<B: CacheBuffer>(
        &self,
        stream: &Arc<CudaStream>,
        q: &DeviceTensor,
        cache: DevicePagedKv<'_, B>,
        scales: &B::Scales,
        o: &mut DeviceTensor,
        lse: Option<&mut DeviceTensor>,
    ) -> Result<(), Error> {
        let want = B::planned(self)?;
        let l = &self.layout;
        let (k_buf, v_buf) = cache.checked(l, want)?;
        let elements = k_buf.elements(stream, l, scales)?;
        let buffers = (k_buf.device_address(stream), v_buf.device_address(stream));
        self.launch_paged(stream, q, buffers, elements, o, lse)
    }

    /// Launches over cache buffers at device addresses `(k, v)` in the plan's layout, read as
    /// `elements` say.
    fn launch_paged(
        &self,
        stream: &Arc<CudaStream>,
        q: &DeviceTensor,
        (k_addr, v_addr): (u64, u64),
        elements: CacheElements,
        o: &mut DeviceTensor,
        lse: Option<&mut DeviceTensor>,
    ) -> Result<(), Error> {
        let elem = elements.bytes;
        let p = &self.plan.problem;
        let l = &self.layout;
        let qo = qo_address(p, stream, q, o, lse.as_deref())?;
        let (k_base, _, k_token, k_head) = cache_strides(l, true);
        let (v_base, _, v_token, v_head) = cache_strides(l, false);
        let (page_size, k_page, v_page) = self.kernel_pages;
        let address = KvAddress {
            k: k_addr + k_base as u64 * elem,
            v: v_addr + v_base as u64 * elem,
            k_stride_token: k_token,
            k_stride_head: k_head,
            v_stride_token: v_token,
            v_stride_head: v_head,
            pages: Some(PageAddress {
                indptr: cudarc::driver::DevicePtr::device_ptr(&self.page_indptr, stream).0,
                indices: cudarc::driver::DevicePtr::device_ptr(&self.page_indices, stream).0,
                k_page_stride: k_page,
                v_page_stride: v_page,
                page_size,
            }),
            scales: elements.fp8.map(|(_, scales)| scales),
        };
        self.plan.launch(stream, qo, address)
    }
}

/// How [`Engine::paged_host`] runs the plan.
#[derive(Clone, Copy, Debug)]
pub enum PagedRunMode<'a> {
    /// One launch.
    Direct,
    /// Captured in a CUDA graph against decoy contents (other K/V values, rotated page ids),
    /// then the real queries, cache and page ids written into the same buffers and the graph
    /// replayed: the output proves that a replay reads new contents and new page ids.
    GraphReplay,
    /// The cache buffers start all NaN and are filled on the device by
    /// [`Engine::append_paged_kv`] from the ragged `k`, `v` (every token new), then one launch:
    /// the output proves the append kernel wrote every token where the attention reads it.
    DeviceAppend {
        /// The keys the cache holds, ragged `[total_kv, num_kv_heads, head_dim_qk]`.
        k: &'a HostTensor,
        /// The values, ragged.
        v: &'a HostTensor,
    },
}

impl Engine {
    /// Plans (as `options` say) and runs a paged problem on host tensors: uploads, poisons the
    /// outputs with NaN, launches (directly or through a replayed CUDA graph), synchronises and
    /// downloads.
    pub fn paged_host(
        &self,
        paged: &PagedAttention,
        q: &HostTensor,
        cache: PagedKv<'_>,
        mode: PagedRunMode<'_>,
        options: PlanOptions,
    ) -> Result<AttentionOutput, Error> {
        paged.validate_q(q)?;
        paged.layout().validate_buffers(cache)?;
        let plan = PagedPlan::with_options(self, paged, options)?;
        self.paged_host_cache::<DeviceTensor>(paged, q, plan, cache, &(), mode)
    }

    /// The run on host tensors over either kind of cache, after the checks of `q` and the host
    /// cache `pages`: `plan` made for them, `scales` on the device.
    pub(crate) fn paged_host_cache<B: CacheBuffer>(
        &self,
        paged: &PagedAttention,
        q: &HostTensor,
        mut plan: PagedPlan,
        pages: PagedKv<'_, B::Host>,
        scales: &B::Scales,
        mode: PagedRunMode<'_>,
    ) -> Result<AttentionOutput, Error> {
        let stream = self.stream();
        let name = plan.spec().name();
        let host_buffers: Vec<&B::Host> = match pages {
            PagedKv::Separate { k, v } => vec![k, v],
            PagedKv::Combined(kv) => vec![kv],
        };
        let mut qd = self.upload(q)?;
        // The appended run starts from a cache of NaN (allocated and filled on the device), so
        // that a token the append misses shows in the output.
        let mut buffers = host_buffers
            .iter()
            .map(|h| match mode {
                PagedRunMode::DeviceAppend { .. } => B::nan_like(stream, h),
                _ => B::upload(stream, h),
            })
            .collect::<Result<Vec<_>, _>>()?;
        match mode {
            PagedRunMode::DeviceAppend { k, v } => {
                let (kd, vd) = (self.upload(k)?, self.upload(v)?);
                self.append_to_cache(
                    stream,
                    paged.layout(),
                    paged.table(),
                    &paged.problem().batch.kv_indptr,
                    (&kd, &vd),
                    device_cache_mut(&mut buffers),
                    scales,
                )?;
                // The cache must hold exactly what the host's append wrote (the attention below
                // would hide a code one step off within its tolerance).
                for (buffer, (d, h)) in buffers.iter().zip(&host_buffers).enumerate() {
                    if let Some((index, device, host, count)) = d.first_difference(stream, h)? {
                        return Err(CudaError::AppendMismatch {
                            buffer,
                            index,
                            device,
                            host,
                            count,
                        }
                        .into());
                    }
                }
                self.run_poisoned(paged.problem(), &name, |o, lse| {
                    plan.run_cache(stream, &qd, device_cache(&buffers), scales, o, lse)
                })
            }
            PagedRunMode::Direct => self.run_poisoned(paged.problem(), &name, |o, lse| {
                plan.run_cache(stream, &qd, device_cache(&buffers), scales, o, lse)
            }),
            PagedRunMode::GraphReplay => {
                qd.write(stream, &negated(q))?;
                for (d, h) in buffers.iter_mut().zip(&host_buffers) {
                    d.write(stream, &B::negated(h))?;
                }
                let mut state = (qd, buffers);
                self.run_poisoned(paged.problem(), &name, |o, lse| {
                    replay_in_graph(
                        stream,
                        &mut plan,
                        &mut state,
                        (o, lse),
                        |plan, (qd, buffers), o, lse| {
                            plan.run_cache(stream, qd, device_cache(buffers), scales, o, lse)
                        },
                        |(qd, buffers)| {
                            qd.write(stream, q)?;
                            for (d, h) in buffers.iter_mut().zip(&host_buffers) {
                                d.write(stream, h)?;
                            }
                            Ok(())
                        },
                    )
                })
            }
        }
    }
}

/// The first of `pairs` (equal?, device value, host value) that differs, with both values shown
/// by `show`, and how many differ.
pub(crate) fn first_of<T: Copy>(
    pairs: impl Iterator<Item = (bool, T, T)>,
    show: impl Fn(T) -> String,
) -> Option<(usize, String, String, usize)> {
    let mut first = None;
    let mut count = 0;
    for (i, (same, a, b)) in pairs.enumerate() {
        if !same {
            count += 1;
            first.get_or_insert((i, show(a), show(b)));
        }
    }
    first.map(|(i, a, b)| (i, a, b, count))
}

/// The graph-replay check of a paged plan ([`PagedRunMode::GraphReplay`]) whose buffers in
/// `state` already hold decoy contents: rotates the page ids to decoys, captures `launch` in a
/// CUDA graph, runs it, then writes the real page ids and (`write_real`) the real contents into
/// the same buffers, poisons the outputs again and replays, so that the outputs prove the replay
/// read the new contents and page ids.
fn replay_in_graph<S>(
    stream: &Arc<CudaStream>,
    plan: &mut PagedPlan,
    state: &mut S,
    (o, mut lse): (&mut DeviceTensor, Option<&mut DeviceTensor>),
    launch: impl Fn(&PagedPlan, &S, &mut DeviceTensor, Option<&mut DeviceTensor>) -> Result<(), Error>,
    write_real: impl FnOnce(&mut S) -> Result<(), Error>,
) -> Result<(), Error> {
    let real = plan.table.kv_page_indices.clone();
    let num_pages = plan.layout.num_pages as i32;
    let decoy: Vec<i32> = real.iter().map(|&p| (p + 1) % num_pages).collect();
    plan.update_page_indices(stream, &decoy)?;
    let graph = capture_graph(stream, || launch(plan, state, o, lse.as_deref_mut()))?;
    graph.launch().during("launching the graph on the decoy")?;
    // The real contents, in the same buffers; the outputs poisoned again.
    plan.update_page_indices(stream, &real)?;
    write_real(state)?;
    o.fill_nan(stream)?;
    if let Some(l) = lse {
        l.fill_nan(stream)?;
    }
    graph.launch().during("replaying the graph")?;
    // The graph is destroyed when it goes out of scope: not while it may run.
    stream.synchronize().during("waiting for the replay")?;
    Ok(())
}

/// `t` with every element negated: decoy contents of the same size and dtype.
fn negated(t: &HostTensor) -> HostTensor {
    match t {
        HostTensor::F16(v) => HostTensor::F16(v.iter().map(|x| -*x).collect()),
        HostTensor::Bf16(v) => HostTensor::Bf16(v.iter().map(|x| -*x).collect()),
        HostTensor::F32(v) => HostTensor::F32(v.iter().map(|x| -x).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::paged::KvOrder;
    use crate::problem::HeadDims;

    /// The strides the kernel gets reproduce the layout's own address of every element, for K
    /// and V, both orders and storages, equal and unequal head dims.
    #[test]
    fn cache_strides_reproduce_the_layout_address() {
        for (qk, vo) in [(128, 128), (192, 128)] {
            for order in [KvOrder::Nhd, KvOrder::Hnd] {
                for storage in [KvStorage::Separate, KvStorage::Combined] {
                    let layout = PagedKvLayout {
                        num_pages: 5,
                        page_size: 4,
                        num_kv_heads: 3,
                        head_dims: HeadDims::new(qk, vo).unwrap(),
                        order,
                        storage,
                        dtype: DType::F16,
                    };
                    if layout.validate().is_err() {
                        continue;
                    }
                    for is_k in [true, false] {
                        let (base, page, token, head) = cache_strides(&layout, is_k);
                        for (p, s, h) in [(0, 0, 0), (4, 3, 2), (2, 1, 1), (3, 0, 2)] {
                            let want = if is_k {
                                layout.k_index(p, s, h, 0)
                            } else {
                                layout.v_index(p, s, h, 0)
                            };
                            let got =
                                base as i64 + p as i64 * page + s as i64 * token + h as i64 * head;
                            assert_eq!(got, want as i64, "{layout:?} k={is_k} ({p},{s},{h})");
                        }
                    }
                }
            }
        }
    }
}
