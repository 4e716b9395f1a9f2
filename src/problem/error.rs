//! The error every validation in the problem model returns.

use std::fmt;

/// A problem that attnforge rejects before any work: it names the argument and says why.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub struct InvalidProblem {
    /// The argument at fault, e.g. `qo_indptr[3]` or `head_dim_qk`.
    pub field: String,
    /// What is wrong with it, including the value seen.
    pub reason: String,
}

impl InvalidProblem {
    /// A new error for `field`.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> InvalidProblem {
        InvalidProblem {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for InvalidProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {}: {}", self.field, self.reason)
    }
}

/// Shorthand for validation results.
pub type Validation<T = ()> = Result<T, InvalidProblem>;
