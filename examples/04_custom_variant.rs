//! A custom variant: a logits transform and a mask written once in Rust (for the CPU backend and
//! the reference) and once in CUDA (compiled into the GPU kernel). This one is a streaming
//! window, each query seeing the first `prefix` keys and the last `window` keys up to itself,
//! with a per-head linear decay over the distance to the key.
//!
//! `cargo run --release --example 04_custom_variant` runs it on the CPU, then on the GPU; where
//! there is no GPU it exits with status 1 and `no CUDA device` after the CPU part.

mod common;

use attnforge::problem::{CudaVariantSource, CustomVariant, LogitSite, ParamType, ParamValue};
use attnforge::reference::{self, ReferenceOutput};
use attnforge::{AttentionProblem, DType, HeadDims, HostTensor, RaggedBatch, Variant};
use std::process::ExitCode;
use std::sync::Arc;

/// Keys every query sees from the start of its request.
const PREFIX: usize = 4;
/// Keys every query sees up to and including its own position.
const WINDOW: usize = 128;
/// Query heads.
const HEADS: usize = 16;

fn streaming_window() -> CustomVariant {
    let decay: Vec<f32> = (0..HEADS).map(|h| 0.002 * (h + 1) as f32).collect();
    let slopes = decay.clone();
    CustomVariant {
        name: "streaming_window".to_string(),
        // Distances are exact in f32; the CUDA side rounds the product and the difference the
        // same way (`__fmul_rn`, `__fsub_rn`: no fused multiply-add).
        cpu_transform: Arc::new(move |s: f32, site: &LogitSite| {
            let distance = site.qo_idx as f32 - site.kv_idx as f32;
            s - slopes[site.qo_head] * distance
        }),
        cpu_mask: Some(Arc::new(|site: &LogitSite| {
            site.kv_idx <= site.qo_idx
                && (site.kv_idx < PREFIX || site.qo_idx - site.kv_idx < WINDOW)
        })),
        cuda: Some(CudaVariantSource {
            transform_body: "return __fsub_rn(s, __fmul_rn(params.decay[qo_head], \
                             (float)(qo_idx - kv_idx)));"
                .to_string(),
            mask_body: Some(
                "return kv_idx <= qo_idx && (kv_idx < params.prefix || qo_idx - kv_idx < \
                 params.window);"
                    .to_string(),
            ),
            params: vec![
                ("decay".to_string(), ParamType::F32Ptr),
                ("prefix".to_string(), ParamType::I32),
                ("window".to_string(), ParamType::I32),
            ],
        }),
        param_values: vec![
            ParamValue::F32Array(decay),
            ParamValue::I32(PREFIX as i32),
            ParamValue::I32(WINDOW as i32),
        ],
    }
}

/// The problem, its inputs and its exact result.
struct Checked {
    problem: AttentionProblem,
    inputs: (HostTensor, HostTensor, HostTensor),
    want: ReferenceOutput,
}

fn main() -> ExitCode {
    let c = match on_cpu() {
        Ok(c) => c,
        Err(e) => return common::report(Err(e)),
    };
    common::with_gpu(|engine| {
        // Compiles the kernel with the variant's CUDA side, uploads its parameters, runs.
        let (q, k, v) = &c.inputs;
        let out = engine.prefill_host(&c.problem, q, k, v)?;
        common::check("gpu vs reference", &out, &c.want, 2e-3, 1e-3)
    })
}

/// Runs the problem on the CPU backend and checks it against the reference.
fn on_cpu() -> Result<Checked, Box<dyn std::error::Error>> {
    // Two prompts; the mask compares positions, so each request's queries are its keys.
    let batch = RaggedBatch::from_lens(&[(500, 500), (130, 130)])?;
    let problem = AttentionProblem::new(batch, HEADS, 4, HeadDims::new(128, 128)?, DType::F16)
        .with_variant(Variant::Custom(streaming_window()));
    let (q, k, v) = common::inputs(&problem, 4);
    let want = reference::attention(&problem, &q, &k, &v)?;
    let out = attnforge::cpu::attention(&problem, &q, &k, &v)?;
    common::check("cpu vs reference", &out, &want, 2e-3, 1e-3)?;
    Ok(Checked {
        problem,
        inputs: (q, k, v),
        want,
    })
}
