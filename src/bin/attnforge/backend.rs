//! Choosing a backend on the command line. The backends themselves live in the library
//! (`attnforge::cpu::CpuBackend`, `attnforge::cuda::CudaBackend`) behind
//! `attnforge::verify::Backend`.
//!
//! Choosing a backend that cannot run here is an error that says why; nothing ever falls back to
//! another backend silently. Only the default (no `--backend`) looks for the best one present.

use attnforge::cpu::CpuBackend;
use attnforge::cuda::{driver_present, CudaBackend};
use attnforge::verify::Backend;

/// A backend named on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// The fast CPU backend (tiled online softmax, rayon).
    Cpu,
    /// The CUDA backend (NVRTC-compiled kernels).
    Cuda,
}

impl BackendKind {
    /// The best backend present: the GPU when a CUDA driver is installed, else the CPU. (With a
    /// driver but no working GPU or NVRTC, opening it fails with the reason.)
    pub fn best() -> BackendKind {
        if driver_present().is_ok() {
            BackendKind::Cuda
        } else {
            BackendKind::Cpu
        }
    }

    /// The backend itself, or why it cannot be had.
    pub fn open(self) -> Result<Box<dyn Backend>, String> {
        match self {
            BackendKind::Cpu => Ok(Box::new(CpuBackend::detect())),
            BackendKind::Cuda => CudaBackend::new(0)
                .map(|b| Box::new(b) as Box<dyn Backend>)
                .map_err(|e| format!("the cuda backend is not available: {e}")),
        }
    }
}
