//! Device buffers: [`DeviceBytes`], device memory that is owned or borrowed, and on it
//! [`DeviceTensor`], a flat buffer tagged with a dtype, with host <-> device copies.
//!
//! A buffer either owns its memory (uploaded here, or a caller's `CudaSlice` handed over with
//! [`DeviceTensor::from_slice`]) or borrows memory the caller owns, given as a raw device
//! address ([`DeviceTensor::from_raw`]: another framework's tensor); a borrowed one is never
//! freed here. The fp8 code buffers (`super::DeviceFp8Tensor`) sit on the same [`DeviceBytes`].

use super::error::{CudaError, DriverContext};
use super::memory;
use crate::dtype::DType;
use crate::tensor::HostTensor;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use half::{bf16, f16};
use std::mem::ManuallyDrop;
use std::sync::Arc;

/// Device memory, owned (freed on drop) or borrowed from the caller (never freed here).
#[derive(Debug)]
pub(crate) struct DeviceBytes {
    bytes: ManuallyDrop<CudaSlice<u8>>,
    /// Whether the memory is the caller's (from a raw address): then it is not freed on drop.
    borrowed: bool,
}

impl Drop for DeviceBytes {
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

impl DeviceBytes {
    /// Takes ownership of `bytes`: they are freed on drop.
    pub(crate) fn owned(bytes: CudaSlice<u8>) -> DeviceBytes {
        DeviceBytes {
            bytes: ManuallyDrop::new(bytes),
            borrowed: false,
        }
    }

    /// Borrows `len` bytes at device address `address` (an error unless it is 16-byte aligned);
    /// dropping them frees nothing.
    ///
    /// # Safety
    /// `address` must be a device allocation of the context `stream` belongs to, at least `len`
    /// bytes long, valid and not written by anything unordered with `stream` for as long as the
    /// buffer (and any launch using it) lives.
    pub(crate) unsafe fn borrowed(
        stream: &Arc<CudaStream>,
        address: u64,
        len: usize,
    ) -> Result<DeviceBytes, CudaError> {
        if address % 16 != 0 {
            return Err(CudaError::Buffer {
                name: "from_raw",
                reason: format!("address {address:#x} is not 16-byte aligned"),
            });
        }
        // SAFETY: the caller vouches for the allocation (see above); the slice is leaked on drop
        // (`borrowed`), so cudarc never frees it.
        let bytes = unsafe { stream.upgrade_device_ptr::<u8>(address, len) };
        Ok(DeviceBytes {
            bytes: ManuallyDrop::new(bytes),
            borrowed: true,
        })
    }

    /// The whole memory, for in-place device fills.
    pub(crate) fn slice_mut(&mut self) -> &mut CudaSlice<u8> {
        &mut self.bytes
    }

    /// Copies `data` into the first `data.len()` bytes, in place, ordered on `stream`.
    pub(crate) fn write(&mut self, stream: &Arc<CudaStream>, data: &[u8]) -> Result<(), CudaError> {
        if !data.is_empty() {
            let mut view = self.bytes.slice_mut(0..data.len());
            stream.memcpy_htod(data, &mut view).during("write")?;
        }
        Ok(())
    }

    /// The first `len` bytes, copied back to the host (synchronises `stream`).
    pub(crate) fn read(&self, stream: &Arc<CudaStream>, len: usize) -> Result<Vec<u8>, CudaError> {
        let mut raw = stream.clone_dtoh(&*self.bytes).during("download")?;
        raw.truncate(len);
        Ok(raw)
    }

    /// The device address, for kernel parameters.
    pub(crate) fn device_address(&self, stream: &Arc<CudaStream>) -> u64 {
        self.bytes.device_ptr(stream).0
    }
}

/// A flat device buffer of `len` elements of `dtype`.
#[derive(Debug)]
pub struct DeviceTensor {
    bytes: DeviceBytes,
    dtype: DType,
    len: usize,
}

impl DeviceTensor {
    fn owned(bytes: CudaSlice<u8>, dtype: DType, len: usize) -> DeviceTensor {
        DeviceTensor {
            bytes: DeviceBytes::owned(bytes),
            dtype,
            len,
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
        // SAFETY: forwarded to the caller (see above).
        let bytes = unsafe { DeviceBytes::borrowed(stream, address, bytes_len)? };
        Ok(DeviceTensor { bytes, dtype, len })
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
        memory::fill_nan(stream, self.bytes.slice_mut(), self.dtype)
    }

    /// Copies back to the host (synchronises `stream`).
    pub fn download(&self, stream: &Arc<CudaStream>) -> Result<HostTensor, CudaError> {
        let raw = self
            .bytes
            .read(stream, self.len * self.dtype.size_bytes())?;
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
        self.bytes.write(stream, host.as_bytes())
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
        self.bytes.device_address(stream)
    }
}
