//! The quantising append's conversion (`quantize8` in `kernels/append_paged.cuh`) modelled on the
//! CPU step by step: one reciprocal a chunk, Markstein's correction in two fused multiply-adds, the
//! saturating conversion, x's sign ORed in and NaN codes repaired. For every f16 and bf16 value
//! (infinities, NaNs, zeros and subnormals included), scales over the whole range the host admits
//! (including subnormal ones, which the kernel scales by 2^64 first) and both formats, the codes
//! equal the host quantiser's, `encode(x / scale)` with an IEEE division (`quantize_value`).

use attnforge::dtype::fp8::Fp8Format;
use attnforge::paged::quantize_value;
use half::{bf16, f16};

/// The kernel's code for `x` (a value of 16-bit rows whose sign bit is `sign`) and `scale`.
fn kernel_code(format: Fp8Format, x: f32, sign: bool, scale: f32) -> u8 {
    let (mut x, mut scale) = (x, scale);
    if scale < 2f32.powi(-125) {
        scale *= 2f32.powi(64);
        x *= 2f32.powi(64);
    }
    // rcp_rn_normal: 1 / scale rounded to nearest, for scale in [2^-126, 2^125].
    let recip = 1.0f32 / scale;
    let q0 = x * recip;
    let q = (-q0).mul_add(scale, x).mul_add(recip, q0);
    // cvt.rn.satfinite gives a NaN code for a NaN (with either sign: the model takes the host's).
    let mut code = format.encode(q);
    if sign {
        code |= 0x80;
    }
    let nan_magnitude = match format {
        Fp8Format::E4m3 => 0x7f,
        Fp8Format::E5m2 => 0x7c,
    };
    if code & 0x7f >= nan_magnitude {
        code = if x.is_nan() {
            0x7f
        } else {
            (code & 0x80) | format.max_code()
        };
    }
    code
}

/// Every f16 and bf16 bit pattern, as (value, sign bit).
fn inputs() -> Vec<(f32, bool)> {
    (0..=u16::MAX)
        .flat_map(|b| {
            let sign = b & 0x8000 != 0;
            [
                (f16::from_bits(b).to_f32(), sign),
                (bf16::from_bits(b).to_f32(), sign),
            ]
        })
        .collect()
}

/// Scales: the quantisers' usual ones, subnormal and tiny ones (the kernel's 2^64 step), the
/// largest the host admits (below 2^120), all-ones significands at 40 exponents and
/// pseudo-random ones over the range.
fn scales() -> Vec<f32> {
    let mut s = vec![
        1.0,
        0.5,
        3.0,
        1.0 / 3.0,
        0.1,
        0.0123,
        448.0 / 65504.0,
        1.0 / 448.0,
        1.0 / 57344.0,
        f32::from_bits(1),
        f32::from_bits(0x0012_3456),
        f32::MIN_POSITIVE,
        2f32.powi(-125),
        2f32.powi(-125) * 0.75,
        2f32.powi(119),
        f32::from_bits((246 << 23) | 0x7f_ffff),
    ];
    s.extend((0..40).map(|k| f32::from_bits(((97 + k) << 23) | 0x7f_ffff)));
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..60 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let exponent = (state % 246) as u32 + 1;
        s.push(f32::from_bits(
            (exponent << 23) | (state >> 40) as u32 & 0x7f_ffff,
        ));
    }
    s
}

#[test]
fn the_kernels_steps_give_the_hosts_codes_for_every_16_bit_value() {
    let xs = inputs();
    for format in Fp8Format::ALL {
        for scale in scales() {
            for &(x, sign) in &xs {
                let want = quantize_value(format, x, scale);
                let got = kernel_code(format, x, sign, scale);
                assert_eq!(
                    got, want,
                    "{format:?}: {x:e} / {scale:e} gave code {got:#04x}, the host {want:#04x}"
                );
            }
        }
    }
}

#[test]
fn without_the_correction_some_codes_differ() {
    // A product by the reciprocal alone misses the IEEE quotient's code for some inputs, so the
    // test above checks the correction.
    let xs = inputs();
    let misses = scales()
        .into_iter()
        .flat_map(|scale| xs.iter().map(move |&(x, _)| (x, scale)))
        .filter(|&(x, scale)| {
            x.is_finite()
                && Fp8Format::E4m3.encode(x * (1.0 / scale))
                    != quantize_value(Fp8Format::E4m3, x, scale)
        })
        .count();
    assert!(misses > 0);
}
