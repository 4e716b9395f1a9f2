//! Array descriptors, and strided reads and writes of host arrays.
//!
//! Python hands every array over as `(address, shape, strides, dtype, device)`: the address of
//! element 0, strides in elements (not bytes), a dtype name (`f16`, `bf16`, `f32`, `i32`, `u8`)
//! and the CUDA ordinal, or -1 for host memory. The package's Python layer builds each
//! descriptor from a live numpy array or torch tensor and keeps the array alive for the call;
//! that is the contract the `unsafe` reads and writes below rely on.

use crate::errors::invalid;
use attnforge::{DType, HostTensor};
use half::{bf16, f16};
use pyo3::prelude::*;

/// One array: `(address, shape, strides, dtype, device)`.
#[derive(Clone, Debug, FromPyObject)]
pub struct ArrayArg(pub u64, pub Vec<usize>, pub Vec<i64>, pub String, pub i64);

impl ArrayArg {
    /// The address of element 0.
    pub fn address(&self) -> u64 {
        self.0
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.1
    }

    /// Strides in elements.
    pub fn strides(&self) -> &[i64] {
        &self.2
    }

    /// The CUDA ordinal, or `None` for host memory.
    pub fn device(&self) -> Option<usize> {
        usize::try_from(self.4).ok()
    }

    /// Elements the shape holds.
    pub fn numel(&self) -> usize {
        self.1.iter().product()
    }

    /// The attention dtype (f16, bf16, f32), or a `ValueError` naming `name`.
    pub fn dtype(&self, name: &str) -> PyResult<DType> {
        match self.3.as_str() {
            "f16" => Ok(DType::F16),
            "bf16" => Ok(DType::Bf16),
            "f32" => Ok(DType::F32),
            other => Err(invalid(
                name,
                format!("has dtype {other}; expected float16, bfloat16 or float32"),
            )),
        }
    }

    /// Checks the rank and that every stride is non-negative.
    pub fn check(&self, name: &str, rank: usize) -> PyResult<()> {
        if self.1.len() != rank || self.2.len() != rank {
            return Err(invalid(
                name,
                format!(
                    "has {} dimensions {:?}; expected {rank}",
                    self.1.len(),
                    self.1
                ),
            ));
        }
        if let Some(s) = self.2.iter().find(|&&s| s < 0) {
            return Err(invalid(name, format!("has a negative stride {s}")));
        }
        Ok(())
    }

    /// Elements from element 0 to one past the last element the view reaches (0 when empty):
    /// the length of the buffer the view lives in, counted from its first element.
    pub fn extent(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        1 + self
            .1
            .iter()
            .zip(&self.2)
            .map(|(&n, &s)| (n - 1) * s as usize)
            .sum::<usize>()
    }

    /// Whether the view is row-major contiguous.
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1i64;
        for (&n, &s) in self.1.iter().zip(&self.2).rev() {
            if n != 1 && s != expected {
                return false;
            }
            expected *= n as i64;
        }
        true
    }

    /// Element offsets of every element, in row-major order of the shape.
    fn offsets(&self) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.numel());
        if self.numel() == 0 {
            return out;
        }
        let rank = self.1.len();
        let mut index = vec![0usize; rank];
        let mut offset = 0usize;
        loop {
            out.push(offset);
            let mut d = rank;
            loop {
                if d == 0 {
                    return out;
                }
                d -= 1;
                index[d] += 1;
                offset += self.2[d] as usize;
                if index[d] < self.1[d] {
                    break;
                }
                offset -= self.2[d] as usize * self.1[d];
                index[d] = 0;
            }
        }
    }

    fn host_only(&self, name: &str) -> PyResult<()> {
        if self.device().is_some() {
            return Err(invalid(name, "is on a CUDA device; expected host memory"));
        }
        self.check(name, self.1.len())
    }

    /// Reads a host array into a contiguous tensor (row-major over the shape).
    pub fn read_host(&self, name: &str) -> PyResult<HostTensor> {
        self.host_only(name)?;
        let offsets = self.offsets();
        // SAFETY: the descriptor comes from a live host array (module docs); every offset is
        // inside it because the shape and strides are its own.
        Ok(unsafe {
            match self.dtype(name)? {
                DType::F16 => HostTensor::F16(self.gather::<u16, _>(&offsets, f16::from_bits)),
                DType::Bf16 => HostTensor::Bf16(self.gather::<u16, _>(&offsets, bf16::from_bits)),
                DType::F32 => HostTensor::F32(self.gather::<u32, _>(&offsets, f32::from_bits)),
            }
        })
    }

    unsafe fn gather<B: Copy, T>(&self, offsets: &[usize], from: impl Fn(B) -> T) -> Vec<T> {
        let base = self.0 as *const B;
        offsets
            .iter()
            .map(|&o| from(unsafe { base.add(o).read_unaligned() }))
            .collect()
    }

    /// Writes a contiguous tensor (row-major over the shape) into the host array.
    pub fn write_host(&self, name: &str, t: &HostTensor) -> PyResult<()> {
        self.host_only(name)?;
        let dtype = self.dtype(name)?;
        if t.dtype() != dtype || t.len() != self.numel() {
            return Err(invalid(
                name,
                format!(
                    "is {} with {} elements; the result is {} with {}",
                    dtype,
                    self.numel(),
                    t.dtype(),
                    t.len()
                ),
            ));
        }
        let offsets = self.offsets();
        // SAFETY: as in `read_host`; the array is writable (outputs are allocated by the package
        // or passed as `out=`, which the Python layer checks).
        unsafe {
            match t {
                HostTensor::F16(v) => self.scatter(&offsets, v, |x| x.to_bits()),
                HostTensor::Bf16(v) => self.scatter(&offsets, v, |x| x.to_bits()),
                HostTensor::F32(v) => self.scatter(&offsets, v, |x| x.to_bits()),
            }
        }
        Ok(())
    }

    /// Writes f32 values (row-major over the shape) into a host f32 array.
    pub fn write_host_f32(&self, name: &str, values: &[f32]) -> PyResult<()> {
        self.write_host(name, &HostTensor::F32(values.to_vec()))
    }

    unsafe fn scatter<B, T: Copy>(&self, offsets: &[usize], values: &[T], to: impl Fn(T) -> B) {
        let base = self.0 as *mut B;
        for (&o, &x) in offsets.iter().zip(values) {
            unsafe { base.add(o).write_unaligned(to(x)) };
        }
    }
}
