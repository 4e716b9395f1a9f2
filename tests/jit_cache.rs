//! The disk cache through `Jit`: miss then hit, corrupt and truncated entries rebuilt, two
//! processes compiling one kernel at once, many threads at once, a background compile beside
//! requests of its kernels, and when the cache is bypassed.

mod jit_support;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use attnforge::jit::batch::{
    compile_all, compile_in_background, BackgroundCompile, BatchJob, Progress,
};
use attnforge::jit::cache::Lookup;
use attnforge::jit::{Arch, CacheStatus, CompileOptions, Jit, KernelSource};
use jit_support::{jit, ADD_KERNEL, SPILL_KERNEL};

/// Set in the child processes of [`two_processes_compile_the_same_kernel`]: their cache dir.
const CHILD_CACHE_ENV: &str = "ATTNFORGE_TEST_CHILD_CACHE";
/// Printed by a child before its cache status.
const STATUS_PREFIX: &str = "CHILD STATUS: ";

fn add() -> KernelSource<'static> {
    KernelSource {
        name: "add f32",
        entry: "add",
        source: ADD_KERNEL,
        snippets: &[],
    }
}

fn heavy() -> KernelSource<'static> {
    KernelSource {
        name: "heavy",
        entry: "heavy",
        source: SPILL_KERNEL,
        snippets: &[],
    }
}

fn entry_file(jit: &Jit, src: &KernelSource<'_>, opts: &CompileOptions) -> std::path::PathBuf {
    let key = jit.key(src, opts);
    jit.cache().unwrap().entry_path(src.name, &key)
}

#[test]
fn miss_then_hit_returns_the_same_kernel() {
    let t = tempfile::tempdir().unwrap();
    let Some(jit) = jit(Some(t.path())) else {
        return;
    };
    let opts = CompileOptions::new(Arch::Sm80);
    let first = jit.compile(&add(), &opts).unwrap();
    assert_eq!(first.cache, CacheStatus::Compiled);
    let path = first.path.clone().unwrap();
    assert!(
        path.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("add_f32-"),
        "{path:?}"
    );
    let second = jit.compile(&add(), &opts).unwrap();
    assert_eq!(second.cache, CacheStatus::Hit);
    assert_eq!(second.kernel.cubin, first.kernel.cubin);
    assert_eq!(second.kernel.report, first.kernel.report);
    assert_eq!(
        second.kernel.compile_time.as_micros(),
        first.kernel.compile_time.as_micros()
    );
    eprintln!(
        "cold compile {:?}, cache load {:?} ({} byte CUBIN)",
        first.elapsed,
        second.elapsed,
        second.kernel.cubin.len()
    );
    // Another architecture is another entry.
    let other = jit
        .compile(&add(), &CompileOptions::new(Arch::Sm90a))
        .unwrap();
    assert_eq!(other.cache, CacheStatus::Compiled);
    assert_ne!(other.path, first.path);
    assert_eq!(jit.cache().unwrap().entry_count().unwrap(), 2);
}

#[test]
fn corrupt_and_truncated_entries_are_rebuilt() {
    let t = tempfile::tempdir().unwrap();
    let Some(jit) = jit(Some(t.path())) else {
        return;
    };
    let opts = CompileOptions::new(Arch::Sm86);
    let good = jit.compile(&add(), &opts).unwrap();
    let path = good.path.clone().unwrap();
    let bytes = fs::read(&path).unwrap();
    let mut flipped = bytes.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0xff;
    for (what, damaged) in [
        ("truncated", bytes[..bytes.len() / 3].to_vec()),
        ("flipped", flipped),
    ] {
        fs::write(&path, damaged).unwrap();
        let out = jit.compile(&add(), &opts).unwrap();
        assert!(
            matches!(out.cache, CacheStatus::Rebuilt { .. }),
            "{what}: {:?}",
            out.cache
        );
        assert_eq!(out.kernel.cubin, good.kernel.cubin, "{what}");
        assert_eq!(
            jit.compile(&add(), &opts).unwrap().cache,
            CacheStatus::Hit,
            "{what}"
        );
    }
}

/// Not a test on its own: the child process of [`two_processes_compile_the_same_kernel`].
#[test]
#[ignore = "helper process spawned by two_processes_compile_the_same_kernel"]
fn child_compiles_into_shared_cache() {
    let dir = std::env::var(CHILD_CACHE_ENV).expect("run only by the parent test");
    let jit = jit(Some(Path::new(&dir))).expect("NVRTC");
    let out = jit
        .compile(&heavy(), &CompileOptions::new(Arch::Sm90a))
        .unwrap();
    println!("{STATUS_PREFIX}{:?}", out.cache);
}

#[test]
fn two_processes_compile_the_same_kernel() {
    let t = tempfile::tempdir().unwrap();
    let Some(jit) = jit(Some(t.path())) else {
        return;
    };
    let exe = std::env::current_exe().unwrap();
    let spawn = || {
        Command::new(&exe)
            .args([
                "--ignored",
                "--exact",
                "child_compiles_into_shared_cache",
                "--nocapture",
            ])
            .env(CHILD_CACHE_ENV, t.path())
            .output()
            .unwrap()
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(spawn);
        let b = s.spawn(spawn);
        (a.join().unwrap(), b.join().unwrap())
    });
    let mut statuses = Vec::new();
    for out in [&a, &b] {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let status = stdout
            .lines()
            .find_map(|l| l.strip_prefix(STATUS_PREFIX))
            .unwrap_or_else(|| panic!("no status line in:\n{stdout}"));
        statuses.push(status.to_string());
    }
    statuses.sort();
    // The build lock lets exactly one process compile; the other waits and loads its entry.
    assert_eq!(statuses, ["Compiled", "Hit"]);
    let opts = CompileOptions::new(Arch::Sm90a);
    let key = jit.key(&heavy(), &opts);
    assert!(matches!(
        jit.cache().unwrap().load("heavy", &key),
        Lookup::Hit(_)
    ));
    assert_eq!(jit.cache().unwrap().entry_count().unwrap(), 1);
    let leftovers: Vec<_> = fs::read_dir(t.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp."))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

#[test]
fn many_threads_one_kernel_compile_once_and_keep_order() {
    let t = tempfile::tempdir().unwrap();
    let Some(jit) = jit(Some(t.path())) else {
        return;
    };
    let job = |arch| BatchJob {
        name: "add".into(),
        entry: "add".into(),
        source: ADD_KERNEL.into(),
        snippets: vec![],
        options: CompileOptions::new(arch),
    };
    let jobs: Vec<BatchJob> = [Arch::Sm80, Arch::Sm80, Arch::Sm89, Arch::Sm80, Arch::Sm89]
        .into_iter()
        .map(job)
        .collect();
    let results = compile_all(&jit, &jobs, 4, &Progress::Silent).unwrap();
    let mut compiled = 0;
    for (r, j) in results.iter().zip(&jobs) {
        let out = r.as_ref().unwrap();
        assert_eq!(out.kernel.arch, j.options.arch);
        compiled += usize::from(out.cache == CacheStatus::Compiled);
    }
    assert_eq!(compiled, 2, "one compile per distinct (source, arch)");
    assert!(compile_all(&jit, &jobs, 0, &Progress::Silent).is_err());
}

fn batch_job(name: &str, source: &str, arch: Arch) -> BatchJob {
    BatchJob {
        name: name.into(),
        entry: name.into(),
        source: source.into(),
        snippets: vec![],
        options: CompileOptions::new(arch),
    }
}

/// Long enough for any compile here on a loaded machine; reached only when something hangs.
const PATIENCE: Duration = Duration::from_secs(300);

#[test]
fn background_compile_beside_requests_of_the_same_kernels() {
    let t = tempfile::tempdir().unwrap();
    let Some(jit) = jit(Some(t.path())) else {
        return;
    };
    // Five distinct kernels. The slow one first: a worker takes it at once, so the test thread's
    // request of it most likely waits on the worker's build lock; the last one the test thread
    // most likely compiles before a worker reaches it. Either way each is compiled once.
    let jobs = vec![
        batch_job("heavy", SPILL_KERNEL, Arch::Sm90a),
        batch_job("add", ADD_KERNEL, Arch::Sm80),
        batch_job("heavy", SPILL_KERNEL, Arch::Sm80),
        batch_job("add", ADD_KERNEL, Arch::Sm90a),
        batch_job("add", ADD_KERNEL, Arch::Sm89),
    ];
    let reported = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&reported);
    let compile = compile_in_background(jit.clone(), jobs.clone(), 2, move |job, result| {
        let arch = job.options.arch;
        log.lock()
            .unwrap()
            .push((job.name.clone(), arch, result.is_ok()));
    })
    .unwrap();
    assert_eq!((compile.total(), compile.workers()), (jobs.len(), 2));

    let mine = [0, jobs.len() - 1];
    let mut asked = Vec::new();
    for &i in &mine {
        let job = &jobs[i];
        let out = jit.compile(&job.kernel_source(), &job.options).unwrap();
        assert!(
            matches!(out.cache, CacheStatus::Hit | CacheStatus::Compiled),
            "job {i}: {:?}",
            out.cache
        );
        assert_eq!(out.kernel.arch, job.options.arch, "job {i}");
        assert_eq!(out.kernel.entry, job.entry, "job {i}");
        assert!(out.kernel.cubin.starts_with(b"\x7fELF"), "job {i}");
        asked.push(out);
    }

    let start = Instant::now();
    while compile.finished() < compile.total() {
        assert!(start.elapsed() < PATIENCE, "{compile:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    let results = compile.join();
    assert_eq!(results.len(), jobs.len());
    for (i, (r, job)) in results.iter().zip(&jobs).enumerate() {
        let out = r
            .as_ref()
            .unwrap_or_else(|e| panic!("job {i} ({}): {e}", job.name));
        assert_eq!(out.kernel.arch, job.options.arch, "job {i}");
        assert_eq!(out.kernel.entry, job.entry, "job {i}");
    }
    // The build lock excludes the test thread and the workers alike: of each pair of requests
    // for one kernel, exactly one compiled it and the other loaded its entry.
    for (&i, out) in mine.iter().zip(&asked) {
        let by_worker = &results[i].as_ref().unwrap().cache;
        let compiled = [&out.cache, by_worker]
            .into_iter()
            .filter(|s| **s == CacheStatus::Compiled)
            .count();
        assert_eq!(
            compiled, 1,
            "job {i}: test thread {:?}, worker {by_worker:?}",
            out.cache
        );
        assert_eq!(out.kernel.cubin, results[i].as_ref().unwrap().kernel.cubin);
    }
    let mut reported = reported.lock().unwrap().clone();
    reported.sort();
    let mut expected: Vec<_> = jobs
        .iter()
        .map(|j| (j.name.clone(), j.options.arch, true))
        .collect();
    expected.sort();
    assert_eq!(reported, expected, "on_finished once per job");
    for (i, job) in jobs.iter().enumerate() {
        let again = jit.compile(&job.kernel_source(), &job.options).unwrap();
        assert_eq!(again.cache, CacheStatus::Hit, "job {i}");
    }
    assert_eq!(jit.cache().unwrap().entry_count().unwrap(), jobs.len());
}

/// A background compile of three jobs on one worker, blocked in its first job's callback until
/// the returned sender sends; the receiver gets each finished job's (arch, ok), the first already
/// received (`(Sm80, true)`).
fn blocked_in_first_job(
    jit: &Jit,
) -> (
    BackgroundCompile,
    mpsc::Receiver<(Arch, bool)>,
    mpsc::Sender<()>,
) {
    let jobs: Vec<BatchJob> = [Arch::Sm80, Arch::Sm86, Arch::Sm89]
        .into_iter()
        .map(|arch| batch_job("add", ADD_KERNEL, arch))
        .collect();
    let (finished_tx, finished_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let go_rx = Mutex::new(go_rx);
    let compile = compile_in_background(jit.clone(), jobs, 1, move |job, result| {
        let _ = finished_tx.send((job.options.arch, result.is_ok()));
        let _ = go_rx.lock().unwrap().recv();
    })
    .unwrap();
    assert_eq!(
        finished_rx.recv_timeout(PATIENCE).unwrap(),
        (Arch::Sm80, true)
    );
    (compile, finished_rx, go_tx)
}

#[test]
fn dropped_background_compile_takes_no_further_job() {
    let t = tempfile::tempdir().unwrap();
    let Some(jit) = jit(Some(t.path())) else {
        return;
    };
    let (compile, finished_rx, go_tx) = blocked_in_first_job(&jit);
    // Dropped on another thread, so that a drop that waited for the (blocked) worker fails the
    // test rather than hanging it.
    let (dropped_tx, dropped_rx) = mpsc::channel();
    std::thread::spawn(move || {
        drop(compile);
        let _ = dropped_tx.send(());
    });
    dropped_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("dropping the handle returns while a worker is busy");
    go_tx.send(()).unwrap();
    // The worker ends without taking another job, and its callback (holding the sender) goes
    // with it.
    assert_eq!(
        finished_rx.recv_timeout(PATIENCE),
        Err(RecvTimeoutError::Disconnected)
    );
    assert_eq!(jit.cache().unwrap().entry_count().unwrap(), 1);
}

#[test]
fn a_stopped_background_compile_waits_for_the_compile_in_progress_only() {
    let t = tempfile::tempdir().unwrap();
    let Some(jit) = jit(Some(t.path())) else {
        return;
    };
    let (compile, finished_rx, go_tx) = blocked_in_first_job(&jit);
    let (stopped_tx, stopped_rx) = mpsc::channel();
    std::thread::spawn(move || {
        compile.stop_and_wait();
        let _ = stopped_tx.send(());
    });
    // Still inside its first job: stopping waits for it.
    assert_eq!(
        stopped_rx.recv_timeout(Duration::from_millis(300)),
        Err(RecvTimeoutError::Timeout)
    );
    go_tx.send(()).unwrap();
    stopped_rx
        .recv_timeout(PATIENCE)
        .expect("stopping returns once the job in progress ends");
    // No further job was taken, and the worker (with its callback's sender) is gone.
    assert_eq!(
        finished_rx.recv_timeout(PATIENCE),
        Err(RecvTimeoutError::Disconnected)
    );
    assert_eq!(jit.cache().unwrap().entry_count().unwrap(), 1);
}

#[test]
fn background_compile_needs_a_thread() {
    let t = tempfile::tempdir().unwrap();
    let Some(jit) = jit(Some(t.path())) else {
        return;
    };
    let jobs = vec![batch_job("add", ADD_KERNEL, Arch::Sm80)];
    let err = compile_in_background(jit.clone(), jobs, 0, |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("at least 1"), "{err}");
    let none = compile_in_background(jit.clone(), Vec::new(), 4, |_, _| {}).unwrap();
    assert_eq!((none.total(), none.workers()), (0, 0));
    assert!(none.join().is_empty());
    assert_eq!(jit.cache().unwrap().entry_count().unwrap(), 0);
}

#[test]
fn include_dirs_bypass_and_no_cache_disables() {
    let t = tempfile::tempdir().unwrap();
    let Some(jit_cached) = jit(Some(t.path())) else {
        return;
    };
    let mut opts = CompileOptions::new(Arch::Sm80);
    opts.include_dirs.push(t.path().to_path_buf());
    let out = jit_cached.compile(&add(), &opts).unwrap();
    assert!(
        matches!(out.cache, CacheStatus::Bypassed { .. }),
        "{:?}",
        out.cache
    );
    assert!(!entry_file(&jit_cached, &add(), &opts).exists());
    let Some(jit_plain) = jit(None) else { return };
    let out = jit_plain
        .compile(&add(), &CompileOptions::new(Arch::Sm80))
        .unwrap();
    assert_eq!(out.cache, CacheStatus::Disabled);
}

#[test]
fn warm_load_timing_is_reported() {
    // A measurement, not a timed assertion: docs/jit.md records the figures.
    let t = tempfile::tempdir().unwrap();
    let Some(jit) = jit(Some(t.path())) else {
        return;
    };
    let opts = CompileOptions::new(Arch::Sm90a);
    let cold = jit.compile(&heavy(), &opts).unwrap();
    const LOADS: u32 = 20;
    let start = Instant::now();
    for _ in 0..LOADS {
        assert!(jit.compile(&heavy(), &opts).unwrap().cache.is_hit());
    }
    eprintln!(
        "heavy sm_90a: cold {:?}; warm load {:?} per kernel ({} byte CUBIN)",
        cold.elapsed,
        start.elapsed() / LOADS,
        cold.kernel.cubin.len()
    );
}
