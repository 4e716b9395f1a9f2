//! `attnforge bench`: times the GPU kernels on the shared shape list, after checking them.
//!
//! Two suites: `prefill` (ragged K/V) and `paged` (batch decode and paged prefill over a paged
//! cache, with the page table the resolved shape list gives the peers too). Each shape is first
//! run once and compared with the exact reference on sampled rows: a wrong kernel is reported as
//! `wrong` and makes the command fail, so a fast wrong kernel never becomes a result. Then CUDA
//! events time the launches, rotating among input copies when one set would sit in L2, and the
//! median is reported. How many launches follows the peers' rule (`bench/peers.py`): after
//! `--warmup` launches and 5 probe launches, enough to fill `--target-ms` of GPU time, at least
//! `--runs` and at most `--max-runs`. Both sides then run about as long: under sustained load
//! the GPU lowers its clock (measured on an H200: from 1980 to about 1675 MHz within a second of
//! the heaviest shapes), so a side timed over fewer launches would be timed at a higher clock.

mod fp8;

use crate::backend::parse_arch;
use attnforge::codegen::TileConfig;
use attnforge::compare::{compare_rows, Tolerance};
use attnforge::cuda::{
    DevicePagedKv, DeviceTensor, Engine, PagedPlan, PlanOptions, PrefillPlan, SplitChoice,
};
use attnforge::jit::Arch;
use attnforge::paged::{append_paged_kv, PagedKvMut};
use attnforge::shapes::{self, ResolvedShape};
use attnforge::tensor::HostTensor;
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
/// Launches timed together, after the warm-up, to estimate one launch's GPU time (the peers'
/// PROBE_RUNS).
const PROBE_RUNS: usize = 5;

/// Which list of `bench/shapes.json`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchSuite {
    /// Prefill over ragged K/V.
    Prefill,
    /// Batch decode and paged prefill over a paged KV cache.
    Paged,
}

impl BenchSuite {
    fn name(self) -> &'static str {
        match self {
            BenchSuite::Prefill => "prefill",
            BenchSuite::Paged => "paged",
        }
    }
}

#[derive(clap::Args)]
pub struct BenchArgs {
    /// The shape list of `--shapes` to run.
    #[arg(long, value_enum, default_value_t = BenchSuite::Prefill)]
    suite: BenchSuite,
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
    /// Fewest timed launches per shape (the median is reported); more while they take less than
    /// `--target-ms` of GPU time, up to `--max-runs` (the peers' rule).
    #[arg(long, default_value_t = 50)]
    runs: usize,
    /// Most timed launches per shape.
    #[arg(long, default_value_t = 200)]
    max_runs: usize,
    /// GPU time the timed launches of a shape should fill, in milliseconds.
    #[arg(long, default_value_t = 300.0)]
    target_ms: f64,
    /// Untimed launches first (then 5 more, timed together, estimate one launch's time).
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Replace the planner's tile (e.g. `w4q2kv64`): for tuning.
    #[arg(long, value_parser = parse_tile)]
    tile: Option<TileConfig>,
    /// Replace the planner's KV split: `none`, or chunks of N keys (a multiple of the KV tile):
    /// for tuning.
    #[arg(long, value_parser = parse_split, default_value = "planned")]
    split: SplitChoice,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Plan the kernels of this GPU architecture rather than the device's: `--tiles-of sm_80`
    /// times the sm_80 (`mma.sync`) kernels on a Hopper GPU, compiled for it (a proxy: ptxas
    /// allocates their registers for the device, not for sm_80).
    #[arg(long, value_parser = parse_arch)]
    tiles_of: Option<Arch>,
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
    let list = match args.suite {
        BenchSuite::Prefill => file.prefill,
        BenchSuite::Paged => file.paged,
    };
    let mut out = Vec::new();
    for s in list {
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
    if let Err(e) = args.check_run_counts() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
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
    if let Some(arch) = args.tiles_of {
        println!(
            "tiles of {}: that architecture's kernels, compiled for this device",
            arch.name()
        );
    }
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
        suite: args.suite.name(),
        shape: &shape.shape.name,
        implementation: "attnforge",
        status: String::new(),
        median_ms: None,
        tflops: None,
        tbps: None,
        runs: 0,
        kernel: None,
    };
    let measured = match args.suite {
        BenchSuite::Prefill => measure(engine, shape, args, &mut line),
        BenchSuite::Paged => measure_paged(engine, shape, args, &mut line),
    };
    match measured {
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
    let plan = PrefillPlan::with_options(engine, &problem, args.plan_options())?;
    line.kernel = Some(plan.spec().name());
    let copies = copies_for(shape);
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
    let (mut o, mut lse) = poisoned_outputs(engine, &problem)?;

    // Correctness first, on the first input set.
    let (q, k, v, qh, kh, vh) = &sets[0];
    plan.run(engine, q, k, v, &mut o, Some(&mut lse))?;
    if let Some(wrong) = check_sampled(engine, &problem, &o, &lse, (qh, kh, vh))? {
        return Ok(wrong);
    }

    time_runs(engine, shape, args, line, |i| {
        let (q, k, v, ..) = &sets[i % copies];
        plan.run(engine, q, k, v, &mut o, Some(&mut lse))
    })
}

/// O and the LSE of `problem` on the device, filled with NaN (an unwritten element shows).
fn poisoned_outputs(
    engine: &Engine,
    problem: &AttentionProblem,
) -> Result<(DeviceTensor, DeviceTensor), Error> {
    let stream = engine.stream();
    Ok((
        DeviceTensor::nan(stream, problem.output_dtype, problem.output_len())?,
        DeviceTensor::nan(
            stream,
            DType::F32,
            problem.batch.total_qo() * problem.num_qo_heads,
        )?,
    ))
}

/// Waits for the run that wrote `o` and `lse`, then compares sampled rows with the reference on
/// the ragged inputs; `Some("wrong: ...")` when they differ beyond the tolerance.
fn check_sampled(
    engine: &Engine,
    problem: &AttentionProblem,
    o: &DeviceTensor,
    lse: &DeviceTensor,
    (q, k, v): (&HostTensor, &HostTensor, &HostTensor),
) -> Result<Option<String>, Error> {
    let stream = engine.stream();
    engine.synchronize()?;
    let out = attnforge::AttentionOutput {
        o: o.download(stream)?,
        lse: Some(lse.download(stream)?.to_f32_vec()),
    };
    let rows = sample_rows(problem, CHECK_ROWS);
    let expected = reference::attention_rows(problem, q, k, v, &rows)?;
    let cmp = compare_rows(&out, problem.num_qo_heads, &rows, &expected);
    Ok((!cmp.passes(&Tolerance::for_problem(problem))).then(|| format!("wrong: {cmp}")))
}

/// Input copies that make one run's working set at least twice the L2 (at most 16).
fn copies_for(shape: &ResolvedShape) -> usize {
    ((2.0 * L2_BYTES / shape.bytes).ceil() as usize).clamp(1, 16)
}

/// Warm-up, a probe of one launch's time, then [`BenchArgs::timed_runs`] timed launches
/// (`launch(i)` runs with input copy `i`), each between two CUDA events; the median goes into
/// `line`.
fn time_runs(
    engine: &Engine,
    shape: &ResolvedShape,
    args: &BenchArgs,
    line: &mut ResultLine,
    mut launch: impl FnMut(usize) -> Result<(), Error>,
) -> Result<String, Error> {
    let stream = engine.stream();
    for i in 0..args.warmup {
        launch(i)?;
    }
    let record = || {
        stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda("event"))
    };
    let probe_start = record()?;
    for i in 0..PROBE_RUNS {
        launch(args.warmup + i)?;
    }
    let probe_end = record()?;
    engine.synchronize()?;
    let probe_ms = f64::from(
        probe_start
            .elapsed_ms(&probe_end)
            .map_err(cuda("event timing"))?,
    ) / PROBE_RUNS as f64;
    let runs = args.timed_runs(probe_ms);
    // Every run is enqueued before any is waited for, so the GPU never idles between runs
    // waiting for the host's next launch (that gap would count in short kernels' times).
    let mut events = Vec::with_capacity(runs);
    for i in 0..runs {
        let start = record()?;
        launch(i)?;
        let end = record()?;
        events.push((start, end));
    }
    engine.synchronize()?;
    let mut times = Vec::with_capacity(runs);
    for (start, end) in &events {
        times.push(start.elapsed_ms(end).map_err(cuda("event timing"))? as f64);
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    line.median_ms = Some(median);
    line.tflops = Some(shape.flops / (median * 1e-3) / 1e12);
    line.tbps = Some(shape.bytes / (median * 1e-3) / 1e12);
    line.runs = times.len();
    Ok("ok".into())
}

/// One input set of a paged shape: the queries and the cache on the device.
struct PagedSet {
    q: DeviceTensor,
    k_cache: DeviceTensor,
    v_cache: DeviceTensor,
}

/// Checks, then times a paged shape; returns the status (`ok` or `wrong: ...`).
fn measure_paged(
    engine: &Engine,
    shape: &ResolvedShape,
    args: &BenchArgs,
    line: &mut ResultLine,
) -> Result<String, Error> {
    let paged = shape.shape.paged_problem()?;
    if let Some(format) = shape.shape.kv_fp8()? {
        return fp8::measure_paged_fp8(engine, shape, args, line, paged, format);
    }
    let problem = paged.problem().clone();
    let layout = *paged.layout();
    let plan = PagedPlan::with_options(engine, &paged, args.plan_options())?;
    line.kernel = Some(format!(
        "{} ({} CTAs{})",
        plan.spec().name(),
        plan.num_ctas(),
        plan.kv_split()
            .map_or(String::new(), |s| format!(", KV chunks of {}", s.chunk))
    ));
    let copies = copies_for(shape);
    let mut sets = Vec::new();
    let mut first = None;
    for c in 0..copies {
        let (q, k, v) = random_inputs(&problem, args.seed.wrapping_add(c as u64));
        let mut k_cache = HostTensor::nan(layout.dtype, layout.k_buffer_len());
        let mut v_cache = HostTensor::nan(layout.dtype, layout.v_buffer_len());
        append_paged_kv(
            &layout,
            paged.table(),
            &problem.batch.kv_indptr,
            &k,
            &v,
            PagedKvMut::Separate {
                k: &mut k_cache,
                v: &mut v_cache,
            },
        )?;
        sets.push(PagedSet {
            q: engine.upload(&q)?,
            k_cache: engine.upload(&k_cache)?,
            v_cache: engine.upload(&v_cache)?,
        });
        if c == 0 {
            first = Some((q, k, v));
        }
    }
    let (mut o, mut lse) = poisoned_outputs(engine, &problem)?;
    let run = |set: &PagedSet, o: &mut DeviceTensor, lse: &mut DeviceTensor| {
        let cache = DevicePagedKv::Separate {
            k: &set.k_cache,
            v: &set.v_cache,
        };
        plan.run(engine, &set.q, cache, o, Some(lse))
    };

    // Correctness first, on the first input set, against the reference on the ragged K/V.
    run(&sets[0], &mut o, &mut lse)?;
    let (qh, kh, vh) = first.as_ref().expect("at least one input copy");
    if let Some(wrong) = check_sampled(engine, &problem, &o, &lse, (qh, kh, vh))? {
        return Ok(wrong);
    }
    time_runs(engine, shape, args, line, |i| {
        run(&sets[i % copies], &mut o, &mut lse)
    })
}

impl BenchArgs {
    /// Refuses run counts the timing cannot use.
    fn check_run_counts(&self) -> Result<(), String> {
        if self.runs == 0 {
            return Err("--runs must be at least 1".into());
        }
        if self.max_runs < self.runs {
            return Err(format!(
                "--max-runs {} is below --runs {}",
                self.max_runs, self.runs
            ));
        }
        if !(self.target_ms.is_finite() && self.target_ms > 0.0) {
            return Err(format!(
                "--target-ms must be a positive number of milliseconds, got {}",
                self.target_ms
            ));
        }
        Ok(())
    }

    /// Timed launches for a shape whose launch took `probe_ms` of GPU time: enough to fill
    /// `--target-ms`, within `--runs..=--max-runs`.
    fn timed_runs(&self, probe_ms: f64) -> usize {
        // A float past usize's range converts to usize::MAX, which the clamp brings down.
        let wanted = (self.target_ms / probe_ms.max(1e-3)).ceil() as usize;
        wanted.clamp(self.runs, self.max_runs)
    }

    fn plan_options(&self) -> PlanOptions {
        PlanOptions {
            tile: self.tile,
            split: self.split,
            tiles_of: self.tiles_of,
        }
    }
}

fn parse_split(s: &str) -> Result<SplitChoice, String> {
    match s {
        "planned" => Ok(SplitChoice::Planned),
        "none" => Ok(SplitChoice::Unsplit),
        n => n
            .parse::<usize>()
            .map(SplitChoice::ChunkKeys)
            .map_err(|_| format!("{s:?} is not `planned`, `none` or a number of keys per chunk")),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn args(extra: &[&str]) -> BenchArgs {
        Cli::parse_from(std::iter::once("bench").chain(extra.iter().copied())).bench
    }

    #[test]
    fn timed_launches_fill_the_target_within_the_limits() {
        let a = args(&[]);
        assert_eq!(a.timed_runs(1.6), 188, "300 ms of 1.6 ms launches");
        assert_eq!(a.timed_runs(10.0), 50, "never fewer than --runs");
        assert_eq!(a.timed_runs(0.01), 200, "never more than --max-runs");
        assert_eq!(a.timed_runs(0.0), 200, "a probe that measured nothing");
        assert_eq!(a.timed_runs(f64::NAN), 200, "nor a NaN probe");
        let b = args(&["--runs", "5", "--max-runs", "1000", "--target-ms", "40"]);
        assert_eq!(b.timed_runs(1.0), 40);
    }

    #[test]
    fn run_counts_the_timing_cannot_use_are_refused() {
        assert!(args(&[]).check_run_counts().is_ok());
        assert!(args(&["--runs", "0"]).check_run_counts().is_err());
        assert!(args(&["--runs", "300"]).check_run_counts().is_err());
        assert!(args(&["--runs", "300", "--max-runs", "300"])
            .check_run_counts()
            .is_ok());
        assert!(args(&["--target-ms", "0"]).check_run_counts().is_err());
        assert!(args(&["--target-ms", "inf"]).check_run_counts().is_err());
    }
}
