//! `attnforge._native`: the compiled half of the `attnforge` Python package.
//!
//! The Python modules (`attnforge.flashinfer`) check the arguments, allocate outputs with the
//! caller's array library and hand the arrays over as they are; they are read here through their
//! public Python attributes into descriptors (data address, shape, element strides, dtype,
//! device: [`array::ArrayArg`]), so nothing depends on numpy's or torch's binary interface. CPU arrays run on attnforge's CPU backend, CUDA arrays on its CUDA
//! backend, on the caller's stream.
//!
//! | module | job |
//! |---|---|
//! | `array` | numpy arrays and torch tensors (fp8 cache codes too) read into descriptors; strided host reads and writes |
//! | `errors` | attnforge's errors as Python exceptions |
//! | `spec` | attention options from Python into an [`attnforge::AttentionProblem`] |
//! | `cache` | paged KV cache descriptors into a [`attnforge::paged::PagedKvLayout`] |
//! | `gpu` | engines per device, the caller's stream, borrowed device buffers, uploaded fp8 scales |
//! | `plans` | the ragged plans (`plan` once, `run` many times) and what the paged ones share with them |
//! | `paged_plan` | the paged plans, over fp8 caches too; graph-stable with `use_cuda_graph` |
//! | `state` | `merge_state(s)` and the paged-cache append (into fp8 caches too) |

mod array;
mod cache;
mod errors;
mod gpu;
mod paged_plan;
mod plans;
mod spec;
mod state;

use pyo3::prelude::*;

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<plans::RaggedPlan>()?;
    m.add_class::<paged_plan::PagedPlan>()?;
    m.add_function(wrap_pyfunction!(state::merge_state, m)?)?;
    m.add_function(wrap_pyfunction!(state::merge_states, m)?)?;
    m.add_function(wrap_pyfunction!(state::append_paged_kv, m)?)?;
    m.add_function(wrap_pyfunction!(gpu::cuda_available, m)?)?;
    m.add_function(wrap_pyfunction!(array::describe, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
