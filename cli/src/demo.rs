//! `attnforge demo`: the main job on the best backend present — a Llama-3-8B-shaped causal
//! prefill and a Gemma-2-shaped soft-capped one — each timed and checked against the exact
//! reference on a sample of rows, printed as a small table.
//!
//! The exit status is non-zero if any case fails its check (or cannot run).

use crate::backend::BackendKind;
use attnforge::compare::{compare_rows, Tolerance};
use attnforge::reference;
use attnforge::shapes::prefill_flops;
use attnforge::testing::{random_inputs, TileRequest};
use attnforge::verify::{sample_rows, Backend};
use attnforge::{AttentionProblem, DType, HeadDims, Mask, RaggedBatch, Variant};
use std::process::ExitCode;
use std::time::Instant;

/// Rows `(token, head)` checked against the reference per case, the first and last included.
const SAMPLED_ROWS: usize = 64;
/// Timed runs per case after one warm-up run; the fastest is reported.
const TIMED_RUNS: usize = 2;
/// Seed of the demo's inputs.
const INPUT_SEED: u64 = 2024;
/// Gemma 2's attention-logit soft-cap.
const GEMMA2_SOFT_CAP: f32 = 50.0;
/// Prefill length of both cases.
const TOKENS: usize = 2048;

/// Arguments of `attnforge demo`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// The backend (default: the best one present; today the CPU).
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    /// Input and output dtype: bf16 (what serving engines feed) or f32.
    #[arg(long, default_value = "bf16", value_parser = parse_dtype)]
    dtype: DType,
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    DType::parse(s).ok_or_else(|| format!("{s:?} is not a dtype (f16, bf16, f32)"))
}

/// One demo case.
struct DemoCase {
    name: &'static str,
    shape: String,
    problem: AttentionProblem,
}

fn demo_cases(dtype: DType) -> Result<Vec<DemoCase>, String> {
    let dims = |d| HeadDims::equal(d).map_err(|e| e.to_string());
    let batch = RaggedBatch::single(TOKENS, TOKENS).map_err(|e| e.to_string())?;
    let llama =
        AttentionProblem::new(batch.clone(), 32, 8, dims(128)?, dtype).with_mask(Mask::Causal);
    let gemma = AttentionProblem::new(batch, 16, 8, dims(256)?, dtype)
        .with_mask(Mask::Causal)
        .with_variant(Variant::SoftCap {
            cap: GEMMA2_SOFT_CAP,
        });
    Ok(vec![
        DemoCase {
            name: "llama3-8b prefill",
            shape: format!("1x{TOKENS} tok, 32/8 heads, D128, causal, {dtype}"),
            problem: llama,
        },
        DemoCase {
            name: "gemma2 soft-cap",
            shape: format!("1x{TOKENS} tok, 16/8 heads, D256, causal, cap 50, {dtype}"),
            problem: gemma,
        },
    ])
}

/// One table row, or why the case could not run.
fn run_case(backend: &dyn Backend, case: &DemoCase) -> Result<(f64, f64, f64, bool), String> {
    let p = &case.problem;
    let (q, k, v) = random_inputs(p, INPUT_SEED);
    let mut out = backend
        .run(p, &q, &k, &v, TileRequest::Planned)
        .map_err(|e| e.to_string())?;
    let mut best = f64::INFINITY;
    for _ in 0..TIMED_RUNS {
        let start = Instant::now();
        out = backend
            .run(p, &q, &k, &v, TileRequest::Planned)
            .map_err(|e| e.to_string())?;
        best = best.min(start.elapsed().as_secs_f64());
    }
    let rows = sample_rows(p, SAMPLED_ROWS);
    let want = reference::attention_rows(p, &q, &k, &v, &rows).map_err(|e| e.to_string())?;
    let cmp = compare_rows(&out, p.num_qo_heads, &rows, &want);
    let ok = cmp.passes(&Tolerance::for_problem(p));
    Ok((best, prefill_flops(p) / best / 1e9, cmp.max_abs_o, ok))
}

/// Runs the demo; see the module doc.
pub fn run(args: DemoArgs) -> ExitCode {
    let backend = match args.backend.unwrap_or_else(BackendKind::best).open() {
        Ok(b) => b,
        Err(why) => {
            eprintln!("error: {why}");
            return ExitCode::FAILURE;
        }
    };
    let cases = match demo_cases(args.dtype) {
        Ok(c) => c,
        Err(why) => {
            eprintln!("error: {why}");
            return ExitCode::FAILURE;
        }
    };
    println!("attnforge demo on {}", backend.describe());
    println!(
        "checked against the f64 reference on {SAMPLED_ROWS} rows per case (first and last included)\n"
    );
    println!(
        "{:<8} {:<18} {:<50} {:>9} {:>8} {:>10}  check",
        "backend", "case", "shape", "time ms", "GFLOP/s", "max err"
    );
    let mut all_ok = true;
    for case in &cases {
        match run_case(backend.as_ref(), case) {
            Ok((seconds, gflops, max_err, ok)) => {
                all_ok &= ok;
                println!(
                    "{:<8} {:<18} {:<50} {:>9.1} {:>8.1} {:>10.2e}  {}",
                    backend.name(),
                    case.name,
                    case.shape,
                    seconds * 1e3,
                    gflops,
                    max_err,
                    if ok { "ok" } else { "FAILED" }
                );
            }
            Err(why) => {
                all_ok = false;
                println!("{:<8} {:<18} error: {why}", backend.name(), case.name);
            }
        }
    }
    if all_ok {
        ExitCode::SUCCESS
    } else {
        eprintln!("demo: verification failed");
        ExitCode::FAILURE
    }
}
