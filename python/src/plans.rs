//! The ragged plans, and what they share with the paged ones (`paged_plan`): built once by
//! `plan`, run many times.
//!
//! A plan holds the validated problem. On a CUDA device it also holds attnforge's device plans
//! (kernel compiled, index arrays uploaded) for contiguous queries, keys and values, so `run` on
//! such inputs only checks its arguments and launches on the caller's stream: no allocation, no
//! synchronisation, safe inside CUDA-graph capture. Inputs with other strides get a device plan
//! of their own on first use (that first run allocates), kept for the next runs.

use crate::array::{ArrayArg, Elem};
use crate::errors::{invalid, IntoPy};
use crate::gpu;
use crate::spec::AttnSpec;
use attnforge::cuda::{self as ac, DeviceTensor, Engine, GraphCapacity, PlanOptions, SplitChoice};
use attnforge::problem::TensorView;
use attnforge::{AttentionOutput, AttentionProblem, DType};
use pyo3::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Checks that `a` has exactly `shape`.
pub fn expect_shape(a: &ArrayArg, name: &str, shape: &[usize]) -> PyResult<()> {
    a.check(name, shape.len())?;
    if a.shape() != shape {
        return Err(invalid(
            name,
            format!("has shape {:?}; expected {shape:?}", a.shape()),
        ));
    }
    Ok(())
}

/// Checks that `a` holds elements of the plan's `dtype`.
pub(crate) fn check_dtype(a: &ArrayArg, name: &str, dtype: DType) -> PyResult<()> {
    check_elem(a, name, Elem::Float(dtype))
}

/// Checks that `a` holds elements of type `elem`.
pub(crate) fn check_elem(a: &ArrayArg, name: &str, elem: Elem) -> PyResult<()> {
    if a.elem() != elem {
        return Err(invalid(
            name,
            format!("has dtype {}; the plan's is {elem}", a.elem()),
        ));
    }
    Ok(())
}

/// The `[tokens, heads, dim]` view of `a` (element strides), or a `ValueError` when its head dim
/// is not contiguous.
pub(crate) fn view(a: &ArrayArg, name: &str) -> PyResult<TensorView> {
    let s = a.strides();
    if a.shape()[2] > 1 && s[2] != 1 {
        return Err(invalid(
            name,
            format!("has stride {} along the head dim; it must be 1", s[2]),
        ));
    }
    Ok(TensorView {
        offset: 0,
        token_stride: s[0] as usize,
        head_stride: s[1] as usize,
    })
}

/// The device plans of one plan, by the strides (and storage) they were made for.
///
/// attnforge uploads a plan's arrays on the engine's own stream, and the caller's stream reads
/// them: a new plan waits for its uploads before it is used, and dropping the plans waits for
/// the device to be idle, so that no launch still in flight on the caller's stream reads freed
/// memory.
pub(crate) struct DevicePlans<K, P> {
    pub(crate) engine: Arc<Engine>,
    pub(crate) plans: Mutex<HashMap<K, Arc<P>>>,
}

impl<K: std::hash::Hash + Eq, P> DevicePlans<K, P> {
    /// The plan for `key`, made by `build` on first use.
    pub(crate) fn get(
        &self,
        key: K,
        build: impl FnOnce(&Engine) -> PyResult<P>,
    ) -> PyResult<Arc<P>> {
        let mut plans = self
            .plans
            .lock()
            .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("plan state poisoned"))?;
        if let Some(plan) = plans.get(&key) {
            return Ok(plan.clone());
        }
        let plan = Arc::new(build(&self.engine)?);
        self.engine.synchronize().py()?;
        plans.insert(key, plan.clone());
        Ok(plan)
    }
}

impl<K, P> DevicePlans<K, P> {
    /// Calls `f` on every plan made so far, with its key (graph-stable plans re-planned in
    /// place: their buffers keep their addresses).
    pub(crate) fn each_mut(&self, mut f: impl FnMut(&K, &mut P) -> PyResult<()>) -> PyResult<()> {
        let mut plans = self
            .plans
            .lock()
            .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("plan state poisoned"))?;
        for (key, plan) in plans.iter_mut() {
            let plan = Arc::get_mut(plan).ok_or_else(|| {
                pyo3::exceptions::PyRuntimeError::new_err("plan() while a run() uses the plan")
            })?;
            f(key, plan)?;
        }
        Ok(())
    }
}

impl<K, P> Drop for DevicePlans<K, P> {
    fn drop(&mut self) {
        // Best effort: a failed synchronisation is reported by the next call on the device.
        let _ = self.engine.context().synchronize();
    }
}

/// Checks `o` (and `lse`) against the problem; on the GPU they must be contiguous.
pub(crate) fn check_outputs(
    p: &AttentionProblem,
    o: &ArrayArg,
    lse: Option<&ArrayArg>,
    on_gpu: bool,
) -> PyResult<()> {
    let (qo, h) = (p.batch.total_qo(), p.num_qo_heads);
    expect_shape(o, "out", &[qo, h, p.head_dims.vo()])?;
    if o.elem() != Elem::Float(p.output_dtype) {
        return Err(invalid(
            "out",
            format!("has dtype {}; expected {}", o.elem(), p.output_dtype),
        ));
    }
    if let Some(l) = lse {
        expect_shape(l, "lse", &[qo, h])?;
        if l.elem() != Elem::Float(DType::F32) {
            return Err(invalid("lse", "must be float32"));
        }
    }
    if on_gpu {
        for (name, a) in [("out", Some(o)), ("lse", lse)] {
            if a.is_some_and(|a| !a.is_contiguous()) {
                return Err(invalid(name, "must be contiguous on a CUDA device"));
            }
        }
    }
    Ok(())
}

/// Writes a CPU result into `o` and `lse`.
pub(crate) fn write_host(
    out: &AttentionOutput,
    o: &ArrayArg,
    lse: Option<&ArrayArg>,
) -> PyResult<()> {
    o.write_host("out", &out.o)?;
    if let (Some(l), Some(values)) = (lse, &out.lse) {
        l.write_host_f32("lse", values)?;
    }
    Ok(())
}

/// The device outputs, borrowed.
pub(crate) fn gpu_outputs(
    stream: &Arc<cudarc::driver::CudaStream>,
    p: &AttentionProblem,
    o: &ArrayArg,
    lse: Option<&ArrayArg>,
) -> PyResult<(DeviceTensor, Option<DeviceTensor>)> {
    let o = gpu::borrow(stream, o, "out", p.output_dtype)?;
    let lse = lse
        .map(|l| gpu::borrow(stream, l, "lse", DType::F32))
        .transpose()?;
    Ok((o, lse))
}

type Views = [usize; 6];

fn views_key(q: &TensorView, k: &TensorView, v: &TensorView) -> Views {
    [
        q.token_stride,
        q.head_stride,
        k.token_stride,
        k.head_stride,
        v.token_stride,
        v.head_stride,
    ]
}

/// A ragged prefill plan (`BatchPrefillWithRaggedKVCacheWrapper`, single prefill).
#[pyclass(module = "attnforge._native")]
pub struct RaggedPlan {
    problem: AttentionProblem,
    device: Option<DevicePlans<Views, ac::PrefillPlan>>,
    /// `use_cuda_graph`: the capacity the device plans are graph-stable for.
    graph: Option<GraphCapacity>,
}

/// The device plan of `problem`: graph-stable for `graph` (unsplit: a ragged batch's key count
/// is not bounded by the caller's buffers), or not.
fn ragged_plan(
    engine: &Engine,
    problem: &AttentionProblem,
    graph: Option<GraphCapacity>,
) -> PyResult<ac::PrefillPlan> {
    match graph {
        Some(capacity) => {
            let options = PlanOptions {
                split: SplitChoice::Unsplit,
                ..PlanOptions::default()
            };
            ac::PrefillPlan::graph_stable(engine, problem, options, capacity)
        }
        None => ac::PrefillPlan::new(engine, problem),
    }
    .py()
}

#[pymethods]
impl RaggedPlan {
    /// Plans the problem on `device` (a CUDA ordinal, or -1 for the CPU backend). On a GPU the
    /// device plan for contiguous inputs is made now, unless `lazy` (a plan run once, on inputs
    /// whose strides it does not know yet: the first `run` makes the plan it needs). With
    /// `graph` (`max_batch, max_qo_tokens`), the device plans are graph-stable
    /// (`use_cuda_graph`): `replan` writes later batches within that capacity into their buffers.
    #[new]
    #[pyo3(signature = (qo_indptr, kv_indptr, spec, device, lazy = false, graph = None))]
    fn new(
        qo_indptr: Vec<i32>,
        kv_indptr: Vec<i32>,
        spec: AttnSpec,
        device: i64,
        lazy: bool,
        graph: Option<(usize, usize)>,
    ) -> PyResult<Self> {
        let problem = spec.ragged_problem(qo_indptr, kv_indptr)?;
        let graph = graph.map(|(max_batch, max_qo_tokens)| GraphCapacity {
            max_batch,
            max_qo_tokens,
            max_qo_len: max_qo_tokens,
            max_kv_tokens: i32::MAX as usize,
        });
        let device = match usize::try_from(device) {
            Err(_) => None,
            Ok(ordinal) => {
                let device = DevicePlans {
                    engine: gpu::engine(ordinal)?,
                    plans: Mutex::new(HashMap::new()),
                };
                if !lazy {
                    let key = views_key(&problem.q_view, &problem.k_view, &problem.v_view);
                    device.get(key, |e| ragged_plan(e, &problem, graph))?;
                }
                Some(device)
            }
        };
        Ok(RaggedPlan {
            problem,
            device,
            graph,
        })
    }

    /// Re-plans a graph-stable plan (made with `graph`) for a new batch with the same heads, head
    /// dims, dtypes and options: checked against the capacity, then written into the device
    /// plans' buffers on `stream` (no allocation), so that a graph captured around an earlier
    /// `run` replays this batch.
    fn replan(
        &mut self,
        qo_indptr: Vec<i32>,
        kv_indptr: Vec<i32>,
        spec: AttnSpec,
        stream: u64,
    ) -> PyResult<()> {
        let Some(capacity) = self.graph else {
            return Err(invalid(
                "use_cuda_graph",
                "replan() needs a plan made for CUDA graphs",
            ));
        };
        let problem = spec.ragged_problem(qo_indptr, kv_indptr)?;
        capacity.check(&problem.batch).py()?;
        ac::check_replan(&self.problem, &problem).py()?;
        if let Some(device) = &self.device {
            let stream = gpu::stream(&device.engine, stream);
            device.each_mut(|&[qt, qh, kt, kh, vt, vh], plan| {
                let mut p = problem.clone();
                let strided = |token_stride, head_stride| TensorView {
                    offset: 0,
                    token_stride,
                    head_stride,
                };
                (p.q_view, p.k_view, p.v_view) =
                    (strided(qt, qh), strided(kt, kh), strided(vt, vh));
                plan.replan(&stream, &p).py()
            })?;
        }
        self.problem = problem;
        Ok(())
    }

    /// Runs on `q [total_qo, Hq, Dqk]`, `k [total_kv, Hkv, Dqk]`, `v [total_kv, Hkv, Dvo]` into
    /// `o` and, if given, `lse` (natural log); `stream` is the CUDA stream for device arrays.
    /// The arrays are numpy arrays or torch tensors.
    #[pyo3(signature = (q, k, v, o, lse, stream))]
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        py: Python<'_>,
        q: &Bound<'_, PyAny>,
        k: &Bound<'_, PyAny>,
        v: &Bound<'_, PyAny>,
        o: &Bound<'_, PyAny>,
        lse: Option<&Bound<'_, PyAny>>,
        stream: u64,
    ) -> PyResult<()> {
        let (q, k, v) = (
            ArrayArg::read(q, "q")?,
            ArrayArg::read(k, "k")?,
            ArrayArg::read(v, "v")?,
        );
        let o = ArrayArg::read_out(o, "out")?;
        let lse = lse.map(|l| ArrayArg::read_out(l, "lse")).transpose()?;
        let p = &self.problem;
        let (qo, kv) = (p.batch.total_qo(), p.batch.total_kv());
        let (dqk, dvo) = (p.head_dims.qk(), p.head_dims.vo());
        expect_shape(&q, "q", &[qo, p.num_qo_heads, dqk])?;
        expect_shape(&k, "k", &[kv, p.num_kv_heads, dqk])?;
        expect_shape(&v, "v", &[kv, p.num_kv_heads, dvo])?;
        for (name, a) in [("q", &q), ("k", &k), ("v", &v)] {
            check_dtype(a, name, p.input_dtype)?;
        }
        let mut arrays = vec![("q", &q), ("k", &k), ("v", &v), ("out", &o)];
        arrays.extend(lse.as_ref().map(|l| ("lse", l)));
        let on = gpu::common_device(&arrays)?;
        check_outputs(p, &o, lse.as_ref(), on.is_some())?;
        match (&self.device, on) {
            // The CPU backend runs without the GIL (the arrays stay referenced by the caller).
            (None, None) => py.detach(|| {
                let mut p = p.clone();
                p.return_lse = lse.is_some();
                let out = attnforge::cpu::attention(
                    &p,
                    &q.read_host("q")?,
                    &k.read_host("k")?,
                    &v.read_host("v")?,
                )
                .py()?;
                write_host(&out, &o, lse.as_ref())
            }),
            (Some(device), Some(ordinal)) if device.engine.info().ordinal == ordinal => {
                let (qv, kv_, vv) = (view(&q, "q")?, view(&k, "k")?, view(&v, "v")?);
                let plan = device.get(views_key(&qv, &kv_, &vv), |e| {
                    let mut vp = p.clone();
                    (vp.q_view, vp.k_view, vp.v_view) = (qv, kv_, vv);
                    ragged_plan(e, &vp, self.graph)
                })?;
                let stream = gpu::stream(&device.engine, stream);
                let dt = p.input_dtype;
                let (qd, kd, vd) = (
                    gpu::borrow(&stream, &q, "q", dt)?,
                    gpu::borrow(&stream, &k, "k", dt)?,
                    gpu::borrow(&stream, &v, "v", dt)?,
                );
                let (mut od, mut ld) = gpu_outputs(&stream, p, &o, lse.as_ref())?;
                plan.run_on(&stream, &qd, &kd, &vd, &mut od, ld.as_mut())
                    .py()
            }
            (planned, given) => Err(device_mismatch(planned.as_ref().map(|d| &d.engine), given)),
        }
    }
}

pub(crate) fn device_mismatch(planned: Option<&Arc<Engine>>, given: Option<usize>) -> PyErr {
    let planned = planned.map_or("cpu".into(), |e| format!("cuda:{}", e.info().ordinal));
    let given = given.map_or("cpu".into(), |o| format!("cuda:{o}"));
    invalid(
        "q",
        format!("is on {given} but the plan was made for {planned}"),
    )
}
