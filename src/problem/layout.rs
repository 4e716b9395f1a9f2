//! Tensor views: where token `t`, head `h`, element `e` of Q, K, V or O lives in its buffer.
//!
//! Strides are explicit and in elements, so Q, K and V can be views into one fused QKV buffer
//! without a copy. The innermost (head-dim) stride is always 1.

use super::error::{InvalidProblem, Validation};

/// A view `[tokens, heads, dim]` into a flat buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorView {
    /// Element offset of token 0, head 0.
    pub offset: usize,
    /// Elements between consecutive tokens.
    pub token_stride: usize,
    /// Elements between consecutive heads.
    pub head_stride: usize,
}

impl TensorView {
    /// The contiguous `[tokens, heads, dim]` view.
    pub fn contiguous(heads: usize, dim: usize) -> TensorView {
        TensorView {
            offset: 0,
            token_stride: heads * dim,
            head_stride: dim,
        }
    }

    /// Index of element (`token`, `head`, `e`).
    pub fn index(&self, token: usize, head: usize, e: usize) -> usize {
        self.offset + token * self.token_stride + head * self.head_stride + e
    }

    /// Checks that `tokens x heads x dim` fits a buffer of `buffer_len` elements and that heads of
    /// one token do not overlap.
    pub fn validate(
        &self,
        name: &str,
        tokens: usize,
        heads: usize,
        dim: usize,
        buffer_len: usize,
    ) -> Validation {
        if heads > 1 && self.head_stride < dim {
            return Err(InvalidProblem::new(
                format!("{name} head stride"),
                format!(
                    "{} is less than the head dim {dim}; heads would overlap",
                    self.head_stride
                ),
            ));
        }
        if tokens > 1 && self.token_stride < heads.saturating_sub(1) * self.head_stride + dim {
            return Err(InvalidProblem::new(
                format!("{name} token stride"),
                format!(
                    "{} is too small for {heads} heads of {dim} elements",
                    self.token_stride
                ),
            ));
        }
        if tokens == 0 || heads == 0 {
            return Ok(());
        }
        let end = self.index(tokens - 1, heads - 1, dim);
        if end > buffer_len {
            return Err(InvalidProblem::new(
                name,
                format!("view of {tokens} tokens x {heads} heads x {dim} needs {end} elements, buffer has {buffer_len}"),
            ));
        }
        Ok(())
    }
}
