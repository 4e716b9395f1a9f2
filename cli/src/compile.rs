//! `attnforge compile`: compile every kernel the engine can emit (`codegen::compile_matrix`, the
//! GPU reference kernels of `codegen::reference_matrix`, the paged-KV append and merge kernels)
//! for each requested architecture, and report registers, spills and shared memory per kernel.
//!
//! Exits non-zero when any kernel fails to render or compile, and when any kernel spills
//! registers beyond what it is declared to allow (`RenderedKernel::spill_budget_bytes`). This is the
//! command CI runs for sm_90a and sm_80 over the whole matrix.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use attnforge::codegen::{self, RenderedKernel, TileConfig};
use attnforge::jit::batch::{compile_all, BatchJob, Progress};
use attnforge::jit::{Arch, CacheStatus, CompileOptions, Jit, JitError, JitOutput, SnippetSpan};
use attnforge::problem::HeadDims;
use serde::Serialize;

/// Default targets: Ampere, Ada, Hopper.
const DEFAULT_ARCHS: &str = "sm_80,sm_89,sm_90a";
/// Milliseconds per second, for printing.
const MS_PER_S: f64 = 1e3;

/// Arguments of `attnforge compile`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Comma-separated targets (sm_80, sm_86, sm_89, sm_90a).
    #[arg(long, default_value = DEFAULT_ARCHS)]
    arch: String,
    /// Only kernels whose name contains this text.
    #[arg(long)]
    filter: Option<String>,
    /// Parallel compiles (default: the number of CPUs).
    #[arg(long)]
    jobs: Option<usize>,
    /// Compile everything; neither read nor write the disk cache.
    #[arg(long)]
    no_cache: bool,
    /// Print one JSON document on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Print what one kernel is and every tuning choice made for it, with the reason for each,
    /// and compile nothing (NAME: a kernel name, or text only one name contains).
    #[arg(long, value_name = "NAME")]
    explain: Option<String>,
    /// No progress output on stderr (which then carries only errors); for logs that are read
    /// after the run, where the table already lists every kernel.
    #[arg(long)]
    quiet: bool,
    /// Also print each kernel's compiler log (warnings and ptxas' report, including its notes on
    /// serialized wgmma), after the table or as a `log` field of the JSON.
    #[arg(long)]
    log: bool,
}

/// One row of the report.
#[derive(Serialize)]
struct Row {
    name: String,
    arch: String,
    /// `compiled`, `cached`, `rebuilt`, or `failed`.
    status: &'static str,
    /// Seconds NVRTC took (for cached kernels: when they were compiled).
    compile_s: Option<f64>,
    /// Seconds this run spent on the kernel (compile, or cache load).
    wall_s: Option<f64>,
    registers: Option<u32>,
    spill_store_bytes: Option<u64>,
    spill_load_bytes: Option<u64>,
    shared_bytes: Option<u64>,
    /// Why ptxas serialized the kernel's wgmma instructions, when it did.
    wgmma_serialized: Option<String>,
    allow_spill: bool,
    /// The compiler log for failures (verbatim, snippet lines mapped).
    error: Option<String>,
    /// The compiler log of a kernel that compiled (with `--log`).
    #[serde(skip_serializing_if = "Option::is_none")]
    log: Option<String>,
}

#[derive(Serialize, Default)]
struct Summary {
    kernels: usize,
    compiled: usize,
    cached: usize,
    failed: usize,
    spilling: usize,
    spilling_not_allowed: usize,
    /// Kernels whose wgmma instructions ptxas serialized (reported, not a failure).
    wgmma_serialized: usize,
    wall_s: f64,
    compile_s_sum: f64,
}

/// Runs the subcommand.
pub fn run(args: Args) -> ExitCode {
    match run_inner(&args) {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("attnforge compile: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn run_inner(args: &Args) -> Result<ExitCode, String> {
    if let Some(name) = &args.explain {
        return crate::explain::print(name);
    }
    let start = Instant::now();
    let archs = Arch::parse_list(&args.arch).map_err(|e| format!("--arch: {e}"))?;
    let threads = match args.jobs {
        Some(0) => return Err("--jobs: must be at least 1, got 0".into()),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let kernels = rendered_matrix(args.filter.as_deref())?;
    let jit = Jit::from_env(!args.no_cache).map_err(|e| e.to_string())?;

    let mut batch = Vec::new();
    let mut budgets = Vec::new();
    for &arch in &archs {
        for k in kernels
            .iter()
            .filter(|k| k.tile.is_none_or(|(t, dims)| t.runs_on(arch, dims)))
        {
            batch.push(job(k, arch));
            budgets.push(k.spill_budget_bytes);
        }
    }
    let progress = if args.quiet {
        Progress::Silent
    } else {
        Progress::auto(batch.len(), "compile")
    };
    let results = compile_all(&jit, &batch, threads, &progress).map_err(|e| e.to_string())?;
    let rows: Vec<Row> = results
        .into_iter()
        .zip(batch.iter().zip(budgets))
        .map(|(r, (job, budget))| row(job, budget, r, args.log))
        .collect();
    let summary = summarize(&rows, start.elapsed());
    if args.json {
        let doc = serde_json::json!({ "kernels": rows, "summary": summary });
        println!("{doc:#}");
    } else {
        print_table(
            &rows,
            &summary,
            jit.cache().map(|c| c.dir().display().to_string()),
        );
    }
    let ok = summary.failed == 0 && summary.spilling_not_allowed == 0;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// One kernel to compile: its source and the spills it may have.
struct Unit {
    name: String,
    entry: String,
    source: String,
    snippets: Vec<SnippetSpan>,
    spill_budget_bytes: u32,
    /// The attention kernel's tile and head dims (which targets it compiles for); `None` for the
    /// others.
    tile: Option<(TileConfig, HeadDims)>,
}

impl From<RenderedKernel> for Unit {
    fn from(k: RenderedKernel) -> Unit {
        Unit {
            name: k.name,
            entry: k.entry,
            source: k.source,
            snippets: k.snippets,
            spill_budget_bytes: k.spill_budget_bytes,
            tile: None,
        }
    }
}

/// Renders the (filtered) matrix: every attention kernel, the GPU reference kernels and the
/// kernels without specialisation (paged-KV append, public merge), which may not spill.
fn rendered_matrix(filter: Option<&str>) -> Result<Vec<Unit>, String> {
    let mut units: Vec<Unit> = codegen::compile_matrix()
        .iter()
        .map(|s| Unit {
            tile: Some((s.tile, s.head_dims)),
            ..Unit::from(codegen::render(s))
        })
        .collect();
    for spec in codegen::reference_matrix() {
        let r = codegen::render_reference(&spec);
        units.push(Unit {
            name: r.entry.clone(),
            entry: r.entry,
            source: r.source,
            snippets: r.snippets,
            spill_budget_bytes: r.spill_budget_bytes,
            tile: None,
        });
    }
    for fixed in [codegen::render_append(), codegen::render_merge_states()] {
        units.push(Unit {
            name: fixed.entry.clone(),
            entry: fixed.entry,
            source: fixed.source,
            snippets: Vec::new(),
            spill_budget_bytes: fixed.spill_budget_bytes,
            tile: None,
        });
    }
    let total = units.len();
    units.retain(|u| filter.is_none_or(|f| u.name.contains(f)));
    if units.is_empty() {
        return Err(format!(
            "--filter {:?} matches none of the {total} kernels",
            filter.unwrap_or_default(),
        ));
    }
    Ok(units)
}

fn job(k: &Unit, arch: Arch) -> BatchJob {
    BatchJob {
        name: k.name.clone(),
        entry: k.entry.clone(),
        source: k.source.clone(),
        snippets: k.snippets.clone(),
        options: CompileOptions::new(arch),
    }
}

fn row(job: &BatchJob, spill_budget: u32, result: Result<JitOutput, JitError>, log: bool) -> Row {
    match result {
        Ok(out) => {
            let r = &out.kernel.report;
            let allow_spill =
                r.spill_store_bytes.max(r.spill_load_bytes) <= u64::from(spill_budget);
            Row {
                name: job.name.clone(),
                arch: job.options.arch.to_string(),
                status: match out.cache {
                    CacheStatus::Hit => "cached",
                    CacheStatus::Rebuilt { .. } => "rebuilt",
                    _ => "compiled",
                },
                compile_s: Some(out.kernel.compile_time.as_secs_f64()),
                wall_s: Some(out.elapsed.as_secs_f64()),
                registers: Some(r.registers),
                spill_store_bytes: Some(r.spill_store_bytes),
                spill_load_bytes: Some(r.spill_load_bytes),
                shared_bytes: Some(r.shared_bytes),
                wgmma_serialized: r.wgmma_serialized.clone(),
                allow_spill,
                error: None,
                log: log.then(|| out.kernel.log.clone()),
            }
        }
        Err(e) => Row {
            name: job.name.clone(),
            arch: job.options.arch.to_string(),
            status: "failed",
            compile_s: None,
            wall_s: None,
            registers: None,
            spill_store_bytes: None,
            spill_load_bytes: None,
            shared_bytes: None,
            wgmma_serialized: None,
            allow_spill: false,
            error: Some(e.to_string()),
            log: None,
        },
    }
}

fn spills(r: &Row) -> bool {
    r.spill_store_bytes.unwrap_or(0) > 0 || r.spill_load_bytes.unwrap_or(0) > 0
}

fn summarize(rows: &[Row], wall: Duration) -> Summary {
    let mut s = Summary {
        kernels: rows.len(),
        wall_s: wall.as_secs_f64(),
        ..Default::default()
    };
    for r in rows {
        match r.status {
            "failed" => s.failed += 1,
            "cached" => s.cached += 1,
            _ => {
                s.compiled += 1;
                s.compile_s_sum += r.compile_s.unwrap_or(0.0);
            }
        }
        if r.wgmma_serialized.is_some() {
            s.wgmma_serialized += 1;
        }
        if spills(r) {
            s.spilling += 1;
            if !r.allow_spill {
                s.spilling_not_allowed += 1;
            }
        }
    }
    s
}

fn time_cell(r: &Row) -> String {
    match (r.status, r.compile_s, r.wall_s) {
        ("cached", _, Some(w)) => format!("cached {:.1} ms", w * MS_PER_S),
        (_, Some(c), _) => format!("{c:.2} s"),
        _ => "-".into(),
    }
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

fn print_table(rows: &[Row], s: &Summary, cache_dir: Option<String>) {
    let name_w = rows.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4);
    println!(
        "{:<name_w$}  {:<7} {:>15} {:>5} {:>13} {:>7}  status",
        "kernel", "arch", "time", "regs", "spill st/ld", "smem"
    );
    for r in rows {
        let status = if r.status == "failed" {
            "FAILED"
        } else if spills(r) && !r.allow_spill {
            "SPILLS"
        } else if spills(r) {
            "ok (spill allowed)"
        } else {
            "ok"
        };
        let status = match &r.wgmma_serialized {
            Some(why) => format!("{status}; wgmma serialized ({why})"),
            None => status.to_string(),
        };
        let spill = match (r.spill_store_bytes, r.spill_load_bytes) {
            (Some(st), Some(ld)) => format!("{st}/{ld}"),
            _ => "-".into(),
        };
        println!(
            "{:<name_w$}  {:<7} {:>15} {:>5} {:>13} {:>7}  {status}",
            r.name,
            r.arch,
            time_cell(r),
            opt(r.registers),
            spill,
            opt(r.shared_bytes),
        );
    }
    for r in rows {
        if let Some(log) = &r.log {
            println!("\n{} {}: compiler log\n{}", r.name, r.arch, log.trim_end());
        }
    }
    for r in rows.iter().filter(|r| r.error.is_some()) {
        eprintln!(
            "\n{} {}: {}",
            r.name,
            r.arch,
            r.error.as_deref().unwrap_or_default()
        );
    }
    println!(
        "\n{} kernels: {} compiled ({:.1} s of NVRTC time), {} cached, {} failed, {} spilling \
         ({} not allowed), {} with serialized wgmma; {:.1} s wall",
        s.kernels,
        s.compiled,
        s.compile_s_sum,
        s.cached,
        s.failed,
        s.spilling,
        s.spilling_not_allowed,
        s.wgmma_serialized,
        s.wall_s
    );
    match cache_dir {
        Some(d) => println!("cache: {d}"),
        None => println!("cache: off (--no-cache)"),
    }
}
