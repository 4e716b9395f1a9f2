//! The exact reference of a paged problem: the ragged reference over the gathered K and V. An
//! fp8 cache with f32 QK accumulation is read as exact values (`decode(code) * scale`,
//! [`gather_exact`]); with f16 QK accumulation it is dequantised whole to the problem's dtype
//! first ([`dequantize`]), then read like a plain one.

use super::attention_exact_kv;
use super::{attention, ReferenceOutput};
use crate::paged::{dequantize, gather, gather_exact, PagedAttention, PagedCache, PagedKv};
use crate::problem::InvalidProblem;
use crate::problem::QkAccum;
use crate::tensor::HostTensor;

/// [`attention`] of `p` over the cache: validates `q` and the cache buffers (and an fp8 cache's
/// scales), copies the paged K/V into contiguous ragged tensors ([`gather`]; an fp8 cache's exact
/// values with f32 QK, [`gather_exact`], else dequantised to the problem's dtype) and runs the
/// reference on them.
pub fn paged_attention<'a>(
    p: &PagedAttention,
    q: &HostTensor,
    cache: impl Into<PagedCache<'a>>,
) -> Result<ReferenceOutput, InvalidProblem> {
    p.validate_q(q)?;
    let (k, v) = match cache.into() {
        PagedCache::Plain(pages) => gather(p.layout(), p.table(), pages)?,
        PagedCache::Fp8(fp8) if p.problem().qk_accum == QkAccum::F32 => {
            let (k, v) = gather_exact(p.layout(), p.table(), fp8)?;
            return attention_exact_kv(p.problem(), q, k, v);
        }
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
