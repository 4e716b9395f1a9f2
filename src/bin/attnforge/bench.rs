//! `attnforge bench`: times the GPU prefill kernel on the shared shape list, after checking it.
//!
//! Each shape is first run once and compared with the exact reference on sampled rows: a wrong
//! kernel is reported as `wrong` and makes the command fail, so a fast wrong kernel never
//! becomes a result. Then CUDA events time `--runs` launches after `--warmup` launches, rotating
//! among input copies when one set would sit in L2, and the median is reported.

use attnforge::codegen::TileConfig;
use attnforge::compare::{compare_rows, Tolerance};
use attnforge::cuda::{DeviceTensor, Engine, PrefillPlan};
use attnforge::shapes::{self, ResolvedShape};
use attnforge::testing::random_inputs;
use attnforge::verify::sample_rows;
use attnforge::{reference, AttentionProblem, DType, Error};
use cudarc::driver::sys::CUevent_flags;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// L2 cache of the largest GPU we target (H200: 60 MB); inputs are rotated until a run's working
/// set is at least twice this.
const L2_BYTES: f64 = 60.0 * 1024.0 * 1024.0;
/// Rows of each output compared with the reference before timing.
const CHECK_ROWS: usize = 48;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// The shape list.
    #[arg(long, default_value = "bench/shapes.json")]
    shapes: PathBuf,
    /// Print the resolved shape list (with flops and bytes) as JSON and exit.
    #[arg(long)]
    print_shapes: bool,
    /// Only shapes whose name contains this.
    #[arg(long)]
    filter: Option<String>,
    /// Run every shape, not only the default selection.
    #[arg(long)]
    all: bool,
    /// Write one JSON line per shape here.
    #[arg(long)]
    json_out: Option<PathBuf>,
    /// Timed launches per shape (median reported).
    #[arg(long, default_value_t = 50)]
    runs: usize,
    /// Untimed launches first.
    #[arg(long, default_value_t = 10)]
    warmup: usize,
    /// Replace the planner's tile (e.g. `w4q2kv64`): for tuning.
    #[arg(long, value_parser = parse_tile)]
    tile: Option<TileConfig>,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Serialize)]
struct ResultLine<'a> {
    suite: &'a str,
    shape: &'a str,
    #[serde(rename = "impl")]
    implementation: &'a str,
    status: String,
    median_ms: Option<f64>,
    tflops: Option<f64>,
    tbps: Option<f64>,
    runs: usize,
    kernel: Option<String>,
}

fn selected(args: &BenchArgs) -> Result<Vec<ResolvedShape>, Error> {
    let text = std::fs::read_to_string(&args.shapes).map_err(|e| {
        attnforge::problem::InvalidProblem::new(
            "--shapes",
            format!("{}: {e}", args.shapes.display()),
        )
    })?;
    let file = shapes::parse(&text)?;
    let mut out = Vec::new();
    for s in file.prefill {
        let wanted = match &args.filter {
            Some(f) => s.name.contains(f.as_str()),
            None => args.all || s.default,
        };
        if wanted {
            out.push(s.resolve()?);
        }
    }
    Ok(out)
}

pub fn run(args: BenchArgs) -> ExitCode {
    let shapes = match selected(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.print_shapes {
        match serde_json::to_string_pretty(&shapes) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
        return ExitCode::SUCCESS;
    }
    let engine = match Engine::new(0) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: attnforge bench needs a GPU: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "device: {} ({}), {} shapes",
        engine.info().name,
        engine.info().arch.name(),
        shapes.len()
    );
    let mut out = match &args.json_out {
        Some(path) => match std::fs::File::create(path) {
            Ok(f) => Some(f),
            Err(e) => {
                eprintln!("error: --json-out {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    let mut failed = false;
    println!(
        "{:<44} {:>10} {:>9} {:>8}  status",
        "shape", "median ms", "TFLOP/s", "TB/s"
    );
    for shape in &shapes {
        let line = bench_one(&engine, shape, &args);
        failed |= line.status != "ok";
        println!(
            "{:<44} {:>10} {:>9} {:>8}  {}",
            shape.shape.name,
            line.median_ms.map_or("-".into(), |x| format!("{x:.3}")),
            line.tflops.map_or("-".into(), |x| format!("{x:.1}")),
            line.tbps.map_or("-".into(), |x| format!("{x:.2}")),
            line.status
        );
        if let Some(f) = out.as_mut() {
            let written = serde_json::to_string(&line).map(|s| writeln!(f, "{s}"));
            if !matches!(written, Ok(Ok(()))) {
                eprintln!("error: writing --json-out failed");
                return ExitCode::FAILURE;
            }
        }
    }
    if failed {
        eprintln!("some shapes failed or were wrong: see the status column");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn bench_one<'a>(engine: &Engine, shape: &'a ResolvedShape, args: &BenchArgs) -> ResultLine<'a> {
    let mut line = ResultLine {
        suite: "prefill",
        shape: &shape.shape.name,
        implementation: "attnforge",
        status: String::new(),
        median_ms: None,
        tflops: None,
        tbps: None,
        runs: 0,
        kernel: None,
    };
    match measure(engine, shape, args, &mut line) {
        Ok(status) => line.status = status,
        Err(e) => line.status = format!("error: {e}"),
    }
    line
}

/// Checks, then times; returns the status (`ok` or `wrong: ...`).
fn measure(
    engine: &Engine,
    shape: &ResolvedShape,
    args: &BenchArgs,
    line: &mut ResultLine,
) -> Result<String, Error> {
    let problem: AttentionProblem = shape.shape.problem()?;
    let plan = PrefillPlan::with_tile(engine, &problem, args.tile)?;
    line.kernel = Some(plan.spec().name());
    let copies = ((2.0 * L2_BYTES / shape.bytes).ceil() as usize).clamp(1, 16);
    let stream = engine.stream();
    let mut sets = Vec::new();
    for c in 0..copies {
        let (q, k, v) = random_inputs(&problem, args.seed.wrapping_add(c as u64));
        sets.push((
            engine.upload(&q)?,
            engine.upload(&k)?,
            engine.upload(&v)?,
            q,
            k,
            v,
        ));
    }
    let mut o = DeviceTensor::nan(stream, problem.output_dtype, problem.output_len())?;
    let mut lse = DeviceTensor::nan(
        stream,
        DType::F32,
        problem.batch.total_qo() * problem.num_qo_heads,
    )?;

    // Correctness first, on the first input set.
    let (q, k, v, qh, kh, vh) = &sets[0];
    plan.run(engine, q, k, v, &mut o, Some(&mut lse))?;
    engine.synchronize()?;
    let out = attnforge::AttentionOutput {
        o: o.download(stream)?,
        lse: Some(lse.download(stream)?.to_f32_vec()),
    };
    let rows = sample_rows(&problem, CHECK_ROWS);
    let expected = reference::attention_rows(&problem, qh, kh, vh, &rows)?;
    let cmp = compare_rows(&out, problem.num_qo_heads, &rows, &expected);
    if !cmp.passes(&Tolerance::for_problem(&problem)) {
        return Ok(format!("wrong: {cmp}"));
    }

    for i in 0..args.warmup {
        let (q, k, v, ..) = &sets[i % copies];
        plan.run(engine, q, k, v, &mut o, Some(&mut lse))?;
    }
    let mut times = Vec::with_capacity(args.runs);
    for i in 0..args.runs {
        let (q, k, v, ..) = &sets[i % copies];
        let start = stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda("event"))?;
        plan.run(engine, q, k, v, &mut o, Some(&mut lse))?;
        let end = stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda("event"))?;
        end.synchronize().map_err(cuda("event synchronisation"))?;
        times.push(start.elapsed_ms(&end).map_err(cuda("event timing"))? as f64);
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    line.median_ms = Some(median);
    line.tflops = Some(shape.flops / (median * 1e-3) / 1e12);
    line.tbps = Some(shape.bytes / (median * 1e-3) / 1e12);
    line.runs = times.len();
    Ok("ok".into())
}

fn parse_tile(s: &str) -> Result<TileConfig, String> {
    TileConfig::parse(s).ok_or_else(|| {
        format!("{s:?} is not a tile like w4q2kv64 (warps, m16 tiles per warp, keys)")
    })
}

fn cuda(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |source| {
        Error::Cuda(attnforge::cuda::CudaError::Driver {
            call: call.into(),
            source,
        })
    }
}
