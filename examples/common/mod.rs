//! What the numbered examples share: deterministic inputs, the check of an output against the
//! exact CPU reference, and opening the GPU. Only the public API is used.

#![allow(dead_code)] // Each example uses part of it.

use attnforge::cuda::Engine;
use attnforge::reference::ReferenceOutput;
use attnforge::{AttentionOutput, AttentionProblem, DType, HostTensor};
use std::error::Error;
use std::process::ExitCode;

/// The result of an example's body.
pub type Outcome = Result<(), Box<dyn Error>>;

/// `n` values in `[-1, 1)` from a fixed-seed xorshift, rounded to `dtype`.
pub fn values(dtype: DType, n: usize, seed: u64) -> HostTensor {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let values: Vec<f32> = (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect();
    HostTensor::from_f32(dtype, &values)
}

/// Contiguous Q, K and V for `p`.
pub fn inputs(p: &AttentionProblem, seed: u64) -> (HostTensor, HostTensor, HostTensor) {
    let (dqk, dvo) = (p.head_dims.qk(), p.head_dims.vo());
    let qo = p.batch.total_qo() * p.num_qo_heads;
    let kv = p.batch.total_kv() * p.num_kv_heads;
    (
        values(p.input_dtype, qo * dqk, seed),
        values(p.input_dtype, kv * dqk, seed + 1),
        values(p.input_dtype, kv * dvo, seed + 2),
    )
}

/// Compares `got` with the exact reference output `want`: prints the relative L2 error of `o`
/// and the largest LSE error, and fails when the former exceeds `rel_l2` or the latter `lse_abs`.
pub fn check(
    what: &str,
    got: &AttentionOutput,
    want: &ReferenceOutput,
    rel_l2: f64,
    lse_abs: f64,
) -> Outcome {
    let o = got.o.to_f32_vec();
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&g, &w) in o.iter().zip(&want.o) {
        diff += (f64::from(g) - w).powi(2);
        norm += w * w;
    }
    let error = (diff / norm.max(f64::MIN_POSITIVE)).sqrt();
    let lse_error = got.lse.as_ref().map_or(0.0, |lse| {
        lse.iter()
            .zip(&want.lse)
            .map(|(&g, &w)| (f64::from(g) - w).abs())
            .fold(0.0, f64::max)
    });
    println!("{what}: relative L2 error {error:.2e}, largest LSE error {lse_error:.2e}");
    if o.len() != want.o.len() || error > rel_l2 || lse_error > lse_abs {
        return Err(format!(
            "{what} differs from the reference (tolerance {rel_l2:.0e}, LSE {lse_abs:.0e})"
        )
        .into());
    }
    Ok(())
}

/// Opens GPU 0 and runs `body` with it; without a GPU, prints `no CUDA device: <why>` and
/// fails (exit status 1), as does an error of `body`.
pub fn with_gpu(body: impl FnOnce(&Engine) -> Outcome) -> ExitCode {
    let engine = match Engine::new(0) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("no CUDA device: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("on {} ({})", engine.info().name, engine.info().arch.name());
    report(body(&engine))
}

/// Exit status 0 on success; otherwise prints the error and exits with 1.
pub fn report(outcome: Outcome) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
