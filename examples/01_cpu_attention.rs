//! Attention on the CPU: a ragged batch with GQA, a causal mask and a soft-cap, computed by the
//! fast CPU backend and checked against the exact (f64) reference.
//!
//! `cargo run --release --example 01_cpu_attention`

mod common;

use attnforge::{reference, AttentionProblem, DType, HeadDims, Mask, RaggedBatch, Variant};
use common::Outcome;
use std::process::ExitCode;
use std::time::Instant;

fn main() -> ExitCode {
    common::report(run())
}

fn run() -> Outcome {
    // Three requests of (queries, keys): a prefill, a chunk of a longer prompt, a decode step.
    let batch = RaggedBatch::from_lens(&[(200, 200), (64, 512), (1, 900)])?;
    // 32 query heads sharing 8 KV heads, head dim 128, f16 in and out.
    let p = AttentionProblem::new(batch, 32, 8, HeadDims::new(128, 128)?, DType::F16)
        .with_mask(Mask::Causal)
        .with_variant(Variant::SoftCap { cap: 50.0 });
    let (q, k, v) = common::inputs(&p, 1);

    let start = Instant::now();
    let out = attnforge::cpu::attention(&p, &q, &k, &v)?;
    println!(
        "cpu::attention: {} queries x 32 heads over {} keys in {:.1} ms ({})",
        p.batch.total_qo(),
        p.batch.total_kv(),
        start.elapsed().as_secs_f64() * 1e3,
        attnforge::cpu::Isa::detect().name()
    );
    // o is [total_qo, num_qo_heads, head_dim_vo] in the output dtype; lse [total_qo, num_qo_heads].
    let lse = out.lse.as_ref().ok_or("the problem asks for the LSE")?;
    println!("o[0] = {:.4}, lse[0] = {:.4}", out.o.get_f32(0), lse[0]);

    let want = reference::attention(&p, &q, &k, &v)?;
    common::check("cpu vs reference", &out, &want, 2e-3, 1e-3)
}
