//! Device allocation: every buffer the engine allocates comes from here.
//!
//! A request the GPU cannot hold is a [`CudaError::OutOfMemory`] naming the size asked and the
//! memory free (the driver's out-of-memory error, completed with `cuMemGetInfo`); nothing was
//! allocated and the engine stays usable. Buffers are filled on the device: zeros with
//! `cuMemsetD8`, the NaN that poisons outputs with `cuMemsetD16`/`cuMemsetD32` and the dtype's
//! bit pattern ([`DType::nan_bits`]), so no host buffer and no copy stand behind them.

use super::error::{CudaError, DriverContext};
use crate::dtype::DType;
use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{
    CudaSlice, CudaStream, DevicePtrMut, DeviceRepr, DriverError, ValidAsZeroBits,
};
use std::mem::size_of;
use std::sync::Arc;

/// `len` elements of `T` on `stream`'s device (stream-ordered where the driver supports it).
///
/// # Safety
/// The memory is uninitialised: the caller writes it before anything reads it.
unsafe fn alloc<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    len: usize,
    what: &str,
) -> Result<CudaSlice<T>, CudaError> {
    let requested = len
        .checked_mul(size_of::<T>())
        .ok_or_else(|| CudaError::Buffer {
            name: "allocation",
            reason: format!(
                "{what}: {len} elements of {} bytes overflow the address space",
                size_of::<T>()
            ),
        })?;
    // SAFETY: forwarded to the caller (the memory is written before it is read).
    match unsafe { stream.alloc::<T>(len) } {
        Ok(slice) => Ok(slice),
        Err(source) => Err(allocation_error(stream, what, requested, source)),
    }
}

/// The error of a failed allocation of `requested` bytes: [`CudaError::OutOfMemory`] with the
/// device's free and total memory when the driver ran out or the request exceeds the device's
/// memory (whatever code the driver gives such a request), else the driver's error.
fn allocation_error(
    stream: &Arc<CudaStream>,
    what: &str,
    requested: usize,
    source: DriverError,
) -> CudaError {
    let driver = |source| CudaError::Driver {
        call: format!("allocating {what} ({requested} bytes)"),
        source,
    };
    match stream.context().mem_get_info() {
        Ok((free, total))
            if source.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY || requested > total =>
        {
            CudaError::OutOfMemory {
                what: what.to_string(),
                requested,
                free,
                total,
            }
        }
        _ => driver(source),
    }
}

/// A device copy of `data`, ordered on `stream`.
pub(crate) fn upload<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    data: &[T],
    what: &str,
) -> Result<CudaSlice<T>, CudaError> {
    // SAFETY: the copy below writes every element before anything can read one.
    let mut slice = unsafe { alloc::<T>(stream, data.len(), what)? };
    stream
        .memcpy_htod(data, &mut slice)
        .during(format!("uploading {what}"))?;
    Ok(slice)
}

/// `len` zeros of `T` on the device, ordered on `stream`.
pub(crate) fn zeros<T: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    len: usize,
    what: &str,
) -> Result<CudaSlice<T>, CudaError> {
    // SAFETY: the memset below writes every byte before anything can read one.
    let mut slice = unsafe { alloc::<T>(stream, len, what)? };
    stream
        .memset_zeros(&mut slice)
        .during(format!("zeroing {what}"))?;
    Ok(slice)
}

/// The bytes of `len` NaN elements of `dtype` on the device, ordered on `stream`.
pub(crate) fn nan(
    stream: &Arc<CudaStream>,
    dtype: DType,
    len: usize,
    what: &str,
) -> Result<CudaSlice<u8>, CudaError> {
    let bytes = len
        .checked_mul(dtype.size_bytes())
        .ok_or_else(|| CudaError::Buffer {
            name: "allocation",
            reason: format!("{what}: {len} {dtype} elements overflow the address space"),
        })?;
    // SAFETY: `fill_nan` below writes every byte before anything can read one.
    let mut slice = unsafe { alloc::<u8>(stream, bytes, what)? };
    fill_nan(stream, &mut slice, dtype)?;
    Ok(slice)
}

/// Overwrites `bytes` with NaN elements of `dtype` on the device, ordered on `stream` (a trailing
/// part shorter than one element is left as it is).
pub(crate) fn fill_nan(
    stream: &Arc<CudaStream>,
    bytes: &mut CudaSlice<u8>,
    dtype: DType,
) -> Result<(), CudaError> {
    let elements = bytes.len() / dtype.size_bytes();
    if elements == 0 {
        return Ok(());
    }
    stream
        .context()
        .bind_to_thread()
        .during("binding the context to fill with NaN")?;
    let bits = dtype.nan_bits();
    let (ptr, _record) = bytes.device_ptr_mut(stream);
    // SAFETY: `ptr` addresses a live allocation of at least `elements` elements of `dtype`
    // (device allocations are aligned far beyond 4 bytes), written in `stream`'s order; the
    // record keeps cudarc's event tracking in step with this write.
    let result = unsafe {
        match dtype {
            DType::F16 | DType::Bf16 => {
                sys::cuMemsetD16Async(ptr, bits as u16, elements, stream.cu_stream())
            }
            DType::F32 => sys::cuMemsetD32Async(ptr, bits, elements, stream.cu_stream()),
        }
    };
    result.result().during("filling with NaN (cuMemsetD16/D32)")
}
