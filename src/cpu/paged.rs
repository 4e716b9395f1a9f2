//! The CPU backend on a paged problem: it gathers the paged K/V into contiguous ragged tensors
//! and runs the ragged kernels on them (no fused paged CPU kernel: the gather costs one copy of
//! the keys and values, small beside the attention itself).

use super::attention;
use crate::error::Error;
use crate::output::AttentionOutput;
use crate::paged::{gather, PagedAttention, PagedKv};
use crate::tensor::HostTensor;

/// [`attention`] of `p` over the cache: validates `q` and the cache buffers, gathers the paged
/// K/V ([`gather`]) and runs the CPU kernels on the ragged problem.
pub fn paged_attention(
    p: &PagedAttention,
    q: &HostTensor,
    cache: PagedKv<'_>,
) -> Result<AttentionOutput, Error> {
    p.validate_q(q)?;
    let (k, v) = gather(p.layout(), p.table(), cache)?;
    attention(p.problem(), q, &k, &v)
}
