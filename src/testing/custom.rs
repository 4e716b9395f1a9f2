//! A sample custom variant with a Rust side and a CUDA side that compute the same f32 function.
//!
//! The transform is `s * temperature + head_bias[qo_head]` (an f32 scalar and an f32 array
//! parameter) and the mask hides key `kv_idx` from query `qo_idx` iff
//! `(qo_idx + 2 * kv_idx) % mask_modulus == MASKED_RESIDUE` (an i32 parameter). The CUDA side uses
//! `__fmul_rn` and `__fadd_rn` so that NVRTC cannot contract the multiply-add into an FMA: both
//! sides then round twice, identically, and agree bit for bit.

use super::rng::SplitMix64;
use crate::problem::{CudaVariantSource, CustomVariant, LogitSite, ParamType, ParamValue};
use std::sync::Arc;

/// The modulus of the sample mask (hides about one key in seven).
const MASK_MODULUS: i32 = 7;
/// The residue the sample mask hides.
const MASKED_RESIDUE: usize = 3;
/// Range of the sampled temperature.
const TEMPERATURE_RANGE: (f64, f64) = (0.5, 1.5);
/// Range of the sampled per-head bias.
const HEAD_BIAS_RANGE: (f64, f64) = (-1.0, 1.0);
/// Salt separating the variant's stream from the inputs' streams of the same seed.
const SALT_CUSTOM: u64 = 0xc057;

/// A custom variant `temp_bias` for problems with `num_qo_heads` query heads, its parameters
/// drawn from `seed`. Used on a problem with more heads, its transform returns NaN for the extra
/// heads, which the reference rejects with an error (it never panics).
pub fn sample_custom_variant(num_qo_heads: usize, seed: u64) -> CustomVariant {
    let mut rng = SplitMix64::with_salt(seed, SALT_CUSTOM);
    let temperature = rng.range_f64(TEMPERATURE_RANGE.0, TEMPERATURE_RANGE.1) as f32;
    let head_bias: Vec<f32> = (0..num_qo_heads)
        .map(|_| rng.range_f64(HEAD_BIAS_RANGE.0, HEAD_BIAS_RANGE.1) as f32)
        .collect();
    let bias = head_bias.clone();
    let transform = move |s: f32, site: &LogitSite| {
        s * temperature + bias.get(site.qo_head).copied().unwrap_or(f32::NAN)
    };
    let modulus = MASK_MODULUS as usize;
    let mask = move |site: &LogitSite| (site.qo_idx + 2 * site.kv_idx) % modulus != MASKED_RESIDUE;
    CustomVariant {
        name: "temp_bias".to_string(),
        cpu_transform: Arc::new(transform),
        cpu_mask: Some(Arc::new(mask)),
        cuda: Some(CudaVariantSource {
            transform_body:
                "return __fadd_rn(__fmul_rn(s, params.temperature), params.head_bias[qo_head]);"
                    .to_string(),
            mask_body: Some(format!(
                "return ((qo_idx + 2 * kv_idx) % params.mask_modulus) != {MASKED_RESIDUE};"
            )),
            params: vec![
                ("temperature".to_string(), ParamType::F32),
                ("head_bias".to_string(), ParamType::F32Ptr),
                ("mask_modulus".to_string(), ParamType::I32),
            ],
        }),
        param_values: vec![
            ParamValue::F32(temperature),
            ParamValue::F32Array(head_bias),
            ParamValue::I32(MASK_MODULUS),
        ],
    }
}
