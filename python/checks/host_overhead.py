"""The host time of one attention call from Python: attnforge.flashinfer beside FlashInfer and
FA3 (each where it can be imported), on bf16, head dim 128, 32 query heads over 8 KV heads,
causal, one request of 4096 tokens and one of 512.

Calls: ``single_prefill_with_kv_cache`` (plans and runs in one call),
``BatchPrefillWithRaggedKVCacheWrapper.run`` after an untimed ``plan`` (one request of the same
length) and ``BatchDecodeWithPagedKVCacheWrapper.run`` after an untimed ``plan`` (DECODE_BATCH
requests of that many keys in pages of PAGE_SIZE, K and V in one tensor), for attnforge and for
FlashInfer (its FA2 backend for the prefills, as bench/peers.py times it); FA3's
``flash_attn_func`` and, when the module has it, ``flash_attn_varlen_func``. Each call allocates
its output, as a caller's would.

Host time: the wall time of each of N calls queued back to back without synchronising, while the
GPU is held busy by a spin kernel (``torch.cuda._sleep``, calibrated against CUDA events) queued
just before them and long enough to outlast them: the host never waits for the GPU, so the time
is the Python layers, argument checks and launches alone, with nothing subtracted. The median
over ROUNDS rounds of N calls is reported. That the spin was still running when the last call
returned is checked each round (a CUDA event recorded after it has not completed); a call that
waits for the GPU (it synchronises) fails that check on a short probe, and its row reports the
wall time of one call on an idle GPU instead, its kernel included, marked "waits for the GPU".

Kernel time: CUDA events around replays of a CUDA graph that captured N calls, per call (the
median of GRAPH_REPLAYS replays); "-" where capture does not apply (a call that synchronises) or
fails (the reason is printed).

The issue's target for attnforge is at most 20 us of host time per ``run``; the last line says
whether the wrapper's ``run`` meets it.

Runs on a CUDA GPU with torch and the attnforge wheel; FlashInfer (``import flashinfer``) and FA3
(``import fa3_fwd_interface``) are optional: a missing one is a row saying why, and so is a call of
theirs that fails. Exits 0 when every attnforge call was measured, 1 when one failed, 2 when it
cannot run (no torch, no GPU, no attnforge).

    python3 python/checks/host_overhead.py [--impls attnforge,flashinfer,fa3] [--calls N]
"""

import argparse
import statistics
import sys
import time

try:
    import torch
except ImportError:
    torch = None

SHAPES = (("s4096", 4096), ("s512", 512))
NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 8, 128
TARGET_US = 20.0
CALLS = 50
ROUNDS = 10
WARMUP = 5
PROBE_CALLS = 5
PROBE_SPIN_MS = 100.0
SPIN_MARGIN = 4.0  # the spin lasts this many times the probe's estimate of the N calls
MIN_SPIN_MS = 5.0
MAX_SPIN_MS = 2000.0
GRAPH_REPLAYS = 10
WORKSPACE_BYTES = 128 << 20
DECODE_BATCH, PAGE_SIZE = 32, 16
DEVICE = "cuda"
IMPLS = ("attnforge", "flashinfer", "fa3")


def cannot_run(why):
    print(f"host_overhead: cannot run: {why}", file=sys.stderr)
    sys.exit(2)


class Spin:
    """Holds the GPU busy on the current stream for a given time (``torch.cuda._sleep``, cycles
    calibrated against CUDA events)."""

    def __init__(self):
        if not hasattr(torch.cuda, "_sleep"):
            cannot_run("torch.cuda._sleep is missing: no way to hold the GPU busy")
        cycles = 20_000_000
        torch.cuda._sleep(1000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        self.cycles_per_ms = cycles / start.elapsed_time(end)
        self.done = None

    def hold(self, ms):
        torch.cuda._sleep(int(ms * self.cycles_per_ms))
        self.done = torch.cuda.Event()
        self.done.record()

    def still_busy(self):
        return not self.done.query()


def queued(spin, call, n, spin_ms):
    """Host nanoseconds of each of ``n`` calls queued behind a spin of ``spin_ms``, and whether
    the spin outlasted them."""
    spin.hold(spin_ms)
    times = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - t0)
    busy = spin.still_busy()
    torch.cuda.synchronize()
    return times, busy


def host_time(spin, call, calls, rounds):
    """(median host us per call, note)."""
    for _ in range(WARMUP):
        call()
    torch.cuda.synchronize()
    probe, busy = queued(spin, call, PROBE_CALLS, PROBE_SPIN_MS)
    if not busy:
        times = []
        for _ in range(calls):
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            call()
            times.append(time.perf_counter_ns() - t0)
        torch.cuda.synchronize()
        return statistics.median(times) / 1e3, "waits for the GPU: one call on an idle GPU"
    estimate_ms = statistics.median(probe) / 1e6 * calls
    spin_ms = min(max(SPIN_MARGIN * estimate_ms, MIN_SPIN_MS), MAX_SPIN_MS)
    samples, idle = [], 0
    for _ in range(rounds):
        times, busy = queued(spin, call, calls, spin_ms)
        samples += times
        idle += not busy
    note = f"GPU went idle before the last call in {idle}/{rounds} rounds" if idle else ""
    return statistics.median(samples) / 1e3, note


def graph_time(call, calls):
    """Kernel ms per call: CUDA events around replays of a graph of ``calls`` calls."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            call()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(GRAPH_REPLAYS):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def settle():
    """Waits for the device after a failed capture; False when the device reports an error."""
    try:
        torch.cuda.synchronize()
    except RuntimeError as exc:
        print(f"host_overhead: the device failed after a graph capture: {short(exc)}")
        return False
    return True


def short(exc):
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:160]


# ----------------------------------------------------------------------------------------------
# The calls of each implementation


def inputs(seq):
    q = torch.randn(seq, NUM_QO_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=DEVICE)
    k = torch.randn(seq, NUM_KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=DEVICE)
    v = torch.randn(seq, NUM_KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=DEVICE)
    indptr = torch.tensor([0, seq], dtype=torch.int32, device=DEVICE)
    return q, k, v, indptr


def flashinfer_api_calls(fi, seq, backend):
    """The two calls of a FlashInfer-style module (attnforge.flashinfer or flashinfer):
    [(name, call)]; ``backend`` is passed where the module takes one."""
    q, k, v, indptr = inputs(seq)
    extra = {} if backend is None else {"backend": backend}
    workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=DEVICE)
    wrapper = fi.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", **extra)
    wrapper.plan(
        indptr,
        indptr,
        NUM_QO_HEADS,
        NUM_KV_HEADS,
        HEAD_DIM,
        causal=True,
        q_data_type=torch.bfloat16,
    )
    return [
        (
            "single_prefill_with_kv_cache",
            lambda: fi.single_prefill_with_kv_cache(q, k, v, causal=True, **extra),
        ),
        ("BatchPrefillWithRaggedKVCacheWrapper.run", lambda: wrapper.run(q, k, v)),
        decode_call(fi, seq, workspace),
    ]


def decode_call(fi, seq, workspace):
    """One decode step of DECODE_BATCH requests of ``seq`` keys each over a paged cache."""
    pages = -(-seq // PAGE_SIZE)
    total = DECODE_BATCH * pages
    kv = torch.randn(
        total, 2, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=DEVICE
    )
    indptr = torch.arange(0, total + 1, pages, dtype=torch.int32, device=DEVICE)
    indices = torch.arange(total, dtype=torch.int32, device=DEVICE)
    last = torch.full((DECODE_BATCH,), seq - (pages - 1) * PAGE_SIZE, dtype=torch.int32)
    wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    wrapper.plan(
        indptr,
        indices,
        last.to(DEVICE),
        NUM_QO_HEADS,
        NUM_KV_HEADS,
        HEAD_DIM,
        PAGE_SIZE,
        q_data_type=torch.bfloat16,
    )
    q = torch.randn(DECODE_BATCH, NUM_QO_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=DEVICE)
    return ("BatchDecodeWithPagedKVCacheWrapper.run", lambda: wrapper.run(q, kv))


def fa3_calls(fa3, seq):
    q, k, v, indptr = inputs(seq)
    q4, k4, v4 = q[None], k[None], v[None]
    calls = [("flash_attn_func", lambda: fa3.flash_attn_func(q4, k4, v4, causal=True))]
    if hasattr(fa3, "flash_attn_varlen_func"):
        calls.append(
            (
                "flash_attn_varlen_func",
                lambda: fa3.flash_attn_varlen_func(q, k, v, indptr, indptr, seq, seq, causal=True),
            )
        )
    return calls


def load(name):
    """(calls factory ``seq -> [(call name, call)]``, version) or (None, why missing). A peer
    that fails inside its import is missing too."""
    try:
        if name == "attnforge":
            import attnforge
            import attnforge.flashinfer as fi

            return (lambda seq: flashinfer_api_calls(fi, seq, None)), attnforge.__version__
        if name == "flashinfer":
            import flashinfer

            version = getattr(flashinfer, "__version__", "?")
            return (lambda seq: flashinfer_api_calls(flashinfer, seq, "fa2")), version
        import fa3_fwd_interface

        return (lambda seq: fa3_calls(fa3_fwd_interface, seq)), "fa3_fwd_interface"
    except Exception as exc:  # noqa: BLE001 (any import failure makes the implementation missing)
        return None, f"not importable: {short(exc)}"


# ----------------------------------------------------------------------------------------------
# Driver


def measure(impl, factory, args):
    """Rows ``(impl, call, shape, host us, kernel ms, note)`` and whether every call ran."""
    rows, ok = [], True
    for shape, seq in SHAPES:
        try:
            calls = factory(seq)
        except Exception as exc:  # noqa: BLE001 (a failed plan is a row of the table)
            rows.append((impl, "setup", shape, "-", "-", f"failed: {short(exc)}"))
            ok = False
            continue
        for name, call in calls:
            try:
                host_us, note = host_time(args.spin, call, args.calls, args.rounds)
            except Exception as exc:  # noqa: BLE001 (a failed call is a row of the table)
                rows.append((impl, name, shape, "-", "-", f"failed: {short(exc)}"))
                ok = False
                continue
            kernel = "-"
            if note.startswith("waits"):
                note += "; not captured in a graph (it synchronises)"
            else:
                try:
                    kernel = f"{graph_time(call, args.calls):.4f}"
                except Exception as exc:  # noqa: BLE001 (capture refused: the host time stands)
                    note = (note + "; " if note else "") + f"graph capture failed: {short(exc)}"
                    ok &= settle()
            rows.append((impl, name, shape, f"{host_us:.1f}", kernel, note))
            print(f"[{impl}] {name} {shape}: {host_us:.1f} us host, {kernel} ms kernel", flush=True)
    return rows, ok


def print_table(rows):
    head = ("implementation", "call", "shape", "host us/call (median)", "kernel ms", "note")
    cells = [head] + rows
    widths = [max(len(str(r[i])) for r in cells) for i in range(len(head))]
    for r in cells:
        print("  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--impls", default=",".join(IMPLS), help="comma-separated: " + ",".join(IMPLS)
    )
    parser.add_argument("--calls", type=int, default=CALLS, help="calls per round and per graph")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    impls = [i for i in args.impls.split(",") if i]
    if not impls or any(i not in IMPLS for i in impls):
        parser.error(f"--impls: choose from {','.join(IMPLS)}")
    if args.calls < 1 or args.rounds < 1:
        parser.error("--calls and --rounds must be at least 1")
    if torch is None:
        cannot_run("torch is not installed (this measurement runs on a GPU machine with torch)")
    if not torch.cuda.is_available():
        cannot_run("torch.cuda is not available: this measurement needs a CUDA GPU")
    args.spin = Spin()
    print(
        f"torch {torch.__version__}, {torch.cuda.get_device_name()}, bf16 D{HEAD_DIM} "
        f"h{NUM_QO_HEADS}/{NUM_KV_HEADS} causal, {args.calls} calls x {args.rounds} rounds, "
        f"spin {args.spin.cycles_per_ms / 1e6:.2f} Mcycles/ms"
    )
    rows, ok = [], True
    for impl in impls:
        factory, version = load(impl)
        if factory is None:
            if impl == "attnforge":
                cannot_run(f"attnforge is {version} (install its wheel)")
            rows.append((impl, "-", "-", "-", "-", f"skipped: {version}"))
            continue
        print(f"{impl} {version}", flush=True)
        impl_rows, impl_ok = measure(impl, factory, args)
        rows += impl_rows
        ok &= impl_ok or impl != "attnforge"
    print_table(rows)
    runs = [r for r in rows if r[0] == "attnforge" and r[1].endswith(".run") and r[3] != "-"]
    for r in runs:
        verdict = "meets" if float(r[3]) <= TARGET_US else "misses"
        print(f"attnforge {r[1]} {r[2]}: {r[3]} us host, {verdict} the target of {TARGET_US:g} us")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
