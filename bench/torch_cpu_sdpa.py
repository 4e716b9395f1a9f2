#!/usr/bin/env python3
"""PyTorch's CPU scaled_dot_product_attention on the shapes of benches/cpu_backend.rs.

The peer figure for the CPU backend in docs/benchmarks.md. Each shape is one request, f32,
inputs [1, heads, tokens, dim] drawn standard normal. GQA shapes are timed two ways and both are
printed: with `enable_gqa=True`, and with K/V expanded to the query heads beforehand (outside the
timed region), since not every torch version has a fast GQA path on the CPU. The ratio in
docs/benchmarks.md uses the faster of the two.

Usage: python bench/torch_cpu_sdpa.py [--runs N] [--threads N]
Needs: torch (pip install torch).
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

# (name, tokens, query heads, kv heads, head dim, causal): the SHAPES of benches/cpu_backend.rs.
SHAPES = [
    ("llama_2048_causal", 2048, 32, 8, 128, True),
    ("llama_512_causal", 512, 32, 8, 128, True),
    ("mha_512_full_d64", 512, 8, 8, 64, False),
    ("gqa_256_causal_d256", 256, 16, 8, 256, True),
]

WARMUP_RUNS = 2


def median_ms(fn, runs):
    for _ in range(WARMUP_RUNS):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), min(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"cpu capability {torch.backends.cpu.get_cpu_capability()}"
    )
    print(f"{'shape':<22} {'mode':<12} {'median ms':>10} {'min ms':>8}")
    for name, n, hq, hkv, d, causal in SHAPES:
        q = torch.randn(1, hq, n, d)
        k = torch.randn(1, hkv, n, d)
        v = torch.randn(1, hkv, n, d)
        modes = []
        if hq != hkv:
            modes.append(("enable_gqa", k, v, True))
            group = hq // hkv
            modes.append(("expanded_kv", k.repeat_interleave(group, dim=1).contiguous(),
                          v.repeat_interleave(group, dim=1).contiguous(), False))
        else:
            modes.append(("mha", k, v, False))
        with torch.inference_mode():
            for mode, kk, vv, gqa in modes:
                kwargs = {"is_causal": causal}
                if gqa:
                    kwargs["enable_gqa"] = True
                med, best = median_ms(lambda: F.scaled_dot_product_attention(q, kk, vv, **kwargs),
                                      args.runs)
                print(f"{name:<22} {mode:<12} {med:>10.2f} {best:>8.2f}")


if __name__ == "__main__":
    main()
