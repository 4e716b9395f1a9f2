//! Prefill on the GPU: plan once per batch shape, run many times.
//!
//! [`PrefillPlan::new`] validates the problem, picks the tile, renders and loads the kernel,
//! builds the work list and uploads everything that depends only on the problem (index pointers,
//! work items, the custom mask, the variant's arrays). [`PrefillPlan::run`] then only checks the
//! buffers, fills the parameter block and launches on the engine's stream: no allocation, no
//! synchronisation. The plan owns the problem, so a variant or mask parameter can never be lost
//! between planning and running. [`PrefillPlan::graph_stable`] makes a plan that
//! [`PrefillPlan::replan`] rewrites in place for each later batch within a capacity, so that a
//! CUDA graph captured once around [`PrefillPlan::run_on`] replays them all (`plan`'s graph
//! module).

use super::buffers::DeviceTensor;
use super::engine::Engine;
use super::error::CudaError;
use super::plan::{GraphCapacity, KernelPlan, KvAddress, PlanOptions, QoAddress, ROW_ALIGNMENT};
use super::schedule::KvSplit;
use crate::codegen::{KernelSpec, KvCache};
use crate::dtype::DType;
use crate::problem::AttentionProblem;
use crate::tensor::HostTensor;
use crate::{AttentionOutput, Error};
use cudarc::driver::CudaStream;
use std::sync::Arc;

/// A prefill problem prepared for one engine.
pub struct PrefillPlan {
    plan: KernelPlan,
}

/// Rejects a view whose rows are not 16-byte aligned (the kernels' copies would fault).
pub(crate) fn check_view_alignment(
    name: &str,
    view: &crate::problem::TensorView,
) -> Result<(), Error> {
    for (what, value) in [
        ("offset", view.offset),
        ("token stride", view.token_stride),
        ("head stride", view.head_stride),
    ] {
        if value % ROW_ALIGNMENT != 0 {
            return Err(Error::Unsupported {
                backend: "cuda",
                what: format!("{name} view {what} {value}"),
                supported: format!(
                    "offsets and strides that are multiples of {ROW_ALIGNMENT} elements (16 bytes)"
                ),
            });
        }
    }
    Ok(())
}

/// A ragged problem's own checks, then the 16-byte alignment of its Q, K and V views.
fn check_ragged_problem(problem: &AttentionProblem) -> Result<(), Error> {
    problem.validate()?;
    for (name, view) in [
        ("q", &problem.q_view),
        ("k", &problem.k_view),
        ("v", &problem.v_view),
    ] {
        check_view_alignment(name, view)?;
    }
    Ok(())
}

/// Checks that a buffer has the plan's dtype and at least `min_len` elements.
pub(crate) fn check_buffer(
    name: &'static str,
    t: &DeviceTensor,
    dtype: DType,
    min_len: usize,
) -> Result<(), CudaError> {
    if t.dtype() != dtype {
        return Err(CudaError::Buffer {
            name,
            reason: format!("has dtype {}, the plan needs {dtype}", t.dtype()),
        });
    }
    if t.len() < min_len {
        return Err(CudaError::Buffer {
            name,
            reason: format!(
                "has {} elements, the plan needs at least {min_len}",
                t.len()
            ),
        });
    }
    Ok(())
}

/// Elements a view of `tokens` x `heads` x `dim` reaches (0 when it has no token).
pub(crate) fn view_extent(
    view: &crate::problem::TensorView,
    tokens: usize,
    heads: usize,
    dim: usize,
) -> usize {
    if tokens == 0 {
        0
    } else {
        view.index(tokens - 1, heads - 1, dim)
    }
}

/// Checks q, o and lse against the problem and returns their addresses.
pub(crate) fn qo_address(
    p: &AttentionProblem,
    stream: &Arc<CudaStream>,
    q: &DeviceTensor,
    o: &DeviceTensor,
    lse: Option<&DeviceTensor>,
) -> Result<QoAddress, Error> {
    let qo = p.batch.total_qo();
    check_buffer(
        "q",
        q,
        p.input_dtype,
        view_extent(&p.q_view, qo, p.num_qo_heads, p.head_dims.qk()),
    )?;
    check_buffer("o", o, p.output_dtype, p.output_len())?;
    if let Some(l) = lse {
        check_buffer("lse", l, DType::F32, qo * p.num_qo_heads)?;
    }
    Ok(QoAddress {
        q: q.device_address(stream),
        o: o.device_address(stream),
        lse: lse.map_or(0, |l| l.device_address(stream)),
    })
}

impl PrefillPlan {
    /// Plans `problem` on `engine`: validation, kernel choice, compilation, uploads.
    pub fn new(engine: &Engine, problem: &AttentionProblem) -> Result<PrefillPlan, Error> {
        PrefillPlan::with_options(engine, problem, PlanOptions::default())
    }

    /// [`new`](Self::new) with the planner's choices (tile, KV split) replaced where `options`
    /// say.
    pub fn with_options(
        engine: &Engine,
        problem: &AttentionProblem,
        options: PlanOptions,
    ) -> Result<PrefillPlan, Error> {
        check_ragged_problem(problem)?;
        Ok(PrefillPlan {
            plan: KernelPlan::new(engine, problem, KvCache::Ragged, options)?,
        })
    }

    /// [`with_options`](Self::with_options), graph-stable for every later batch within
    /// `capacity` ([`replan`](Self::replan)). K and V are read without tensor maps (a map holds
    /// the key count); custom masks and the warp-specialised tile are refused.
    pub fn graph_stable(
        engine: &Engine,
        problem: &AttentionProblem,
        options: PlanOptions,
        capacity: GraphCapacity,
    ) -> Result<PrefillPlan, Error> {
        check_ragged_problem(problem)?;
        Ok(PrefillPlan {
            plan: KernelPlan::graph_stable(
                engine,
                problem,
                KvCache::Ragged,
                None,
                options,
                capacity,
            )?,
        })
    }

    /// Re-plans a graph-stable plan for `problem`: any batch within the capacity, everything
    /// else as planned ([`super::check_replan`]). Writes the new work list and index pointers
    /// into the plan's buffers on `stream` (no allocation); a graph captured around an earlier
    /// run and replayed on `stream` afterwards runs this batch.
    pub fn replan(
        &mut self,
        stream: &Arc<CudaStream>,
        problem: &AttentionProblem,
    ) -> Result<(), Error> {
        problem.validate()?;
        self.plan.replan(stream, problem)
    }

    /// The kernel this plan runs.
    pub fn spec(&self) -> &KernelSpec {
        &self.plan.spec
    }

    /// The planned problem.
    pub fn problem(&self) -> &AttentionProblem {
        &self.plan.problem
    }

    /// CTAs per launch of the prefill kernel.
    pub fn num_ctas(&self) -> u32 {
        self.plan.num_work
    }

    /// How the KV range is split across CTAs, if it is.
    pub fn kv_split(&self) -> Option<KvSplit> {
        self.plan.split
    }

    /// [`run_on`](Self::run_on) the engine's stream.
    pub fn run(
        &self,
        engine: &Engine,
        q: &DeviceTensor,
        k: &DeviceTensor,
        v: &DeviceTensor,
        o: &mut DeviceTensor,
        lse: Option<&mut DeviceTensor>,
    ) -> Result<(), Error> {
        self.run_on(engine.stream(), q, k, v, o, lse)
    }

    /// Launches on `stream` (a stream of the engine's context; the caller orders it against
    /// the writes of q, k, v and the reads of o). `o` is contiguous `[total_qo, num_qo_heads,
    /// head_dim_vo]` in the output dtype; `lse`, if given, `[total_qo, num_qo_heads]` f32. No
    /// allocation, no synchronisation: safe to capture in a CUDA graph.
    pub fn run_on(
        &self,
        stream: &Arc<CudaStream>,
        q: &DeviceTensor,
        k: &DeviceTensor,
        v: &DeviceTensor,
        o: &mut DeviceTensor,
        lse: Option<&mut DeviceTensor>,
    ) -> Result<(), Error> {
        let p = &self.plan.problem;
        let kv = p.batch.total_kv();
        let (dqk, dvo) = (p.head_dims.qk(), p.head_dims.vo());
        check_buffer(
            "k",
            k,
            p.input_dtype,
            view_extent(&p.k_view, kv, p.num_kv_heads, dqk),
        )?;
        check_buffer(
            "v",
            v,
            p.input_dtype,
            view_extent(&p.v_view, kv, p.num_kv_heads, dvo),
        )?;
        let qo = qo_address(p, stream, q, o, lse.as_deref())?;
        let elem = p.input_dtype.size_bytes() as u64;
        let address = KvAddress {
            k: k.device_address(stream) + p.k_view.offset as u64 * elem,
            v: v.device_address(stream) + p.v_view.offset as u64 * elem,
            k_stride_token: p.k_view.token_stride as i64,
            k_stride_head: p.k_view.head_stride as i64,
            v_stride_token: p.v_view.token_stride as i64,
            v_stride_head: p.v_view.head_stride as i64,
            pages: None,
            scales: None,
        };
        self.plan.launch(stream, qo, address)
    }
}

impl Engine {
    /// Plans and runs `problem` on host tensors: uploads, poisons the outputs with NaN (so an
    /// unwritten element shows), launches, synchronises and downloads.
    pub fn prefill_host(
        &self,
        problem: &AttentionProblem,
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
    ) -> Result<AttentionOutput, Error> {
        self.prefill_host_with_options(problem, q, k, v, PlanOptions::default())
    }

    /// [`prefill_host`](Self::prefill_host) with the planner's choices replaced where `options`
    /// say.
    pub fn prefill_host_with_options(
        &self,
        problem: &AttentionProblem,
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
        options: PlanOptions,
    ) -> Result<AttentionOutput, Error> {
        problem.validate_inputs(q, k, v)?;
        let plan = PrefillPlan::with_options(self, problem, options)?;
        let (qd, kd, vd) = (self.upload(q)?, self.upload(k)?, self.upload(v)?);
        self.run_poisoned(problem, &plan.spec().name(), |o, lse| {
            plan.run(self, &qd, &kd, &vd, o, lse)
        })
    }

    /// Allocates O (and the LSE when the problem returns it) filled with NaN, calls `launch`
    /// with them, synchronises (a kernel fault is reported as a launch failure of `kernel`) and
    /// downloads the outputs.
    pub(crate) fn run_poisoned(
        &self,
        problem: &AttentionProblem,
        kernel: &str,
        launch: impl FnOnce(&mut DeviceTensor, Option<&mut DeviceTensor>) -> Result<(), Error>,
    ) -> Result<AttentionOutput, Error> {
        let stream = self.stream();
        let mut o = DeviceTensor::nan(stream, problem.output_dtype, problem.output_len().max(1))?;
        let lse_len = problem.batch.total_qo() * problem.num_qo_heads;
        let mut lse = if problem.return_lse {
            Some(DeviceTensor::nan(stream, DType::F32, lse_len.max(1))?)
        } else {
            None
        };
        launch(&mut o, lse.as_mut())?;
        self.synchronize().map_err(|e| match e {
            Error::Cuda(CudaError::Driver { source, .. }) => Error::Cuda(CudaError::Launch {
                kernel: kernel.to_string(),
                source,
            }),
            other => other,
        })?;
        let o_host = truncate(o.download(stream)?, problem.output_len());
        let lse_host = match lse {
            Some(l) => Some(truncate(l.download(stream)?, lse_len).to_f32_vec()),
            None => None,
        };
        Ok(AttentionOutput {
            o: o_host,
            lse: lse_host,
        })
    }
}

/// Drops the padding element of an output that was allocated for an empty problem.
fn truncate(t: HostTensor, len: usize) -> HostTensor {
    match t {
        HostTensor::F16(mut v) => {
            v.truncate(len);
            HostTensor::F16(v)
        }
        HostTensor::Bf16(mut v) => {
            v.truncate(len);
            HostTensor::Bf16(v)
        }
        HostTensor::F32(mut v) => {
            v.truncate(len);
            HostTensor::F32(v)
        }
    }
}
