//! Head dimensions: the supported (qk, vo) pairs, checked once, never truncated.

use super::error::{InvalidProblem, Validation};
use std::fmt;

/// The (head_dim_qk, head_dim_vo) pairs attnforge supports.
pub const SUPPORTED_HEAD_DIMS: [(usize, usize); 4] = [(64, 64), (128, 128), (256, 256), (192, 128)];

/// A validated pair of head dimensions: `qk` for queries and keys, `vo` for values and output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct HeadDims {
    qk: usize,
    vo: usize,
}

impl HeadDims {
    /// Checks `(qk, vo)` against [`SUPPORTED_HEAD_DIMS`]. Any other pair is an error that lists
    /// the supported ones: a head dim is never rounded or truncated to a supported one.
    pub fn new(qk: usize, vo: usize) -> Validation<HeadDims> {
        if SUPPORTED_HEAD_DIMS.contains(&(qk, vo)) {
            Ok(HeadDims { qk, vo })
        } else {
            Err(InvalidProblem::new(
                "head_dim",
                format!(
                    "(qk {qk}, vo {vo}) is not supported; supported (qk, vo): {}",
                    supported_list()
                ),
            ))
        }
    }

    /// The same head dim for qk and vo.
    pub fn equal(d: usize) -> Validation<HeadDims> {
        HeadDims::new(d, d)
    }

    /// Head dim of queries and keys.
    pub fn qk(self) -> usize {
        self.qk
    }

    /// Head dim of values and the output.
    pub fn vo(self) -> usize {
        self.vo
    }

    /// Every supported pair.
    pub fn all() -> impl Iterator<Item = HeadDims> {
        SUPPORTED_HEAD_DIMS
            .iter()
            .map(|&(qk, vo)| HeadDims { qk, vo })
    }

    /// Parses `128` or `192/128` (qk/vo).
    pub fn parse(s: &str) -> Validation<HeadDims> {
        let bad =
            || InvalidProblem::new("head_dim", format!("{s:?} is not a number or a pair qk/vo"));
        match s.split_once('/') {
            Some((a, b)) => HeadDims::new(
                a.trim().parse().map_err(|_| bad())?,
                b.trim().parse().map_err(|_| bad())?,
            ),
            None => HeadDims::equal(s.trim().parse().map_err(|_| bad())?),
        }
    }
}

fn supported_list() -> String {
    SUPPORTED_HEAD_DIMS
        .iter()
        .map(|(q, v)| format!("({q}, {v})"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for HeadDims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.qk == self.vo {
            write!(f, "{}", self.qk)
        } else {
            write!(f, "{}/{}", self.qk, self.vo)
        }
    }
}
