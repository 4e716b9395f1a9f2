//! Device tensors: flat device buffers tagged with a dtype, and host <-> device copies.
//!
//! A tensor either owns its buffer (uploaded here, or a caller's `CudaSlice` handed over with
//! [`DeviceTensor::from_slice`]) or borrows memory the caller owns, given as a raw device
//! address ([`DeviceTensor::from_raw`]: another framework's tensor); a borrowed one is never
//! freed here.

use super::error::{CudaError, DriverContext};
use super::memory;
use crate::dtype::DType;
use crate::tensor::HostTensor;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use half::{bf16, f16};
use std::mem::ManuallyDrop;
use std::sync::Arc;

/// A flat device buffer of `len` elements of `dtype`.
#[derive(Debug)]
pub struct DeviceTensor {
    bytes: ManuallyDrop<CudaSlice<u8>>,
    dtype: DType,
    len: usize,
    /// Whether the memory is the caller's (from a raw address): then it is not freed on drop.
    borrowed: bool,
}

impl Drop for DeviceTensor {
    fn drop(&mut self) {
        // SAFETY: `bytes` is taken exactly once, here, and never used again.
        let bytes = unsafe { ManuallyDrop::take(&mut self.bytes) };
        if self.borrowed {
            bytes.leak();
        } else {
            drop(bytes);
        }
    }
}

impl DeviceTensor {
    fn owned(bytes: CudaSlice<u8>, dtype: DType, len: usize) -> DeviceTensor {
        DeviceTensor {
            bytes: ManuallyDrop::new(bytes),
            dtype,
            len,
            borrowed: false,
        }
    }

    /// Takes ownership of a caller's device buffer holding `len` elements of `dtype` (an error
    /// when its size in bytes is not `len` elements).
    pub fn from_slice(
        bytes: CudaSlice<u8>,
        dtype: DType,
        len: usize,
    ) -> Result<DeviceTensor, CudaError> {
        let want = len.checked_mul(dtype.size_bytes());
        if want != Some(bytes.len()) {
            return Err(CudaError::Buffer {
                name: "from_slice",
                reason: format!(
                    "{} bytes cannot hold exactly {len} {dtype} elements",
                    bytes.len()
                ),
            });
        }
        Ok(DeviceTensor::owned(bytes, dtype, len))
    }

    /// Wraps `len` elements of `dtype` at device address `address` (e.g. another framework's
    /// tensor), without taking ownership: dropping the tensor frees nothing.
    ///
    /// # Safety
    /// `address` must be a device allocation of the context `stream` belongs to, at least
    /// `len * dtype.size_bytes()` bytes long and 16-byte aligned, valid and not written by
    /// anything unordered with `stream` for as long as this tensor (and any launch using it) lives.
    pub unsafe fn from_raw(
        stream: &Arc<CudaStream>,
        address: u64,
        dtype: DType,
        len: usize,
    ) -> Result<DeviceTensor, CudaError> {
        let bytes_len = len
            .checked_mul(dtype.size_bytes())
            .ok_or_else(|| CudaError::Buffer {
                name: "from_raw",
                reason: format!("{len} {dtype} elements overflow the address space"),
            })?;
        if address % 16 != 0 {
            return Err(CudaError::Buffer {
                name: "from_raw",
                reason: format!("address {address:#x} is not 16-byte aligned"),
            });
        }
        // SAFETY: the caller vouches for the allocation (see above); the slice is leaked on drop
        // (`borrowed`), so cudarc never frees it.
        let bytes = unsafe { stream.upgrade_device_ptr::<u8>(address, bytes_len) };
        Ok(DeviceTensor {
            bytes: ManuallyDrop::new(bytes),
            dtype,
            len,
            borrowed: true,
        })
    }

    /// Copies a host tensor to the device (on `stream`); [`CudaError::OutOfMemory`] when the
    /// device cannot hold it.
    pub fn upload(stream: &Arc<CudaStream>, host: &HostTensor) -> Result<DeviceTensor, CudaError> {
        let what = format!("a {}-element {} tensor", host.len(), host.dtype());
        let bytes = memory::upload(stream, host.as_bytes(), &what)?;
        Ok(DeviceTensor::owned(bytes, host.dtype(), host.len()))
    }

    /// A device tensor of `len` NaN elements (outputs are poisoned so an unwritten element
    /// shows), allocated and filled on the device; [`CudaError::OutOfMemory`] when the device
    /// cannot hold it.
    pub fn nan(
        stream: &Arc<CudaStream>,
        dtype: DType,
        len: usize,
    ) -> Result<DeviceTensor, CudaError> {
        let what = format!("a {len}-element {dtype} tensor");
        let bytes = memory::nan(stream, dtype, len, &what)?;
        Ok(DeviceTensor::owned(bytes, dtype, len))
    }

    /// Overwrites every element with NaN on the device, in place, ordered on `stream`.
    pub fn fill_nan(&mut self, stream: &Arc<CudaStream>) -> Result<(), CudaError> {
        memory::fill_nan(stream, &mut self.bytes, self.dtype)
    }

    /// Copies back to the host (synchronises `stream`).
    pub fn download(&self, stream: &Arc<CudaStream>) -> Result<HostTensor, CudaError> {
        let raw = stream.clone_dtoh(&*self.bytes).during("download")?;
        let pairs = raw
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]));
        Ok(match self.dtype {
            DType::F16 => HostTensor::F16(pairs.map(f16::from_bits).collect()),
            DType::Bf16 => HostTensor::Bf16(pairs.map(bf16::from_bits).collect()),
            DType::F32 => HostTensor::F32(
                raw.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
        })
    }

    /// Overwrites the whole buffer with `host` (same dtype and length), in place: the address
    /// stays, so kernels and captured graphs that hold it read the new contents. Ordered on
    /// `stream`.
    pub fn write(&mut self, stream: &Arc<CudaStream>, host: &HostTensor) -> Result<(), CudaError> {
        if host.dtype() != self.dtype || host.len() != self.len {
            return Err(CudaError::Buffer {
                name: "write",
                reason: format!(
                    "{} {} elements into a buffer of {} {}",
                    host.len(),
                    host.dtype(),
                    self.len,
                    self.dtype
                ),
            });
        }
        if self.len > 0 {
            stream
                .memcpy_htod(host.as_bytes(), &mut *self.bytes)
                .during("write")?;
        }
        Ok(())
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address, for kernel parameters.
    pub(crate) fn device_address(&self, stream: &Arc<CudaStream>) -> u64 {
        self.bytes.device_ptr(stream).0
    }
}
