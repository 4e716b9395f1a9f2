//! Compiling many kernels at once: N worker threads over one [`Jit`], taking the jobs in order.
//!
//! [`compile_all`] blocks until every job has a result, with progress on stderr: an indicatif
//! bar when stderr is a terminal, one plain line per finished kernel otherwise (CI logs), or
//! nothing ([`Progress::Silent`]). [`compile_in_background`] starts the same workers and returns
//! at once with a [`BackgroundCompile`] handle, so that the caller can use each kernel as soon as
//! it exists (`attnforge verify` runs its cases meanwhile). Both run one worker loop.
//!
//! NVRTC is thread-safe for distinct programs, so each worker compiles its own program; the
//! disk cache's atomic writes and build locks make concurrent workers (and processes) safe.
//! That includes a [`Jit::compile`] of the same kernel made beside a background compile: on
//! unix the build lock is an `flock` on a file opened afresh by every request, and such locks
//! belong to the open file, not the process, so threads of one process exclude each other like
//! processes do. The request then either waits for the worker's compile and loads its entry, or
//! compiles the kernel itself and the worker later finds it cached. Off unix there is no build
//! lock at all (`cache.rs`), so there the request and the worker may both compile the kernel;
//! the atomic rename still keeps the entry whole, and only the work is done twice. The same holds
//! wherever `flock` is emulated with weaker scope (Linux maps it to byte-range locks on NFS).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

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

/// One job's result, tagged with the job's index.
type Tagged = (usize, Result<JitOutput, JitError>);

/// Told of each job as it finishes, on the worker that compiled it.
type OnFinished<'a> = dyn Fn(&BatchJob, &Result<JitOutput, JitError>) + Send + Sync + 'a;

/// The workers' shared place in the job list.
#[derive(Debug, Default)]
struct Cursor {
    /// The index of the next job to take.
    next: AtomicUsize,
    /// Jobs whose compile has ended (and whose `on_finished` has returned).
    finished: AtomicUsize,
    /// Set when no further job should be taken.
    stop: AtomicBool,
}

impl Cursor {
    /// One worker: takes jobs in order until none is left or [`Cursor::stop`] is set, and
    /// returns the results of the jobs it took.
    fn work(&self, jit: &Jit, jobs: &[BatchJob], on_finished: &OnFinished<'_>) -> Vec<Tagged> {
        let mut mine = Vec::new();
        while !self.stop.load(Ordering::Relaxed) {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(job) = jobs.get(i) else { break };
            let result = jit.compile(&job.kernel_source(), &job.options);
            on_finished(job, &result);
            self.finished.fetch_add(1, Ordering::Release);
            mine.push((i, result));
        }
        mine
    }
}

/// The workers to start for `jobs`: at most `threads`, and none idle from the start.
fn worker_count(jobs: usize, threads: usize) -> Result<usize, JitError> {
    if threads == 0 {
        return Err(JitError::InvalidInput {
            what: "jobs",
            reason: "the number of parallel compiles must be at least 1, got 0".into(),
        });
    }
    Ok(threads.min(jobs))
}

/// A worker thread's name (shown by a panic message and by debuggers).
fn worker_thread(i: usize) -> thread::Builder {
    thread::Builder::new().name(format!("attnforge-compile-{i}"))
}

/// The workers' results in the order of `jobs`; a job without one (its worker panicked) gets
/// [`JitError::WorkerPanicked`].
fn in_job_order(
    jobs: &[BatchJob],
    joined: impl IntoIterator<Item = thread::Result<Vec<Tagged>>>,
) -> Vec<Result<JitOutput, JitError>> {
    let mut slots: Vec<Option<Result<JitOutput, JitError>>> =
        (0..jobs.len()).map(|_| None).collect();
    // A panicked worker's results are lost with it, its finished jobs' included.
    for (i, result) in joined.into_iter().flatten().flatten() {
        if let Some(slot) = slots.get_mut(i) {
            *slot = Some(result);
        }
    }
    slots
        .into_iter()
        .zip(jobs)
        .map(|(slot, job)| {
            slot.unwrap_or_else(|| {
                Err(JitError::WorkerPanicked {
                    kernel: job.name.clone(),
                })
            })
        })
        .collect()
}

/// Compiles every job on `threads` workers; results come back in the order of `jobs`.
///
/// An error (rather than results) when `threads` is 0 or a worker thread cannot be started.
pub fn compile_all(
    jit: &Jit,
    jobs: &[BatchJob],
    threads: usize,
    progress: &Progress,
) -> Result<Vec<Result<JitOutput, JitError>>, JitError> {
    let workers = worker_count(jobs.len(), threads)?;
    let cursor = Cursor::default();
    let report = |job: &BatchJob, result: &Result<JitOutput, JitError>| {
        let label = format!("{} {}", job.name, job.options.arch);
        progress.finished(&label, &outcome_word(result));
    };
    let joined = thread::scope(|s| {
        let mut handles = Vec::with_capacity(workers);
        let mut spawn_error = None;
        for i in 0..workers {
            match worker_thread(i).spawn_scoped(s, || cursor.work(jit, jobs, &report)) {
                Ok(handle) => handles.push(handle),
                Err(e) => {
                    cursor.stop.store(true, Ordering::Relaxed);
                    spawn_error = Some(e);
                    break;
                }
            }
        }
        // Joining here (rather than letting the scope do it) turns a worker's panic into a
        // per-kernel error below instead of a panic of the caller.
        let joined: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
        match spawn_error {
            Some(source) => Err(JitError::WorkerSpawn { source }),
            None => Ok(joined),
        }
    });
    progress.finish();
    Ok(in_job_order(jobs, joined?))
}

/// What the workers of a [`BackgroundCompile`] share.
struct Shared {
    jit: Jit,
    jobs: Vec<BatchJob>,
    cursor: Cursor,
    on_finished: Box<OnFinished<'static>>,
}

/// Compiles running on worker threads of their own, started by [`compile_in_background`].
///
/// [`BackgroundCompile::join`] waits for them and returns the results;
/// [`BackgroundCompile::stop_and_wait`] lets them take no further job and waits for the ones in
/// progress. Dropping the handle instead waits for nothing: the workers take no further job, those compiling finish their
/// current one (storing it in the disk cache) and end, and a process that exits meanwhile ends
/// them (an entry is written by an atomic rename and a build lock is released with its file, so
/// nothing half-done is left behind).
pub struct BackgroundCompile {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<Vec<Tagged>>>,
}

impl std::fmt::Debug for BackgroundCompile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackgroundCompile")
            .field("jobs", &self.shared.jobs.len())
            .field("finished", &self.finished())
            .field("workers", &self.workers.len())
            .finish()
    }
}

impl BackgroundCompile {
    /// The number of jobs.
    pub fn total(&self) -> usize {
        self.shared.jobs.len()
    }

    /// The number of worker threads started.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// The number of jobs whose compile has ended, successfully or not.
    pub fn finished(&self) -> usize {
        self.shared.cursor.finished.load(Ordering::Acquire)
    }

    /// Waits for every job and returns the results in the order of the jobs (a job whose
    /// worker panicked: [`JitError::WorkerPanicked`]).
    pub fn join(mut self) -> Vec<Result<JitOutput, JitError>> {
        let joined: Vec<_> = std::mem::take(&mut self.workers)
            .into_iter()
            .map(|h| h.join())
            .collect();
        in_job_order(&self.shared.jobs, joined)
    }
}

impl BackgroundCompile {
    /// Tells the workers to take no further job and waits for the compiles they are in (at
    /// most one each), discarding the results: afterwards no thread of this compile is inside
    /// NVRTC, so a process may exit without its exit-time cleanup running beside a compile.
    pub fn stop_and_wait(mut self) {
        self.shared.cursor.stop.store(true, Ordering::Relaxed);
        for worker in std::mem::take(&mut self.workers) {
            // A worker that panicked has nothing left to wait for.
            let _ = worker.join();
        }
    }
}

impl Drop for BackgroundCompile {
    /// Tells the workers to take no further job; joins nothing (see the type's doc).
    fn drop(&mut self) {
        self.shared.cursor.stop.store(true, Ordering::Relaxed);
    }
}

/// Starts compiling every job on `threads` worker threads of their own (at most one per job),
/// in the order of `jobs`, and returns at once; `on_finished` is called on the worker with each
/// job's result as soon as it has one (it must not block for long: the worker waits for it).
///
/// A request for one of the same kernels through [`Jit::compile`] meanwhile is safe and compiles
/// it at most once (see the module doc). An error, and no compile, when `threads` is 0 or a
/// worker thread cannot be started.
pub fn compile_in_background(
    jit: Jit,
    jobs: Vec<BatchJob>,
    threads: usize,
    on_finished: impl Fn(&BatchJob, &Result<JitOutput, JitError>) + Send + Sync + 'static,
) -> Result<BackgroundCompile, JitError> {
    let workers = worker_count(jobs.len(), threads)?;
    let mut compile = BackgroundCompile {
        shared: Arc::new(Shared {
            jit,
            jobs,
            cursor: Cursor::default(),
            on_finished: Box::new(on_finished),
        }),
        workers: Vec::with_capacity(workers),
    };
    for i in 0..workers {
        let shared = Arc::clone(&compile.shared);
        let worker = worker_thread(i)
            .spawn(move || {
                shared
                    .cursor
                    .work(&shared.jit, &shared.jobs, &*shared.on_finished)
            })
            // Dropping `compile` on this error stops the workers already started.
            .map_err(|source| JitError::WorkerSpawn { source })?;
        compile.workers.push(worker);
    }
    Ok(compile)
}
