//! Array descriptors, and strided reads and writes of host arrays.
//!
//! Python hands every array over as the array object itself: a torch tensor (read through its
//! public attributes `data_ptr()`, `shape`, `stride()`, `dtype`, `is_cuda`, `get_device()`, so
//! nothing here depends on torch's binary interface) or a numpy array (read through its
//! `__array_struct__`). [`ArrayArg`] is what is read: the address of element 0, the shape,
//! strides in elements (not bytes), the dtype and the CUDA ordinal, or none for host memory.
//! The caller keeps the array alive for the call; that is the contract the `unsafe` reads and
//! writes below rely on.

use crate::errors::invalid;
use attnforge::dtype::fp8::{Fp8Format, Fp8Tensor};
use attnforge::{DType, HostTensor};
use half::{bf16, f16};
use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCapsule, PyType};

/// The element type of an array: a float type, or the codes of an fp8 KV cache (one byte each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// float16, bfloat16 or float32.
    Float(DType),
    /// fp8 codes: a torch `float8_e4m3fn` / `float8_e5m2` tensor, or a numpy `uint8` array read
    /// as the codes of the format the plan names.
    Fp8(Fp8Format),
}

impl Elem {
    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            Elem::Float(d) => d.size_bytes(),
            Elem::Fp8(_) => 1,
        }
    }
}

impl std::fmt::Display for Elem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Elem::Float(d) => write!(f, "{d}"),
            Elem::Fp8(format) => write!(f, "{format}"),
        }
    }
}

/// One array, as read from its Python object.
#[derive(Clone, Debug)]
pub struct ArrayArg {
    address: u64,
    shape: Vec<usize>,
    strides: Vec<i64>,
    elem: Elem,
    device: Option<usize>,
    writable: bool,
}

static NDARRAY: PyOnceLock<Py<PyType>> = PyOnceLock::new();

impl ArrayArg {
    /// Reads `obj`, a numpy array or a torch tensor; `TypeError` for anything else, `ValueError`
    /// (naming `name`) for an element type other than float16, bfloat16 (torch) or float32, or a
    /// device other than the CPU or a CUDA device.
    pub fn read(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<ArrayArg> {
        let a = ArrayArg::read_cache(obj, name, None)?;
        match a.elem {
            Elem::Float(_) => Ok(a),
            Elem::Fp8(format) => Err(invalid(
                name,
                format!("holds {format} codes; expected float16, bfloat16 or float32"),
            )),
        }
    }

    /// [`read`](Self::read) for the arrays of a paged KV cache, which may also hold fp8 codes:
    /// a torch `float8_e4m3fn` or `float8_e5m2` tensor, or, when `fp8` names the format the
    /// plan was made for, a numpy `uint8` array (numpy has no fp8 type) read as its codes.
    pub fn read_cache(
        obj: &Bound<'_, PyAny>,
        name: &str,
        fp8: Option<Fp8Format>,
    ) -> PyResult<ArrayArg> {
        let py = obj.py();
        if obj.is_instance(NDARRAY.import(py, "numpy", "ndarray")?)? {
            return read_numpy(obj, name, fp8);
        }
        match obj.getattr(intern!(py, "data_ptr")) {
            Ok(data_ptr) => read_torch(obj, &data_ptr, name),
            Err(_) => Err(PyTypeError::new_err(format!(
                "{name} must be a numpy array or a torch tensor, not {}",
                obj.get_type().name()?
            ))),
        }
    }

    /// [`read`](Self::read) for an array the call writes: a read-only numpy array is a
    /// `ValueError`.
    pub fn read_out(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<ArrayArg> {
        let a = ArrayArg::read(obj, name)?;
        if !a.writable() {
            return Err(invalid(name, "the array is read-only"));
        }
        Ok(a)
    }

    /// The same array seen through another shape and strides (a view of the same memory).
    pub fn with_view(&self, shape: Vec<usize>, strides: Vec<i64>) -> ArrayArg {
        ArrayArg {
            shape,
            strides,
            ..self.clone()
        }
    }

    /// The address of element 0.
    pub fn address(&self) -> u64 {
        self.address
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Strides in elements.
    pub fn strides(&self) -> &[i64] {
        &self.strides
    }

    /// The CUDA ordinal, or `None` for host memory.
    pub fn device(&self) -> Option<usize> {
        self.device
    }

    /// Elements the shape holds.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The element type.
    pub fn elem(&self) -> Elem {
        self.elem
    }

    /// The float element type; a `ValueError` naming `name` for fp8 codes (only
    /// [`read_cache`](Self::read_cache) reads those).
    pub fn dtype(&self, name: &str) -> PyResult<DType> {
        match self.elem {
            Elem::Float(d) => Ok(d),
            Elem::Fp8(format) => Err(invalid(
                name,
                format!("holds {format} codes; expected float16, bfloat16 or float32"),
            )),
        }
    }

    /// Whether the call may write the array.
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// Checks the rank and that every stride is non-negative.
    pub fn check(&self, name: &str, rank: usize) -> PyResult<()> {
        if self.shape.len() != rank || self.strides.len() != rank {
            return Err(invalid(
                name,
                format!(
                    "has {} dimensions {:?}; expected {rank}",
                    self.shape.len(),
                    self.shape
                ),
            ));
        }
        if let Some(s) = self.strides.iter().find(|&&s| s < 0) {
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
            .shape
            .iter()
            .zip(&self.strides)
            .map(|(&n, &s)| (n - 1) * s as usize)
            .sum::<usize>()
    }

    /// Whether the view is row-major contiguous.
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1i64;
        for (&n, &s) in self.shape.iter().zip(&self.strides).rev() {
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
        let rank = self.shape.len();
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
                offset += self.strides[d] as usize;
                if index[d] < self.shape[d] {
                    break;
                }
                offset -= self.strides[d] as usize * self.shape[d];
                index[d] = 0;
            }
        }
    }

    fn host_only(&self, name: &str) -> PyResult<()> {
        if self.device().is_some() {
            return Err(invalid(name, "is on a CUDA device; expected host memory"));
        }
        self.check(name, self.shape.len())
    }

    /// Reads a host array into a contiguous tensor (row-major over the shape).
    pub fn read_host(&self, name: &str) -> PyResult<HostTensor> {
        let dtype = self.dtype(name)?;
        self.host_only(name)?;
        let offsets = self.offsets();
        // SAFETY: the descriptor comes from a live host array (module docs); every offset is
        // inside it because the shape and strides are its own.
        Ok(unsafe {
            match dtype {
                DType::F16 => HostTensor::F16(self.gather::<u16, _>(&offsets, f16::from_bits)),
                DType::Bf16 => HostTensor::Bf16(self.gather::<u16, _>(&offsets, bf16::from_bits)),
                DType::F32 => HostTensor::F32(self.gather::<u32, _>(&offsets, f32::from_bits)),
            }
        })
    }

    /// Reads a host array of fp8 codes into a contiguous tensor (row-major over the shape).
    pub fn read_host_codes(&self, name: &str) -> PyResult<Fp8Tensor> {
        let Elem::Fp8(format) = self.elem else {
            return Err(invalid(
                name,
                format!("has dtype {}; expected fp8 codes", self.elem),
            ));
        };
        self.host_only(name)?;
        let offsets = self.offsets();
        // SAFETY: as in `read_host`.
        let codes = unsafe { self.gather::<u8, _>(&offsets, |c| c) };
        Ok(Fp8Tensor { format, codes })
    }

    /// Writes fp8 codes (row-major over the shape, of this array's format) into the host array.
    pub fn write_host_codes(&self, name: &str, t: &Fp8Tensor) -> PyResult<()> {
        self.host_only(name)?;
        if !self.writable {
            return Err(invalid(name, "the array is read-only"));
        }
        if self.elem != Elem::Fp8(t.format) || t.len() != self.numel() {
            return Err(invalid(
                name,
                format!(
                    "is {} with {} elements; the result is {} with {}",
                    self.elem,
                    self.numel(),
                    t.format,
                    t.len()
                ),
            ));
        }
        let offsets = self.offsets();
        // SAFETY: as in `read_host`; the array is writable (checked above).
        unsafe { self.scatter(&offsets, &t.codes, |c| c) };
        Ok(())
    }

    unsafe fn gather<B: Copy, T>(&self, offsets: &[usize], from: impl Fn(B) -> T) -> Vec<T> {
        let base = self.address as *const B;
        offsets
            .iter()
            .map(|&o| from(unsafe { base.add(o).read_unaligned() }))
            .collect()
    }

    /// Writes a contiguous tensor (row-major over the shape) into the host array.
    pub fn write_host(&self, name: &str, t: &HostTensor) -> PyResult<()> {
        self.host_only(name)?;
        if !self.writable {
            return Err(invalid(name, "the array is read-only"));
        }
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
        // SAFETY: as in `read_host`; the array is writable (checked above).
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
        let base = self.address as *mut B;
        for (&o, &x) in offsets.iter().zip(values) {
            unsafe { base.add(o).write_unaligned(to(x)) };
        }
    }
}

/// What [`describe`] returns.
type Descriptor = (u64, Vec<usize>, Vec<i64>, &'static str, i64);

/// `(address, shape, strides in elements, dtype, CUDA ordinal or -1)` of `obj` as every call
/// reads it: the same `TypeError` / `ValueError` (naming `name`) for what attnforge does not
/// take. For the Python layer, which reads shapes before the native call.
#[pyfunction]
pub fn describe(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Descriptor> {
    let a = ArrayArg::read(obj, name)?;
    let dtype = match a.dtype(name)? {
        DType::F16 => "f16",
        DType::Bf16 => "bf16",
        DType::F32 => "f32",
    };
    let device = a.device.map_or(-1, |d| d as i64);
    Ok((a.address, a.shape, a.strides, dtype, device))
}

/// attnforge's element type of a torch dtype name (`torch.bfloat16`, `torch.float8_e4m3fn`...).
fn elem_of_name(dtype: &str) -> Option<Elem> {
    match dtype.strip_prefix("torch.").unwrap_or(dtype) {
        "float16" => Some(Elem::Float(DType::F16)),
        "bfloat16" => Some(Elem::Float(DType::Bf16)),
        "float32" => Some(Elem::Float(DType::F32)),
        "float8_e4m3fn" => Some(Elem::Fp8(Fp8Format::E4m3)),
        "float8_e5m2" => Some(Elem::Fp8(Fp8Format::E5m2)),
        _ => None,
    }
}

/// numpy's `PyArrayInterface`, the C struct behind `__array_struct__` (numpy's array interface
/// protocol, version 3).
#[repr(C)]
struct ArrayStruct {
    two: std::ffi::c_int,
    nd: std::ffi::c_int,
    typekind: std::ffi::c_char,
    itemsize: std::ffi::c_int,
    flags: std::ffi::c_int,
    shape: *const isize,
    strides: *const isize,
    data: *mut std::ffi::c_void,
    descr: *mut std::ffi::c_void,
}

/// `ArrayStruct::flags`: the bytes are in the machine's order, and may be written.
const NOTSWAPPED: std::ffi::c_int = 0x200;
const WRITEABLE: std::ffi::c_int = 0x400;

/// A numpy array, through its `__array_struct__` (one capsule: no dict, no strings); byte
/// strides in whole elements. A `uint8` array is read as codes of `fp8` when given.
fn read_numpy(obj: &Bound<'_, PyAny>, name: &str, fp8: Option<Fp8Format>) -> PyResult<ArrayArg> {
    let py = obj.py();
    let capsule = obj.getattr(intern!(py, "__array_struct__"))?;
    let capsule = capsule.cast::<PyCapsule>()?;
    // SAFETY: numpy's capsule holds a PyArrayInterface (checked by `two`) that lives, with the
    // shape and strides it points to, as long as the capsule, which outlives every read here.
    let s = unsafe {
        capsule
            .pointer_checked(None)?
            .cast::<ArrayStruct>()
            .as_ref()
    };
    let bad_dtype = || -> PyResult<PyErr> {
        let dtype = obj.getattr(intern!(py, "dtype"))?.str()?;
        let expected = if fp8.is_some() {
            "float16, float32 or uint8 (fp8 codes)"
        } else {
            "float16 or float32 (uint8 fp8 codes only with a plan's fp8 kv_data_type)"
        };
        Ok(invalid(
            name,
            format!("has dtype {dtype}; expected {expected}"),
        ))
    };
    if s.two != 2 || s.flags & NOTSWAPPED == 0 {
        return Err(bad_dtype()?);
    }
    let elem = match (s.typekind as u8, s.itemsize, fp8) {
        (b'f', 2, _) => Elem::Float(DType::F16),
        (b'f', 4, _) => Elem::Float(DType::F32),
        (b'u', 1, Some(format)) => Elem::Fp8(format),
        _ => return Err(bad_dtype()?),
    };
    let nd = usize::try_from(s.nd).unwrap_or(0);
    // SAFETY: `shape` (and `strides`, when not null) hold `nd` entries (the protocol).
    let shape: Vec<usize> = (0..nd)
        .map(|d| unsafe { *s.shape.add(d) } as usize)
        .collect();
    let strides = if s.strides.is_null() {
        row_major(&shape)
    } else {
        let size = s.itemsize as isize;
        let bytes: Vec<isize> = (0..nd).map(|d| unsafe { *s.strides.add(d) }).collect();
        if bytes.iter().any(|b| b % size != 0) {
            return Err(invalid(
                name,
                format!("strides {bytes:?} are not whole elements"),
            ));
        }
        bytes.iter().map(|&b| (b / size) as i64).collect()
    };
    Ok(ArrayArg {
        address: s.data as u64,
        shape,
        strides,
        elem,
        device: None,
        writable: s.flags & WRITEABLE != 0,
    })
}

/// Row-major element strides of `shape`.
fn row_major(shape: &[usize]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1] as i64;
    }
    strides
}

/// A torch tensor (or an object with the same attributes), `data_ptr` its bound method.
fn read_torch(
    obj: &Bound<'_, PyAny>,
    data_ptr: &Bound<'_, PyAny>,
    name: &str,
) -> PyResult<ArrayArg> {
    let py = obj.py();
    let dtype_obj = obj.getattr(intern!(py, "dtype"))?;
    let dtype_name = dtype_obj.str()?;
    let elem = elem_of_name(&dtype_name.to_cow()?).ok_or_else(|| {
        invalid(
            name,
            format!("has dtype {dtype_name}; expected float16, bfloat16 or float32"),
        )
    })?;
    let device = if obj.getattr(intern!(py, "is_cuda"))?.is_truthy()? {
        let ordinal: i64 = obj.call_method0(intern!(py, "get_device"))?.extract()?;
        Some(
            usize::try_from(ordinal)
                .map_err(|_| invalid(name, format!("reports CUDA device {ordinal}")))?,
        )
    } else {
        let device = obj.getattr(intern!(py, "device"))?;
        let kind = device.getattr(intern!(py, "type"))?;
        if kind.str()?.to_cow()? != "cpu" {
            return Err(invalid(
                name,
                format!("is on {}; expected cpu or cuda", device.str()?),
            ));
        }
        None
    };
    Ok(ArrayArg {
        address: data_ptr.call0()?.extract()?,
        shape: obj.getattr(intern!(py, "shape"))?.extract()?,
        strides: obj.call_method0(intern!(py, "stride"))?.extract()?,
        elem,
        device,
        writable: true,
    })
}
