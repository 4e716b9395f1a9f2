//! The exact reference of a paged problem: the ragged reference over the gathered K and V; an
//! fp8 cache is dequantised whole first ([`dequantize`]), then read like a plain one.

use super::{attention, ReferenceOutput};
use crate::paged::{dequantize, gather, PagedAttention, PagedCache, PagedKv};
use crate::problem::InvalidProblem;
use crate::tensor::HostTensor;

/// [`attention`] of `p` over the cache: validates `q` and the cache buffers (and an fp8 cache's
/// scales), dequantises an fp8 cache to the problem's dtype, copies the paged K/V into contiguous
/// ragged tensors ([`gather`]) and runs the reference on them.
pub fn paged_attention<'a>(
    p: &PagedAttention,
    q: &HostTensor,
    cache: impl Into<PagedCache<'a>>,
) -> Result<ReferenceOutput, InvalidProblem> {
    p.validate_q(q)?;
    let (k, v) = match cache.into() {
        PagedCache::Plain(pages) => gather(p.layout(), p.table(), pages)?,
        PagedCache::Fp8(fp8) => {
            let buffers = dequantize(p.layout(), fp8)?;
            let pages = match &buffers[..] {
                [k, v] => PagedKv::Separate { k, v },
                [kv] => PagedKv::Combined(kv),
                _ => {
                    return Err(InvalidProblem::new(
                        "kv_cache",
                        "dequantised into neither one nor two buffers",
                    ))
                }
            };
            gather(p.layout(), p.table(), pages)?
        }
    };
    attention(p.problem(), q, &k, &v)
}
