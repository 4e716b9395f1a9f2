//! `merge_state`: combining partial attention results over disjoint key sets.
//!
//! A partial result over a key set `A` is `(o_A, lse_A)`: the softmax-weighted mean of the values
//! of `A` and the natural-log sum of `exp(t_j)` over `A`. Two partials over disjoint sets combine
//! into the result over `A ∪ B`:
//!
//! ```text
//! m   = max(lse_A, lse_B),  w_A = exp(lse_A - m),  w_B = exp(lse_B - m)
//! lse = m + ln(w_A + w_B)                       (= ln(exp(lse_A) + exp(lse_B)))
//! o   = (w_A * o_A + w_B * o_B) / (w_A + w_B)   (= exp(lse_A - lse) o_A + exp(lse_B - lse) o_B)
//! ```
//!
//! An empty partial is `(0, -inf)`; merging two empty partials gives `(0, -inf)`, never NaN.
//! This is the basis of split-KV and shared-prefix (cascade) attention.
//!
//! **Partials never include the attention sink.** A sink joins the softmax denominator exactly
//! once, so it is applied after all partials of a row have been merged, with [`apply_sink`]:
//! `lse' = ln(exp(lse) + exp(sink))`, `o' = o * exp(lse - lse')`.
//!
//! The functions are generic over f32 and f64 ([`MergeFloat`]); the reference uses f64, backends
//! f32. Every public function checks its slice lengths and rejects NaN and +inf LSEs with an
//! [`InvalidProblem`] naming the argument.

use crate::problem::{InvalidProblem, Validation};
use std::fmt::Display;
use std::ops::{Add, Div, Mul, Sub};

/// The float types `merge_state` works on (f32 and f64).
pub trait MergeFloat:
    Copy
    + PartialOrd
    + Display
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Send
    + Sync
{
    /// 0.
    const ZERO: Self;
    /// -inf: the LSE of an empty key set.
    const NEG_INFINITY: Self;
    /// `e^self`.
    fn exp(self) -> Self;
    /// Natural log.
    fn ln(self) -> Self;
    /// Whether the value is NaN.
    fn is_nan(self) -> bool;
    /// Whether the value is +inf.
    fn is_pos_infinite(self) -> bool;
}

macro_rules! impl_merge_float {
    ($t:ty) => {
        impl MergeFloat for $t {
            const ZERO: Self = 0.0;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn is_pos_infinite(self) -> bool {
                self == <$t>::INFINITY
            }
        }
    };
}
impl_merge_float!(f32);
impl_merge_float!(f64);

fn check_lse<T: MergeFloat>(name: &str, lse: T) -> Validation {
    if lse.is_nan() || lse.is_pos_infinite() {
        return Err(InvalidProblem::new(
            name,
            format!("is {lse}; an LSE must be finite or -inf"),
        ));
    }
    Ok(())
}

fn check_len(name: &str, len: usize, expected: usize, what: &str) -> Validation {
    if len != expected {
        return Err(InvalidProblem::new(
            name,
            format!("has {len} elements, expected {expected} ({what})"),
        ));
    }
    Ok(())
}

/// Merges one row: `(o_a, lse_a)` and `(o_b, lse_b)` over disjoint key sets into `o` (same
/// length), returning the merged LSE.
pub fn merge_state_into<T: MergeFloat>(
    o_a: &[T],
    lse_a: T,
    o_b: &[T],
    lse_b: T,
    o: &mut [T],
) -> Result<T, InvalidProblem> {
    check_len("o_b", o_b.len(), o_a.len(), "the length of o_a")?;
    check_len("o", o.len(), o_a.len(), "the length of o_a")?;
    check_lse("lse_a", lse_a)?;
    check_lse("lse_b", lse_b)?;
    Ok(merge_row(o_a, lse_a, o_b, lse_b, o))
}

/// Merges one row and returns `(o, lse)`.
pub fn merge_state<T: MergeFloat>(
    o_a: &[T],
    lse_a: T,
    o_b: &[T],
    lse_b: T,
) -> Result<(Vec<T>, T), InvalidProblem> {
    let mut o = vec![T::ZERO; o_a.len()];
    let lse = merge_state_into(o_a, lse_a, o_b, lse_b, &mut o)?;
    Ok((o, lse))
}

/// Merges `rows` rows at once: `o_a`, `o_b` are `[rows, dim]`, `lse_a`, `lse_b` are `[rows]`.
/// Returns `(o [rows, dim], lse [rows])`.
pub fn merge_states<T: MergeFloat>(
    o_a: &[T],
    lse_a: &[T],
    o_b: &[T],
    lse_b: &[T],
    dim: usize,
) -> Result<(Vec<T>, Vec<T>), InvalidProblem> {
    let rows = lse_a.len();
    check_len("lse_b", lse_b.len(), rows, "one LSE per row, like lse_a")?;
    check_len("o_a", o_a.len(), rows * dim, "rows x dim")?;
    check_len("o_b", o_b.len(), rows * dim, "rows x dim")?;
    for r in 0..rows {
        check_lse(&format!("lse_a[{r}]"), lse_a[r])?;
        check_lse(&format!("lse_b[{r}]"), lse_b[r])?;
    }
    let mut o = vec![T::ZERO; rows * dim];
    let mut lse = Vec::with_capacity(rows);
    if dim == 0 {
        lse.extend(
            lse_a
                .iter()
                .zip(lse_b)
                .map(|(&a, &b)| merge_row(&[], a, &[], b, &mut [])),
        );
        return Ok((o, lse));
    }
    for (r, out) in o.chunks_exact_mut(dim).enumerate() {
        let span = r * dim..(r + 1) * dim;
        lse.push(merge_row(
            &o_a[span.clone()],
            lse_a[r],
            &o_b[span],
            lse_b[r],
            out,
        ));
    }
    Ok((o, lse))
}

/// The shape of the states a merge combines: `rows` tokens x `heads` heads, each row of `o`
/// `head_dim` elements long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MergeShape {
    /// Tokens.
    pub rows: usize,
    /// Heads per token.
    pub heads: usize,
    /// Elements of `o` per (token, head).
    pub head_dim: usize,
}

impl MergeShape {
    /// LSEs per state (`rows * heads`).
    pub fn lse_len(&self) -> usize {
        self.rows * self.heads
    }

    /// Elements of `o` per state (`rows * heads * head_dim`).
    pub fn o_len(&self) -> usize {
        self.lse_len() * self.head_dim
    }
}

/// Merges any number of states of one shape: each is `(o [rows, heads, head_dim], lse [rows,
/// heads])`, contiguous. Returns the merged `(o, lse)`. At least one state; the result does not
/// depend on their order beyond rounding.
pub fn merge_many<T: MergeFloat>(
    shape: MergeShape,
    states: &[(&[T], &[T])],
) -> Result<(Vec<T>, Vec<T>), InvalidProblem> {
    let Some(((o0, lse0), rest)) = states.split_first() else {
        return Err(InvalidProblem::new(
            "states",
            "none given; a merge needs at least one",
        ));
    };
    for (c, (o, lse)) in states.iter().enumerate() {
        check_len(
            &format!("o of state {c}"),
            o.len(),
            shape.o_len(),
            "rows x heads x head_dim",
        )?;
        check_len(
            &format!("lse of state {c}"),
            lse.len(),
            shape.lse_len(),
            "rows x heads",
        )?;
    }
    let mut acc = (o0.to_vec(), lse0.to_vec());
    for (o, lse) in rest {
        acc = merge_states(&acc.0, &acc.1, o, lse, shape.head_dim)?;
    }
    if rest.is_empty() {
        // One state merges into itself, except that a row that saw no key is (0, -inf).
        for (r, &l) in acc.1.iter().enumerate() {
            check_lse(&format!("lse of state 0 [{r}]"), l)?;
            if l == T::NEG_INFINITY {
                let span = r * shape.head_dim..(r + 1) * shape.head_dim;
                acc.0[span].iter_mut().for_each(|x| *x = T::ZERO);
            }
        }
    }
    Ok(acc)
}

/// Applies a sink logit to a merged row in place and returns the new LSE:
/// `lse' = ln(exp(lse) + exp(sink))`, `o' = o * exp(lse - lse')`. An empty row (`lse = -inf`)
/// gets `lse' = sink` and keeps `o = 0`.
pub fn apply_sink<T: MergeFloat>(o: &mut [T], lse: T, sink: T) -> Result<T, InvalidProblem> {
    check_lse("lse", lse)?;
    if sink.is_nan() || sink.is_pos_infinite() || sink == T::NEG_INFINITY {
        return Err(InvalidProblem::new(
            "sink",
            format!("is {sink}; a sink logit must be finite"),
        ));
    }
    // The sink is a partial with no value contribution: (0, sink).
    let zeros = vec![T::ZERO; o.len()];
    let a = o.to_vec();
    Ok(merge_row(&a, lse, &zeros, sink, o))
}

/// The merge itself; inputs already checked.
fn merge_row<T: MergeFloat>(o_a: &[T], lse_a: T, o_b: &[T], lse_b: T, o: &mut [T]) -> T {
    let max = if lse_a > lse_b { lse_a } else { lse_b };
    if max == T::NEG_INFINITY {
        o.iter_mut().for_each(|x| *x = T::ZERO);
        return T::NEG_INFINITY;
    }
    // One of the two weights is exactly 1, the other in [0, 1]: no overflow, no 0/0. The
    // output weights are w / (w_a + w_b), equal to exp(lse_x - lse) but not computed from the
    // rounded lse (for |lse| ~ 1e30 in f32, `lse - max` would lose the ln 2 entirely).
    let (w_a, w_b) = ((lse_a - max).exp(), (lse_b - max).exp());
    let total = w_a + w_b;
    let lse = max + total.ln();
    for ((out, &a), &b) in o.iter_mut().zip(o_a).zip(o_b) {
        *out = (w_a * a + w_b * b) / total;
    }
    lse
}
