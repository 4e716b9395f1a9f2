//! Host tensors: flat buffers of one [`DType`] that the CPU backends and the tests use.
//!
//! Shapes and strides live in the problem model ([`crate::problem`]); a host tensor is only its
//! elements, so one buffer can back several views (a fused QKV buffer, for example).

use crate::dtype::{DType, Element};
use half::{bf16, f16};
use rayon::prelude::*;

/// A flat host buffer of f16, bf16 or f32 elements.
#[derive(Clone, Debug, PartialEq)]
pub enum HostTensor {
    /// IEEE binary16 elements.
    F16(Vec<f16>),
    /// bfloat16 elements.
    Bf16(Vec<bf16>),
    /// f32 elements.
    F32(Vec<f32>),
}

impl HostTensor {
    /// Rounds each f32 value to `dtype`.
    pub fn from_f32(dtype: DType, values: &[f32]) -> HostTensor {
        match dtype {
            DType::F16 => HostTensor::F16(values.par_iter().map(|&x| f16::from_f32(x)).collect()),
            DType::Bf16 => {
                HostTensor::Bf16(values.par_iter().map(|&x| bf16::from_f32(x)).collect())
            }
            DType::F32 => HostTensor::F32(values.to_vec()),
        }
    }

    /// A tensor of `len` elements, all NaN (used to poison outputs before a run).
    /// Built in `dtype` directly; device buffers are poisoned on the device
    /// (`cuda::DeviceTensor::nan`).
    pub fn nan(dtype: DType, len: usize) -> HostTensor {
        match dtype {
            DType::F16 => HostTensor::F16(vec![f16::NAN; len]),
            DType::Bf16 => HostTensor::Bf16(vec![bf16::NAN; len]),
            DType::F32 => HostTensor::F32(vec![f32::NAN; len]),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            HostTensor::F16(_) => DType::F16,
            HostTensor::Bf16(_) => DType::Bf16,
            HostTensor::F32(_) => DType::F32,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            HostTensor::F16(v) => v.len(),
            HostTensor::Bf16(v) => v.len(),
            HostTensor::F32(v) => v.len(),
        }
    }

    /// Whether the tensor holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` widened exactly to f32. Panics if `i` is out of range (an internal bug:
    /// every caller indexes through a validated problem).
    pub fn get_f32(&self, i: usize) -> f32 {
        match self {
            HostTensor::F16(v) => v[i].to_f32(),
            HostTensor::Bf16(v) => v[i].to_f32(),
            HostTensor::F32(v) => v[i],
        }
    }

    /// All elements widened to f32.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self {
            HostTensor::F16(v) => v.par_iter().map(|x| x.to_f32()).collect(),
            HostTensor::Bf16(v) => v.par_iter().map(|x| x.to_f32()).collect(),
            HostTensor::F32(v) => v.clone(),
        }
    }

    /// The raw bytes, little-endian, as a device copy takes them.
    pub fn as_bytes(&self) -> &[u8] {
        fn bytes<T: Element>(v: &[T]) -> &[u8] {
            // SAFETY: f16, bf16 and f32 are plain old data with no padding; the slice covers
            // exactly `size_of_val(v)` initialised bytes and u8 has alignment 1.
            unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
        }
        match self {
            HostTensor::F16(v) => bytes(v),
            HostTensor::Bf16(v) => bytes(v),
            HostTensor::F32(v) => bytes(v),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_bits_are_the_quiet_nan_of_each_dtype() {
        assert_eq!(DType::F16.nan_bits(), 0x7E00);
        assert_eq!(DType::Bf16.nan_bits(), 0x7FC0);
        assert_eq!(DType::F32.nan_bits(), 0x7FC0_0000);
        assert!(f16::from_bits(DType::F16.nan_bits() as u16).is_nan());
        assert!(bf16::from_bits(DType::Bf16.nan_bits() as u16).is_nan());
        assert!(f32::from_bits(DType::F32.nan_bits()).is_nan());
    }

    // The device fill (`cuda::DeviceTensor::nan`) writes `nan_bits` per element: the same bytes
    // as the host tensor.
    #[test]
    fn a_nan_tensor_holds_the_nan_bits_of_its_dtype() {
        for dtype in [DType::F16, DType::Bf16, DType::F32] {
            let t = HostTensor::nan(dtype, 3);
            assert_eq!(t.dtype(), dtype);
            assert_eq!(t.len(), 3);
            let size = dtype.size_bytes();
            let pattern = &dtype.nan_bits().to_le_bytes()[..size];
            for element in t.as_bytes().chunks_exact(size) {
                assert_eq!(element, pattern, "{dtype}");
            }
        }
    }
}
