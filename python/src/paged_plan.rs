//! The paged plans (`BatchPrefillWithPagedKVCacheWrapper`, `BatchDecodeWithPagedKVCacheWrapper`),
//! over caches of the problem's dtype or of fp8 codes; graph-stable with `use_cuda_graph`
//! (`replan` writes each later batch into the device plans' buffers).

use crate::array::{ArrayArg, Elem};
use crate::cache;
use crate::errors::{invalid, IntoPy};
use crate::gpu;
use crate::plans::{
    check_dtype, check_elem, check_outputs, device_mismatch, expect_shape, gpu_outputs, view,
    write_host, DevicePlans,
};
use crate::spec::AttnSpec;
use attnforge::cuda::{
    self as ac, DeviceFp8Kv, DevicePagedKv, Engine, PagedGraphCapacity, PlanOptions, SplitChoice,
};
use attnforge::dtype::fp8::Fp8Format;
use attnforge::paged::{Fp8Kv, KvScales, KvStorage, PageTable, PagedAttention, PagedKvLayout};
use attnforge::problem::TensorView;
use attnforge::AttentionProblem;
use pyo3::prelude::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

type PagedKey = (KvStorage, usize, usize);

/// A paged plan (`BatchPrefillWithPagedKVCacheWrapper`, `BatchDecodeWithPagedKVCacheWrapper`),
/// over a cache of the problem's dtype or of fp8 codes (`kv_fp8`).
#[pyclass(module = "attnforge._native")]
pub struct PagedPlan {
    problem: AttentionProblem,
    table: PageTable,
    /// The layout planned for, with the smallest page count the table allows.
    layout: PagedKvLayout,
    /// The cache's fp8 format, `None` for pages of the problem's dtype.
    kv_fp8: Option<Fp8Format>,
    device: Option<DevicePlans<PagedKey, ac::PagedPlan>>,
    /// `use_cuda_graph`: the capacity the device plans are graph-stable for.
    graph: Option<PagedGraphCapacity>,
    /// How the device plans cut each request's KV range (`unsplit`, `chunk_keys`).
    split: SplitChoice,
    /// Graph-stable plans on a GPU: the pages of the cache the last run read (0 before the
    /// first), which bounds the page ids of a re-plan (a replayed graph reads that cache).
    cache_pages: AtomicUsize,
}

/// The fp8 format named by a plan's `kv_fp8` (`e4m3`, `e5m2`, or PyTorch's spellings).
fn fp8_format(kv_fp8: Option<&str>) -> PyResult<Option<Fp8Format>> {
    kv_fp8
        .map(|name| {
            Fp8Format::parse(name).ok_or_else(|| {
                invalid(
                    "kv_data_type",
                    format!("{name:?} is not an fp8 format (e4m3, e5m2)"),
                )
            })
        })
        .transpose()
}

/// The scales of an fp8 run: `k_scale` and `v_scale` (1 entry each, or one per KV head), 1.0
/// where not given.
fn run_scales(k_scale: Option<Vec<f32>>, v_scale: Option<Vec<f32>>) -> KvScales {
    KvScales {
        k: k_scale.unwrap_or_else(|| vec![1.0]),
        v: v_scale.unwrap_or_else(|| vec![1.0]),
    }
}

/// A page table and the problem over it, as `PagedPlan::new` and `replan` read them.
struct PagedParts {
    problem: AttentionProblem,
    table: PageTable,
    layout: PagedKvLayout,
}

impl PagedParts {
    #[allow(clippy::too_many_arguments)]
    fn new(
        qo_indptr: Vec<i32>,
        kv_page_indptr: Vec<i32>,
        kv_page_indices: Vec<i32>,
        kv_last_page_len: Vec<i32>,
        page_size: usize,
        kv_layout: &str,
        spec: &AttnSpec,
    ) -> PyResult<PagedParts> {
        let table = PageTable {
            kv_page_indptr,
            kv_page_indices,
            kv_last_page_len,
        };
        let num_pages = table
            .kv_page_indices
            .iter()
            .map(|&i| i.max(0) as usize + 1)
            .max()
            .unwrap_or(1);
        let layout = PagedKvLayout {
            num_pages,
            page_size,
            num_kv_heads: spec.num_kv_heads,
            head_dims: spec.head_dims()?,
            order: cache::order(kv_layout)?,
            storage: KvStorage::Separate,
            dtype: spec.dtype()?,
        };
        let p = PagedAttention::problem_for(qo_indptr, spec.num_qo_heads, &layout, &table).py()?;
        Ok(PagedParts {
            problem: spec.apply(p)?,
            table,
            layout,
        })
    }
}

/// The device plan of `paged` over a cache of `kv_fp8` codes (or none), its KV range cut as
/// `split` says: graph-stable for `graph`, or not.
fn device_plan(
    engine: &Engine,
    paged: &PagedAttention,
    kv_fp8: Option<Fp8Format>,
    graph: Option<PagedGraphCapacity>,
    split: SplitChoice,
) -> PyResult<ac::PagedPlan> {
    let options = PlanOptions {
        split,
        ..PlanOptions::default()
    };
    match graph {
        Some(capacity) => ac::PagedPlan::graph_stable(engine, paged, kv_fp8, options, capacity),
        None => ac::PagedPlan::with_kv_fp8(engine, paged, kv_fp8, options),
    }
    .py()
}

impl PagedPlan {
    /// The paged problem over a cache laid out as `layout`.
    fn paged(
        &self,
        layout: PagedKvLayout,
        q_view: TensorView,
        return_lse: bool,
    ) -> PyResult<PagedAttention> {
        let mut p = self.problem.clone();
        p.q_view = q_view;
        p.return_lse = return_lse;
        PagedAttention::new(p, layout, self.table.clone()).py()
    }
}

#[pymethods]
impl PagedPlan {
    /// Plans queries `qo_indptr` over the pages of the table, `page_size` tokens each, laid out
    /// as `kv_layout`, on `device` (a CUDA ordinal, or -1 for the CPU backend); `kv_fp8` names
    /// the fp8 format of the cache's codes (`e4m3`, `e5m2`), or is `None` for pages of the
    /// problem's dtype.
    /// With `graph` (`max_batch, max_qo_tokens, max_qo_len, max_pages`), the device plans are
    /// graph-stable (`use_cuda_graph`): `replan` writes later batches within that capacity into
    /// their buffers, so that a graph captured around `run` replays them.
    /// The planner chooses how to split each request's KV range across CTAs, unless `unsplit`
    /// (never split) or `chunk_keys` (chunks of that many keys, a positive multiple of the
    /// kernel's KV tile; 64 is one for every kernel that splits) says otherwise.
    #[new]
    #[pyo3(signature = (
        qo_indptr, kv_page_indptr, kv_page_indices, kv_last_page_len, page_size, kv_layout, spec,
        device, kv_fp8 = None, graph = None, unsplit = false, chunk_keys = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        qo_indptr: Vec<i32>,
        kv_page_indptr: Vec<i32>,
        kv_page_indices: Vec<i32>,
        kv_last_page_len: Vec<i32>,
        page_size: usize,
        kv_layout: &str,
        spec: AttnSpec,
        device: i64,
        kv_fp8: Option<&str>,
        graph: Option<(usize, usize, usize, usize)>,
        unsplit: bool,
        chunk_keys: Option<usize>,
    ) -> PyResult<Self> {
        let kv_fp8 = fp8_format(kv_fp8)?;
        let split = match (unsplit, chunk_keys) {
            (false, None) => SplitChoice::Planned,
            (true, None) => SplitChoice::Unsplit,
            (false, Some(keys)) => SplitChoice::ChunkKeys(keys),
            (true, Some(_)) => {
                return Err(invalid(
                    "chunk_keys",
                    "give unsplit or chunk_keys, not both",
                ))
            }
        };
        let PagedParts {
            problem,
            table,
            layout,
        } = PagedParts::new(
            qo_indptr,
            kv_page_indptr,
            kv_page_indices,
            kv_last_page_len,
            page_size,
            kv_layout,
            &spec,
        )?;
        let graph =
            graph.map(
                |(max_batch, max_qo_tokens, max_qo_len, max_pages)| PagedGraphCapacity {
                    max_batch,
                    max_qo_tokens,
                    max_qo_len,
                    max_pages,
                },
            );
        let mut plan = PagedPlan {
            layout,
            problem,
            table,
            kv_fp8,
            device: None,
            graph,
            split,
            cache_pages: AtomicUsize::new(0),
        };
        let contiguous = plan.problem.q_view;
        plan.paged(layout, contiguous, true)?;
        if let Ok(ordinal) = usize::try_from(device) {
            let device = DevicePlans {
                engine: gpu::engine(ordinal)?,
                plans: Mutex::new(HashMap::new()),
            };
            let mut storages = vec![KvStorage::Separate];
            if layout.head_dims.qk() == layout.head_dims.vo() {
                storages.push(KvStorage::Combined);
            }
            for storage in storages {
                let paged = plan.paged(PagedKvLayout { storage, ..layout }, contiguous, true)?;
                let key = (storage, contiguous.token_stride, contiguous.head_stride);
                device.get(key, |e| device_plan(e, &paged, kv_fp8, graph, split))?;
            }
            plan.device = Some(device);
        }
        Ok(plan)
    }

    /// Re-plans a graph-stable plan (made with `graph`) for a new batch over the same cache
    /// layout, heads, head dims, dtypes and options: checked against the capacity, then written
    /// into the device plans' buffers on `stream` (no allocation), so that a graph captured
    /// around an earlier `run` replays this batch.
    #[pyo3(signature = (
        qo_indptr, kv_page_indptr, kv_page_indices, kv_last_page_len, page_size, kv_layout, spec,
        stream, kv_fp8 = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn replan(
        &mut self,
        qo_indptr: Vec<i32>,
        kv_page_indptr: Vec<i32>,
        kv_page_indices: Vec<i32>,
        kv_last_page_len: Vec<i32>,
        page_size: usize,
        kv_layout: &str,
        spec: AttnSpec,
        stream: u64,
        kv_fp8: Option<&str>,
    ) -> PyResult<()> {
        let Some(capacity) = self.graph else {
            return Err(invalid(
                "use_cuda_graph",
                "replan() needs a plan made for CUDA graphs",
            ));
        };
        if fp8_format(kv_fp8)? != self.kv_fp8 {
            return Err(invalid(
                "kv_data_type",
                "differs from the first plan's; a CUDA-graph wrapper keeps its dtypes",
            ));
        }
        let parts = PagedParts::new(
            qo_indptr,
            kv_page_indptr,
            kv_page_indices,
            kv_last_page_len,
            page_size,
            kv_layout,
            &spec,
        )?;
        let fixed = PagedKvLayout {
            num_pages: self.layout.num_pages,
            ..parts.layout
        };
        if fixed != self.layout {
            return Err(invalid(
                "page_size",
                "the cache layout (page size, KV heads, head dims, dtype, kv_layout) differs from \
                 the first plan's; a CUDA-graph wrapper keeps it",
            ));
        }
        attnforge::cuda::GraphCapacity {
            max_batch: capacity.max_batch,
            max_qo_tokens: capacity.max_qo_tokens,
            max_qo_len: capacity.max_qo_len,
            max_kv_tokens: capacity.max_pages * page_size,
        }
        .check(&parts.problem.batch)
        .py()?;
        ac::check_replan(&self.problem, &parts.problem).py()?;
        if parts.table.kv_page_indices.len() > capacity.max_pages {
            return Err(invalid(
                "paged_kv_indices",
                format!(
                    "has {} page ids; the buffer holds {}",
                    parts.table.kv_page_indices.len(),
                    capacity.max_pages
                ),
            ));
        }
        let captured = *self.cache_pages.get_mut();
        if captured > 0 && parts.layout.num_pages > captured {
            return Err(invalid(
                "paged_kv_indices",
                format!(
                    "uses page id {}; the cache the plan last ran on has {captured} pages",
                    parts.layout.num_pages - 1
                ),
            ));
        }
        let old = std::mem::replace(
            self,
            PagedPlan {
                problem: parts.problem,
                table: parts.table,
                layout: parts.layout,
                kv_fp8: self.kv_fp8,
                device: None,
                graph: self.graph,
                split: self.split,
                cache_pages: AtomicUsize::new(captured),
            },
        );
        let result = match &old.device {
            None => Ok(()),
            Some(device) => {
                let stream = gpu::stream(&device.engine, stream);
                device.each_mut(|&(storage, token_stride, head_stride), plan| {
                    let view = TensorView {
                        offset: 0,
                        token_stride,
                        head_stride,
                    };
                    let paged = self.paged(
                        PagedKvLayout {
                            storage,
                            ..self.layout
                        },
                        view,
                        true,
                    )?;
                    plan.replan(&stream, &paged).py()
                })
            }
        };
        match result {
            Ok(()) => {
                self.device = old.device;
                Ok(())
            }
            Err(e) => {
                *self = old;
                Err(e)
            }
        }
    }

    /// Runs on `q [total_qo, Hq, Dqk]` over `cache` (one combined array, or a (K, V) pair) into
    /// `o` and, if given, `lse` (natural log); `stream` is the CUDA stream for device arrays.
    /// The arrays are numpy arrays or torch tensors. An fp8 plan's cache holds codes of its
    /// format (numpy: `uint8`), dequantised with `k_scale` and `v_scale` (one entry, or one per KV
    /// head; 1.0 when not given); a plain plan takes no scales.
    #[pyo3(signature = (q, cache, o, lse, stream, k_scale = None, v_scale = None))]
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        py: Python<'_>,
        q: &Bound<'_, PyAny>,
        cache: &Bound<'_, PyAny>,
        o: &Bound<'_, PyAny>,
        lse: Option<&Bound<'_, PyAny>>,
        stream: u64,
        k_scale: Option<Vec<f32>>,
        v_scale: Option<Vec<f32>>,
    ) -> PyResult<()> {
        let q = ArrayArg::read(q, "q")?;
        let cache = cache::arrays(cache, self.kv_fp8)?;
        let scales =
            match self.kv_fp8 {
                Some(_) => Some(run_scales(k_scale, v_scale)),
                None if k_scale.is_some() || v_scale.is_some() => return Err(invalid(
                    "k_scale",
                    "scales dequantise an fp8 cache; the plan is for a cache of the query's dtype",
                )),
                None => None,
            };
        let o = ArrayArg::read_out(o, "out")?;
        let lse = lse.map(|l| ArrayArg::read_out(l, "lse")).transpose()?;
        let p = &self.problem;
        expect_shape(
            &q,
            "q",
            &[p.batch.total_qo(), p.num_qo_heads, p.head_dims.qk()],
        )?;
        check_dtype(&q, "q", p.input_dtype)?;
        let order = match self.layout.order {
            attnforge::paged::KvOrder::Nhd => "NHD",
            attnforge::paged::KvOrder::Hnd => "HND",
        };
        let layout = cache::layout(&cache, order, p.input_dtype)?;
        let elem = self.kv_fp8.map_or(Elem::Float(p.input_dtype), Elem::Fp8);
        check_elem(&cache[0], "paged_kv_cache", elem)?;
        for (what, planned, given) in [
            ("page_size", self.layout.page_size, layout.page_size),
            (
                "num_kv_heads",
                self.layout.num_kv_heads,
                layout.num_kv_heads,
            ),
            (
                "head_dim_qk",
                self.layout.head_dims.qk(),
                layout.head_dims.qk(),
            ),
            (
                "head_dim_vo",
                self.layout.head_dims.vo(),
                layout.head_dims.vo(),
            ),
        ] {
            if planned != given {
                return Err(invalid(
                    "paged_kv_cache",
                    format!("has {what} {given}; the plan's is {planned}"),
                ));
            }
        }
        let mut arrays = vec![("q", &q), ("out", &o)];
        arrays.extend(cache.iter().map(|a| ("paged_kv_cache", a)));
        arrays.extend(lse.as_ref().map(|l| ("lse", l)));
        let on = gpu::common_device(&arrays)?;
        check_outputs(p, &o, lse.as_ref(), on.is_some())?;
        match (&self.device, on) {
            (None, None) => {
                let paged = self.paged(layout, p.q_view, lse.is_some())?;
                py.detach(|| {
                    let q = q.read_host("q")?;
                    let out = match &scales {
                        Some(scales) => {
                            let codes = cache::read_host_codes(&cache)?;
                            let pages = cache::host_view(&codes);
                            attnforge::cpu::paged_attention(&paged, &q, Fp8Kv { pages, scales })
                        }
                        None => {
                            let buffers = cache::read_host(&cache)?;
                            attnforge::cpu::paged_attention(&paged, &q, cache::host_view(&buffers))
                        }
                    }
                    .py()?;
                    write_host(&out, &o, lse.as_ref())
                })
            }
            (Some(device), Some(ordinal)) if device.engine.info().ordinal == ordinal => {
                for (i, a) in cache.iter().enumerate() {
                    if !a.is_contiguous() {
                        return Err(invalid(
                            &format!("paged_kv_cache[{i}]"),
                            "must be contiguous on a CUDA device (or the two halves of one combined cache)",
                        ));
                    }
                }
                if layout.num_pages < self.layout.num_pages {
                    return Err(invalid(
                        "paged_kv_cache",
                        format!(
                            "has {} pages; the page table uses page ids up to {}",
                            layout.num_pages,
                            self.layout.num_pages - 1
                        ),
                    ));
                }
                let qv = view(&q, "q")?;
                let storage = layout.storage;
                let plan = device.get((storage, qv.token_stride, qv.head_stride), |e| {
                    let planned = PagedKvLayout {
                        storage,
                        ..self.layout
                    };
                    let paged = self.paged(planned, qv, true)?;
                    device_plan(e, &paged, self.kv_fp8, self.graph, self.split)
                })?;
                self.cache_pages.store(layout.num_pages, Ordering::Relaxed);
                let stream = gpu::stream(&device.engine, stream);
                let dt = p.input_dtype;
                let qd = gpu::borrow(&stream, &q, "q", dt)?;
                let (mut od, mut ld) = gpu_outputs(&stream, p, &o, lse.as_ref())?;
                if let (Some(scales), Some(format)) = (&scales, self.kv_fp8) {
                    let scales = gpu::kv_scales(&device.engine, &layout, format, scales)?;
                    let bufs = cache
                        .iter()
                        .map(|a| gpu::borrow_codes(&stream, a, "paged_kv_cache"))
                        .collect::<PyResult<Vec<_>>>()?;
                    let kv = DeviceFp8Kv {
                        pages: device_pages(&bufs)?,
                        scales: &scales,
                    };
                    return plan.run_fp8_on(&stream, &qd, kv, &mut od, ld.as_mut()).py();
                }
                let bufs = cache
                    .iter()
                    .map(|a| gpu::borrow(&stream, a, "paged_kv_cache", dt))
                    .collect::<PyResult<Vec<_>>>()?;
                plan.run_on(&stream, &qd, device_pages(&bufs)?, &mut od, ld.as_mut())
                    .py()
            }
            (planned, given) => Err(device_mismatch(planned.as_ref().map(|d| &d.engine), given)),
        }
    }
}

/// The device cache over one (combined) or two (separate) borrowed buffers.
fn device_pages<B>(bufs: &[B]) -> PyResult<DevicePagedKv<'_, B>> {
    match bufs {
        [kv] => Ok(DevicePagedKv::Combined(kv)),
        [k, v] => Ok(DevicePagedKv::Separate { k, v }),
        _ => Err(invalid("paged_kv_cache", "expected one or two arrays")),
    }
}
