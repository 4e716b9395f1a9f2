//! Emulation of f16 QK accumulation (`QkAccum::F16`) on the CPU backend.
//!
//! The tensor cores' `mma.m16n8k16` with f16 accumulators adds each 16-wide chunk of the dot
//! product to an f16 accumulator and rounds after each chunk. Here: q is pre-scaled by the exact
//! power of two `prescale` and rounded to f16 once per row ([`prescale_row`]); each chunk's
//! products (exact in f64) are summed, added to the accumulator and rounded to f16; the result,
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

/// The scaled logit `s` of one (query, key) pair: `q_scaled` from [`prescale_row`], `q` and `k`
/// the f16 inputs widened to f32.
pub(super) fn logit(
    q_scaled: &[f32],
    q: &[f32],
    k: &[f32],
    scaling: QkScaling,
    sm_scale: f32,
) -> f32 {
    let mut acc = f16::ZERO;
    for (qc, kc) in q_scaled
        .chunks_exact(F16_ACCUM_CHUNK)
        .zip(k.chunks_exact(F16_ACCUM_CHUNK))
    {
        let chunk: f64 = qc
            .iter()
            .zip(kc)
            .map(|(&a, &b)| f64::from(a) * f64::from(b))
            .sum();
        acc = f16::from_f64(acc.to_f64() + chunk);
        if !acc.is_finite() {
            let dot: f32 = q.iter().zip(k).map(|(&a, &b)| a * b).sum();
            return sm_scale * dot;
        }
    }
    acc.to_f32() * scaling.post_scale
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
}
