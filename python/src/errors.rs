//! attnforge's errors as Python exceptions: bad input is a `ValueError`, a valid request that a
//! backend does not run is a `NotImplementedError`, and a failure of the driver or the JIT is a
//! `RuntimeError`; each carries the Rust error's message.

use attnforge::cuda::CudaError;
use attnforge::problem::InvalidProblem;
use attnforge::Error;
use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError, PyValueError};
use pyo3::PyErr;

/// The Python exception for an attnforge error.
pub fn to_py(e: Error) -> PyErr {
    let message = e.to_string();
    match e {
        Error::InvalidProblem(_) | Error::Cuda(CudaError::Buffer { .. }) => {
            PyValueError::new_err(message)
        }
        Error::Unsupported { .. } => PyNotImplementedError::new_err(message),
        Error::Jit(_) | Error::Cuda(_) => PyRuntimeError::new_err(message),
    }
}

/// A `ValueError` naming `field`, worded as the problem model words its own.
pub fn invalid(field: &str, reason: impl Into<String>) -> PyErr {
    to_py(InvalidProblem::new(field, reason).into())
}

/// A `NotImplementedError` for `what`.
pub fn unsupported(what: impl Into<String>) -> PyErr {
    PyNotImplementedError::new_err(what.into())
}

/// Converts any attnforge-side result.
pub trait IntoPy<T> {
    /// The value, or the Python exception for the error.
    fn py(self) -> Result<T, PyErr>;
}

impl<T, E: Into<Error>> IntoPy<T> for Result<T, E> {
    fn py(self) -> Result<T, PyErr> {
        self.map_err(|e| to_py(e.into()))
    }
}
