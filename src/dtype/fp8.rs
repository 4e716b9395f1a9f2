//! fp8 element formats of a quantised KV cache: e4m3 (`float8_e4m3fn`) and e5m2, their exact
//! decoding, their round-to-nearest-even saturating encoding, and [`Fp8Tensor`], a host buffer of
//! fp8 codes.
//!
//! A code is one byte, sign in bit 7. e4m3 has 4 exponent bits (bias 7) and 3 mantissa bits, no
//! infinity, NaN only as `S.1111.111` (0x7F / 0xFF), largest finite 448. e5m2 has 5 exponent bits
//! (bias 15) and 2 mantissa bits, IEEE-like: exponent 31 is infinity (mantissa 0) or NaN, largest
//! finite 57344. Both have subnormals (exponent field 0). Every code decodes exactly to f32
//! ([`Fp8Format::decode`]); [`Fp8Format::encode`] is the inverse rounding that the quantising
//! append uses (`docs/semantics.md`, "fp8 KV cache").

use std::fmt;

/// An fp8 element format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Fp8Format {
    /// `float8_e4m3fn`: 4 exponent bits, 3 mantissa bits, max 448, no infinity.
    E4m3,
    /// `float8_e5m2`: 5 exponent bits, 2 mantissa bits, max 57344, with infinities.
    E5m2,
}

impl Fp8Format {
    /// Both formats.
    pub const ALL: [Fp8Format; 2] = [Fp8Format::E4m3, Fp8Format::E5m2];

    /// Short name, as on the command line and in kernel names (`e4m3`, `e5m2`).
    pub fn name(self) -> &'static str {
        match self {
            Fp8Format::E4m3 => "e4m3",
            Fp8Format::E5m2 => "e5m2",
        }
    }

    /// Parses [`name`](Self::name) and the PyTorch spellings (`float8_e4m3fn`, `float8_e5m2`).
    pub fn parse(s: &str) -> Option<Fp8Format> {
        match s {
            "e4m3" | "fp8_e4m3" | "float8_e4m3fn" => Some(Fp8Format::E4m3),
            "e5m2" | "fp8_e5m2" | "float8_e5m2" => Some(Fp8Format::E5m2),
            _ => None,
        }
    }

    /// Mantissa bits.
    pub fn mantissa_bits(self) -> u32 {
        match self {
            Fp8Format::E4m3 => 3,
            Fp8Format::E5m2 => 2,
        }
    }

    /// Exponent bias.
    pub fn bias(self) -> i32 {
        match self {
            Fp8Format::E4m3 => 7,
            Fp8Format::E5m2 => 15,
        }
    }

    /// The largest finite value (448 or 57344).
    pub fn max_finite(self) -> f32 {
        match self {
            Fp8Format::E4m3 => 448.0,
            Fp8Format::E5m2 => 57344.0,
        }
    }

    /// The code of the largest finite value (0x7E or 0x7B); its negative is `| 0x80`.
    pub fn max_code(self) -> u8 {
        match self {
            Fp8Format::E4m3 => 0x7E,
            Fp8Format::E5m2 => 0x7B,
        }
    }

    /// The NaN code that encoding a NaN gives (0x7F in both formats, as the GPU's `cvt` writes).
    pub fn nan_code(self) -> u8 {
        0x7F
    }

    /// The exact value of `code`: ±0, a subnormal, a normal number, ±infinity (e5m2) or NaN.
    pub fn decode(self, code: u8) -> f32 {
        let m_bits = self.mantissa_bits();
        let exp_field = i32::from((code & 0x7F) >> m_bits);
        let mantissa = u32::from(code) & ((1 << m_bits) - 1);
        let top = (1i32 << (7 - m_bits)) - 1;
        let magnitude = match self {
            Fp8Format::E4m3 if exp_field == top && mantissa == (1 << m_bits) - 1 => f32::NAN,
            Fp8Format::E5m2 if exp_field == top && mantissa == 0 => f32::INFINITY,
            Fp8Format::E5m2 if exp_field == top => f32::NAN,
            _ if exp_field == 0 => mantissa as f32 * pow2(1 - self.bias() - m_bits as i32),
            _ => ((1 << m_bits) + mantissa) as f32 * pow2(exp_field - self.bias() - m_bits as i32),
        };
        if code & 0x80 != 0 {
            -magnitude
        } else {
            magnitude
        }
    }

    /// The code nearest to `x`, ties to the even code; magnitudes above the largest finite value
    /// (infinities included) saturate to ±[`max_finite`](Self::max_finite); NaN gives
    /// [`nan_code`](Self::nan_code); -0 gives 0x80.
    pub fn encode(self, x: f32) -> u8 {
        if x.is_nan() {
            return self.nan_code();
        }
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        let a = f64::from(x.abs());
        if a >= f64::from(self.max_finite()) {
            return sign | self.max_code();
        }
        if a == 0.0 {
            return sign;
        }
        let m_bits = self.mantissa_bits() as i32;
        let e_min = 1 - self.bias();
        // f32 values are normal f64 numbers, so the f64 exponent field is floor(log2(a)).
        let e = (((a.to_bits() >> 52) & 0x7FF) as i32 - 1023).max(e_min);
        // `a / quantum` is exact (a power-of-two scaling) and below 2^(m_bits + 1).
        let quantum = f64::from(pow2(e - m_bits));
        let mut n = (a / quantum).round_ties_even() as u32;
        let mut e = e;
        if n == 1 << (m_bits + 1) {
            n >>= 1;
            e += 1;
        }
        let code = if n < 1 << m_bits {
            // A subnormal (only possible at e == e_min): exponent field 0.
            n
        } else {
            (((e + self.bias()) as u32) << m_bits) | (n - (1 << m_bits))
        };
        sign | code as u8
    }
}

/// 2^e for the small exponents fp8 needs, -16 to 13, built from its exponent field (`powi` is a
/// library call a benchmark's gigabyte-sized cache would make billions of times).
fn pow2(e: i32) -> f32 {
    debug_assert!((-126..=127).contains(&e), "2^{e} is not a normal f32");
    f32::from_bits(((e + 127) as u32) << 23)
}

impl fmt::Display for Fp8Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A flat host buffer of fp8 codes of one format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fp8Tensor {
    /// The format of every code.
    pub format: Fp8Format,
    /// The codes.
    pub codes: Vec<u8>,
}

impl Fp8Tensor {
    /// `len` NaN codes: what an unwritten cache holds in the tests, so reading it shows.
    pub fn nan(format: Fp8Format, len: usize) -> Fp8Tensor {
        Fp8Tensor {
            format,
            codes: vec![format.nan_code(); len],
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.codes.len()
    }

    /// Whether the tensor holds no element.
    pub fn is_empty(&self) -> bool {
        self.codes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of every finite code, by brute force from the bit fields written out again.
    fn finite_codes(f: Fp8Format) -> Vec<(u8, f32)> {
        (0..=255u8)
            .map(|c| (c, f.decode(c)))
            .filter(|(_, x)| x.is_finite())
            .collect()
    }

    /// The encoding by exhaustive search: the nearest finite code, ties to the even code
    /// (-0 for negative inputs that round to zero), saturating beyond the largest finite value.
    fn encode_by_search(f: Fp8Format, x: f32) -> u8 {
        if x.is_nan() {
            return f.nan_code();
        }
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        let a = f64::from(x.abs());
        let mut best: Option<(f64, u8)> = None;
        for (c, v) in finite_codes(f).into_iter().filter(|(c, _)| c & 0x80 == 0) {
            let d = (a - f64::from(v)).abs();
            best = match best {
                Some((bd, bc)) if bd < d || (bd == d && bc % 2 == 0) => Some((bd, bc)),
                _ => Some((d, c)),
            };
        }
        let (_, code) = best.expect("codes exist");
        if a > f64::from(f.max_finite()) {
            return sign | f.max_code();
        }
        sign | code
    }

    #[test]
    fn decoding_matches_the_documented_values() {
        let e4 = Fp8Format::E4m3;
        assert_eq!(e4.decode(0x00), 0.0);
        assert!(e4.decode(0x80).is_sign_negative() && e4.decode(0x80) == 0.0);
        assert_eq!(e4.decode(0x01), 2f32.powi(-9));
        assert_eq!(e4.decode(0x07), 7.0 * 2f32.powi(-9));
        assert_eq!(e4.decode(0x08), 2f32.powi(-6));
        assert_eq!(e4.decode(0x38), 1.0);
        assert_eq!(e4.decode(0x7E), 448.0);
        assert_eq!(e4.decode(0xFE), -448.0);
        assert_eq!(e4.decode(0x78), 256.0);
        assert!(e4.decode(0x7F).is_nan() && e4.decode(0xFF).is_nan());
        let e5 = Fp8Format::E5m2;
        assert_eq!(e5.decode(0x01), 2f32.powi(-16));
        assert_eq!(e5.decode(0x04), 2f32.powi(-14));
        assert_eq!(e5.decode(0x3C), 1.0);
        assert_eq!(e5.decode(0x7B), 57344.0);
        assert_eq!(e5.decode(0x7C), f32::INFINITY);
        assert_eq!(e5.decode(0xFC), f32::NEG_INFINITY);
        for c in [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF] {
            assert!(e5.decode(c).is_nan(), "{c:#x}");
        }
        for f in Fp8Format::ALL {
            assert_eq!(f.decode(f.max_code()), f.max_finite());
            let nans = (0..=255u8).filter(|&c| f.decode(c).is_nan()).count();
            assert_eq!(nans, if f == Fp8Format::E4m3 { 2 } else { 6 });
        }
    }

    #[test]
    fn every_code_round_trips() {
        for f in Fp8Format::ALL {
            for c in 0..=255u8 {
                let x = f.decode(c);
                let back = f.encode(x);
                if x.is_nan() {
                    assert_eq!(back, f.nan_code(), "{f} {c:#x}");
                } else if x.is_infinite() {
                    assert_eq!(back, (c & 0x80) | f.max_code(), "{f} {c:#x} saturates");
                } else {
                    assert_eq!(back, c, "{f} {c:#x} = {x}");
                }
            }
        }
    }

    #[test]
    fn ties_round_to_the_even_code_and_neighbours_to_the_nearest() {
        for f in Fp8Format::ALL {
            let codes = finite_codes(f);
            let positive: Vec<(u8, f32)> =
                codes.into_iter().filter(|(c, _)| c & 0x80 == 0).collect();
            for w in positive.windows(2) {
                let ((c0, v0), (c1, v1)) = (w[0], w[1]);
                let mid = (f64::from(v0) + f64::from(v1)) / 2.0;
                // The midpoint of two fp8 neighbours is exact in f32.
                let mid = mid as f32;
                let even = if c0 % 2 == 0 { c0 } else { c1 };
                assert_eq!(f.encode(mid), even, "{f} tie {v0}..{v1}");
                assert_eq!(f.encode(-mid), 0x80 | even, "{f} tie -{v0}..{v1}");
                let below = f32::from_bits(mid.to_bits() - 1);
                let above = f32::from_bits(mid.to_bits() + 1);
                assert_eq!(f.encode(below), c0, "{f} just below {mid}");
                assert_eq!(f.encode(above), c1, "{f} just above {mid}");
            }
        }
    }

    #[test]
    fn encoding_equals_the_exhaustive_search() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for f in Fp8Format::ALL {
            for _ in 0..20_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Random bit patterns over the whole range, and values near the fp8 range.
                let wide = f32::from_bits(x as u32);
                let near = ((x >> 32) as u32 as f32 / u32::MAX as f32 - 0.5) * 2.5 * f.max_finite()
                    / 2f32.powi((x >> 60) as i32 * 2);
                for v in [wide, near] {
                    assert_eq!(f.encode(v), encode_by_search(f, v), "{f} {v:e}");
                }
            }
        }
    }

    #[test]
    fn saturation_and_special_inputs() {
        for f in Fp8Format::ALL {
            let max = f.max_finite();
            assert_eq!(f.encode(f32::INFINITY), f.max_code());
            assert_eq!(f.encode(f32::NEG_INFINITY), 0x80 | f.max_code());
            assert_eq!(f.encode(max * 4.0), f.max_code());
            assert_eq!(f.encode(-f32::MAX), 0x80 | f.max_code());
            assert_eq!(f.encode(f32::NAN), 0x7F);
            assert_eq!(f.encode(-0.0), 0x80);
            assert_eq!(f.encode(f32::MIN_POSITIVE), 0);
        }
        // Half the smallest subnormal is a tie with zero: zero is even.
        assert_eq!(Fp8Format::E4m3.encode(2f32.powi(-10)), 0x00);
        assert_eq!(Fp8Format::E4m3.encode(1.5 * 2f32.powi(-9)), 0x02);
        assert_eq!(Fp8Format::E5m2.encode(2f32.powi(-17)), 0x00);
        // Between 448 and the next binade the e4m3 encoding saturates, never reaching NaN.
        assert_eq!(Fp8Format::E4m3.encode(470.0), 0x7E);
    }

    #[test]
    fn names_parse_back() {
        for f in Fp8Format::ALL {
            assert_eq!(Fp8Format::parse(f.name()), Some(f));
        }
        assert_eq!(Fp8Format::parse("float8_e4m3fn"), Some(Fp8Format::E4m3));
        assert_eq!(Fp8Format::parse("e3m4"), None);
    }
}
