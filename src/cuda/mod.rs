//! The CUDA runtime layer: devices, buffers, loading generated kernels, planning and launching.
//!
//! Built on `cudarc`'s driver API, loaded at run time: `cargo build` needs no CUDA toolkit, and
//! on a machine without a GPU [`Engine::new`] returns an error ([`CudaError::NoDriver`]) instead
//! of panicking. Kernels come from `codegen` through `jit`; this layer owns what happens on the
//! device. The GPU reference kernel's entry point is [`Engine::reference_attention`].

mod append;
#[cfg(feature = "harness")]
mod append_check;
#[cfg(feature = "harness")]
mod backend;
mod buffers;
mod device;
mod engine;
mod error;
mod fp8;
mod graph;
mod launch;
mod memory;
mod merge;
mod paged;
mod pages;
mod plan;
mod prefill;
mod problem_arrays;
mod reference;
mod schedule;
mod tma;

pub use append::{AppendPlan, DevicePagedKvMut};
#[cfg(feature = "harness")]
pub use backend::CudaBackend;
pub use buffers::DeviceTensor;
pub use device::{driver_present, DeviceInfo};
pub use engine::{Engine, LoadedKernel};
pub use error::CudaError;
pub use fp8::{DeviceFp8Kv, DeviceFp8Tensor, DeviceKvScales};
pub use graph::capture_graph;
pub use merge::DeviceState;
pub use paged::{DevicePagedKv, PagedGraphCapacity, PagedPlan, PagedRunMode};
pub use plan::{check_replan, GraphCapacity, PlanOptions};
pub use prefill::PrefillPlan;
pub use schedule::{KvSplit, SplitChoice};
