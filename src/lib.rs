//! attnforge: attention kernels for LLM serving.
//!
//! The data flows one way, and each stage has its module:
//!
//! | stage | type | module |
//! |---|---|---|
//! | what the caller asks | [`problem::AttentionProblem`] | [`problem`] (validation included) |
//! | what it means, exactly | f64 oracle | `reference` |
//! | CPU execution | tiled online softmax | `cpu` |
//! | what gets compiled | `KernelSpec` → CUDA source | `codegen` (pure: no GPU) |
//! | compiled kernel | CUBIN from NVRTC, cached on disk | `jit` |
//! | launch plan and run | device buffers, streams | `cuda` |
//! | paged KV cache (host side) | layout, page table, gather, append | `paged` |
//!
//! `docs/semantics.md` defines every formula; the reference is its executable form and the oracle
//! of every test.
//!
//! # The `harness` feature
//!
//! The correctness harness is not part of the default API: the CLI (`cli/`) and this package's
//! tests build the library with the `harness` feature, which adds
//!
//! | module | job |
//! |---|---|
//! | `testing` | the shared case list and its inputs |
//! | `verify` | running the case list through a backend against the exact reference |
//! | `compare` | comparing outputs, with the tolerance of each dtype |
//! | `shapes` | the benchmark shapes, FLOP and byte counts (shared with the peers' script) |
//!
//! and the backends the suite drives, `cpu::CpuBackend` and `cuda::CudaBackend`.

pub mod codegen;
#[cfg(feature = "harness")]
pub mod compare;
pub mod cpu;
pub mod cuda;
pub mod dtype;
pub mod error;
pub mod jit;
pub mod merge;
pub mod output;
pub mod paged;
pub mod problem;
pub mod reference;
#[cfg(feature = "harness")]
pub mod shapes;
pub mod tensor;
#[cfg(feature = "harness")]
pub mod testing;
#[cfg(feature = "harness")]
pub mod verify;

pub use dtype::DType;
pub use error::{Error, Result};
pub use output::AttentionOutput;
pub use problem::{AttentionProblem, HeadDims, Mask, QkAccum, RaggedBatch, Variant};
pub use tensor::HostTensor;

/// The README's examples, compiled as doctests so they cannot drift from the API.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
