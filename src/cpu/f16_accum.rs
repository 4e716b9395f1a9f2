//! Emulation of f16 QK accumulation (`QkAccum::F16`) on the CPU backend.
//!
//! The tensor cores' `mma.m16n8k16` with f16 accumulators adds each 16-wide chunk of the dot
//! product to an f16 accumulator and rounds after each chunk. Here: q is pre-scaled by the exact
//! power of two `prescale` and rounded to f16 once per row ([`prescale_row`]); each chunk's
//! products are summed exactly (in fixed point), added to the accumulator and rounded to f16 once;
//! the result,
//! widened to f32, is multiplied by `post_scale`. If the accumulator leaves the f16 range, the
//! logit is recomputed with f32 accumulation (`sm_scale * dot`), never passed on as inf or NaN.

use crate::problem::{QkScaling, F16_ACCUM_CHUNK};
use half::f16;

/// Writes `round_f16(q * prescale)` for one query row.
pub(super) fn prescale_row(q: &[f32], prescale: f32, dst: &mut [f32]) {
    for (d, &x) in dst.iter_mut().zip(q) {
        *d = f16::from_f32(x * prescale).to_f32();
    }
}

/// Binary digits after the point of the fixed-point form of an f16 value (its quantum is 2^-24).
const F16_FRACTION_BITS: u32 = 24;
/// Binary digits after the point of a product of two f16 values, and of the accumulator.
const PRODUCT_FRACTION_BITS: u32 = 2 * F16_FRACTION_BITS;
/// Significant bits of a normal f16 (10 stored + the implicit one).
const F16_SIGNIFICANT_BITS: u32 = 11;

/// `x * 2^24` as an integer: exact for every f16 value.
fn to_fixed(x: f32) -> i64 {
    (f64::from(x) * f64::from(1u32 << F16_FRACTION_BITS)) as i64
}

/// Rounds `n * 2^-48` to the nearest f16 (ties to even) and returns it in the same units, or
/// `None` if it overflows the f16 range. Computed on integers, so the rounding happens once
/// (`half`'s f64 -> f16 conversion may round twice, through f32).
fn round_to_f16(n: i128) -> Option<i128> {
    let magnitude = n.unsigned_abs();
    if magnitude == 0 {
        return Some(0);
    }
    let bits = u128::BITS - magnitude.leading_zeros();
    // Keep 11 significant bits, but never go below the subnormal quantum 2^-24.
    let shift = bits
        .saturating_sub(F16_SIGNIFICANT_BITS)
        .max(PRODUCT_FRACTION_BITS - F16_FRACTION_BITS);
    let unit = 1u128 << shift;
    let (mut kept, rest) = (magnitude >> shift, magnitude & (unit - 1));
    if rest > unit / 2 || (rest == unit / 2 && kept & 1 == 1) {
        kept += 1;
    }
    let rounded = kept << shift;
    let max = (f16::MAX.to_f64() * 2f64.powi(PRODUCT_FRACTION_BITS as i32)) as u128;
    if rounded > max {
        return None;
    }
    Some(if n < 0 {
        -(rounded as i128)
    } else {
        rounded as i128
    })
}

/// The scaled logit `s` of one (query, key) pair: `q_scaled` from [`prescale_row`], `q` and `k`
/// the f16 inputs widened to f32.
pub(super) fn logit(
    q_scaled: &[f32],
    q: &[f32],
    k: &[f32],
    scaling: QkScaling,
    sm_scale: f32,
) -> f32 {
    let mut acc: i128 = 0;
    for (qc, kc) in q_scaled
        .chunks_exact(F16_ACCUM_CHUNK)
        .zip(k.chunks_exact(F16_ACCUM_CHUNK))
    {
        // Each product is a multiple of 2^-48 below 2^32 in magnitude: the chunk sum is exact.
        let chunk: i128 = qc
            .iter()
            .zip(kc)
            .map(|(&a, &b)| i128::from(to_fixed(a)) * i128::from(to_fixed(b)))
            .sum();
        match round_to_f16(acc + chunk) {
            Some(rounded) => acc = rounded,
            None => {
                let dot: f32 = q.iter().zip(k).map(|(&a, &b)| a * b).sum();
                return sm_scale * dot;
            }
        }
    }
    // The accumulator holds an f16 value: exact in f64 and in f32.
    let acc = (acc as f64 / 2f64.powi(PRODUCT_FRACTION_BITS as i32)) as f32;
    acc * scaling.post_scale
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::QkAccum;

    #[test]
    fn rounds_per_chunk_and_falls_back_on_overflow() {
        let scaling = QkScaling::new(1.0, QkAccum::F16);
        // 2048 + 1 is not an f16 (spacing 2 above 2048): each chunk's +1 is lost when rounding.
        let mut q = vec![0.0f32; 32];
        let mut k = vec![0.0f32; 32];
        (q[0], k[0]) = (2048.0, 1.0);
        (q[16], k[16]) = (1.0, 1.0);
        let mut qs = vec![0.0; 32];
        prescale_row(&q, scaling.prescale, &mut qs);
        assert_eq!(logit(&qs, &q, &k, scaling, 1.0), 2048.0);
        // 60000 + 60000 overflows f16 (max 65504): the f32 dot product is used instead.
        (q[0], q[16]) = (60000.0, 60000.0);
        prescale_row(&q, scaling.prescale, &mut qs);
        assert_eq!(logit(&qs, &q, &k, scaling, 1.0), 120000.0);
    }

    #[test]
    fn rounding_is_single_and_ties_to_even() {
        let unit = 2f64.powi(PRODUCT_FRACTION_BITS as i32);
        let fixed = |x: f64| (x * unit) as i128;
        // 2049 is a tie between 2048 and 2050: even mantissa wins (2048).
        assert_eq!(round_to_f16(fixed(2049.0)), Some(fixed(2048.0)));
        assert_eq!(round_to_f16(fixed(2051.0)), Some(fixed(2052.0)));
        // Just above the tie rounds up, even though via f32 it would tie.
        let above = fixed(2049.0) + 1;
        assert_eq!(round_to_f16(above), Some(fixed(2050.0)));
        assert_eq!(round_to_f16(-fixed(2049.0)), Some(-fixed(2048.0)));
        // Subnormal quantum 2^-24, and the overflow threshold 65520.
        assert_eq!(round_to_f16(1), Some(0));
        assert_eq!(round_to_f16(fixed(65519.0)), Some(fixed(65504.0)));
        assert_eq!(round_to_f16(fixed(65520.0)), None);
    }
}
