//! The GPU reference: [`Engine::reference_attention`] runs a problem through the reference kernel
//! (`kernels/reference.cuh`, rendered by [`codegen::render_reference`]) on host tensors and
//! returns f32 outputs.
//!
//! The reference kernel is slow and plain (one warp per (query token, query head) row, a two-pass
//! f32 softmax with accurate `expf`/`logf`) but shares the mask predicate and the variant hooks
//! of the fast kernels. `attnforge verify` judges the fast kernels against it on every row of
//! the problems too large for the f64 CPU reference, and checks it against the f64 reference on
//! every other case (docs/semantics.md, "Comparing with the reference").
//!
//! K and V are ragged views only. A paged problem is by definition the ragged problem over the
//! keys its page table gathers: gather the cache with [`crate::paged::gather`] and pass the
//! problem's ragged form (`PagedAttention::problem`); the verify suite passes the ragged
//! tensors its paged cases build their caches from. The kernel reads elements one at a time, so
//! views need no alignment. f32 inputs are refused as by every CUDA kernel.

use super::buffers::DeviceTensor;
use super::engine::Engine;
use super::error::CudaError;
use super::launch::{launch_1d, Launch1d};
use super::problem_arrays::ProblemArrays;
use crate::codegen::{
    self, PrefillParams, ReferenceSpec, REFERENCE_ROWS_PER_CTA, REFERENCE_THREADS,
};
use crate::dtype::DType;
use crate::jit::KernelSource;
use crate::problem::{AttentionProblem, Mask};
use crate::tensor::HostTensor;
use crate::{AttentionOutput, Error};

impl Engine {
    /// `problem` on host tensors through the GPU reference kernel: validates the problem and the
    /// buffers, renders and loads the problem's reference kernel (compiled once, then from the
    /// caches), uploads, launches, synchronises and downloads. Returns `o` as f32
    /// `[total_qo, num_qo_heads, head_dim_vo]` and the natural-log LSE (always, whatever
    /// `problem.return_lse` says). The outputs are NaN before the launch, so an unwritten
    /// element shows.
    pub fn reference_attention(
        &self,
        problem: &AttentionProblem,
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
    ) -> Result<AttentionOutput, Error> {
        problem.validate_inputs(q, k, v)?;
        let spec = ReferenceSpec::for_problem(problem)?;
        let rendered = codegen::render_reference(&spec);
        let function = self.single_entry(&KernelSource {
            name: &rendered.entry,
            entry: &rendered.entry,
            source: &rendered.source,
            snippets: &rendered.snippets,
        })?;
        let rows = problem.batch.total_qo() * problem.num_qo_heads;
        let ctas = u32::try_from(rows.div_ceil(REFERENCE_ROWS_PER_CTA as usize))
            .ok()
            .filter(|&c| c <= i32::MAX as u32)
            .ok_or_else(|| CudaError::Buffer {
                name: "o",
                reason: format!("{rows} rows need more CTAs than one launch takes"),
            })?;
        let stream = self.stream();
        let (qd, kd, vd) = (self.upload(q)?, self.upload(k)?, self.upload(v)?);
        let arrays = ProblemArrays::upload(self, problem)?;
        let o = DeviceTensor::nan(stream, DType::F32, problem.output_len().max(1))?;
        let lse = DeviceTensor::nan(stream, DType::F32, rows.max(1))?;
        if rows > 0 {
            let params = reference_params(problem, self, (&qd, &kd, &vd), (&o, &lse), &arrays);
            let variant_bytes = arrays.variant_bytes(stream, &rendered.params.variant);
            let block = rendered.params.pack(&params, &variant_bytes);
            // SAFETY: the kernel takes one parameter, a struct whose layout `block` reproduces
            // (the generated source asserts its size and field sizes); every pointer in it
            // refers to a live allocation sized for the problem (validate_inputs checked the
            // host buffers these are copies of, and `o` and `lse` hold every row).
            unsafe {
                launch_1d(
                    stream,
                    &function,
                    Launch1d {
                        blocks: ctas,
                        threads: REFERENCE_THREADS,
                        smem_bytes: 0,
                    },
                    &block[..],
                    || rendered.entry.clone(),
                )
            }?;
        }
        stream.synchronize().map_err(|source| CudaError::Launch {
            kernel: rendered.entry.clone(),
            source,
        })?;
        let o_host = o.download(stream)?.to_f32_vec();
        let lse_host = lse.download(stream)?.to_f32_vec();
        Ok(AttentionOutput {
            o: HostTensor::F32(o_host[..problem.output_len()].to_vec()),
            lse: Some(lse_host[..rows].to_vec()),
        })
    }
}

/// The fields of the prefill parameter block the reference kernel reads (the rest stay 0).
fn reference_params(
    p: &AttentionProblem,
    engine: &Engine,
    (q, k, v): (&DeviceTensor, &DeviceTensor, &DeviceTensor),
    (o, lse): (&DeviceTensor, &DeviceTensor),
    arrays: &ProblemArrays,
) -> PrefillParams {
    let stream = engine.stream();
    let elem = p.input_dtype.size_bytes() as u64;
    let dvo = p.head_dims.vo();
    let scaling = p.qk_scaling();
    let (qo_indptr, kv_indptr) = arrays.indptrs(stream);
    let (custom_mask, mask_indptr) = arrays.custom_mask(stream);
    PrefillParams {
        q: q.device_address(stream) + p.q_view.offset as u64 * elem,
        k: k.device_address(stream) + p.k_view.offset as u64 * elem,
        v: v.device_address(stream) + p.v_view.offset as u64 * elem,
        o: o.device_address(stream),
        lse: lse.device_address(stream),
        qo_indptr,
        kv_indptr,
        custom_mask,
        mask_indptr,
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
        total_qo: p.batch.total_qo() as i32,
        batch_size: p.batch.len() as i32,
        ..PrefillParams::default()
    }
}
