"""Where the host time of one attnforge.flashinfer call goes, piece by piece.

For each kind of array available here — numpy arrays (the CPU backend), torch CPU tensors and
torch CUDA tensors (where torch, and a GPU, are installed) — it times:

- ``read 1 array``: the native module reading one array (``_native.describe``, the reader every
  call uses);
- ``alloc out``: allocating an output like ``q`` as the wrappers do;
- ``stream``: the current CUDA stream as the package finds it, beside
  ``torch.cuda.current_stream().cuda_stream`` (CUDA only);
- ``native run``: ``plan.run`` on q, k, v and a given ``out`` (on the CPU backend this includes
  the attention of the tiny problem itself; on a GPU, the launch);
- ``wrapper run``: ``BatchPrefillWithRaggedKVCacheWrapper.run(q, k, v)`` after ``plan``, which
  allocates its output;
- ``decode run``: ``BatchDecodeWithPagedKVCacheWrapper.run(q, cache)`` after ``plan``;
- ``single prefill``: ``single_prefill_with_kv_cache(q, k, v, causal=True)`` (its plan kept).

The problem is tiny (1 query and 16 keys of 1 head at head dim 64, f16) so that the kernel, or
the CPU backend's arithmetic, is small beside the host work. Each figure is the best of ROUNDS
medians of CALLS calls, in microseconds (best, because other work on the machine only adds
time). On a GPU the calls are queued without synchronising; the device keeps up with tiny
kernels, so the host time is what is measured.

    python3 python/checks/host_breakdown.py [--calls N] [--rounds R]
"""

import argparse
import statistics
import time

import numpy as np

import attnforge.flashinfer as fi
from attnforge import _arrays, _native

HEADS, DIM, KV_LEN, PAGE = 1, 64, 16, 16


def timed(call, calls, rounds, sync=None):
    """Best median microseconds per call of ``call``."""
    for _ in range(20):
        call()
    best = float("inf")
    for _ in range(rounds):
        times = []
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            call()
            times.append(time.perf_counter_ns() - t0)
        if sync:
            sync()
        best = min(best, statistics.median(times) / 1e3)
    return best


def kinds():
    """(name, converter from numpy, workspace, sync) for every kind of array available."""
    out = [
        ("numpy", lambda a: a, np.empty(1, np.uint8), None),
    ]
    try:
        import torch
    except ImportError:
        return out
    out.append(("torch cpu", torch.from_numpy, torch.empty(1, dtype=torch.uint8), None))
    if torch.cuda.is_available():
        out.append(
            (
                "torch cuda",
                lambda a: torch.from_numpy(a).cuda(),
                torch.empty(1 << 20, dtype=torch.uint8, device="cuda"),
                torch.cuda.synchronize,
            )
        )
    return out


def rows_for(name, convert, ws, sync, calls, rounds):
    rng = np.random.default_rng(0)
    host = {
        "q": rng.standard_normal((1, HEADS, DIM)).astype(np.float16),
        "k": rng.standard_normal((KV_LEN, HEADS, DIM)).astype(np.float16),
        "v": rng.standard_normal((KV_LEN, HEADS, DIM)).astype(np.float16),
        "cache": rng.standard_normal((1, 2, PAGE, HEADS, DIM)).astype(np.float16),
        "out": np.empty((1, HEADS, DIM), np.float16),
    }
    a = {key: convert(value) for key, value in host.items()}
    t = lambda call: timed(call, calls, rounds, sync)  # noqa: E731
    rows = [("read 1 array", t(lambda: _native.describe(a["q"], "q")))]
    device = _arrays.device_of(a["q"])
    rows.append(("alloc out", t(lambda: _arrays.empty(a["q"], (1, HEADS, DIM)))))
    if device >= 0:
        import torch

        rows.append(("stream (attnforge)", t(lambda: _arrays.current_stream(device))))
        rows.append(
            (
                "stream (torch.cuda.current_stream)",
                t(lambda: torch.cuda.current_stream(device).cuda_stream),
            )
        )
    ragged = fi.BatchPrefillWithRaggedKVCacheWrapper(ws)
    ragged.plan([0, 1], [0, KV_LEN], HEADS, HEADS, DIM, causal=True)
    plan = ragged._plan[0]
    stream = _arrays.current_stream(device)
    rows.append(("native run", t(lambda: plan.run(a["q"], a["k"], a["v"], a["out"], None, stream))))
    rows.append(("wrapper run", t(lambda: ragged.run(a["q"], a["k"], a["v"]))))
    decode = fi.BatchDecodeWithPagedKVCacheWrapper(ws)
    decode.plan([0, 1], [0], [KV_LEN], HEADS, HEADS, DIM, PAGE)
    rows.append(("decode run", t(lambda: decode.run(a["q"], a["cache"]))))
    single = lambda: fi.single_prefill_with_kv_cache(a["q"], a["k"], a["v"], causal=True)  # noqa
    rows.append(("single prefill", t(single)))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print("| arrays | piece | us per call |\n|---|---|---:|")
    for name, convert, ws, sync in kinds():
        for piece, us in rows_for(name, convert, ws, sync, args.calls, args.rounds):
            print(f"| {name} | {piece} | {us:.2f} |")


if __name__ == "__main__":
    main()
