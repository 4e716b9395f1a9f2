//! The CPU backend on a paged problem: it gathers the paged K/V into contiguous ragged tensors
//! and runs the ragged kernels on them (no fused paged CPU kernel: the gather costs one copy of
//! the keys and values, small beside the attention itself). An fp8 cache is read as its exact
//! values with f32 QK accumulation (the problem then runs with f32 inputs, rounded once to f32,
//! and its output in the problem's dtype), and dequantised to the problem's dtype with f16 QK
//! accumulation, as docs/semantics.md defines them.

use super::attention;
use crate::dtype::DType;
use crate::error::Error;
use crate::output::AttentionOutput;
use crate::paged::{gather, gather_dequantized, gather_exact, PagedAttention, PagedCache};
use crate::problem::{AttentionProblem, QkAccum};
use crate::tensor::HostTensor;

/// [`attention`] of `p` over the cache: validates `q` and the cache buffers (and an fp8 cache's
/// scales), gathers the paged K/V ([`gather`], [`gather_exact`], [`gather_dequantized`]) and runs
/// the CPU kernels on the ragged problem.
pub fn paged_attention<'a>(
    p: &PagedAttention,
    q: &HostTensor,
    cache: impl Into<PagedCache<'a>>,
) -> Result<AttentionOutput, Error> {
    paged_attention_with(p, q, cache.into(), attention)
}

/// [`paged_attention`] with the ragged problem computed by `ragged` (the backend's choice of
/// kernels).
pub(crate) fn paged_attention_with(
    p: &PagedAttention,
    q: &HostTensor,
    cache: PagedCache<'_>,
    ragged: impl FnOnce(
        &AttentionProblem,
        &HostTensor,
        &HostTensor,
        &HostTensor,
    ) -> Result<AttentionOutput, Error>,
) -> Result<AttentionOutput, Error> {
    p.validate_q(q)?;
    let (k, v) = match cache {
        PagedCache::Plain(pages) => gather(p.layout(), p.table(), pages)?,
        PagedCache::Fp8(fp8) if p.problem().qk_accum == QkAccum::F32 => {
            let (k, v) = gather_exact(p.layout(), p.table(), fp8)?;
            let as_f32 = |x: Vec<f64>| {
                HostTensor::from_f32(
                    DType::F32,
                    &x.into_iter().map(|x| x as f32).collect::<Vec<_>>(),
                )
            };
            let mut exact = p.problem().clone();
            exact.input_dtype = DType::F32;
            let q = HostTensor::from_f32(DType::F32, &q.to_f32_vec());
            return ragged(&exact, &q, &as_f32(k), &as_f32(v));
        }
        PagedCache::Fp8(fp8) => gather_dequantized(p.layout(), p.table(), fp8)?,
    };
    ragged(p.problem(), q, &k, &v)
}
