//! The backends the CLI can run a problem on, behind one small trait, so `demo` and `verify` are
//! written once and a CUDA backend slots in by adding a [`BackendKind`] arm and an implementation.
//!
//! Choosing a backend that this build does not have is an error that says so; nothing ever falls
//! back to another backend silently.

use attnforge::cpu::{self, Isa};
use attnforge::testing::BackendCaps;
use attnforge::{AttentionOutput, AttentionProblem, HostTensor};

/// A backend named on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// The fast CPU backend (tiled online softmax, rayon).
    Cpu,
    /// The CUDA backend (NVRTC-compiled kernels).
    Cuda,
}

impl BackendKind {
    /// The best backend this build and machine offer (today always the CPU).
    pub fn best() -> BackendKind {
        BackendKind::Cpu
    }

    /// The backend itself, or why it cannot be had.
    pub fn open(self) -> Result<Box<dyn Backend>, String> {
        match self {
            BackendKind::Cpu => Ok(Box::new(CpuBackend { isa: Isa::detect() })),
            BackendKind::Cuda => Err(
                "the cuda backend is not built yet in this version of attnforge; \
                 use --backend cpu"
                    .to_string(),
            ),
        }
    }
}

/// What `demo` and `verify` need from a backend.
pub trait Backend {
    /// Short name, as on the command line.
    fn name(&self) -> &'static str;
    /// A one-line description (instruction set, threads, device).
    fn describe(&self) -> String;
    /// What the backend runs; `verify` lists only cases inside it.
    fn caps(&self) -> BackendCaps;
    /// Runs one problem.
    fn run(
        &self,
        p: &AttentionProblem,
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
    ) -> Result<AttentionOutput, attnforge::Error>;
}

/// The fast CPU backend with the kernels of one instruction set.
struct CpuBackend {
    isa: Isa,
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        cpu::BACKEND
    }

    fn describe(&self) -> String {
        format!(
            "cpu ({} kernels, {} threads)",
            self.isa.name(),
            rayon::current_num_threads()
        )
    }

    fn caps(&self) -> BackendCaps {
        BackendCaps::cpu()
    }

    fn run(
        &self,
        p: &AttentionProblem,
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
    ) -> Result<AttentionOutput, attnforge::Error> {
        cpu::attention_with_isa(p, q, k, v, self.isa)
    }
}
