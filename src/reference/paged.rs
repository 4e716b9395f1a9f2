//! The exact reference of a paged problem: the ragged reference over the gathered K and V.

use super::{attention, ReferenceOutput};
use crate::paged::{gather, PagedAttention, PagedKv};
use crate::problem::InvalidProblem;
use crate::tensor::HostTensor;

/// [`attention`] of `p` over the cache: validates `q` and the cache buffers, copies the paged
/// K/V into contiguous ragged tensors ([`gather`]) and runs the reference on them.
pub fn paged_attention(
    p: &PagedAttention,
    q: &HostTensor,
    cache: PagedKv<'_>,
) -> Result<ReferenceOutput, InvalidProblem> {
    p.validate_q(q)?;
    let (k, v) = gather(p.layout(), p.table(), cache)?;
    attention(p.problem(), q, &k, &v)
}
