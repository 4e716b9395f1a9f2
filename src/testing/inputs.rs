//! Random Q, K, V for a problem: the one input generator every suite (CPU and GPU) uses.
//!
//! Values are standard normal times a scale, rounded to the problem's input dtype, and never
//! zero: a zero would be replaced by `±scale * ZERO_REPLACEMENT`. Never-zero inputs make an
//! exactly-zero output row mean one thing only — a query that sees no key — which
//! [`crate::compare`] checks exactly.

use super::rng::SplitMix64;
use crate::dtype::DType;
use crate::problem::{AttentionProblem, TensorView};
use crate::tensor::HostTensor;

/// Magnitude (relative to the scale) that replaces a value that rounds to zero.
const ZERO_REPLACEMENT: f64 = 1.0 / 16.0;
/// Salts that give Q, K and V independent streams from one seed.
const SALT_Q: u64 = 1;
const SALT_K: u64 = 2;
const SALT_V: u64 = 3;

/// Random `(q, k, v)` buffers sized by the problem's views, values O(1) (standard normal),
/// rounded to the input dtype, never zero. Deterministic in `seed`.
pub fn random_inputs(p: &AttentionProblem, seed: u64) -> (HostTensor, HostTensor, HostTensor) {
    random_inputs_scaled(p, seed, 1.0, 1.0)
}

/// Like [`random_inputs`] with Q and K drawn with standard deviation `qk_scale` and V with
/// `v_scale` (e.g. large Q and K push the logits towards the f16 range).
pub fn random_inputs_scaled(
    p: &AttentionProblem,
    seed: u64,
    qk_scale: f64,
    v_scale: f64,
) -> (HostTensor, HostTensor, HostTensor) {
    let (qo, kv) = (p.batch.total_qo(), p.batch.total_kv());
    let (dqk, dvo) = (p.head_dims.qk(), p.head_dims.vo());
    let dtype = p.input_dtype;
    let q_len = extent(&p.q_view, qo, p.num_qo_heads, dqk);
    let k_len = extent(&p.k_view, kv, p.num_kv_heads, dqk);
    let v_len = extent(&p.v_view, kv, p.num_kv_heads, dvo);
    (
        random_tensor(dtype, q_len, qk_scale, SplitMix64::with_salt(seed, SALT_Q)),
        random_tensor(dtype, k_len, qk_scale, SplitMix64::with_salt(seed, SALT_K)),
        random_tensor(dtype, v_len, v_scale, SplitMix64::with_salt(seed, SALT_V)),
    )
}

/// Elements a buffer needs to hold a view of `tokens x heads x dim`.
pub fn extent(view: &TensorView, tokens: usize, heads: usize, dim: usize) -> usize {
    if tokens == 0 || heads == 0 {
        return 0;
    }
    view.index(tokens - 1, heads - 1, dim)
}

/// Elements drawn from one random stream: blocks are generated in parallel, each from its own
/// stream, so that the gigabyte-sized inputs of the benchmarks take seconds, not minutes.
const BLOCK: usize = 1 << 16;

fn random_tensor(dtype: DType, len: usize, scale: f64, mut rng: SplitMix64) -> HostTensor {
    use rayon::prelude::*;
    let base = rng.next_u64();
    let mut values = vec![0.0f32; len];
    values
        .par_chunks_mut(BLOCK)
        .enumerate()
        .for_each(|(block, out)| {
            let mut rng = SplitMix64::with_salt(base, block as u64);
            for x in out {
                let v = dtype.round_f64(rng.normal() * scale);
                let v = if v == 0.0 {
                    dtype.round_f64(
                        scale * ZERO_REPLACEMENT * if rng.bernoulli(0.5) { 1.0 } else { -1.0 },
                    )
                } else {
                    v
                };
                *x = v as f32;
            }
        });
    HostTensor::from_f32(dtype, &values)
}
