//! Errors of the CUDA runtime layer: no driver, a failed driver call, a failed launch.

use cudarc::driver::DriverError;

/// An error of the CUDA runtime layer. Every variant names what was being done.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No NVIDIA driver library could be loaded: there is no GPU backend on this machine.
    #[error("no CUDA driver found (tried to load {tried}): {reason}")]
    NoDriver {
        /// The library names tried.
        tried: String,
        /// The loader's message.
        reason: String,
    },
    /// The GPU is older than the kernels support.
    #[error("{name} (compute capability {major}.{minor}) is not supported: {reason}")]
    UnsupportedDevice {
        /// Device name.
        name: String,
        /// Compute capability, major.
        major: u32,
        /// Compute capability, minor.
        minor: u32,
        /// Why (lists the supported architectures).
        reason: String,
    },
    /// A driver call failed.
    #[error("CUDA {call} failed: {source}")]
    Driver {
        /// What was being done.
        call: String,
        /// The driver's error.
        source: DriverError,
    },
    /// A kernel launch (or the kernel itself, reported at the next synchronisation) failed.
    #[error("launch of {kernel} failed: {source}")]
    Launch {
        /// The kernel's name.
        kernel: String,
        /// The driver's error.
        source: DriverError,
    },
    /// A buffer passed to a run does not match the plan.
    #[error("buffer {name}: {reason}")]
    Buffer {
        /// Which buffer.
        name: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// Attaches the call's description to a driver error.
pub(crate) trait DriverContext<T> {
    fn during(self, call: impl Into<String>) -> Result<T, CudaError>;
}

impl<T> DriverContext<T> for Result<T, DriverError> {
    fn during(self, call: impl Into<String>) -> Result<T, CudaError> {
        self.map_err(|source| CudaError::Driver {
            call: call.into(),
            source,
        })
    }
}
