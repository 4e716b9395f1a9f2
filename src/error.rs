//! The crate-level error: one variant per layer, each carrying that layer's own error type.

use crate::cuda::CudaError;
use crate::jit::JitError;
use crate::problem::InvalidProblem;

/// Any error attnforge returns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The problem or its buffers were rejected before any work.
    #[error(transparent)]
    InvalidProblem(#[from] InvalidProblem),
    /// Compiling a kernel failed, or NVRTC could not be found.
    #[error(transparent)]
    Jit(#[from] JitError),
    /// A CUDA driver call, a launch or a buffer failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The combination is valid in the model but this backend does not run it.
    #[error("{backend} does not support {what}; supported: {supported}")]
    Unsupported {
        /// The backend that refused.
        backend: &'static str,
        /// What was asked.
        what: String,
        /// What it does support.
        supported: String,
    },
}

/// Shorthand for results with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
