//! Host tensors: flat buffers of one [`DType`] that the CPU backends and the tests use.
//!
//! Shapes and strides live in the problem model ([`crate::problem`]); a host tensor is only its
//! elements, so one buffer can back several views (a fused QKV buffer, for example).

use crate::dtype::{DType, Element};
use half::{bf16, f16};

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
            DType::F16 => HostTensor::F16(values.iter().map(|&x| f16::from_f32(x)).collect()),
            DType::Bf16 => HostTensor::Bf16(values.iter().map(|&x| bf16::from_f32(x)).collect()),
            DType::F32 => HostTensor::F32(values.to_vec()),
        }
    }

    /// A tensor of `len` elements, all NaN (used to poison outputs before a run).
    pub fn nan(dtype: DType, len: usize) -> HostTensor {
        HostTensor::from_f32(dtype, &vec![f32::NAN; len])
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
            HostTensor::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            HostTensor::Bf16(v) => v.iter().map(|x| x.to_f32()).collect(),
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
