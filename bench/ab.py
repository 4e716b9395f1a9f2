#!/usr/bin/env python3
"""ab.py: time two attnforge binaries against each other on the same shapes, in A B B A order.

A kernel change is judged by its own binary beside the binary it changes, in one run on one GPU:
each round runs A, B, B, A over the selected shapes (one `attnforge bench` process per binary and
round, so both see the same clocks and temperatures on average), and the table gives each
binary's mean TFLOP/s (TB/s for decode shapes) and B's change against A in percent.

    python3 bench/ab.py --bin main=bin/attnforge-main --bin new=bin/attnforge-new \\
        --shape f16-d256-h32/32-s2048-noncausal --shape decode-f16-d128-h32/8-b64-kv4096-p16 \\
        --rounds 2 --out ab.jsonl

Shapes are names from bench/shapes.json (either suite). Every line `attnforge bench` writes is
kept in --out with two more fields: `bin` (the name given to --bin) and `run` (1, 2, ...).
Exit status 1 if a bench process fails or a shape reports anything but `ok`.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", action="append", required=True, metavar="NAME=PATH",
                    help="a binary and its name in the table; exactly two, A then B")
    ap.add_argument("--shape", action="append", required=True, metavar="NAME",
                    help="a shape name from the shape list (repeat)")
    ap.add_argument("--shapes", default="bench/shapes.json", help="the shape list")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of A B B A (each binary runs twice per round)")
    ap.add_argument("--runs", type=int, default=10, help="fewest timed graph replays per shape (attnforge bench times more while they fill its --target-ms)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed launches first (attnforge bench adds 5 probe launches)")
    ap.add_argument("--out", required=True, help="JSON lines of every measurement")
    ap.add_argument("--tiles-of", metavar="ARCH",
                    help="passed to attnforge bench: time that architecture's kernels (e.g. sm_80)")
    args = ap.parse_args()
    bins = []
    for b in args.bin:
        name, sep, path = b.partition("=")
        if not sep or not name or not path:
            ap.error(f"--bin takes NAME=PATH, got {b!r}")
        if not os.access(path, os.X_OK):
            ap.error(f"--bin {name}: {path} is not an executable file")
        bins.append((name, path))
    if len(bins) != 2 or bins[0][0] == bins[1][0]:
        ap.error("--bin: exactly two binaries with different names")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    return args, bins


def select_shapes(path, names):
    """The shape list restricted to `names`, per suite, and the names of all its suites; an error
    naming any shape not found."""
    with open(path) as f:
        lists = json.load(f)
    wanted = set(names)
    selected = {}
    for suite, shapes in lists.items():
        chosen = [dict(s, default=True) for s in shapes if s["name"] in wanted]
        if chosen:
            selected[suite] = chosen
        wanted -= {s["name"] for s in chosen}
    if wanted:
        sys.exit(f"ab.py: shapes not in {path}: {', '.join(sorted(wanted))}")
    return selected, list(lists)


def bench(binary, suite, shapes_file, args, out_file):
    cmd = [binary, "bench", "--suite", suite, "--shapes", shapes_file, "--json-out", out_file,
           "--runs", str(args.runs), "--warmup", str(args.warmup)]
    if args.tiles_of:
        cmd += ["--tiles-of", args.tiles_of]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out_file) as f:
        return [json.loads(line) for line in f if line.strip()]


def figure(line):
    """TFLOP/s, or TB/s for shapes measured by bandwidth (decode: no tflops figure)."""
    if line.get("shape", "").startswith("decode"):
        return line.get("tbps")
    return line.get("tflops")


def main():
    args, bins = parse_args()
    selected, suites = select_shapes(args.shapes, args.shape)
    records = []
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        shapes_file = os.path.join(tmp, "shapes.json")
        with open(shapes_file, "w") as f:
            # Every suite's key, empty where nothing was chosen: `attnforge bench` reads the file
            # whole and needs each list (only paged shapes chosen: no prefill key, an error).
            json.dump({suite: selected.get(suite, []) for suite in suites}, f)
        order = [bins[0], bins[1], bins[1], bins[0]] * args.rounds
        for run, (name, path) in enumerate(order, start=1):
            for suite in selected:
                out_file = os.path.join(tmp, f"{run}-{suite}.jsonl")
                try:
                    lines = bench(path, suite, shapes_file, args, out_file)
                except subprocess.CalledProcessError as e:
                    print(f"ab.py: {name} failed on suite {suite} (exit {e.returncode})", file=sys.stderr)
                    failed = True
                    continue
                # Appended as each run ends, so that a run cut short keeps what it measured.
                with open(args.out, "a") as f:
                    for line in lines:
                        line.update(bin=name, run=run)
                        records.append(line)
                        f.write(json.dumps(line) + "\n")
                        if line.get("status") != "ok":
                            failed = True

    a, b = bins[0][0], bins[1][0]
    print(f"\n| shape | {a} | {b} | {b} vs {a} |")
    print("|---|---:|---:|---:|")
    for shape in args.shape:
        cols = []
        for name in (a, b):
            vals = [figure(r) for r in records
                    if r["shape"] == shape and r["bin"] == name and r.get("status") == "ok" and figure(r)]
            cols.append(sum(vals) / len(vals) if vals else None)
        fa, fb = cols
        delta = f"{(fb / fa - 1) * 100:+.1f}%" if fa and fb else "n/a"
        show = lambda v: f"{v:.1f}" if v is not None else "failed"
        print(f"| {shape} | {show(fa)} | {show(fb)} | {delta} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
