"""How bench/peers.py times a peer, the way `attnforge bench` times ours (docs/benchmarking.md):

  1. WARMUP_RUNS untimed calls.
  2. A probe: PROBE_RUNS calls captured in a CUDA graph (torch.cuda.CUDAGraph), replayed once
     untimed and once between two CUDA events: one launch's GPU time. A peer whose calls cannot
     be captured (the capture raises) is timed back to back instead: groups of calls enqueued
     one after another, behind a spin kernel (torch.cuda._sleep) that keeps the GPU busy while
     Python enqueues them, so the host's per-call time does not show as idle gaps. The result
     line says which (`method`: "graph" or "back-to-back", and in `note` why capture failed).
  3. The host time of one call: wall time (time.perf_counter) around each of host_calls() calls,
     no synchronisation inside a burst of HOST_BURST calls, each burst waited for after it (so
     the launch queue never fills and blocks a call); the median, in microseconds.
  4. N = launches_per_replay() calls (rotating among the input copies) in one graph (or group),
     so that a replay lasts about REPLAY_TARGET_MS; timed_runs() replays, each between two
     events; the median replay over N is one launch's time.

This module imports no torch (it is passed in), so its self-test runs on any machine against a
stand-in of the few torch calls it makes.
"""

import math
import statistics
import time

WARMUP_RUNS = 5
PROBE_RUNS = 5
REPLAY_TARGET_MS = 4.0  # one replay of N launches lasts about this long (bench --replay-ms)
MAX_LAUNCHES = 1000  # launches in one replay, at most (--max-launches)
MIN_RUNS = 10  # timed replays (--runs, --max-runs, --target-ms)
MAX_RUNS = 100
TARGET_TIMED_MS = 200.0
HOST_BURST = 10
HOST_TARGET_MS = 50.0
MIN_HOST_CALLS = 10
MAX_HOST_CALLS = 100
ENQUEUE_MARGIN = 1.5  # back to back: keep the GPU busy 1.5x as long as enqueueing takes
SLEEP_CAP_MS = 2000.0
ASSUMED_CLOCK_KHZ = 2_000_000
METHOD_GRAPH = "graph"
METHOD_BACK_TO_BACK = "back-to-back"
ERROR_TEXT_LIMIT = 200


def launches_per_replay(launch_ms, copies, target_ms=REPLAY_TARGET_MS, most=MAX_LAUNCHES):
    """Launches in one replay: enough to last target_ms, at least `copies` (a replay reads every
    input copy), at most `most` (attnforge bench's Timing::launches_per_replay)."""
    launch_ms = launch_ms if launch_ms == launch_ms else 0.0  # NaN: as if nothing was measured
    wanted = math.ceil(target_ms / max(launch_ms, 1e-4))
    return max(1, min(most, max(wanted, copies)))


def timed_runs(replay_ms):
    """Timed replays: enough to fill TARGET_TIMED_MS, within MIN_RUNS..MAX_RUNS."""
    replay_ms = replay_ms if replay_ms == replay_ms else 0.0
    wanted = math.ceil(TARGET_TIMED_MS / max(replay_ms, 1e-3))
    return max(MIN_RUNS, min(MAX_RUNS, wanted))


def host_calls(launch_ms):
    """Host-timed calls: enough to fill HOST_TARGET_MS of GPU time, within the limits, in whole
    bursts."""
    launch_ms = launch_ms if launch_ms == launch_ms else 0.0
    wanted = max(MIN_HOST_CALLS, min(MAX_HOST_CALLS, math.ceil(HOST_TARGET_MS /
                                                               max(launch_ms, 1e-3))))
    return math.ceil(wanted / HOST_BURST) * HOST_BURST


def first_output(result):
    """The output tensor of a call that returns it alone or first in a tuple (FA3's
    flash_attn_func returns out, or (out, lse) in some builds)."""
    return result[0] if isinstance(result, (tuple, list)) else result


class Timer:
    """Times run(i) (a call with input copy i) as the module says; `method` "graph" tries a CUDA
    graph first, "back-to-back" never does."""

    def __init__(self, torch, method=METHOD_GRAPH):
        self.torch = torch
        self.method = method
        props = torch.cuda.get_device_properties(0)
        # CUDA 13 dropped cudaDeviceProp.clockRate; if torch reports 0, assume the H200's boost
        # clock. A lower real clock only makes the spin longer, which costs nothing in the numbers.
        self.clock_khz = getattr(props, "clock_rate", 0) or ASSUMED_CLOCK_KHZ
        self.can_sleep = hasattr(torch.cuda, "_sleep")

    def _group(self, run, n, copies, graph):
        """(enqueue(), method): n calls over the copies, replayed from a graph or called back to
        back."""
        calls = [i % copies for i in range(n)]
        if graph:
            g = self.torch.cuda.CUDAGraph()
            with self.torch.cuda.graph(g):
                for i in calls:
                    run(i)
            return g.replay, METHOD_GRAPH

        def back_to_back():
            for i in calls:
                run(i)
        return back_to_back, METHOD_BACK_TO_BACK

    def _time_once(self, enqueue):
        torch = self.torch
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        enqueue()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    def _host_time(self, run, copies, calls):
        times = []
        for c in range(calls):
            t0 = time.perf_counter()
            run(c % copies)
            times.append((time.perf_counter() - t0) * 1e6)
            if (c + 1) % HOST_BURST == 0:
                self.torch.cuda.synchronize()
        self.torch.cuda.synchronize()
        return statistics.median(times)

    def time_runs(self, run, copies):
        """A dict of the result line's timing fields: median_ms (one launch), runs (replays),
        launches (per replay), method, host_us, host_calls, and note (why a capture failed)."""
        torch = self.torch
        for w in range(WARMUP_RUNS):
            run(w % copies)
        torch.cuda.synchronize()
        graph, note = self.method == METHOD_GRAPH, None
        try:
            probe, method = self._group(run, PROBE_RUNS, copies, graph)
        except Exception as exc:  # a call the graph cannot hold: time it back to back
            torch.cuda.synchronize()
            lines = str(exc).strip().splitlines() or [""]
            text = f"{type(exc).__name__}: {lines[0]}"[:ERROR_TEXT_LIMIT]
            note = f"CUDA graph capture failed ({text}): timed back to back"
            graph = False
            probe, method = self._group(run, PROBE_RUNS, copies, graph)
        probe()
        launch_ms = self._time_once(probe) / PROBE_RUNS
        del probe
        calls = host_calls(launch_ms)
        host_us = self._host_time(run, copies, calls)

        launches = launches_per_replay(launch_ms, copies)
        enqueue, method = self._group(run, launches, copies, graph)
        enqueue()
        torch.cuda.synchronize()
        runs = timed_runs(launch_ms * launches)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
        if method == METHOD_BACK_TO_BACK and self.can_sleep:
            sleep_ms = min(ENQUEUE_MARGIN * runs * launches * host_us * 1e-3, SLEEP_CAP_MS)
            torch.cuda._sleep(int(sleep_ms * self.clock_khz))
        for r in range(runs):
            starts[r].record()
            enqueue()
            ends[r].record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) / launches for s, e in zip(starts, ends)]
        return {"median_ms": statistics.median(times), "runs": runs, "launches": launches,
                "method": method, "host_us": host_us, "host_calls": calls, "note": note}


# ----------------------------------------------------------------------------------------------
# Self-test, against a stand-in of torch.cuda whose clock advances by a fixed time per kernel.


class _FakeCuda:
    """Kernels of KERNEL_MS each on one stream; events read the stream's clock; a graph records
    the calls made while capturing and replays their kernels. capture_fails makes every capture
    raise, as torch does when a call synchronises."""

    KERNEL_MS = 0.02

    def __init__(self, capture_fails):
        self.clock = 0.0
        self.capturing = None
        self.capture_fails = capture_fails
        self.kernels = 0
        self.slept = 0
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = fake.clock

            def elapsed_time(self, end):
                return end.t - self.t

        class CUDAGraph:
            def __init__(self):
                self.kernels = 0

            def replay(self):
                fake.launch(self.kernels)

        class graph:
            def __init__(self, g):
                self.g = g

            def __enter__(self):
                if fake.capture_fails:
                    raise RuntimeError("operation not permitted when stream is capturing")
                fake.capturing = self.g

            def __exit__(self, *exc):
                fake.capturing = None
                return False

        class Props:
            clock_rate = 0

        self.Event, self.CUDAGraph, self.graph = Event, CUDAGraph, graph
        self.get_device_properties = lambda _: Props()

    def launch(self, kernels=1):
        if self.capturing is not None:
            self.capturing.kernels += kernels
        else:
            self.clock += kernels * self.KERNEL_MS
            self.kernels += kernels

    def synchronize(self):
        pass

    def _sleep(self, cycles):
        self.slept += 1


class _FakeTorch:
    def __init__(self, capture_fails):
        self.cuda = _FakeCuda(capture_fails)


def self_test():
    """Checks the rules and the Timer on the stand-in; returns True when every check passes."""
    failures = []

    def check(cond, what):
        print(f"  {'ok  ' if cond else 'FAIL'} {what}")
        if not cond:
            failures.append(what)

    print("timing rules:")
    check(launches_per_replay(0.016, 1) == 250, "4 ms of 16 us launches: 250 per replay")
    check(launches_per_replay(0.5, 16) == 16, "a replay reads every input copy")
    check(launches_per_replay(30.0, 1) == 1, "at least one launch per replay")
    check(launches_per_replay(0.0, 1) == MAX_LAUNCHES, "at most MAX_LAUNCHES")
    check(launches_per_replay(float("nan"), 1) == MAX_LAUNCHES, "a NaN probe: MAX_LAUNCHES")
    check(timed_runs(4.0) == 50, "200 ms of 4 ms replays: 50")
    check(timed_runs(30.0) == MIN_RUNS and timed_runs(0.0) == MAX_RUNS, "replays within limits")
    check(host_calls(0.01) == MAX_HOST_CALLS and host_calls(30.0) == MIN_HOST_CALLS,
          "host-timed calls within limits")
    check(host_calls(2.0) % HOST_BURST == 0, "host-timed calls in whole bursts")
    check(first_output(("o", "lse")) == "o" and first_output("o") == "o",
          "FA3's output alone or first in a tuple")
    for fails in (False, True):
        torch = _FakeTorch(fails)
        calls = []

        def run(i, torch=torch, calls=calls):
            calls.append(i)
            torch.cuda.launch()
        timing = Timer(torch).time_runs(run, 3)
        want = METHOD_BACK_TO_BACK if fails else METHOD_GRAPH
        label = "capture fails" if fails else "capture works"
        check(timing["method"] == want, f"{label}: method {want}")
        check(abs(timing["median_ms"] - _FakeCuda.KERNEL_MS) < 1e-9,
              f"{label}: one launch's time is the kernel's ({timing['median_ms']:.4f} ms)")
        check(timing["launches"] == launches_per_replay(_FakeCuda.KERNEL_MS, 3),
              f"{label}: N from the probe ({timing['launches']})")
        check(timing["runs"] == timed_runs(_FakeCuda.KERNEL_MS * timing["launches"]),
              f"{label}: replays fill the target ({timing['runs']})")
        check(set(calls) == {0, 1, 2}, f"{label}: every input copy is used")
        check(timing["host_calls"] == host_calls(_FakeCuda.KERNEL_MS) and timing["host_us"] >= 0,
              f"{label}: host time of {timing['host_calls']} calls")
        check((timing["note"] is not None) == fails and (torch.cuda.slept > 0) == fails,
              f"{label}: {'a note and a spin kernel' if fails else 'no note, no spin kernel'}")
    back = Timer(_FakeTorch(False), METHOD_BACK_TO_BACK)
    check(back.time_runs(lambda i: back.torch.cuda.launch(), 1)["method"] == METHOD_BACK_TO_BACK,
          "--method back-to-back never captures")
    print(f"timing self-test: {'PASS' if not failures else f'FAIL ({len(failures)})'}")
    return not failures
