//! The JIT: complete CUDA source → CUBIN through NVRTC, with a disk cache.
//!
//! | module | job |
//! |---|---|
//! | [`locate`] | find `libnvrtc.so*` on disk (env settings, toolkits, pip wheels) |
//! | [`nvrtc`] | load it by absolute path; checked FFI; RAII program |
//! | [`arch`] | the targets (`sm_80` … `sm_90a`) |
//! | [`compile`] | one compile: options → NVRTC arguments, CUBIN, snippet-mapped errors |
//! | [`report`] | ptxas' `-v` resource report (registers, spills, shared memory) |
//! | [`cache`] | the on-disk cache: key, entry format, atomic writes, corruption checks |
//! | [`cached`] | [`Jit`]: the cache in front of NVRTC (load, lock, load again, build, store) |
//! | [`batch`] | many compiles on N threads: waited for with progress, or in the background |
//!
//! The code generator (`codegen`) hands this layer a complete source; nothing here knows what
//! the kernel computes. Launching the CUBIN is the CUDA runtime layer's job (on `cudarc`'s
//! driver API). `docs/jit.md` explains the choices and records the timings.

pub mod arch;
pub mod batch;
pub mod cache;
pub mod cached;
pub mod compile;
pub mod error;
pub mod locate;
pub mod nvrtc;
pub mod report;

pub use arch::Arch;
pub use cache::{CacheKey, DiskCache};
pub use cached::{CacheStatus, Jit, JitOutput};
pub use compile::{CompileOptions, CompiledKernel, KernelSource, SnippetSpan};
pub use error::JitError;
pub use report::ResourceReport;
