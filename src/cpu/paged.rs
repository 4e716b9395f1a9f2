//! The CPU backend on a paged problem: it gathers the paged K/V into contiguous ragged tensors
//! (dequantising an fp8 cache's codes as it reads them) and runs the ragged kernels on them (no
//! fused paged CPU kernel: the gather costs one copy of the keys and values, small beside the
//! attention itself).

use super::attention;
use crate::error::Error;
use crate::output::AttentionOutput;
use crate::paged::{gather, gather_dequantized, PagedAttention, PagedCache};
use crate::tensor::HostTensor;

/// [`attention`] of `p` over the cache: validates `q` and the cache buffers (and an fp8 cache's
/// scales), gathers the paged K/V ([`gather`], [`gather_dequantized`]) and runs the CPU kernels
/// on the ragged problem.
pub fn paged_attention<'a>(
    p: &PagedAttention,
    q: &HostTensor,
    cache: impl Into<PagedCache<'a>>,
) -> Result<AttentionOutput, Error> {
    p.validate_q(q)?;
    let (k, v) = match cache.into() {
        PagedCache::Plain(pages) => gather(p.layout(), p.table(), pages)?,
        PagedCache::Fp8(fp8) => gather_dequantized(p.layout(), p.table(), fp8)?,
    };
    attention(p.problem(), q, &k, &v)
}
