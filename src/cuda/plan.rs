//! The part of a plan that ragged prefill and paged attention share: the kernel, the work list,
//! the KV split and its workspace, and the device copies of everything that depends only on the
//! problem; and the one launch sequence (attention kernel, then the merge when split).
//!
//! [`super::PrefillPlan`] and [`super::PagedPlan`] wrap a [`KernelPlan`] and differ only in
//! where K and V come from ([`KvAddress`]) and in the buffers they check before a launch.

use super::engine::{Engine, LoadedKernel};
use super::launch::{launch_1d, Launch1d};
use super::memory;
use super::problem_arrays::ProblemArrays;
use super::schedule::{
    choose_kv_split, choose_tile_on, item_costs, prefill_work, split_slots, KvSplit, SplitChoice,
};
use super::tma::kv_tensor_map;
use crate::codegen::{
    self, FastDivisor, KernelSpec, KvCache, ParamBlockLayout, PrefillParams, TileConfig, TmaMap,
    MERGE_ROWS_PER_CTA, MERGE_THREADS,
};
use crate::dtype::fp8::Fp8Format;
use crate::jit::Arch;
use crate::problem::{AttentionProblem, HeadDims, Mask};
use crate::Error;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr};
use std::sync::{Arc, Mutex};

mod graph;
mod persistent;

use graph::{check_graph_problem, graph_split, padded_work, work_capacity, GraphState};
pub use graph::{check_replan, GraphCapacity};
pub(crate) use persistent::persistent_plannable;
use persistent::{kv_view, persistent_work};

/// log2(e), folded into the scale when the variant has no transform.
const LOG2E: f32 = std::f32::consts::LOG2_E;

/// Elements of 16 bits per 16-byte copy: the kernels load and store whole rows in such copies.
pub(crate) const ROW_ALIGNMENT: usize = 8;

/// Per-chunk partial results of a split KV range, merged by the merge kernel.
struct Workspace {
    o: CudaSlice<f32>,
    lse: CudaSlice<f32>,
}

/// Where the kernel reads K and V: device addresses of element 0 of KV head 0 and the strides
/// (elements). For a paged cache the token strides are those within a page.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct KvAddress {
    pub k: u64,
    pub v: u64,
    pub k_stride_token: i64,
    pub k_stride_head: i64,
    pub v_stride_token: i64,
    pub v_stride_head: i64,
    /// Paged only: the page table on the device and the page geometry.
    pub pages: Option<PageAddress>,
    /// fp8 K/V only: the scales on the device.
    pub scales: Option<ScaleAddress>,
}

/// The dequantisation scales an fp8 launch reads: f32 arrays of one entry (per tensor) or one
/// per KV head.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ScaleAddress {
    pub k: u64,
    pub v: u64,
    /// 0 (one scale per tensor) or 1 (one per KV head).
    pub head_stride: i32,
}

/// The page table a paged launch reads.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PageAddress {
    pub indptr: u64,
    pub indices: u64,
    pub k_page_stride: i64,
    pub v_page_stride: i64,
    pub page_size: usize,
}

/// The query and output side of a launch.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct QoAddress {
    pub q: u64,
    pub o: u64,
    /// 0 when the LSE is not wanted.
    pub lse: u64,
}

/// Uploads `data`; an empty slice becomes one default element (the driver allocates nothing of
/// size 0, and the kernel never reads it).
pub(crate) fn upload<T: DeviceRepr + Default + Copy>(
    engine: &Engine,
    data: &[T],
    what: &str,
) -> Result<CudaSlice<T>, Error> {
    let one = [T::default()];
    let data = if data.is_empty() { &one[..] } else { data };
    Ok(memory::upload(engine.stream(), data, what)?)
}

/// Writes `data` over the first elements of `dst` on `stream` (the address stays); an error when
/// `dst` is too short.
pub(crate) fn memory_write<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    data: &[T],
    dst: &mut CudaSlice<T>,
    what: &str,
) -> Result<(), Error> {
    if data.is_empty() {
        return Ok(());
    }
    if data.len() > dst.len() {
        return Err(crate::cuda::CudaError::Buffer {
            name: "graph-stable plan",
            reason: format!(
                "{what} needs {} entries; its buffer holds {}",
                data.len(),
                dst.len()
            ),
        }
        .into());
    }
    use crate::cuda::error::DriverContext;
    stream
        .memcpy_htod(data, dst)
        .during(format!("rewriting {what}"))?;
    Ok(())
}

/// What a caller may set when planning; the defaults are the planner's choices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanOptions {
    /// Replaces the planner's tile (tuning: the compile matrix covers only the planner's tiles).
    pub tile: Option<TileConfig>,
    /// How the KV range is cut ([`SplitChoice::Planned`] by default).
    pub split: SplitChoice,
    /// Plan the tiles of this architecture rather than the device's (`None`): `Some(Sm80)` on a
    /// Hopper GPU runs the sm_80 (`mma.sync`) kernels there, compiled for the device, so that
    /// they can be checked on it. Refused when the device cannot run that architecture's tiles
    /// (sm_90a's wgmma tiles on an older GPU).
    pub tiles_of: Option<Arch>,
}

/// The architecture whose tiles a plan takes on a device of architecture `device`: `tiles_of`,
/// or the device's; an error when the device cannot run them. Every tile but the wgmma ones
/// (sm_90a only) runs on every architecture the engine supports, and the others' tiles need no
/// more shared memory than any of them has.
pub(crate) fn plan_arch(tiles_of: Option<Arch>, device: Arch) -> Result<Arch, Error> {
    match tiles_of {
        Some(Arch::Sm90a) if device != Arch::Sm90a => Err(Error::Unsupported {
            backend: "cuda",
            what: format!("the tiles of sm_90a on an {} device", device.name()),
            supported: format!(
                "the tiles of the device's architecture or of an older one ({})",
                [Arch::Sm80, Arch::Sm86, Arch::Sm89]
                    .map(Arch::name)
                    .join(", ")
            ),
        }),
        Some(arch) => Ok(arch),
        None => Ok(device),
    }
}

/// A problem prepared for one engine: kernel, work list, split, uploads.
pub(crate) struct KernelPlan {
    pub problem: AttentionProblem,
    pub spec: KernelSpec,
    kernel: Arc<LoadedKernel>,
    layout: ParamBlockLayout,
    /// CTAs per launch: one per work item, or with the warp-specialised tile (persistent CTAs,
    /// [`persistent_work`]) at most one per slot.
    pub num_work: u32,
    pub split: Option<KvSplit>,
    workspace: Option<Workspace>,
    work: CudaSlice<i32>,
    arrays: ProblemArrays,
    /// CTA slots of the device (SMs x resident CTAs), the work list's launch order is for.
    slots: usize,
    /// Graph-stable plans only: what construction fixed ([`graph`]).
    graph: Option<GraphState>,
    /// The K/V tensor maps of the last launch and the views they were encoded for: a launch
    /// over the same K/V (the usual case: one cache, or a caching allocator's buffer) reuses
    /// them instead of encoding two maps on the host again.
    last_tensor_maps: Mutex<Option<(TensorMapKey, TensorMapPair)>>,
}

/// What a launch's tensor maps depend on besides the plan: the K/V addresses and strides.
type TensorMapKey = [i64; 6];
type TensorMapPair = (Option<TmaMap>, Option<TmaMap>);

/// Refuses a tile that is not built for `arch` (a forced `PlanOptions::tile`; the planner picks
/// only tiles that are): a wgmma tile off sm_90a, or on sm_90a an mma.sync tile that has a wgmma
/// twin, which the error names.
fn check_tile_runs_on(tile: TileConfig, arch: Arch, dims: HeadDims) -> Result<(), Error> {
    if tile.runs_on(arch, dims) {
        return Ok(());
    }
    let twin = tile.for_arch(arch, dims);
    let supported = if twin != tile {
        format!("its wgmma twin {} on {}", twin.label(), arch.name())
    } else {
        "wgmma (`g`) tiles on sm_90a (Hopper) devices".into()
    };
    Err(Error::Unsupported {
        backend: "cuda",
        what: format!("tile {} on {}", tile.label(), arch.name()),
        supported,
    })
}

/// The work list of a plan (not graph-stable) and its CTA count: one CTA per item, or with the
/// warp-specialised tile the persistent launch over the items ([`persistent_work`]).
fn work_list(
    problem: &AttentionProblem,
    tile: TileConfig,
    cta_q: usize,
    split: Option<&KvSplit>,
    slots: usize,
) -> (usize, Vec<i32>) {
    if tile.warp_specialized {
        let (grid, work) = persistent_work(slots, item_costs(problem, cta_q, split, slots));
        (grid as usize, work)
    } else {
        let items = prefill_work(problem, cta_q, split, slots);
        (items.len(), items.into_iter().flatten().collect())
    }
}

impl KernelPlan {
    /// Plans `problem` (already validated by the caller) with K/V from `kv`, as `options` say.
    pub fn new(
        engine: &Engine,
        problem: &AttentionProblem,
        kv: KvCache,
        options: PlanOptions,
    ) -> Result<KernelPlan, Error> {
        KernelPlan::with_kv_fp8(engine, problem, kv, None, options)
    }

    /// [`new`](Self::new) with K/V of fp8 `kv_fp8` codes (`None`: of the problem's dtype).
    pub fn with_kv_fp8(
        engine: &Engine,
        problem: &AttentionProblem,
        kv: KvCache,
        kv_fp8: Option<Fp8Format>,
        options: PlanOptions,
    ) -> Result<KernelPlan, Error> {
        KernelPlan::build(engine, problem, kv, kv_fp8, options, None)
    }

    /// [`with_kv_fp8`](Self::with_kv_fp8), graph-stable: every later plan within `capacity` is
    /// written into this plan's arrays by [`replan`](Self::replan), and a graph captured around
    /// [`launch`](Self::launch) replays it ([`graph`]).
    pub fn graph_stable(
        engine: &Engine,
        problem: &AttentionProblem,
        kv: KvCache,
        kv_fp8: Option<Fp8Format>,
        options: PlanOptions,
        capacity: GraphCapacity,
    ) -> Result<KernelPlan, Error> {
        KernelPlan::build(engine, problem, kv, kv_fp8, options, Some(capacity))
    }

    fn build(
        engine: &Engine,
        problem: &AttentionProblem,
        kv: KvCache,
        kv_fp8: Option<Fp8Format>,
        options: PlanOptions,
        capacity: Option<GraphCapacity>,
    ) -> Result<KernelPlan, Error> {
        if let Some(cap) = &capacity {
            cap.check(&problem.batch)?;
            check_graph_problem(problem, &options)?;
        }
        let sm_count = engine.info().sm_count as usize;
        let arch = plan_arch(options.tiles_of, engine.info().arch)?;
        let tile = options.tile.unwrap_or_else(|| {
            let persistent = persistent_plannable(problem, kv, options.split, capacity.is_some());
            choose_tile_on(problem, kv, sm_count, arch, persistent)
        });
        check_tile_runs_on(tile, arch, problem.head_dims)?;
        let spec = KernelSpec::for_problem(problem, kv, tile)?.with_kv_fp8(kv_fp8)?;
        let rendered = codegen::render(&spec);
        let kernel = engine.load(&rendered)?;

        let cta_q = spec.tile.cta_q() as usize;
        let kv_tile = spec.tile.kv_tile as usize;
        let slots = sm_count * kernel.ctas_per_sm.max(1) as usize;
        let split_slots = split_slots(spec.tile, sm_count, kernel.ctas_per_sm);
        let split = match &capacity {
            Some(cap) => graph_split(problem, cap, (cta_q, kv_tile, split_slots), options.split)?,
            None => {
                let planned = if spec.tile.plans_kv_split() {
                    choose_kv_split(problem, cta_q, kv_tile, split_slots)
                } else {
                    None
                };
                let max_kv = problem.batch.lens().iter().map(|l| l.1).max().unwrap_or(0);
                options.split.resolve(planned, max_kv, kv_tile)?
            }
        };
        let graph = capacity.map(|cap| GraphState {
            capacity: cap,
            items: work_capacity(
                &cap,
                problem.num_kv_heads,
                problem.group_size(),
                cta_q,
                split.as_ref(),
            ),
            split_batch: split.map(|_| (problem.batch.len(), problem.batch.total_qo())),
        });
        let (num_work, work) = match &graph {
            Some(g) => (
                g.items,
                padded_work(problem, (cta_q, slots), split.as_ref(), g.items)?,
            ),
            None => work_list(problem, spec.tile, cta_q, split.as_ref(), slots),
        };
        let num_work = u32::try_from(num_work)
            .ok()
            .filter(|&n| n <= i32::MAX as u32)
            .ok_or_else(|| Error::Unsupported {
                backend: "the CUDA backend",
                what: format!("a launch of {num_work} CTAs"),
                supported: format!("at most {} CTAs per launch (the grid's x limit)", i32::MAX),
            })?;
        let workspace = match &split {
            Some(s) => {
                let tokens = capacity.map_or(problem.batch.total_qo(), |c| c.max_qo_tokens);
                let rows = tokens * problem.num_qo_heads * s.max_chunks;
                let stream = engine.stream();
                Some(Workspace {
                    o: memory::zeros::<f32>(
                        stream,
                        rows * problem.head_dims.vo(),
                        "the split-KV workspace's outputs",
                    )?,
                    lse: memory::zeros::<f32>(stream, rows, "the split-KV workspace's LSE")?,
                })
            }
            None => None,
        };
        let arrays = match &capacity {
            Some(cap) => ProblemArrays::upload_with_capacity(engine, problem, cap.max_batch)?,
            None => ProblemArrays::upload(engine, problem)?,
        };
        Ok(KernelPlan {
            problem: problem.clone(),
            spec,
            kernel,
            layout: rendered.params,
            num_work,
            split,
            workspace,
            work: upload(engine, &work, "work list")?,
            arrays,
            slots,
            graph,
            last_tensor_maps: Mutex::new(None),
        })
    }

    /// The K and V tensor maps of a launch whose kernel copies whole tiles by the tensor memory
    /// accelerator (`KernelSpec::copies_kv_by_tma`); `None` for the other kernels, for views
    /// the accelerator cannot address, and for graph-stable plans (a map holds the key count).
    fn kv_tensor_maps(&self, kv: KvAddress) -> TensorMapPair {
        if !self.spec.copies_kv_by_tma() || kv.pages.is_some() || self.graph.is_some() {
            return (None, None);
        }
        let key = [
            kv.k as i64,
            kv.v as i64,
            kv.k_stride_token,
            kv.k_stride_head,
            kv.v_stride_token,
            kv.v_stride_head,
        ];
        let mut last = self
            .last_tensor_maps
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((k, maps)) = *last {
            if k == key {
                return maps;
            }
        }
        let maps = self.encode_kv_tensor_maps(kv);
        *last = Some((key, maps));
        maps
    }

    /// The K and V tensor maps of `kv`'s views (see [`kv_tensor_maps`](Self::kv_tensor_maps)).
    fn encode_kv_tensor_maps(&self, kv: KvAddress) -> TensorMapPair {
        let p = &self.problem;
        let view = |address, dim, token_stride, head_stride| {
            kv_view(p, address, dim, token_stride, head_stride)
        };
        (
            kv_tensor_map(&view(
                kv.k,
                p.head_dims.qk(),
                kv.k_stride_token,
                kv.k_stride_head,
            )),
            kv_tensor_map(&view(
                kv.v,
                p.head_dims.vo(),
                kv.v_stride_token,
                kv.v_stride_head,
            )),
        )
    }

    /// Launches the attention kernel (and the merge, when split) on `stream`. The caller has
    /// checked every buffer against the problem. No allocation, no synchronisation.
    pub fn launch(
        &self,
        stream: &Arc<CudaStream>,
        qo: QoAddress,
        kv: KvAddress,
    ) -> Result<(), Error> {
        if self.num_work == 0 {
            return Ok(());
        }
        let p = &self.problem;
        let dvo = p.head_dims.vo();
        let elem = p.input_dtype.size_bytes() as u64;
        let scaling = p.qk_scaling();
        let page = kv.pages.unwrap_or_default();
        let (qo_indptr, kv_indptr) = self.arrays.indptrs(stream);
        let (custom_mask, mask_indptr) = self.arrays.custom_mask(stream);
        let group_div = FastDivisor::new(p.group_size() as u32);
        let (k_tmap, v_tmap) = self.kv_tensor_maps(kv);
        let kv_tma = k_tmap.is_some() && v_tmap.is_some();
        if self.spec.tile.warp_specialized && kv.pages.is_none() && !kv_tma {
            return Err(Error::Unsupported {
                backend: "cuda",
                what: format!(
                    "tile {} over K/V views the tensor memory accelerator cannot address",
                    self.spec.tile.label()
                ),
                supported: "K and V with positive strides and a base address that are multiples of 16 bytes, fewer than 2^31 tokens (every tile arrives by TMA)".into(),
            });
        }
        let fixed = PrefillParams {
            k_tmap: k_tmap.unwrap_or_default(),
            v_tmap: v_tmap.unwrap_or_default(),
            q: qo.q + p.q_view.offset as u64 * elem,
            k: kv.k,
            v: kv.v,
            o: qo.o,
            lse: qo.lse,
            qo_indptr,
            kv_indptr,
            work: self.work.device_ptr(stream).0,
            custom_mask,
            mask_indptr,
            partial_o: self
                .workspace
                .as_ref()
                .map_or(0, |w| w.o.device_ptr(stream).0),
            partial_lse: self
                .workspace
                .as_ref()
                .map_or(0, |w| w.lse.device_ptr(stream).0),
            kv_page_indptr: page.indptr,
            kv_page_indices: page.indices,
            q_stride_token: p.q_view.token_stride as i64,
            q_stride_head: p.q_view.head_stride as i64,
            k_stride_token: kv.k_stride_token,
            k_stride_head: kv.k_stride_head,
            v_stride_token: kv.v_stride_token,
            v_stride_head: kv.v_stride_head,
            o_stride_token: (p.num_qo_heads * dvo) as i64,
            o_stride_head: dvo as i64,
            k_page_stride: page.k_page_stride,
            v_page_stride: page.v_page_stride,
            num_qo_heads: p.num_qo_heads as i32,
            group_size: p.group_size() as i32,
            group_div_magic: group_div.magic,
            group_div_shift: group_div.shift as i32,
            window_left: match p.mask {
                Mask::SlidingWindow { window_left } => window_left as i32,
                _ => 0,
            },
            q_prescale: scaling.prescale,
            post_scale: scaling.post_scale,
            scale_log2: scaling.post_scale * LOG2E,
            kv_chunk: self.split.map_or(0, |s| s.chunk as i32),
            max_chunks: self.split.map_or(0, |s| s.max_chunks as i32),
            total_qo: p.batch.total_qo() as i32,
            batch_size: p.batch.len() as i32,
            page_shift: page.page_size.max(1).trailing_zeros() as i32,
            page_mask: page.page_size.saturating_sub(1) as i32,
            kv_tma: u64::from(kv_tma),
            k_scale: kv.scales.map_or(0, |s| s.k),
            v_scale: kv.scales.map_or(0, |s| s.v),
            kv_scale_head_stride: kv.scales.map_or(0, |s| s.head_stride),
            reserved_fp8: 0,
        };
        let variant_bytes = self.arrays.variant_bytes(stream, &self.layout.variant);
        let block = self.layout.pack(&fixed, &variant_bytes);
        let f = &self.kernel;
        // SAFETY: the kernel takes one parameter, a struct whose layout `block` reproduces (the
        // generated source asserts its size and field sizes); every pointer in it refers to a
        // live allocation sized for the plan's problem (the callers check the buffers, and page
        // tables were validated against the cache).
        unsafe {
            launch_1d(
                stream,
                &f.function,
                Launch1d {
                    blocks: self.num_work,
                    threads: f.threads,
                    smem_bytes: f.smem_bytes,
                },
                &block[..],
                || f.name.clone(),
            )
        }?;
        if self.split.is_some() {
            let rows = (p.batch.total_qo() * p.num_qo_heads) as u32;
            // SAFETY: as above; the merge kernel reads the workspace the attention kernel wrote
            // (same stream, so in order) and writes O and the LSE.
            unsafe {
                launch_1d(
                    stream,
                    &f.merge,
                    Launch1d {
                        blocks: rows.div_ceil(MERGE_ROWS_PER_CTA),
                        threads: MERGE_THREADS,
                        smem_bytes: 0,
                    },
                    &block[..],
                    || format!("{} (merge)", f.name),
                )
            }?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::QkAccum;

    fn d128() -> HeadDims {
        HeadDims::new(128, 128).expect("head dims")
    }

    // A forced tile that is not built for the device is refused with the tile to use instead.
    #[test]
    fn a_tile_not_built_for_the_device_is_refused_naming_what_is() {
        let dims = d128();
        let tiles = TileConfig::row_tiles(dims, QkAccum::F32, KvCache::Ragged);
        let twinned = tiles
            .iter()
            .copied()
            .find(|t| !t.wgmma && !t.runs_on(Arch::Sm90a, dims))
            .expect("an mma.sync tile with a wgmma twin at head dim 128");
        let err = check_tile_runs_on(twinned, Arch::Sm90a, dims).expect_err("twinned on sm_90a");
        let twin = twinned.for_arch(Arch::Sm90a, dims).label();
        let text = err.to_string();
        assert!(
            text.contains(&twinned.label()) && text.contains(&twin),
            "{text}"
        );
        assert!(check_tile_runs_on(twinned, Arch::Sm80, dims).is_ok());

        let wgmma = twinned.for_arch(Arch::Sm90a, dims);
        assert!(check_tile_runs_on(wgmma, Arch::Sm90a, dims).is_ok());
        let text = check_tile_runs_on(wgmma, Arch::Sm80, dims)
            .expect_err("wgmma on sm_80")
            .to_string();
        assert!(text.contains("sm_90a"), "{text}");
    }

    // Another architecture's tiles: older ones anywhere, sm_90a's only on sm_90a.
    #[test]
    fn the_tiles_of_an_older_architecture_are_planned_and_wgmma_ones_only_on_hopper() {
        assert_eq!(plan_arch(None, Arch::Sm90a).ok(), Some(Arch::Sm90a));
        assert_eq!(
            plan_arch(Some(Arch::Sm80), Arch::Sm90a).ok(),
            Some(Arch::Sm80)
        );
        assert_eq!(
            plan_arch(Some(Arch::Sm89), Arch::Sm80).ok(),
            Some(Arch::Sm89)
        );
        assert_eq!(
            plan_arch(Some(Arch::Sm90a), Arch::Sm90a).ok(),
            Some(Arch::Sm90a)
        );
        let text = plan_arch(Some(Arch::Sm90a), Arch::Sm89)
            .expect_err("wgmma tiles on sm_89")
            .to_string();
        assert!(text.contains("sm_90a") && text.contains("sm_80"), "{text}");
    }
}
