//! `attnforge bench`: times the GPU kernels on the shared shape list, after checking them.
//!
//! Two suites: `prefill` (ragged K/V) and `paged` (batch decode and paged prefill over a paged
//! cache, with the page table the resolved shape list gives the peers too, and the append of new
//! tokens' K/V into such a cache: `append.rs`). Each attention shape is first run once and
//! compared with the exact reference on sampled rows, each append with the host's append bit for
//! bit: a wrong kernel is reported as `wrong` and makes the command fail, so a fast wrong kernel
//! never becomes a result.
//!
//! Then the kernel time, the way `bench/peers.py` times every peer (docs/benchmarking.md): N
//! launches (rotating among input copies when one set would sit in L2) are captured in a CUDA
//! graph, N chosen so that one replay lasts about `--replay-ms`; the replays are timed between
//! two CUDA events each, as many as fill `--target-ms` of GPU time (at least `--runs`, at most
//! `--max-runs`), and the median replay over N is the time of one launch. `--method
//! back-to-back` times groups of N launches enqueued back to back instead. Both sides run about
//! as long: under sustained load the GPU lowers its clock (measured on an H200: from 1980 to
//! about 1675 MHz within a second of the heaviest shapes), so a side timed for less time would
//! be timed at a higher clock. Apart from the kernel, the host time of one `run` call (wall
//! time, no synchronisation) is measured, its median reported as `host_us`.

mod append;
mod fp8;

use crate::backend::{parse_arch, parse_tile};
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
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use timing::{time_launches, Timing};

mod timing;

/// L2 cache of the largest GPU we target (H200: 60 MB); inputs are rotated until a run's working
/// set is at least twice this.
const L2_BYTES: f64 = 60.0 * 1024.0 * 1024.0;
/// Rows of each output compared with the reference before timing.
const CHECK_ROWS: usize = 48;

/// Which list of `bench/shapes.json`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchSuite {
    /// Prefill over ragged K/V.
    Prefill,
    /// Batch decode and paged prefill over a paged KV cache, and the append into one.
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
    #[command(flatten)]
    timing: Timing,
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
    /// Timed replays (of `launches` launches each).
    runs: usize,
    method: &'static str,
    launches: usize,
    host_us: Option<f64>,
    host_calls: usize,
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
    if let Err(e) = args.timing.check() {
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
    if shapes.is_empty() {
        // Timing nothing is not a benchmark (`--print-shapes` lists the empty selection).
        let by = match (&args.filter, args.all) {
            (Some(f), _) => format!(" matches --filter {f:?}"),
            (None, true) => " is listed".to_string(),
            (None, false) => " is marked default (--all takes every shape)".to_string(),
        };
        eprintln!(
            "error: no shape of {} ({:?} suite){by}; nothing to time",
            args.shapes.display(),
            args.suite
        );
        return ExitCode::FAILURE;
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
        "{:<44} {:>10} {:>9} {:>8} {:>8}  status ({})",
        "shape",
        "median ms",
        "TFLOP/s",
        "TB/s",
        "host us",
        args.timing.method.name()
    );
    for shape in &shapes {
        let line = bench_one(&engine, shape, &args);
        failed |= line.status != "ok";
        println!(
            "{:<44} {:>10} {:>9} {:>8} {:>8}  {}",
            shape.shape.name,
            line.median_ms.map_or("-".into(), |x| format!("{x:.4}")),
            line.tflops.map_or("-".into(), |x| format!("{x:.1}")),
            line.tbps.map_or("-".into(), |x| format!("{x:.2}")),
            line.host_us.map_or("-".into(), |x| format!("{x:.1}")),
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
        method: args.timing.method.name(),
        launches: 0,
        host_us: None,
        host_calls: 0,
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

/// Times `launch(i)` (input copy `i`) with [`time_launches`] and fills `line` in.
fn time_runs(
    engine: &Engine,
    shape: &ResolvedShape,
    args: &BenchArgs,
    line: &mut ResultLine,
    launch: impl FnMut(usize) -> Result<(), Error>,
) -> Result<String, Error> {
    let timed = time_launches(engine, &args.timing, copies_for(shape), launch)?;
    let seconds = timed.median_ms * 1e-3;
    line.median_ms = Some(timed.median_ms);
    // An append does no arithmetic: no TFLOP/s.
    line.tflops = (shape.flops > 0.0).then(|| shape.flops / seconds / 1e12);
    line.tbps = Some(shape.bytes / seconds / 1e12);
    line.runs = timed.replays;
    line.launches = timed.launches;
    line.host_us = Some(timed.host_us);
    line.host_calls = timed.host_calls;
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
    if shape.shape.append {
        return append::measure_append(engine, shape, args, line);
    }
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
    fn replays_fill_the_target_within_the_limits() {
        let a = args(&[]).timing;
        assert_eq!(a.timed_runs(4.0), 50, "200 ms of 4 ms replays");
        assert_eq!(a.timed_runs(30.0), 10, "never fewer than --runs");
        assert_eq!(a.timed_runs(0.5), 100, "never more than --max-runs");
        assert_eq!(a.timed_runs(0.0), 100, "a probe that measured nothing");
        assert_eq!(a.timed_runs(f64::NAN), 100, "nor a NaN probe");
        let b = args(&["--runs", "5", "--max-runs", "1000", "--target-ms", "40"]).timing;
        assert_eq!(b.timed_runs(1.0), 40);
    }

    #[test]
    fn a_replay_lasts_the_replay_time_and_reads_every_copy() {
        let a = args(&[]).timing;
        assert_eq!(
            a.launches_per_replay(0.016, 1),
            250,
            "4 ms of 16 us launches"
        );
        assert_eq!(a.launches_per_replay(0.5, 16), 16, "every input copy once");
        assert_eq!(a.launches_per_replay(30.0, 1), 1, "at least one launch");
        assert_eq!(
            a.launches_per_replay(0.0, 1),
            1000,
            "at most --max-launches"
        );
        assert_eq!(
            a.launches_per_replay(f64::NAN, 1),
            1000,
            "nor for a NaN probe"
        );
        let b = args(&["--replay-ms", "1", "--max-launches", "8"]).timing;
        assert_eq!(b.launches_per_replay(0.1, 1), 8);
        assert_eq!(b.launches_per_replay(0.25, 1), 4);
    }

    #[test]
    fn timing_options_the_timing_cannot_use_are_refused() {
        let check = |extra: &[&str]| args(extra).timing.check();
        assert!(check(&[]).is_ok());
        assert!(check(&["--runs", "0"]).is_err());
        assert!(check(&["--runs", "300"]).is_err());
        assert!(check(&["--runs", "300", "--max-runs", "300"]).is_ok());
        assert!(check(&["--target-ms", "0"]).is_err());
        assert!(check(&["--target-ms", "inf"]).is_err());
        assert!(check(&["--replay-ms=-1"]).is_err());
        assert!(check(&["--max-launches", "0"]).is_err());
    }

    #[test]
    fn both_methods_are_named_as_the_peers_name_them() {
        assert_eq!(args(&[]).timing.method.name(), "graph");
        let b = args(&["--method", "back-to-back"]).timing;
        assert_eq!(b.method.name(), "back-to-back");
    }
}
