//! Device tensors: flat device buffers tagged with a dtype, and host <-> device copies.

use super::error::{CudaError, DriverContext};
use crate::dtype::DType;
use crate::tensor::HostTensor;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use half::{bf16, f16};
use std::sync::Arc;

/// A flat device buffer of `len` elements of `dtype`.
#[derive(Debug)]
pub struct DeviceTensor {
    bytes: CudaSlice<u8>,
    dtype: DType,
    len: usize,
}

impl DeviceTensor {
    /// Copies a host tensor to the device (on `stream`).
    pub fn upload(stream: &Arc<CudaStream>, host: &HostTensor) -> Result<DeviceTensor, CudaError> {
        let bytes = stream.clone_htod(host.as_bytes()).during("upload")?;
        Ok(DeviceTensor {
            bytes,
            dtype: host.dtype(),
            len: host.len(),
        })
    }

    /// A device tensor of `len` NaN elements (outputs are poisoned so an unwritten element shows).
    pub fn nan(
        stream: &Arc<CudaStream>,
        dtype: DType,
        len: usize,
    ) -> Result<DeviceTensor, CudaError> {
        DeviceTensor::upload(stream, &HostTensor::nan(dtype, len))
    }

    /// Copies back to the host (synchronises `stream`).
    pub fn download(&self, stream: &Arc<CudaStream>) -> Result<HostTensor, CudaError> {
        let raw = stream.clone_dtoh(&self.bytes).during("download")?;
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
                .memcpy_htod(host.as_bytes(), &mut self.bytes)
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
