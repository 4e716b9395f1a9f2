//! Compiling many kernels at once: N worker threads over one [`Jit`], with progress.
//!
//! NVRTC is thread-safe for distinct programs, so each worker compiles its own program; the
//! disk cache's atomic writes and build locks make concurrent workers (and processes) safe.
//! Progress goes to stderr: an indicatif bar when stderr is a terminal, one plain line per
//! finished kernel otherwise (CI logs), or nothing ([`Progress::Silent`]).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicUsize, Ordering};

use indicatif::{ProgressBar, ProgressStyle};

use super::cached::{CacheStatus, Jit, JitOutput};
use super::compile::{CompileOptions, KernelSource, SnippetSpan};
use super::error::JitError;

/// One kernel to compile, owning its source.
#[derive(Debug, Clone)]
pub struct BatchJob {
    /// Readable name.
    pub name: String,
    /// `extern "C"` entry.
    pub entry: String,
    /// Complete CUDA source.
    pub source: String,
    /// User snippet spans in `source`.
    pub snippets: Vec<SnippetSpan>,
    /// NVRTC options (architecture included).
    pub options: CompileOptions,
}

impl BatchJob {
    /// The borrowed view [`Jit::compile`] takes.
    pub fn kernel_source(&self) -> KernelSource<'_> {
        KernelSource {
            name: &self.name,
            entry: &self.entry,
            source: &self.source,
            snippets: &self.snippets,
        }
    }
}

/// Where progress is shown.
pub enum Progress {
    /// An indicatif bar (terminal).
    Bar(ProgressBar),
    /// One line per finished kernel on stderr.
    Lines {
        /// Total number of kernels.
        total: usize,
        /// Finished so far.
        done: AtomicUsize,
    },
    /// Nothing.
    Silent,
}

/// The bar's layout.
const BAR_TEMPLATE: &str = "{prefix} [{bar:30}] {pos}/{len} {elapsed_precise} {wide_msg}";

impl Progress {
    /// A bar when stderr is a terminal, plain lines otherwise.
    pub fn auto(total: usize, what: &str) -> Progress {
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total as u64);
            if let Ok(style) = ProgressStyle::with_template(BAR_TEMPLATE) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_prefix(what.to_string());
            Progress::Bar(bar)
        } else {
            Progress::Lines {
                total,
                done: AtomicUsize::new(0),
            }
        }
    }

    /// Records one finished kernel.
    pub fn finished(&self, name: &str, outcome: &str) {
        match self {
            Progress::Bar(bar) => {
                bar.set_message(format!("{name}: {outcome}"));
                bar.inc(1);
            }
            Progress::Lines { total, done } => {
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                eprintln!("[{n}/{total}] {name}: {outcome}");
            }
            Progress::Silent => {}
        }
    }

    /// Clears the bar (lines need no closing).
    pub fn finish(&self) {
        if let Progress::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

/// A one-word summary of a result, for progress output.
pub fn outcome_word(result: &Result<JitOutput, JitError>) -> String {
    match result {
        Ok(out) if out.cache == CacheStatus::Hit => "cached".into(),
        Ok(out) => format!("compiled in {:.2} s", out.kernel.compile_time.as_secs_f64()),
        Err(JitError::Compile { .. }) => "FAILED to compile".into(),
        Err(e) => format!("error: {e}"),
    }
}

/// Compiles every job on `threads` workers; results come back in the order of `jobs`.
pub fn compile_all(
    jit: &Jit,
    jobs: &[BatchJob],
    threads: usize,
    progress: &Progress,
) -> Result<Vec<Result<JitOutput, JitError>>, JitError> {
    if threads == 0 {
        return Err(JitError::InvalidInput {
            what: "jobs",
            reason: "the number of parallel compiles must be at least 1, got 0".into(),
        });
    }
    let next = AtomicUsize::new(0);
    let workers = threads.min(jobs.len());
    let joined = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(job) = jobs.get(i) else { break };
                        let result = jit.compile(&job.kernel_source(), &job.options);
                        let label = format!("{} {}", job.name, job.options.arch);
                        progress.finished(&label, &outcome_word(&result));
                        mine.push((i, result));
                    }
                    mine
                })
            })
            .collect();
        // Joining here (rather than letting the scope do it) turns a worker's panic into a
        // per-kernel error below instead of a panic of the caller.
        handles.into_iter().map(|h| h.join()).collect::<Vec<_>>()
    });
    progress.finish();
    let mut slots: Vec<Option<Result<JitOutput, JitError>>> =
        (0..jobs.len()).map(|_| None).collect();
    for (i, result) in joined.into_iter().flatten().flatten() {
        slots[i] = Some(result);
    }
    Ok(slots
        .into_iter()
        .zip(jobs)
        .map(|(slot, job)| {
            slot.unwrap_or_else(|| {
                Err(JitError::WorkerPanicked {
                    kernel: job.name.clone(),
                })
            })
        })
        .collect())
}
