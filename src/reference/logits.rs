//! Exact scaled logits and logits transforms, in f64: the part of the reference that turns one
//! (query row, key row) pair into the transformed logit `t`.
//!
//! Two QK accumulation modes (`docs/semantics.md`, "QK accumulation"):
//! - f32 accumulation is modelled as exact: `s = sm_scale * dot(q, k)` in f64.
//! - f16 accumulation is emulated bit for bit: q is pre-scaled by an exact power of two and rounded
//!   to f16, each 16-wide chunk of the dot product is summed *exactly* and added to an f16
//!   accumulator with one round-to-nearest-even, and the result is widened to f32 and multiplied
//!   by the post-scale as an f32 multiply. If the accumulator leaves the f16 range, the logit
//!   falls back to the f32 path.
//!
//! The exact chunk sums use fixed point: every f16 value is an integer multiple of 2^-24, so every
//! product of two is an integer multiple of 2^-48 below 2^32 in magnitude, and a sum of a few
//! thousand such products fits an `i128` with no rounding at all. Only the conversion back to f16
//! rounds, once, as the tensor core's accumulator does.

use crate::problem::{LogitSite, QkAccum, QkScaling, Variant, F16_ACCUM_CHUNK};
use half::f16;

/// log2 of the fixed-point unit of one f16 value: every f16 is an integer multiple of 2^-24.
const F16_FIXED_BITS: i32 = 24;
/// log2 of the fixed-point unit of a product of two f16 values (and of the accumulator).
const PRODUCT_FIXED_BITS: i32 = 2 * F16_FIXED_BITS;
/// Significand bits of f16, the implicit leading one included.
const F16_SIGNIFICAND_BITS: i32 = 11;
/// Independent partial sums in the f64 dot product (lets the compiler vectorise it; the order
/// of f64 additions changes the result by far less than any tolerance we check).
const DOT_LANES: usize = 8;

/// The scaled logit `s` of query row `q` and key row `k` under `accum`, as the reference defines
/// it (`q` and `k` have the same length, the head dim qk).
///
/// With [`QkAccum::F16`] the inputs are taken as f16 values (f16 inputs widen exactly; any other
/// value is first rounded to f32, then to f16), and the result is the f32 value the tensor-core path produces,
/// widened to f64; see the module doc.
pub fn scaled_logit(accum: QkAccum, sm_scale: f32, q: &[f64], k: &[f64]) -> f64 {
    match accum {
        QkAccum::F32 => f64::from(sm_scale) * dot(q, k),
        QkAccum::F16 => f16_accumulated_logit(sm_scale, q, k).unwrap_or_else(|| {
            let q_as_f16: Vec<f64> = q
                .iter()
                .map(|&x| f16::from_f32(x as f32).to_f64())
                .collect();
            let k_as_f16: Vec<f64> = k
                .iter()
                .map(|&x| f16::from_f32(x as f32).to_f64())
                .collect();
            f64::from(sm_scale) * dot(&q_as_f16, &k_as_f16)
        }),
    }
}

/// The f16-accumulated logit, or `None` when the accumulator left the f16 range at some chunk
/// (the caller then uses the f32 path).
pub fn f16_accumulated_logit(sm_scale: f32, q: &[f64], k: &[f64]) -> Option<f64> {
    let scaling = QkScaling::new(sm_scale, QkAccum::F16);
    let prescale = f64::from(scaling.prescale);
    let mut acc: i128 = 0;
    for (qc, kc) in q.chunks(F16_ACCUM_CHUNK).zip(k.chunks(F16_ACCUM_CHUNK)) {
        let chunk: i128 = qc
            .iter()
            .zip(kc)
            .map(|(&qe, &ke)| {
                // q * prescale is exact in f32 (an f16 times a power of two >= 2^-14), so this
                // is a single rounding; `half`'s f64 -> f16 conversion rounds twice.
                let q_scaled = f16::from_f32((qe * prescale) as f32);
                i128::from(f16_to_fixed(q_scaled))
                    * i128::from(f16_to_fixed(f16::from_f32(ke as f32)))
            })
            .sum();
        acc = round_fixed_to_f16(acc + chunk)?;
    }
    let acc_f32 = fixed_to_f64(acc) as f32;
    Some(f64::from(acc_f32 * scaling.post_scale))
}

/// `x * 2^24` as an integer; exact for every finite f16.
fn f16_to_fixed(x: f16) -> i64 {
    (x.to_f64() * 2f64.powi(F16_FIXED_BITS)) as i64
}

/// The value of an accumulator `n * 2^-48`, exactly (callers pass f16-representable values).
fn fixed_to_f64(n: i128) -> f64 {
    n as f64 * 2f64.powi(-PRODUCT_FIXED_BITS)
}

/// Rounds `n * 2^-48` to the nearest f16 (ties to even) and returns it again as `m * 2^-48`, or
/// `None` if the rounded value overflows f16 (|value| >= 65520 rounds to infinity).
fn round_fixed_to_f16(n: i128) -> Option<i128> {
    if n == 0 {
        return Some(0);
    }
    let magnitude = n.unsigned_abs();
    let bits = (u128::BITS - magnitude.leading_zeros()) as i32;
    // The unit in the last place: 11 significant bits for normal values, and never finer than
    // the subnormal quantum 2^-24 (which is 2^24 in units of 2^-48).
    let shift = (bits - F16_SIGNIFICAND_BITS).max(PRODUCT_FIXED_BITS - F16_FIXED_BITS) as u32;
    let mut kept = magnitude >> shift;
    let rest = magnitude - (kept << shift);
    let half = 1u128 << (shift - 1);
    if rest > half || (rest == half && kept & 1 == 1) {
        kept += 1;
    }
    let rounded = kept << shift;
    let max_fixed = (f16::MAX.to_f64() * 2f64.powi(PRODUCT_FIXED_BITS)) as u128;
    if rounded > max_fixed {
        return None;
    }
    let rounded = rounded as i128;
    Some(if n < 0 { -rounded } else { rounded })
}

/// Rounds an f64 to the nearest f16 (ties to even, one rounding) exactly like the f16
/// accumulator does; `None` on overflow. Exact for multiples of 2^-48 (every accumulator value);
/// other values are rounded through f32 first. Exposed for tests of the emulation.
pub fn round_to_f16_checked(x: f64) -> Option<f64> {
    let n = x * 2f64.powi(PRODUCT_FIXED_BITS);
    if !n.is_finite() || n.abs() >= 2f64.powi(126) || n.fract() != 0.0 {
        // Only multiples of 2^-48 below 2^78 are meaningful accumulator values.
        let rounded = f16::from_f32(x as f32);
        return rounded.is_finite().then(|| rounded.to_f64());
    }
    round_fixed_to_f16(n as i128).map(fixed_to_f64)
}

/// The f64 dot product of two rows (over the shorter length).
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut lanes = [0.0f64; DOT_LANES];
    let a_chunks = a.chunks_exact(DOT_LANES);
    let b_chunks = b.chunks_exact(DOT_LANES);
    let tail: f64 = a_chunks
        .remainder()
        .iter()
        .zip(b_chunks.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (ac, bc) in a_chunks.zip(b_chunks) {
        for l in 0..DOT_LANES {
            lanes[l] += ac[l] * bc[l];
        }
    }
    lanes.iter().sum::<f64>() + tail
}

/// The transformed logit `t = transform(s)` of the variant at `site`.
///
/// Built-in transforms are evaluated in f64 (the exact values that f32 kernels approximate);
/// a custom transform is the user's f32 closure, called with `s` rounded to f32 and its result
/// widened back. Sinks do not change `t`; they join the denominator (see the row computation).
pub fn transform(variant: &Variant, s: f64, site: &LogitSite) -> f64 {
    match variant {
        Variant::None | Variant::Sinks { .. } => s,
        Variant::SoftCap { cap } => {
            let c = f64::from(*cap);
            c * (s / c).tanh()
        }
        Variant::Alibi { slopes } => {
            let d = site.kv_len as f64 - site.qo_len as f64;
            let distance = site.kv_idx as f64 - (site.qo_idx as f64 + d);
            s + f64::from(slopes[site.qo_head]) * distance
        }
        Variant::Custom(c) => f64::from((c.cpu_transform)(s as f32, site)),
    }
}

/// Whether a custom variant's own mask (if any) lets `site` through.
pub fn variant_visible(variant: &Variant, site: &LogitSite) -> bool {
    match variant {
        Variant::Custom(c) => c.cpu_mask.as_ref().is_none_or(|m| m(site)),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Correctly rounded f64 -> f16 (ties to even) by searching the neighbours of a first guess;
    /// `half::f16::from_f64` is not usable as the oracle: on x86 with F16C it rounds through f32
    /// (double rounding), and its software fallback truncates the low mantissa bits.
    fn nearest_f16(x: f64) -> Option<f64> {
        if x.abs() >= 65520.0 {
            return None;
        }
        let guess = f16::from_f64(x).to_bits();
        let candidates = [guess.wrapping_sub(1), guess, guess.wrapping_add(1)]
            .map(f16::from_bits)
            .into_iter()
            .filter(|c| c.is_finite() && c.to_bits() & 0x7fff <= 0x7bff);
        let best = candidates
            .min_by(|a, b| {
                let (da, db) = ((a.to_f64() - x).abs(), (b.to_f64() - x).abs());
                da.total_cmp(&db)
                    .then((a.to_bits() & 1).cmp(&(b.to_bits() & 1)))
            })?
            .to_f64();
        Some(if best == 0.0 { 0.0 } else { best })
    }

    #[test]
    fn fixed_point_rounding_is_correct_rounding() {
        // Multiples of 2^-48 across the whole f16 range, including subnormals, ties and overflow.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200_000 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let mantissa = (state >> 11) as i64 % (1 << 40) - (1 << 39);
            let exponent = ((state >> 3) % 40) as i32 - PRODUCT_FIXED_BITS;
            let x = mantissa as f64 * 2f64.powi(exponent);
            let got = round_to_f16_checked(x).map(|v| if v == 0.0 { 0.0 } else { v });
            assert_eq!(got, nearest_f16(x), "x = {x:e}");
        }
        for (x, expected) in [
            (65504.0, Some(65504.0)),
            (65519.99, Some(65504.0)),
            (65520.0, None),
            (-65520.0, None),
            (2049.0, Some(2048.0)),
            (2051.0, Some(2052.0)),
            (2f64.powi(-25), Some(0.0)),
            (3.0 * 2f64.powi(-25), Some(2f64.powi(-23))),
        ] {
            assert_eq!(round_to_f16_checked(x), expected, "x = {x}");
        }
    }
}
