//! Prefill on the GPU: plan once, upload, run on the engine's stream, download, and check
//! against the exact CPU reference.
//!
//! `cargo run --release --example 02_gpu_prefill` (exits with status 1 and `no CUDA device`
//! where there is no GPU).

mod common;

use attnforge::cuda::{DeviceTensor, Engine, PrefillPlan};
use attnforge::{reference, AttentionOutput, AttentionProblem, DType, HeadDims, Mask, RaggedBatch};
use common::Outcome;
use std::process::ExitCode;

fn main() -> ExitCode {
    // Two prompts of 384 and 128 tokens (the second continues 256 cached tokens), 32/8 heads.
    let problem = || -> attnforge::Result<AttentionProblem> {
        let batch = RaggedBatch::from_lens(&[(384, 384), (128, 384)])?;
        Ok(
            AttentionProblem::new(batch, 32, 8, HeadDims::new(128, 128)?, DType::Bf16)
                .with_mask(Mask::Causal),
        )
    };
    match problem() {
        Ok(p) => common::with_gpu(|engine| run(engine, &p)),
        Err(e) => common::report(Err(e.into())),
    }
}

fn run(engine: &Engine, p: &AttentionProblem) -> Outcome {
    // The plan compiles (or loads from the disk cache) the kernel and uploads the work list.
    let plan = PrefillPlan::new(engine, p)?;
    println!(
        "plan: kernel {}, {} CTAs",
        plan.spec().name(),
        plan.num_ctas()
    );

    let (q, k, v) = common::inputs(p, 2);
    let (qd, kd, vd) = (engine.upload(&q)?, engine.upload(&k)?, engine.upload(&v)?);
    // Outputs poisoned with NaN on the device: an element the kernel missed would show.
    let rows = p.batch.total_qo() * p.num_qo_heads;
    let mut o = DeviceTensor::nan(engine.stream(), p.output_dtype, p.output_len())?;
    let mut lse = DeviceTensor::nan(engine.stream(), DType::F32, rows)?;
    // On the engine's stream; nothing allocated, nothing waited for.
    plan.run(engine, &qd, &kd, &vd, &mut o, Some(&mut lse))?;
    engine.synchronize()?;

    let out = AttentionOutput {
        o: o.download(engine.stream())?,
        lse: Some(lse.download(engine.stream())?.to_f32_vec()),
    };
    let want = reference::attention(p, &q, &k, &v)?;
    common::check("gpu prefill vs reference", &out, &want, 1e-2, 1e-3)
}
