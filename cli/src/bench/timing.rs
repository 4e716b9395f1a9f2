//! How `attnforge bench` times a kernel, the way `bench/peers.py` times each peer: warm-up
//! launches, a probe of one launch's time, the host time of one call, then timed replays of a
//! CUDA graph of N launches (or, with `--method back-to-back`, groups of N launches enqueued back
//! to back), each between two CUDA events; the median replay over N is one launch's time.

use attnforge::cuda::{capture_graph, Engine};
use attnforge::Error;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};
use std::sync::Arc;
use std::time::Instant;

/// Launches in the probe group that estimates one launch's GPU time (the peers' PROBE_RUNS).
const PROBE_RUNS: usize = 5;
/// Host-timed calls are enqueued in bursts of this many, then waited for, so the launch queue
/// never fills and blocks a call (the peers' HOST_BURST).
const HOST_BURST: usize = 10;
/// GPU time the host-timed calls may take, within MIN_HOST_CALLS..=MAX_HOST_CALLS calls.
const HOST_TARGET_MS: f64 = 50.0;
const MIN_HOST_CALLS: usize = 10;
const MAX_HOST_CALLS: usize = 100;

/// How the launches of a timed replay are enqueued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Method {
    /// N launches captured once in a CUDA graph, the graph replayed.
    Graph,
    /// N launches enqueued one after another from the host.
    BackToBack,
}

impl Method {
    /// The name in the result lines (`method`), as `bench/peers.py` writes it.
    pub fn name(self) -> &'static str {
        match self {
            Method::Graph => "graph",
            Method::BackToBack => "back-to-back",
        }
    }
}

/// The timing options of `attnforge bench`.
#[derive(clap::Args)]
pub struct Timing {
    /// How the timed launches are enqueued: captured in a CUDA graph and replayed, or back to
    /// back from the host.
    #[arg(long, value_enum, default_value_t = Method::Graph)]
    pub method: Method,
    /// GPU time one timed replay (N launches) should last, in milliseconds: sets N.
    #[arg(long, default_value_t = 4.0)]
    pub replay_ms: f64,
    /// Most launches in one replay.
    #[arg(long, default_value_t = 1000)]
    pub max_launches: usize,
    /// Fewest timed replays per shape (the median is reported); more while they take less than
    /// `--target-ms` of GPU time, up to `--max-runs` (the peers' rule).
    #[arg(long, default_value_t = 10)]
    pub runs: usize,
    /// Most timed replays per shape.
    #[arg(long, default_value_t = 100)]
    pub max_runs: usize,
    /// GPU time the timed replays of a shape should fill, in milliseconds.
    #[arg(long, default_value_t = 200.0)]
    pub target_ms: f64,
    /// Untimed launches first (then 5 more, timed together, estimate one launch's time).
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
}

/// What [`time_launches`] measured.
#[derive(Clone, Debug)]
pub struct Timed {
    /// One launch's GPU time: the median replay over the launches in it, in milliseconds.
    pub median_ms: f64,
    /// Timed replays.
    pub replays: usize,
    /// Launches per replay (N).
    pub launches: usize,
    /// Median wall time of one call on the host, without synchronisation, in microseconds.
    pub host_us: f64,
    /// Calls the host time is the median of.
    pub host_calls: usize,
}

impl Timing {
    /// Refuses option values the timing cannot use.
    pub fn check(&self) -> Result<(), String> {
        if self.runs == 0 {
            return Err("--runs must be at least 1".into());
        }
        if self.max_runs < self.runs {
            return Err(format!(
                "--max-runs {} is below --runs {}",
                self.max_runs, self.runs
            ));
        }
        if self.max_launches == 0 {
            return Err("--max-launches must be at least 1".into());
        }
        for (name, ms) in [
            ("--target-ms", self.target_ms),
            ("--replay-ms", self.replay_ms),
        ] {
            if !(ms.is_finite() && ms > 0.0) {
                return Err(format!(
                    "{name} must be a positive number of milliseconds, got {ms}"
                ));
            }
        }
        Ok(())
    }

    /// Launches per replay for a launch of `launch_ms`: enough to last `--replay-ms`, at least
    /// `copies` (so a replay reads every input copy), at most `--max-launches`.
    pub fn launches_per_replay(&self, launch_ms: f64, copies: usize) -> usize {
        // A float past usize's range converts to usize::MAX, which the clamp brings down.
        let wanted = (self.replay_ms / launch_ms.max(1e-4)).ceil() as usize;
        wanted.max(copies).clamp(1, self.max_launches)
    }

    /// Timed replays for a replay of `replay_ms`: enough to fill `--target-ms`, within
    /// `--runs..=--max-runs`.
    pub fn timed_runs(&self, replay_ms: f64) -> usize {
        let wanted = (self.target_ms / replay_ms.max(1e-3)).ceil() as usize;
        wanted.clamp(self.runs, self.max_runs)
    }
}

/// Host-timed calls for a launch of `launch_ms`: enough to fill HOST_TARGET_MS, within the
/// limits, in whole bursts.
fn host_calls(launch_ms: f64) -> usize {
    let wanted = (HOST_TARGET_MS / launch_ms.max(1e-3)).ceil() as usize;
    wanted
        .clamp(MIN_HOST_CALLS, MAX_HOST_CALLS)
        .div_ceil(HOST_BURST)
        * HOST_BURST
}

/// Times `launch(i)` (a launch with input copy `i % copies`, on the engine's stream, with no
/// allocation and no synchronisation) as the module says.
pub fn time_launches(
    engine: &Engine,
    timing: &Timing,
    copies: usize,
    mut launch: impl FnMut(usize) -> Result<(), Error>,
) -> Result<Timed, Error> {
    let stream = engine.stream();
    for i in 0..timing.warmup {
        launch(i)?;
    }
    engine.synchronize()?;
    let mut probe = Group::new(stream, timing.method, PROBE_RUNS, &mut launch)?;
    probe.enqueue()?; // a first run of the group, untimed
    let probe_ms = probe.time_once(engine)? / PROBE_RUNS as f64;
    drop(probe);

    let (host_us, host_calls) = host_time(engine, probe_ms, &mut launch)?;

    let launches = timing.launches_per_replay(probe_ms, copies);
    let mut group = Group::new(stream, timing.method, launches, &mut launch)?;
    group.enqueue()?;
    engine.synchronize()?;
    let replays = timing.timed_runs(probe_ms * launches as f64);
    let mut events = Vec::with_capacity(replays);
    for _ in 0..replays {
        let start = record(stream)?;
        group.enqueue()?;
        events.push((start, record(stream)?));
    }
    engine.synchronize()?;
    let mut times = Vec::with_capacity(replays);
    for (start, end) in &events {
        times.push(f64::from(
            start.elapsed_ms(end).map_err(cuda("event timing"))?,
        ));
    }
    Ok(Timed {
        median_ms: median(&mut times) / launches as f64,
        replays,
        launches,
        host_us,
        host_calls,
    })
}

/// N launches, replayable: a captured graph, or the launch closure called N times.
enum Group<'a, F> {
    Graph(cudarc::driver::CudaGraph),
    BackToBack { launch: &'a mut F, n: usize },
}

impl<'a, F: FnMut(usize) -> Result<(), Error>> Group<'a, F> {
    fn new(
        stream: &Arc<CudaStream>,
        method: Method,
        n: usize,
        launch: &'a mut F,
    ) -> Result<Self, Error> {
        Ok(match method {
            Method::Graph => {
                let graph = capture_graph(stream, || (0..n).try_for_each(&mut *launch))?;
                graph.upload().map_err(cuda("graph upload"))?;
                Group::Graph(graph)
            }
            Method::BackToBack => Group::BackToBack { launch, n },
        })
    }

    /// Enqueues the N launches once.
    fn enqueue(&mut self) -> Result<(), Error> {
        match self {
            Group::Graph(graph) => graph.launch().map_err(cuda("graph launch")),
            Group::BackToBack { launch, n } => (0..*n).try_for_each(&mut **launch),
        }
    }

    /// The GPU time of one enqueue, in milliseconds (the stream idle first).
    fn time_once(&mut self, engine: &Engine) -> Result<f64, Error> {
        let stream = engine.stream();
        engine.synchronize()?;
        let start = record(stream)?;
        self.enqueue()?;
        let end = record(stream)?;
        engine.synchronize()?;
        Ok(f64::from(
            start.elapsed_ms(&end).map_err(cuda("event timing"))?,
        ))
    }
}

/// The median wall time of one call on the host, in microseconds, and how many calls it is the
/// median of; the calls go in bursts of HOST_BURST, each burst waited for.
fn host_time(
    engine: &Engine,
    launch_ms: f64,
    launch: &mut impl FnMut(usize) -> Result<(), Error>,
) -> Result<(f64, usize), Error> {
    let calls = host_calls(launch_ms);
    let mut times = Vec::with_capacity(calls);
    for i in 0..calls {
        let t0 = Instant::now();
        launch(i)?;
        times.push(t0.elapsed().as_secs_f64() * 1e6);
        if (i + 1) % HOST_BURST == 0 {
            engine.synchronize()?;
        }
    }
    Ok((median(&mut times), calls))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn record(stream: &Arc<CudaStream>) -> Result<CudaEvent, Error> {
    stream
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(cuda("event"))
}

fn cuda(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |source| {
        Error::Cuda(attnforge::cuda::CudaError::Driver {
            call: call.into(),
            source,
        })
    }
}
