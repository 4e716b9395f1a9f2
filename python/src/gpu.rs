//! The CUDA side: one [`Engine`] per device, the caller's stream, and borrowed device buffers.
//!
//! Engines are opened on first use and kept for the life of the process (each holds the JIT and
//! the loaded kernels). Launches go to the stream the caller passes (torch's current stream),
//! wrapped without taking ownership; arrays are borrowed by address
//! ([`DeviceTensor::from_raw`], [`DeviceFp8Tensor::from_raw`]), never copied. The scales of fp8
//! caches are uploaded once per device and values, and kept ([`kv_scales`]).

use crate::array::{ArrayArg, Elem};
use crate::errors::{invalid, IntoPy};
use attnforge::cuda::{DeviceFp8Tensor, DeviceKvScales, DeviceTensor, Engine};
use attnforge::dtype::fp8::Fp8Format;
use attnforge::paged::{KvScales, PagedKvLayout};
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

/// The device buffer of fp8 codes behind `a` (from its element 0 to the last element it
/// reaches), borrowed.
pub fn borrow_codes(
    stream: &Arc<CudaStream>,
    a: &ArrayArg,
    name: &str,
) -> PyResult<DeviceFp8Tensor> {
    let Elem::Fp8(format) = a.elem() else {
        return Err(invalid(
            name,
            format!("has dtype {}; expected fp8 codes", a.elem()),
        ));
    };
    if a.device().is_none() {
        return Err(invalid(name, "is in host memory; expected a CUDA tensor"));
    }
    // SAFETY: as in `borrow`: a live CUDA tensor of this device, its extent inside its
    // allocation, its use ordered by the caller's stream.
    unsafe { DeviceFp8Tensor::from_raw(stream, a.address(), format, a.extent()) }.py()
}

/// What identifies uploaded scales: device, KV heads, format, dtype, and the bits of the K and V
/// scales.
type ScalesKey = (usize, usize, Fp8Format, DType, Vec<u32>, Vec<u32>);

static SCALES: OnceLock<Mutex<HashMap<ScalesKey, Arc<DeviceKvScales>>>> = OnceLock::new();

/// Distinct scale values kept per process (a model's layers each have theirs); past this many,
/// the device is synchronised and the kept ones are freed.
const SCALES_KEPT: usize = 1024;

/// The device copy of `scales` for an fp8 cache of `layout` and `format` on `engine`: validated
/// and uploaded (on the engine's stream, then waited for) the first time these values are seen,
/// then kept, so that later runs with them neither allocate nor synchronise.
pub fn kv_scales(
    engine: &Engine,
    layout: &PagedKvLayout,
    format: Fp8Format,
    scales: &KvScales,
) -> PyResult<Arc<DeviceKvScales>> {
    let bits = |s: &[f32]| s.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let key = (
        engine.info().ordinal,
        layout.num_kv_heads,
        format,
        layout.dtype,
        bits(&scales.k),
        bits(&scales.v),
    );
    let kept = SCALES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut kept = kept
        .lock()
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("scale registry poisoned"))?;
    if let Some(s) = kept.get(&key) {
        return Ok(s.clone());
    }
    if kept.len() >= SCALES_KEPT {
        // A launch still in flight may read kept scales: wait for every device that has some.
        for e in kept
            .keys()
            .map(|k| k.0)
            .collect::<std::collections::BTreeSet<_>>()
        {
            self::engine(e)?
                .context()
                .synchronize()
                .map_err(|err| pyo3::exceptions::PyRuntimeError::new_err(err.to_string()))?;
        }
        kept.clear();
    }
    let s = Arc::new(DeviceKvScales::upload(engine.stream(), scales, layout, format).py()?);
    engine.synchronize().py()?;
    kept.insert(key, s.clone());
    Ok(s)
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
