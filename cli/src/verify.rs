//! `attnforge verify`: the randomized correctness suite of `attnforge::testing` run through one
//! backend and judged against the exact reference (`attnforge::verify`).
//!
//! Prints one line per failing case (and per case with `-v`) and ends with the line
//! `N passed, M failed`; the exit status is non-zero when M > 0, and when `--filter` or `--tile`
//! leaves no case to run (nothing verified is not a pass). Progress through the case list goes
//! to stderr ([`CaseProgress`]).

use crate::backend::{parse_arch, parse_tile, BackendKind};
use attnforge::codegen::{KernelSpec, KvCache, TileConfig};
use attnforge::jit::Arch;
use attnforge::testing::{cases, merge_cases, Case, MergeCase, PagedRun, Suite};
use attnforge::verify::{run_cases, run_merge_case, smallest_case, CaseResult, SELF_CHECK};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How often a log (stderr not a terminal) gets a progress line: often enough to show a long GPU
/// run moving (the full suite's kernels compile while its cases run), rarely enough not to
/// drown the result lines.
const PROGRESS_LINE_INTERVAL: Duration = Duration::from_secs(15);

/// Progress through the attention cases on stderr, beside the result lines on stdout: a bar on a
/// terminal (result lines printed above it), otherwise a line at most every
/// [`PROGRESS_LINE_INTERVAL`].
struct CaseProgress {
    bar: Option<ProgressBar>,
    total: usize,
    done: usize,
    failed: usize,
    start: Instant,
    last_line: Instant,
}

impl CaseProgress {
    fn new(total: usize) -> CaseProgress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(total as u64);
            if let Ok(style) =
                ProgressStyle::with_template("cases [{bar:30}] {pos}/{len} {elapsed_precise} {msg}")
            {
                bar.set_style(style.progress_chars("=> "));
            }
            bar
        });
        let now = Instant::now();
        CaseProgress {
            bar,
            total,
            done: 0,
            failed: 0,
            start: now,
            last_line: now,
        }
    }

    /// Records one finished case; `print` writes its result lines (above the bar).
    fn record(&mut self, passed: bool, print: impl FnOnce()) {
        self.done += 1;
        self.failed += usize::from(!passed);
        match &self.bar {
            Some(bar) => {
                bar.suspend(print);
                bar.set_message(format!("{} failed", self.failed));
                bar.inc(1);
            }
            None => {
                print();
                if self.last_line.elapsed() >= PROGRESS_LINE_INTERVAL && self.done < self.total {
                    self.last_line = Instant::now();
                    eprintln!(
                        "verify: {} of {} cases done, {} failed, {:.0} s",
                        self.done,
                        self.total,
                        self.failed,
                        self.start.elapsed().as_secs_f64()
                    );
                }
            }
        }
    }

    /// Clears the bar (lines need no closing).
    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// The case list, as named on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SuiteArg {
    /// Every mask × variant pair once; a few seconds.
    Quick,
    /// Every mask × variant × dtype configuration × head dims; minutes.
    Full,
}

/// Arguments of `attnforge verify`.
#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    /// The backend to verify (default: the best one present).
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    /// Which case list.
    #[arg(long, value_enum, default_value = "quick")]
    suite: SuiteArg,
    /// Base seed of the case list and inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Only cases whose name contains this.
    #[arg(long)]
    filter: Option<String>,
    /// Print a line for every case, not only failures.
    #[arg(short, long)]
    verbose: bool,
    /// Plan the kernels of this GPU architecture rather than the device's (cuda backend only):
    /// `--tiles-of sm_80` runs the sm_80 (`mma.sync`) kernels on a Hopper GPU, compiled for it.
    #[arg(long, value_parser = parse_arch)]
    tiles_of: Option<Arch>,
    /// Compute every case with this tile (cuda backend only), e.g. `--tile ws4q1kv64`: the cases
    /// whose kernel the tile cannot compute (by K/V storage, QK accumulation, head dims) are left
    /// out, and the header line counts them; the planner's tile otherwise.
    #[arg(long, value_parser = parse_tile)]
    tile: Option<TileConfig>,
    /// Split every case's KV range into chunks of this many keys rather than as the planner
    /// chooses (cuda backend only): the split path of a tile the planner never splits, e.g.
    /// `--tile ws4q1kv64 --split-keys 256`. A positive multiple of the kernels' KV tile (64 or
    /// 128); a case whose kernel it does not suit fails with the plan's error.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    split_keys: Option<u64>,
}

/// Whether `tile` can compute the kernel of `case` (`None`: the planner's tile, always): its
/// spec exists (K/V storage, QK accumulation, head dims, an fp8 cache), and a case replayed from
/// a CUDA graph needs a graph-stable plan, which the warp-specialised tile has not.
fn tile_computes(tile: Option<TileConfig>, case: &Case) -> bool {
    let Some(t) = tile else {
        return true;
    };
    let kv = if case.paged.is_some() {
        KvCache::Paged
    } else {
        KvCache::Ragged
    };
    let fp8 = case.paged.as_ref().and_then(|c| c.fp8.map(|f| f.format));
    let replayed = case
        .paged
        .as_ref()
        .is_some_and(|c| c.run == PagedRun::GraphReplay);
    KernelSpec::for_problem(&case.problem, kv, t)
        .and_then(|s| s.with_kv_fp8(fp8))
        .is_ok()
        && !(t.warp_specialized && replayed)
}

fn report(result: &CaseResult, seed: u64, verbose: bool) {
    if result.passed && !verbose {
        return;
    }
    let verdict = if result.passed { "ok  " } else { "FAIL" };
    let detail = match &result.outcome {
        Ok(c) => c.to_string(),
        Err(e) => format!("error: {e}"),
    };
    let oracle = match result.oracle.describe() {
        "" => String::new(),
        words => format!(", {words}"),
    };
    let ms = result.backend_time.as_secs_f64() * 1e3;
    println!(
        "{verdict} {} (seed {seed}, {ms:.0} ms{oracle}): {detail}",
        result.name
    );
    for (label, outcome, passed) in &result.also {
        let verdict = if *passed { "ok  " } else { "FAIL" };
        match outcome {
            Ok(c) => println!("     {verdict} {label}: {c}"),
            Err(e) => println!("     {verdict} {label}: error: {e}"),
        }
    }
}

/// Runs the suite; see the module doc.
pub fn run(args: VerifyArgs) -> ExitCode {
    let kind = args.backend.unwrap_or_else(BackendKind::best);
    let backend = match kind.open_with(
        args.tiles_of,
        args.tile,
        args.split_keys.map(|k| k as usize),
    ) {
        Ok(b) => b,
        Err(why) => {
            eprintln!("error: {why}");
            return ExitCode::FAILURE;
        }
    };
    let suite = match args.suite {
        SuiteArg::Quick => Suite::Quick,
        SuiteArg::Full => Suite::Full,
    };
    let named: Vec<Case> = cases(suite, args.seed, &backend.caps())
        .into_iter()
        .filter(|c| args.filter.as_deref().is_none_or(|f| c.name.contains(f)))
        .collect();
    let named_count = named.len();
    let selected: Vec<Case> = named
        .into_iter()
        .filter(|c| tile_computes(args.tile, c))
        .collect();
    if let Some(tile) = args.tile {
        println!(
            "verify: --tile {} leaves out {} of the {named_count} cases (a kernel it cannot compute)",
            tile.label(),
            named_count - selected.len()
        );
    }
    if let Some(keys) = args.split_keys {
        println!(
            "verify: every plan splits the KV range into chunks of {keys} keys (--split-keys)"
        );
    }
    let merges: Vec<MergeCase> = merge_cases(suite, args.seed)
        .into_iter()
        .filter(|c| args.filter.as_deref().is_none_or(|f| c.name.contains(f)))
        .collect();
    println!(
        "verify: {} attention and {} merge cases of the {:?} suite (seed {}) on {}",
        selected.len(),
        merges.len(),
        args.suite,
        args.seed,
        backend.describe()
    );
    if let Err(e) = backend.prepare(&selected) {
        eprintln!("error: preparing the cases: {e}");
        return ExitCode::FAILURE;
    }
    let mut progress = CaseProgress::new(selected.len());
    let mut summary = run_cases(backend.as_ref(), &selected, |r| {
        progress.record(r.passed, || report(r, args.seed, args.verbose))
    });
    progress.finish();
    if summary.stopped.is_some() {
        summary.not_run += merges.len();
    } else {
        let mut results: Vec<CaseResult> = merges
            .iter()
            .map(|case| run_merge_case(backend.as_ref(), case))
            .collect();
        // The backend's self-checks, with the smallest case of the whole list.
        let all: Vec<Case> = cases(suite, args.seed, &backend.caps())
            .into_iter()
            .filter(|c| tile_computes(args.tile, c))
            .collect();
        let wanted = args
            .filter
            .as_deref()
            .is_none_or(|f| f.starts_with(SELF_CHECK));
        if let Some(small) = smallest_case(&all).filter(|_| wanted) {
            results.extend(backend.self_checks(small));
        }
        for result in &results {
            report(result, args.seed, args.verbose);
            if result.passed {
                summary.passed += 1;
            } else {
                summary.failed += 1;
            }
        }
    }
    if let Some(why) = &summary.stopped {
        println!(
            "stopped {why}; the {} cases after it were not run",
            summary.not_run
        );
        println!(
            "{} passed, {} failed, {} not run",
            summary.passed, summary.failed, summary.not_run
        );
        return ExitCode::FAILURE;
    }
    println!("{} passed, {} failed", summary.passed, summary.failed);
    if summary.passed + summary.failed == 0 {
        // A filter or tile that selects nothing verified nothing: not a pass.
        eprintln!(
            "error: no case of the {:?} suite was selected{}{}; nothing was verified",
            args.suite,
            args.filter
                .as_deref()
                .map_or(String::new(), |f| format!(" by --filter {f:?}")),
            args.tile
                .map_or(String::new(), |t| format!(" with --tile {}", t.label())),
        );
        return ExitCode::FAILURE;
    }
    if summary.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
