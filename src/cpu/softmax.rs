//! Online softmax in base 2 for the CPU backend: a vectorisable `exp2`, lane-parallel row
//! reductions, and the per-row running state (max, sum) with its final normalisation.
//!
//! Logits enter this module already multiplied by `LOG2E` (`x = t * log2(e)`), so every
//! exponential is an `exp2`; the natural-log LSE is recovered once per row at the end
//! (`lse = m * ln 2 + ln l`). `exp2` is a polynomial on the fraction plus an exponent built from
//! bits: no library call, so the row loops vectorise.

/// Lanes of the partial reductions (max, sum): independent accumulators that the compiler maps to
/// one vector register, since floating-point reductions may not be reordered otherwise.
const LANES: usize = 16;

/// Below this argument `exp2` returns exactly 0 (2^-126 is the smallest normal f32).
const EXP2_MIN_ARG: f32 = -126.0;

/// Coefficients of 2^f - 1 ≈ f·P(f) on |f| <= 1/2 (Cephes `exp2f`), highest degree first.
const EXP2_POLY: [f32; 6] = [
    1.535_336_2e-4,
    1.339_887_4e-3,
    9.618_437e-3,
    5.550_332_5e-2,
    2.402_264_8e-1,
    6.931_472e-1,
];

/// Bits to shift an exponent into an f32's exponent field.
const F32_MANTISSA_BITS: u32 = 23;
/// The f32 exponent bias.
const F32_EXPONENT_BIAS: i32 = 127;

/// 2^x for x <= 0 (and -inf), relative error below 2e-7; 0 for x < -126.
#[inline(always)]
pub(super) fn exp2(x: f32) -> f32 {
    let clamped = x.max(EXP2_MIN_ARG);
    let n = (clamped + 0.5).floor();
    let f = clamped - n;
    let mut p = EXP2_POLY[0];
    for &c in &EXP2_POLY[1..] {
        p = p * f + c;
    }
    let scale = f32::from_bits(((n as i32 + F32_EXPONENT_BIAS) as u32) << F32_MANTISSA_BITS);
    let y = (f * p + 1.0) * scale;
    if x < EXP2_MIN_ARG {
        0.0
    } else {
        y
    }
}

/// The maximum of `row` (a multiple of 16 long), -inf for an all -inf row.
#[inline(always)]
pub(super) fn row_max(row: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    for chunk in row.chunks_exact(LANES) {
        for (a, &x) in acc.iter_mut().zip(chunk) {
            *a = if x > *a { x } else { *a };
        }
    }
    acc.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x))
}

/// Replaces each `x` of `row` by `exp2(x - max)` and returns their sum.
#[inline(always)]
pub(super) fn exp2_and_sum(row: &mut [f32], max: f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    for chunk in row.chunks_exact_mut(LANES) {
        for (a, x) in acc.iter_mut().zip(chunk) {
            *x = exp2(*x - max);
            *a += *x;
        }
    }
    acc.iter().sum()
}

/// Running softmax state of one query row, in base 2: `sum_j 2^(x_j) = 2^max * sum`.
#[derive(Clone, Copy, Debug)]
pub(super) struct RowState {
    /// Largest `x` seen so far (-inf before the first visible key).
    pub max: f32,
    /// Sum of `2^(x_j - max)` over the keys seen.
    pub sum: f32,
}

impl RowState {
    /// The state before any key.
    pub const EMPTY: RowState = RowState {
        max: f32::NEG_INFINITY,
        sum: 0.0,
    };

    /// Folds in one tile of logits (`x`, masked entries -inf): turns `x` into the probabilities
    /// `2^(x - new_max)` and returns the factor by which the output accumulated so far must be
    /// multiplied (1 when the max did not grow).
    #[inline(always)]
    pub fn update(&mut self, x: &mut [f32]) -> f32 {
        let tile_max = row_max(x);
        let new_max = self.max.max(tile_max);
        if new_max == f32::NEG_INFINITY {
            x.fill(0.0);
            return 1.0;
        }
        let alpha = if new_max > self.max {
            exp2(self.max - new_max)
        } else {
            1.0
        };
        let tile_sum = exp2_and_sum(x, new_max);
        self.sum = self.sum * alpha + tile_sum;
        self.max = new_max;
        alpha
    }

    /// The final `(1 / denominator, natural-log LSE)` of the row, folding in the sink logit (natural
    /// log) if there is one. An empty row gives a factor of 0 and an LSE of -inf (or the sink).
    pub fn finish(self, sink: Option<f32>) -> (f32, f32) {
        if self.sum == 0.0 {
            return (0.0, sink.unwrap_or(f32::NEG_INFINITY));
        }
        let ln_sum = f64::from(self.sum).ln();
        let mut lse = f64::from(self.max) * std::f64::consts::LN_2 + ln_sum;
        if let Some(sink) = sink {
            let (hi, lo) = if lse >= f64::from(sink) {
                (lse, f64::from(sink))
            } else {
                (f64::from(sink), lse)
            };
            lse = hi + (lo - hi).exp().ln_1p();
        }
        // o = acc * 2^max / exp(lse) = acc / (sum * exp(lse - ln(sum 2^x))).
        let inv = (f64::from(self.max) * std::f64::consts::LN_2 - lse).exp();
        (inv as f32, lse as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp2_is_accurate_and_exact_at_the_ends() {
        let mut worst = 0.0f64;
        let mut x = -125.0f32;
        while x <= 0.0 {
            let want = f64::from(x).exp2();
            let got = f64::from(exp2(x));
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 2e-7, "relative error {worst}");
        assert_eq!(exp2(0.0), 1.0);
        assert_eq!(exp2(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp2(-200.0), 0.0);
    }

    #[test]
    fn row_state_matches_direct_softmax() {
        let logits: Vec<f32> = (0..32)
            .map(|i| ((i * 37) % 11) as f32 * 0.7 - 3.0)
            .collect();
        let mut state = RowState::EMPTY;
        let mut weights = Vec::new();
        let mut acc = 0.0f32; // sum of p_j * j, rescaled like an output row
        for (t, tile) in logits.chunks(16).enumerate() {
            let mut x = tile.to_vec();
            let alpha = state.update(&mut x);
            acc *= alpha;
            for (j, p) in x.iter().enumerate() {
                acc += p * (t * 16 + j) as f32;
            }
            weights.extend(x);
        }
        let (inv, lse) = state.finish(None);
        let direct: f64 = logits.iter().map(|&x| f64::from(x).exp2()).sum();
        let mean: f64 = logits
            .iter()
            .enumerate()
            .map(|(j, &x)| f64::from(x).exp2() * j as f64)
            .sum::<f64>()
            / direct;
        assert!((f64::from(lse) - direct.ln()).abs() < 1e-5);
        assert!((f64::from(acc * inv) - mean).abs() < 1e-4);
    }

    #[test]
    fn empty_row_and_sink() {
        let mut state = RowState::EMPTY;
        let mut x = vec![f32::NEG_INFINITY; 16];
        assert_eq!(state.update(&mut x), 1.0);
        assert!(x.iter().all(|&p| p == 0.0));
        assert_eq!(state.finish(None), (0.0, f32::NEG_INFINITY));
        assert_eq!(state.finish(Some(1.5)), (0.0, 1.5));
    }
}
