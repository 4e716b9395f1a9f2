//! The CUDA side: one [`Engine`] per device, the caller's stream, and borrowed device buffers.
//!
//! Engines are opened on first use and kept for the life of the process (each holds the JIT and
//! the loaded kernels). Launches go to the stream the caller passes (torch's current stream),
//! wrapped without taking ownership; arrays are borrowed by address
//! ([`DeviceTensor::from_raw`]), never copied.

use crate::array::ArrayArg;
use crate::errors::{invalid, IntoPy};
use attnforge::cuda::{DeviceTensor, Engine};
use attnforge::DType;
use cudarc::driver::{sys::CUstream, CudaStream};
use pyo3::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

static ENGINES: OnceLock<Mutex<HashMap<usize, Arc<Engine>>>> = OnceLock::new();

/// The engine of device `ordinal`, opened on first use.
pub fn engine(ordinal: usize) -> PyResult<Arc<Engine>> {
    let engines = ENGINES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut engines = engines
        .lock()
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("engine registry poisoned"))?;
    if let Some(e) = engines.get(&ordinal) {
        return Ok(e.clone());
    }
    let e = Arc::new(Engine::new(ordinal).py()?);
    engines.insert(ordinal, e.clone());
    Ok(e)
}

/// Whether a CUDA driver can be loaded here (the CUDA backend's precondition).
#[pyfunction]
pub fn cuda_available() -> bool {
    attnforge::cuda::driver_present().is_ok()
}

/// The caller's stream `handle` (a `cudaStream_t`; 0 is the legacy default stream) on `engine`'s
/// context, not owned.
pub fn stream(engine: &Engine, handle: u64) -> Arc<CudaStream> {
    // SAFETY: the handle is a live stream of the device's primary context (torch's current
    // stream on the tensors' device, which the Python layer checks); torch keeps it alive for
    // the call, and the wrapper never destroys it.
    unsafe {
        engine
            .context()
            .wrap_borrowed_stream(handle as usize as CUstream)
    }
}

/// The device buffer behind `a` (from its element 0 to the last element it reaches), borrowed.
pub fn borrow(
    stream: &Arc<CudaStream>,
    a: &ArrayArg,
    name: &str,
    dtype: DType,
) -> PyResult<DeviceTensor> {
    if a.device().is_none() {
        return Err(invalid(name, "is in host memory; expected a CUDA tensor"));
    }
    // SAFETY: the descriptor comes from a live CUDA tensor of this device (module docs of
    // `array`); its extent is inside its allocation, and the caller's stream orders its use.
    unsafe { DeviceTensor::from_raw(stream, a.address(), dtype, a.extent()) }.py()
}

/// The CUDA ordinal shared by `arrays`, `None` if all are host arrays, or a `ValueError`.
pub fn common_device(arrays: &[(&str, &ArrayArg)]) -> PyResult<Option<usize>> {
    let first = arrays.first().and_then(|(_, a)| a.device());
    for (name, a) in arrays {
        if a.device() != first {
            return Err(invalid(
                name,
                format!(
                    "is on {} but {} is on {}",
                    device_name(a.device()),
                    arrays[0].0,
                    device_name(first)
                ),
            ));
        }
    }
    Ok(first)
}

fn device_name(d: Option<usize>) -> String {
    d.map_or("cpu".into(), |o| format!("cuda:{o}"))
}
