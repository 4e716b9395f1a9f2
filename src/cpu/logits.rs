//! Logits of one query row for one key tile: scale, mask, transform, and the change to base 2.
//!
//! This is where the CPU backend applies the problem's semantics (`docs/semantics.md`) to the raw
//! dot products of a tile: `s = sm_scale * dot`, `t = transform(s)`, hidden keys set to -inf, and
//! `x = t * LOG2E` for the base-2 online softmax (`softmax.rs`). Which keys a built-in mask leaves
//! visible is an interval per row ([`visible_range`]), so causal and sliding-window tiles need no
//! per-key test; the custom bit mask and a custom variant's mask are tested key by key.

use crate::problem::{CpuMask, CpuTransform, CustomMask, LogitSite, Mask, Variant};
use std::f32::consts::LOG2_E;
use std::ops::Range;

/// The logits transform of a problem, borrowed from its variant.
#[derive(Clone, Copy)]
pub(super) enum Transform<'a> {
    /// `t = s` (no variant, and sinks, which change only the denominator).
    Identity,
    /// `t = cap * tanh(s / cap)`.
    SoftCap(f32),
    /// `t = s + slopes[qo_head] * (j - (i + d))`.
    Alibi(&'a [f32]),
    /// A custom variant's Rust closure.
    Custom(&'a CpuTransform),
}

/// Everything that turns a raw dot product into a base-2 logit.
#[derive(Clone, Copy)]
pub(super) struct LogitRules<'a> {
    /// The transform.
    pub transform: Transform<'a>,
    /// The custom bit mask, if the problem's mask is custom.
    pub bits: Option<&'a CustomMask>,
    /// A custom variant's own mask, if it has one.
    pub variant_mask: Option<&'a CpuMask>,
    /// Factor from the tile's values to `s`: `sm_scale` when the tile holds raw dot products,
    /// 1 when it already holds `s` (f16 accumulation).
    pub s_mul: f32,
}

impl<'a> LogitRules<'a> {
    /// The rules of `mask` and `variant` for tiles whose values are `s / s_mul`.
    pub fn new(mask: &'a Mask, variant: &'a Variant, s_mul: f32) -> LogitRules<'a> {
        let (transform, variant_mask) = match variant {
            Variant::None | Variant::Sinks { .. } => (Transform::Identity, None),
            Variant::SoftCap { cap } => (Transform::SoftCap(*cap), None),
            Variant::Alibi { slopes } => (Transform::Alibi(slopes), None),
            Variant::Custom(c) => (Transform::Custom(&c.cpu_transform), c.cpu_mask.as_ref()),
        };
        let bits = match mask {
            Mask::Custom(m) => Some(m),
            _ => None,
        };
        LogitRules {
            transform,
            bits,
            variant_mask,
            s_mul,
        }
    }

    /// Turns one row of a tile (`x`, raw values) into base-2 logits in place. `visible` is the
    /// tile-local range the built-in mask leaves visible (already clipped to the tile's keys);
    /// `site` describes the row (its `kv_idx` is overwritten) and `j0` is the request-local index
    /// of the tile's first key. Returns the first site where a custom transform returned NaN or
    /// +inf (which the caller reports as an error), if any.
    #[inline(always)]
    pub fn apply(
        &self,
        x: &mut [f32],
        visible: Range<usize>,
        j0: usize,
        mut site: LogitSite,
    ) -> Option<LogitSite> {
        let (a, b) = (visible.start, visible.end);
        if let (Transform::Identity, None, None) = (self.transform, self.bits, self.variant_mask) {
            let scale = self.s_mul * LOG2_E;
            for (j, v) in x.iter_mut().enumerate() {
                // min(MAX) keeps an overflowed dot product from turning into inf - inf = NaN.
                *v = if j >= a && j < b {
                    (*v * scale).min(f32::MAX)
                } else {
                    f32::NEG_INFINITY
                };
            }
            return None;
        }
        let mut bad = None;
        let d = site.kv_len as i64 - site.qo_len as i64;
        for (j, v) in x.iter_mut().enumerate() {
            site.kv_idx = j0 + j;
            let shown = j >= a
                && j < b
                && self
                    .bits
                    .is_none_or(|m| m.visible(site.request, site.kv_len, site.qo_idx, site.kv_idx))
                && self.variant_mask.is_none_or(|f| f(&site));
            if !shown {
                *v = f32::NEG_INFINITY;
                continue;
            }
            let s = *v * self.s_mul;
            let t = match self.transform {
                Transform::Identity => s,
                Transform::SoftCap(cap) => cap * (s / cap).tanh(),
                Transform::Alibi(slopes) => {
                    let distance = site.kv_idx as i64 - (site.qo_idx as i64 + d);
                    s + slopes[site.qo_head] * distance as f32
                }
                Transform::Custom(f) => {
                    let t = f(s, &site);
                    if t.is_nan() || t == f32::INFINITY {
                        bad = bad.or(Some(site));
                    }
                    t
                }
            };
            *v = (t * LOG2_E).min(f32::MAX);
        }
        bad
    }
}

/// Keys `[lo, hi)` of a request that query `i` may see under a built-in mask (the custom mask
/// starts from every key and tests bits); empty when `lo >= hi`.
pub(super) fn visible_range(mask: &Mask, qo_len: usize, kv_len: usize, i: usize) -> Range<usize> {
    let diag = i as i64 + kv_len as i64 - qo_len as i64;
    let clip = |x: i64| x.clamp(0, kv_len as i64) as usize;
    match mask {
        Mask::None | Mask::Custom(_) => 0..kv_len,
        Mask::Causal => 0..clip(diag + 1),
        Mask::SlidingWindow { window_left } => clip(diag - window_left)..clip(diag + 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_agree_with_the_mask_definition() {
        let masks = [
            Mask::None,
            Mask::Causal,
            Mask::SlidingWindow { window_left: 0 },
            Mask::SlidingWindow { window_left: 3 },
        ];
        for mask in &masks {
            for (qo, kv) in [(5, 5), (3, 9), (9, 3), (1, 1), (4, 0)] {
                for i in 0..qo {
                    let range = visible_range(mask, qo, kv, i);
                    for j in 0..kv {
                        assert_eq!(
                            range.contains(&j),
                            mask.visible(0, qo, kv, i, j),
                            "{mask:?} qo {qo} kv {kv} i {i} j {j}"
                        );
                    }
                }
            }
        }
    }
}
