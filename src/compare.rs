//! Comparing a backend's output with the reference, and the tolerances a backend must meet.
//!
//! [`compare`] takes a whole [`AttentionOutput`] and a whole [`ReferenceOutput`];
//! [`compare_rows`] takes a sample of rows and their [`RowOutput`]s from
//! [`reference::attention_rows`](crate::reference::attention_rows). Both return a
//! [`Comparison`] of error figures, and [`Comparison::passes`] judges it against a [`Tolerance`].
//!
//! What fails, whatever the tolerance:
//! - any NaN or infinity in `o`, any NaN or +inf in the LSE;
//! - an LSE that is `-inf` on one side and finite on the other;
//! - a row whose reference output is exactly zero (a query that sees no key, with or without a
//!   sink — random inputs are never zero, so no other row is) but whose output is not exactly 0;
//! - shapes that do not match.
//!
//! Then `o` is judged by its relative L2 error over all compared rows, and the LSE row by row by
//! `|Δlse| <= lse_abs * max(1, |lse_ref|)` (absolute near 0, relative for the large LSEs that
//! large logits give, where an f32 LSE cannot be closer than its own rounding).

use crate::dtype::DType;
use crate::output::AttentionOutput;
use crate::problem::{AttentionProblem, QkAccum};
use crate::reference::{ReferenceOutput, RowOutput};
use std::fmt;

/// Error figures of one output against the reference.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Comparison {
    /// Rows compared.
    pub rows: usize,
    /// `||o - o_ref||_2 / ||o_ref||_2` (0 if both are 0; inf if only the reference is 0).
    pub rel_l2_o: f64,
    /// Largest `|o - o_ref|`.
    pub max_abs_o: f64,
    /// Largest `|lse - lse_ref|` over rows where both are finite.
    pub max_abs_lse: f64,
    /// Largest `|lse - lse_ref| / max(1, |lse_ref|)`: what [`Tolerance::lse_abs`] bounds.
    pub max_scaled_lse: f64,
    /// Whether the LSE was compared (the output carried one).
    pub lse_compared: bool,
    /// NaN or infinite values in `o`, plus NaN or +inf values in the LSE.
    pub nan_count: usize,
    /// Rows where one LSE is `-inf` and the other is not.
    pub lse_mismatch: usize,
    /// Rows whose reference `o` is exactly 0 but whose output is not.
    pub empty_row_violations: usize,
    /// The flat row index `token * num_qo_heads + head` with the largest `|o - o_ref|`.
    pub worst_row: Option<usize>,
    /// Why the shapes did not match, if they did not (nothing else is then meaningful).
    pub shape_error: Option<String>,
}

/// How close an output must be to the reference.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Bound on [`Comparison::rel_l2_o`].
    pub rel_l2: f64,
    /// Bound on [`Comparison::max_scaled_lse`].
    pub lse_abs: f64,
}

/// Relative L2 tolerance of f16 outputs (f16 keeps 11 significant bits; P·V in f16/f32).
const F16_REL_L2: f64 = 2e-3;
/// Relative L2 tolerance of bf16 outputs (8 significant bits).
const BF16_REL_L2: f64 = 1e-2;
/// Relative L2 tolerance of f32 outputs.
const F32_REL_L2: f64 = 1e-5;
/// LSE tolerance with half-precision inputs (the LSE itself is f32).
const HALF_LSE_ABS: f64 = 1e-3;
/// LSE tolerance with f32 inputs.
const F32_LSE_ABS: f64 = 1e-5;
/// Extra LSE tolerance with f16 QK accumulation: the tensor cores' f16-accumulating MMA is not
/// bit for bit the reference's model of it (each k16 step's exact sum rounded to nearest,
/// `reference::logits`). Measured on an H200, the model reproduces 99.9945% of 2M random
/// `mma.sync.m16n8k16` outputs and the rest differ by up to 2 ulp of f16, at most `2^-9` of the
/// accumulator. A logit takes the accumulator times a constant, and the LSE is a weighted mean of
/// the logits' errors: one such step moves the LSE by up to `2^-9 * |logit|`, 1.4e-3 in a one-key
/// row of a head-dim-256 case (`attnforge verify --backend cuda --suite full --filter qk16`
/// checks every f16-accumulation case against it).
const F16_ACCUM_LSE_SLACK: f64 = 1.0 / 512.0;
/// Relative L2 tolerance of the GPU reference against the exact reference.
const GPU_REFERENCE_REL_L2: f64 = 1e-4;
/// LSE tolerance of the GPU reference against the exact reference.
const GPU_REFERENCE_LSE_ABS: f64 = 5e-5;

impl Tolerance {
    /// The tolerance for results of this dtype.
    pub fn for_dtype(dtype: DType) -> Tolerance {
        match dtype {
            DType::F16 => Tolerance {
                rel_l2: F16_REL_L2,
                lse_abs: HALF_LSE_ABS,
            },
            DType::Bf16 => Tolerance {
                rel_l2: BF16_REL_L2,
                lse_abs: HALF_LSE_ABS,
            },
            DType::F32 => Tolerance {
                rel_l2: F32_REL_L2,
                lse_abs: F32_LSE_ABS,
            },
        }
    }

    /// How close the GPU reference (`cuda::Engine::reference_attention`: f32 arithmetic on the
    /// problem's inputs) must be to the exact reference: 1e-4 relative L2 and 5e-5 LSE, which an
    /// f32 softmax over tens of thousands of keys meets with room (its rounding grows like
    /// `sqrt(keys) * 6e-8`) and which is 20x tighter than the f16 tolerance it then judges
    /// kernels with (bf16: 100x).
    pub fn gpu_reference() -> Tolerance {
        Tolerance {
            rel_l2: GPU_REFERENCE_REL_L2,
            lse_abs: GPU_REFERENCE_LSE_ABS,
        }
    }

    /// The looser of the tolerances of the problem's input and output dtypes; with f16 QK
    /// accumulation the LSE's widened by `F16_ACCUM_LSE_SLACK` (the hardware's rounding differs
    /// from the reference's model by up to 2 ulp of f16, rarely).
    pub fn for_problem(p: &AttentionProblem) -> Tolerance {
        let (a, b) = (
            Tolerance::for_dtype(p.input_dtype),
            Tolerance::for_dtype(p.output_dtype),
        );
        let accum_slack = match p.qk_accum {
            QkAccum::F32 => 0.0,
            QkAccum::F16 => F16_ACCUM_LSE_SLACK,
        };
        Tolerance {
            rel_l2: a.rel_l2.max(b.rel_l2),
            lse_abs: a.lse_abs.max(b.lse_abs) + accum_slack,
        }
    }
}

impl Comparison {
    /// Whether the output is within `tol` and free of every hard failure (see the module doc).
    pub fn passes(&self, tol: &Tolerance) -> bool {
        self.shape_error.is_none()
            && self.nan_count == 0
            && self.lse_mismatch == 0
            && self.empty_row_violations == 0
            && self.rel_l2_o <= tol.rel_l2
            && (!self.lse_compared || self.max_scaled_lse <= tol.lse_abs)
    }
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(e) = &self.shape_error {
            return write!(f, "shape mismatch: {e}");
        }
        write!(
            f,
            "rel_l2(o) {:.2e}, max|Δo| {:.2e}",
            self.rel_l2_o, self.max_abs_o
        )?;
        if self.lse_compared {
            write!(f, ", max|Δlse| {:.2e}", self.max_abs_lse)?;
        } else {
            write!(f, ", lse not compared")?;
        }
        write!(
            f,
            ", {} NaN/inf, {} lse -inf mismatches, {} empty-row violations over {} rows",
            self.nan_count, self.lse_mismatch, self.empty_row_violations, self.rows
        )?;
        if let Some(row) = self.worst_row {
            write!(f, " (worst row {row})")?;
        }
        Ok(())
    }
}

/// Compares a whole output with the whole reference.
pub fn compare(out: &AttentionOutput, reference: &ReferenceOutput) -> Comparison {
    let rows = reference.lse.len();
    if rows == 0 {
        return shape_check(out.o.len(), 0, out.lse.as_ref().map(Vec::len), 0).unwrap_or_default();
    }
    let dim = reference.o.len() / rows;
    if let Some(bad) = shape_check(
        out.o.len(),
        reference.o.len(),
        out.lse.as_ref().map(Vec::len),
        rows,
    ) {
        return bad;
    }
    let mut acc = Accumulator::new(out.lse.is_some());
    for r in 0..rows {
        let ref_row = &reference.o[r * dim..(r + 1) * dim];
        acc.row(
            r,
            |e| f64::from(out.o.get_f32(r * dim + e)),
            out.lse.as_ref().map(|l| l[r]),
            ref_row,
            reference.lse[r],
        );
    }
    acc.finish()
}

/// Compares sampled rows `(query token, query head)` of a whole output with their reference rows
/// (from [`reference::attention_rows`](crate::reference::attention_rows), same order).
pub fn compare_rows(
    out: &AttentionOutput,
    num_qo_heads: usize,
    rows: &[(usize, usize)],
    reference: &[RowOutput],
) -> Comparison {
    let mismatch = |why: String| Comparison {
        shape_error: Some(why),
        ..Comparison::default()
    };
    if rows.len() != reference.len() {
        return mismatch(format!(
            "{} rows sampled but {} reference rows",
            rows.len(),
            reference.len()
        ));
    }
    let dim = reference.first().map_or(0, |r| r.o.len());
    let mut acc = Accumulator::new(out.lse.is_some());
    for (&(token, head), ref_row) in rows.iter().zip(reference) {
        let row = token * num_qo_heads + head;
        let end = (row + 1) * dim;
        let lse_ok = out.lse.as_ref().is_none_or(|l| row < l.len());
        if head >= num_qo_heads || end > out.o.len() || ref_row.o.len() != dim || !lse_ok {
            return mismatch(format!(
                "row (token {token}, head {head}) is outside the output ({} o elements, {num_qo_heads} heads, dim {dim})",
                out.o.len()
            ));
        }
        acc.row(
            row,
            |e| f64::from(out.o.get_f32(row * dim + e)),
            out.lse.as_ref().map(|l| l[row]),
            &ref_row.o,
            ref_row.lse,
        );
    }
    acc.finish()
}

fn shape_check(
    o_len: usize,
    ref_o_len: usize,
    lse_len: Option<usize>,
    rows: usize,
) -> Option<Comparison> {
    let why = if o_len != ref_o_len {
        format!("o has {o_len} elements, the reference {ref_o_len}")
    } else if lse_len.is_some_and(|l| l != rows) {
        format!(
            "lse has {} entries, the reference {rows}",
            lse_len.unwrap_or(0)
        )
    } else {
        return None;
    };
    Some(Comparison {
        shape_error: Some(why),
        ..Comparison::default()
    })
}

/// Running sums over compared rows.
struct Accumulator {
    cmp: Comparison,
    diff_sq: f64,
    ref_sq: f64,
}

impl Accumulator {
    fn new(lse_compared: bool) -> Accumulator {
        Accumulator {
            cmp: Comparison {
                lse_compared,
                ..Comparison::default()
            },
            diff_sq: 0.0,
            ref_sq: 0.0,
        }
    }

    fn row(
        &mut self,
        at: usize,
        out_o: impl Fn(usize) -> f64,
        out_lse: Option<f32>,
        ref_o: &[f64],
        ref_lse: f64,
    ) {
        let c = &mut self.cmp;
        c.rows += 1;
        let ref_is_zero = ref_o.iter().all(|&x| x == 0.0);
        let mut row_nonzero = false;
        for (e, &r) in ref_o.iter().enumerate() {
            let o = out_o(e);
            if !o.is_finite() {
                c.nan_count += 1;
                continue;
            }
            row_nonzero |= o != 0.0;
            let d = (o - r).abs();
            self.diff_sq += d * d;
            self.ref_sq += r * r;
            if d > c.max_abs_o {
                c.max_abs_o = d;
                c.worst_row = Some(at);
            }
        }
        if ref_is_zero && row_nonzero {
            c.empty_row_violations += 1;
        }
        if let Some(lse) = out_lse.map(f64::from) {
            if lse.is_nan() || lse == f64::INFINITY {
                c.nan_count += 1;
            } else if (lse == f64::NEG_INFINITY) != (ref_lse == f64::NEG_INFINITY) {
                c.lse_mismatch += 1;
            } else if ref_lse.is_finite() {
                let d = (lse - ref_lse).abs();
                c.max_abs_lse = c.max_abs_lse.max(d);
                c.max_scaled_lse = c.max_scaled_lse.max(d / ref_lse.abs().max(1.0));
            }
        }
    }

    fn finish(mut self) -> Comparison {
        self.cmp.rel_l2_o = if self.ref_sq > 0.0 {
            (self.diff_sq / self.ref_sq).sqrt()
        } else if self.diff_sq == 0.0 {
            0.0
        } else {
            f64::INFINITY
        };
        self.cmp
    }
}
