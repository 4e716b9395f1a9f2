//! Masks: which keys a query may see, within one request.
//!
//! Positions are local to a request. With `d = kv_len - qo_len` the queries are the last
//! `qo_len` positions of the sequence, so query `i` sits at position `i + d`.

use super::error::{InvalidProblem, Validation};

/// Which keys each query sees. `docs/semantics.md` gives the formulas.
#[derive(Clone, Debug, PartialEq)]
pub enum Mask {
    /// Every query sees every key of its request.
    None,
    /// Query `i` sees key `j` iff `j <= i + d`.
    Causal,
    /// Causal, and additionally `j >= i + d - window_left`.
    SlidingWindow {
        /// How many keys to the left of the diagonal stay visible (`W >= 0`).
        window_left: i64,
    },
    /// A bit-packed boolean mask per request.
    Custom(CustomMask),
}

/// The kind of a [`Mask`] without its data: what changes the generated kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum MaskKind {
    /// [`Mask::None`].
    None,
    /// [`Mask::Causal`].
    Causal,
    /// [`Mask::SlidingWindow`].
    SlidingWindow,
    /// [`Mask::Custom`].
    Custom,
}

impl MaskKind {
    /// Every mask kind.
    pub const ALL: [MaskKind; 4] = [
        MaskKind::None,
        MaskKind::Causal,
        MaskKind::SlidingWindow,
        MaskKind::Custom,
    ];

    /// Short name used in kernel names and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            MaskKind::None => "none",
            MaskKind::Causal => "causal",
            MaskKind::SlidingWindow => "window",
            MaskKind::Custom => "custom",
        }
    }
}

/// A boolean mask per request, bit-packed.
///
/// Request `r` (with `qo_len` queries and `kv_len` keys) owns the bytes starting at
/// `mask_indptr[r]`; its bit `b = i * kv_len + j` (row-major over query, key) is bit `b % 8` of
/// byte `b / 8` of that segment (little-endian bit order). A set bit means visible.
/// `mask_indptr` has `batch + 1` entries; each segment must hold at least
/// `ceil(qo_len * kv_len / 8)` bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CustomMask {
    /// The packed bits of every request, one segment after another.
    pub packed: Vec<u8>,
    /// Byte offset of each request's segment, plus the end.
    pub mask_indptr: Vec<usize>,
}

impl CustomMask {
    /// Packs one boolean matrix per request (`masks[r][i * kv_len + j]`), each padded to whole bytes.
    pub fn pack(masks: &[Vec<bool>]) -> CustomMask {
        let mut packed = Vec::new();
        let mut mask_indptr = vec![0];
        for m in masks {
            let start = packed.len();
            packed.resize(start + m.len().div_ceil(8), 0u8);
            for (b, &visible) in m.iter().enumerate() {
                if visible {
                    packed[start + b / 8] |= 1 << (b % 8);
                }
            }
            mask_indptr.push(packed.len());
        }
        CustomMask {
            packed,
            mask_indptr,
        }
    }

    /// Whether query `i` of request `r` sees key `j`. The caller has validated the mask.
    pub fn visible(&self, r: usize, kv_len: usize, i: usize, j: usize) -> bool {
        let b = i * kv_len + j;
        self.packed[self.mask_indptr[r] + b / 8] >> (b % 8) & 1 == 1
    }

    /// Checks the segments against the request lengths `(qo_len, kv_len)`.
    pub fn validate(&self, lens: &[(usize, usize)]) -> Validation {
        if self.mask_indptr.len() != lens.len() + 1 {
            return Err(InvalidProblem::new(
                "mask_indptr",
                format!(
                    "has {} entries, expected batch + 1 = {}",
                    self.mask_indptr.len(),
                    lens.len() + 1
                ),
            ));
        }
        for (r, &(qo, kv)) in lens.iter().enumerate() {
            let (start, end) = (self.mask_indptr[r], self.mask_indptr[r + 1]);
            if end < start {
                return Err(InvalidProblem::new(
                    format!("mask_indptr[{}]", r + 1),
                    format!("{end} is less than mask_indptr[{r}] = {start}"),
                ));
            }
            let need = (qo * kv).div_ceil(8);
            if end - start < need {
                return Err(InvalidProblem::new(
                    format!("custom mask of request {r}"),
                    format!(
                        "has {} bytes, needs {need} for {qo} x {kv} bits",
                        end - start
                    ),
                ));
            }
        }
        let last = *self.mask_indptr.last().unwrap_or(&0);
        if last > self.packed.len() {
            return Err(InvalidProblem::new(
                "custom mask",
                format!(
                    "mask_indptr ends at byte {last} but the packed mask has {} bytes",
                    self.packed.len()
                ),
            ));
        }
        Ok(())
    }
}

impl Mask {
    /// The kind of this mask.
    pub fn kind(&self) -> MaskKind {
        match self {
            Mask::None => MaskKind::None,
            Mask::Causal => MaskKind::Causal,
            Mask::SlidingWindow { .. } => MaskKind::SlidingWindow,
            Mask::Custom(_) => MaskKind::Custom,
        }
    }

    /// Whether query `i` sees key `j` in request `r` of lengths (`qo_len`, `kv_len`), before any
    /// variant's own mask. This is the definition the reference and the kernels implement.
    pub fn visible(&self, r: usize, qo_len: usize, kv_len: usize, i: usize, j: usize) -> bool {
        let diag = i as i64 + kv_len as i64 - qo_len as i64;
        let j = j as i64;
        match self {
            Mask::None => true,
            Mask::Causal => j <= diag,
            Mask::SlidingWindow { window_left } => j <= diag && j >= diag - window_left,
            Mask::Custom(m) => m.visible(r, kv_len, i, j as usize),
        }
    }

    /// Checks the mask's own parameters against the request lengths.
    pub fn validate(&self, lens: &[(usize, usize)]) -> Validation {
        match self {
            Mask::None | Mask::Causal => Ok(()),
            Mask::SlidingWindow { window_left } if *window_left < 0 => Err(InvalidProblem::new(
                "window_left",
                format!("{window_left} is negative; a sliding window needs window_left >= 0"),
            )),
            Mask::SlidingWindow { window_left } if *window_left > i32::MAX as i64 => Err(
                InvalidProblem::new("window_left", format!("{window_left} exceeds {}", i32::MAX)),
            ),
            Mask::SlidingWindow { .. } => Ok(()),
            Mask::Custom(m) => m.validate(lens),
        }
    }
}
