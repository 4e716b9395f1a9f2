//! Prefill on the GPU: plan once per batch shape, run many times.
//!
//! [`PrefillPlan::new`] validates the problem, picks the tile, renders and loads the kernel,
//! builds the work list and uploads everything that depends only on the problem (index pointers,
//! work items, the custom mask, the variant's arrays). [`PrefillPlan::run`] then only checks the
//! buffers, fills the parameter block and launches on the engine's stream: no allocation, no
//! synchronisation. The plan owns the problem, so a variant or mask parameter can never be lost
//! between planning and running.

use super::buffers::DeviceTensor;
use super::engine::{Engine, LoadedKernel};
use super::error::{CudaError, DriverContext};
use super::schedule::{choose_kv_split, prefill_work, KvSplit};
use crate::codegen::{
    self, KernelSpec, ParamBlockLayout, PrefillParams, TileConfig, MERGE_ROWS_PER_CTA,
    MERGE_THREADS,
};
use crate::dtype::DType;
use crate::problem::{AttentionProblem, Mask, ParamValue};
use crate::tensor::HostTensor;
use crate::{AttentionOutput, Error};
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};
use std::ffi::c_void;
use std::sync::Arc;

/// log2(e), folded into the scale when the variant has no transform.
const LOG2E: f32 = std::f32::consts::LOG2_E;

/// Per-chunk partial results of a split KV range, merged by the merge kernel.
struct Workspace {
    o: CudaSlice<f32>,
    lse: CudaSlice<f32>,
}

/// A prefill problem prepared for one engine.
pub struct PrefillPlan {
    problem: AttentionProblem,
    spec: KernelSpec,
    kernel: Arc<LoadedKernel>,
    layout: ParamBlockLayout,
    num_work: u32,
    split: Option<KvSplit>,
    workspace: Option<Workspace>,
    work: CudaSlice<i32>,
    qo_indptr: CudaSlice<i32>,
    kv_indptr: CudaSlice<i32>,
    custom_mask: Option<(CudaSlice<u8>, CudaSlice<i64>)>,
    variant_arrays: Vec<CudaSlice<u8>>,
    variant_values: Vec<ParamValue>,
}

/// Elements of 16 bits per 16-byte copy: the kernels load and store whole rows in such copies.
const ROW_ALIGNMENT: usize = 8;

/// Rejects views whose rows are not 16-byte aligned (the kernels' copies would fault).
fn check_alignment(p: &AttentionProblem) -> Result<(), Error> {
    for (name, view) in [("q", &p.q_view), ("k", &p.k_view), ("v", &p.v_view)] {
        for (what, value) in [
            ("offset", view.offset),
            ("token stride", view.token_stride),
            ("head stride", view.head_stride),
        ] {
            if value % ROW_ALIGNMENT != 0 {
                return Err(Error::Unsupported {
                    backend: "cuda",
                    what: format!("{name} view {what} {value}"),
                    supported: format!("offsets and strides that are multiples of {ROW_ALIGNMENT} elements (16 bytes)"),
                });
            }
        }
    }
    Ok(())
}

/// Uploads `data`; an empty slice becomes one default element (the driver allocates nothing of
/// size 0, and the kernel never reads it).
fn upload<T: DeviceRepr + Default + Copy>(
    engine: &Engine,
    data: &[T],
    what: &str,
) -> Result<CudaSlice<T>, Error> {
    let one = [T::default()];
    let data = if data.is_empty() { &one[..] } else { data };
    Ok(engine
        .stream()
        .clone_htod(data)
        .during(format!("uploading {what}"))?)
}

impl PrefillPlan {
    /// Plans `problem` on `engine`: validation, kernel choice, compilation, uploads.
    pub fn new(engine: &Engine, problem: &AttentionProblem) -> Result<PrefillPlan, Error> {
        PrefillPlan::with_tile(engine, problem, None)
    }

    /// [`new`](Self::new) with the planner's tile replaced by `tile` (for tuning: the compile
    /// matrix covers only the planner's choices).
    pub fn with_tile(
        engine: &Engine,
        problem: &AttentionProblem,
        tile: Option<TileConfig>,
    ) -> Result<PrefillPlan, Error> {
        problem.validate()?;
        check_alignment(problem)?;
        let mut spec = KernelSpec::for_problem(problem)?;
        if let Some(t) = tile {
            spec.tile = t;
        }
        let rendered = codegen::render(&spec);
        let kernel = engine.load(&rendered)?;

        let cta_q = spec.tile.cta_q() as usize;
        let sm_count = engine.info().sm_count as usize;
        let split = choose_kv_split(problem, cta_q, spec.tile.kv_tile as usize, sm_count);
        let work: Vec<i32> = prefill_work(problem, cta_q, split.as_ref())
            .into_iter()
            .flatten()
            .collect();
        let workspace = match &split {
            Some(s) => {
                let rows = problem.batch.total_qo() * problem.num_qo_heads * s.max_chunks;
                let stream = engine.stream();
                Some(Workspace {
                    o: stream
                        .alloc_zeros::<f32>(rows * problem.head_dims.vo())
                        .during("allocating the split-KV workspace")?,
                    lse: stream
                        .alloc_zeros::<f32>(rows)
                        .during("allocating the split-KV workspace")?,
                })
            }
            None => None,
        };
        let num_work = (work.len() / 4) as u32;
        let custom_mask = match &problem.mask {
            Mask::Custom(m) => {
                let offsets: Vec<i64> = m.mask_indptr.iter().map(|&o| o as i64).collect();
                Some((
                    upload(engine, &m.packed, "custom mask")?,
                    upload(engine, &offsets, "mask_indptr")?,
                ))
            }
            _ => None,
        };
        let variant_values = codegen::param_values(&problem.variant);
        let mut variant_arrays = Vec::new();
        for value in &variant_values {
            let bytes: Option<Vec<u8>> = match value {
                ParamValue::F32Array(a) => Some(a.iter().flat_map(|x| x.to_le_bytes()).collect()),
                ParamValue::I32Array(a) => Some(a.iter().flat_map(|x| x.to_le_bytes()).collect()),
                ParamValue::F32(_) | ParamValue::I32(_) => None,
            };
            if let Some(bytes) = bytes {
                variant_arrays.push(upload(engine, &bytes, "variant parameter")?);
            }
        }
        Ok(PrefillPlan {
            problem: problem.clone(),
            spec,
            kernel,
            layout: rendered.params,
            num_work,
            split,
            workspace,
            work: upload(engine, &work, "work list")?,
            qo_indptr: upload(engine, &problem.batch.qo_indptr, "qo_indptr")?,
            kv_indptr: upload(engine, &problem.batch.kv_indptr, "kv_indptr")?,
            custom_mask,
            variant_arrays,
            variant_values,
        })
    }

    /// The kernel this plan runs.
    pub fn spec(&self) -> &KernelSpec {
        &self.spec
    }

    /// The planned problem.
    pub fn problem(&self) -> &AttentionProblem {
        &self.problem
    }

    /// CTAs per launch of the prefill kernel.
    pub fn num_ctas(&self) -> u32 {
        self.num_work
    }

    /// How the KV range is split across CTAs, if it is.
    pub fn kv_split(&self) -> Option<KvSplit> {
        self.split
    }

    fn check(
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

    /// Launches the kernel on the engine's stream. `o` is contiguous `[total_qo, num_qo_heads,
    /// head_dim_vo]` in the output dtype; `lse`, if given, `[total_qo, num_qo_heads]` f32.
    /// Does not synchronise.
    pub fn run(
        &self,
        engine: &Engine,
        q: &DeviceTensor,
        k: &DeviceTensor,
        v: &DeviceTensor,
        o: &mut DeviceTensor,
        lse: Option<&mut DeviceTensor>,
    ) -> Result<(), Error> {
        let p = &self.problem;
        let (qo, kv) = (p.batch.total_qo(), p.batch.total_kv());
        let (dqk, dvo) = (p.head_dims.qk(), p.head_dims.vo());
        let extent =
            |view: &crate::problem::TensorView, tokens: usize, heads: usize, dim: usize| {
                if tokens == 0 {
                    0
                } else {
                    view.index(tokens - 1, heads - 1, dim)
                }
            };
        Self::check(
            "q",
            q,
            p.input_dtype,
            extent(&p.q_view, qo, p.num_qo_heads, dqk),
        )?;
        Self::check(
            "k",
            k,
            p.input_dtype,
            extent(&p.k_view, kv, p.num_kv_heads, dqk),
        )?;
        Self::check(
            "v",
            v,
            p.input_dtype,
            extent(&p.v_view, kv, p.num_kv_heads, dvo),
        )?;
        Self::check("o", o, p.output_dtype, p.output_len())?;
        if let Some(l) = &lse {
            Self::check("lse", l, DType::F32, qo * p.num_qo_heads)?;
        }
        if self.num_work == 0 {
            return Ok(());
        }
        let stream = engine.stream();
        let elem = p.input_dtype.size_bytes() as u64;
        let scaling = p.qk_scaling();
        let ptr = |s: &CudaSlice<i32>| s.device_ptr(stream).0;
        let fixed = PrefillParams {
            q: q.device_address(stream) + p.q_view.offset as u64 * elem,
            k: k.device_address(stream) + p.k_view.offset as u64 * elem,
            v: v.device_address(stream) + p.v_view.offset as u64 * elem,
            o: o.device_address(stream),
            lse: lse.as_ref().map_or(0, |l| l.device_address(stream)),
            qo_indptr: ptr(&self.qo_indptr),
            kv_indptr: ptr(&self.kv_indptr),
            work: ptr(&self.work),
            custom_mask: self
                .custom_mask
                .as_ref()
                .map_or(0, |(m, _)| m.device_ptr(stream).0),
            mask_indptr: self
                .custom_mask
                .as_ref()
                .map_or(0, |(_, i)| i.device_ptr(stream).0),
            q_stride_token: p.q_view.token_stride as i64,
            q_stride_head: p.q_view.head_stride as i64,
            k_stride_token: p.k_view.token_stride as i64,
            k_stride_head: p.k_view.head_stride as i64,
            v_stride_token: p.v_view.token_stride as i64,
            v_stride_head: p.v_view.head_stride as i64,
            o_stride_token: (p.num_qo_heads * dvo) as i64,
            o_stride_head: dvo as i64,
            num_qo_heads: p.num_qo_heads as i32,
            group_size: p.group_size() as i32,
            window_left: match p.mask {
                Mask::SlidingWindow { window_left } => window_left as i32,
                _ => 0,
            },
            q_prescale: scaling.prescale,
            post_scale: scaling.post_scale,
            scale_log2: scaling.post_scale * LOG2E,
            partial_o: self
                .workspace
                .as_ref()
                .map_or(0, |w| w.o.device_ptr(stream).0),
            partial_lse: self
                .workspace
                .as_ref()
                .map_or(0, |w| w.lse.device_ptr(stream).0),
            kv_chunk: self.split.map_or(0, |s| s.chunk as i32),
            max_chunks: self.split.map_or(0, |s| s.max_chunks as i32),
            total_qo: qo as i32,
            batch_size: p.batch.len() as i32,
        };
        let array_ptrs: Vec<u64> = self
            .variant_arrays
            .iter()
            .map(|a| a.device_ptr(stream).0)
            .collect();
        let variant_bytes = self.layout.variant.pack(&self.variant_values, &array_ptrs);
        let mut block = self.layout.pack(&fixed, &variant_bytes);
        let mut args = [block.as_mut_ptr().cast::<c_void>()];
        let f = &self.kernel;
        // SAFETY: the kernel takes one parameter, a struct whose layout `block` reproduces (the
        // generated source asserts its size and field sizes); every pointer in it refers to a
        // live allocation of this engine sized for the plan's problem (checked above), and the
        // driver copies the parameter bytes at launch.
        unsafe {
            cudarc::driver::result::launch_kernel(
                f.function.cu_function(),
                (self.num_work, 1, 1),
                (f.threads, 1, 1),
                f.smem_bytes,
                stream.cu_stream(),
                &mut args,
            )
        }
        .map_err(|source| CudaError::Launch {
            kernel: f.name.clone(),
            source,
        })?;
        if self.split.is_some() {
            let rows = (qo * p.num_qo_heads) as u32;
            // SAFETY: as above; the merge kernel reads the workspace the prefill kernel wrote
            // (same stream, so in order) and writes O and the LSE.
            unsafe {
                cudarc::driver::result::launch_kernel(
                    f.merge.cu_function(),
                    (rows.div_ceil(MERGE_ROWS_PER_CTA), 1, 1),
                    (MERGE_THREADS, 1, 1),
                    0,
                    stream.cu_stream(),
                    &mut args,
                )
            }
            .map_err(|source| CudaError::Launch {
                kernel: format!("{} (merge)", f.name),
                source,
            })?;
        }
        Ok(())
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
        problem.validate_inputs(q, k, v)?;
        let plan = PrefillPlan::new(self, problem)?;
        let stream = self.stream();
        let (qd, kd, vd) = (self.upload(q)?, self.upload(k)?, self.upload(v)?);
        let mut o = DeviceTensor::nan(stream, problem.output_dtype, problem.output_len().max(1))?;
        let lse_len = problem.batch.total_qo() * problem.num_qo_heads;
        let mut lse = if problem.return_lse {
            Some(DeviceTensor::nan(stream, DType::F32, lse_len.max(1))?)
        } else {
            None
        };
        plan.run(self, &qd, &kd, &vd, &mut o, lse.as_mut())?;
        self.synchronize().map_err(|e| match e {
            Error::Cuda(CudaError::Driver { source, .. }) => Error::Cuda(CudaError::Launch {
                kernel: plan.spec().name(),
                source,
            }),
            other => other,
        })?;
        let o_host = o.download(stream)?;
        let o_host = truncate(o_host, problem.output_len());
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
