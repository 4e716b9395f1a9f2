//! Errors of the CUDA runtime layer: no driver, a failed driver call, an allocation beyond the
//! device's memory, a failed launch.

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
    /// A device allocation the GPU cannot hold; nothing was allocated.
    #[error(
        "out of device memory: {what} asked for {}, the GPU has {} free of {}",
        size(.requested),
        size(.free),
        size(.total)
    )]
    OutOfMemory {
        /// What was being allocated.
        what: String,
        /// Bytes asked for.
        requested: usize,
        /// Bytes free on the device when the allocation failed.
        free: usize,
        /// The device's memory in bytes.
        total: usize,
    },
    /// A buffer passed to a run does not match the plan.
    #[error("buffer {name}: {reason}")]
    Buffer {
        /// Which buffer.
        name: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A cache that the device's append filled differs from the host's append of the same rows
    /// (checked by the verification mode [`PagedRunMode::DeviceAppend`](super::PagedRunMode)).
    #[error(
        "the device's append wrote {device} at element {index} of cache buffer {buffer}, where the host's wrote {host} ({count} elements differ)"
    )]
    AppendMismatch {
        /// Which cache buffer (K, V or the combined one, in the storage's order).
        buffer: usize,
        /// The first element that differs.
        index: usize,
        /// What the device wrote there.
        device: String,
        /// What the host wrote there.
        host: String,
        /// Elements that differ in that buffer.
        count: usize,
    },
}

/// A byte count with its size in GiB, for messages.
fn size(bytes: &usize) -> String {
    format!(
        "{bytes} bytes ({:.2} GiB)",
        *bytes as f64 / (1u64 << 30) as f64
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_names_the_size_asked_and_the_memory_free() {
        let e = CudaError::OutOfMemory {
            what: "a 100000000000-element f16 tensor".into(),
            requested: 200_000_000_000,
            free: 150_000_000_000,
            total: 150_754_820_096,
        };
        assert_eq!(
            e.to_string(),
            "out of device memory: a 100000000000-element f16 tensor asked for 200000000000 bytes \
             (186.26 GiB), the GPU has 150000000000 bytes (139.70 GiB) free of 150754820096 bytes \
             (140.40 GiB)"
        );
    }
}
