//! What an attention run returns on the host.

use crate::tensor::HostTensor;

/// The output of one attention run, on the host.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionOutput {
    /// `o`, contiguous `[total_qo, num_qo_heads, head_dim_vo]`, in the problem's output dtype.
    pub o: HostTensor,
    /// Natural-log LSE per (query token, query head), `[total_qo, num_qo_heads]`, if requested.
    pub lse: Option<Vec<f32>>,
}
