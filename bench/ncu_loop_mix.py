#!/usr/bin/env python3
"""Reads ncu's per-SASS-line source counters of one kernel and prints where its instructions go:
executed warp instructions and stall samples in the prologue, the main loop and the epilogue,
then the loop's instruction mix per SASS opcode, divided by a count you give (warps x KV tiles,
so that two kernels on the same shape compare per warp and tile). With a second file, both side
by side.

The input is the CSV that `ncu --import REPORT --page source --csv --print-source sass` writes
for a report taken with `--section SourceCounters` (gzip-compressed or not). The main loop is the
span from the earliest target to the latest source of the backward branches that jump more than
100 instructions (the K/V tile loop; short inner loops are inside it).

  python3 bench/ncu_loop_mix.py ours.csv.gz [theirs.csv.gz] --per 16384

Example (session 7, s1024 non-causal: 1024 warps x 16 tiles of 64 keys): the CSVs are in
docs/results/ncu/.
"""
import argparse
import collections
import csv
import gzip
import re
import sys


def load(path):
    """(address, SASS text, stall samples, executed warp instructions) per line."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)
    if header_at is None:
        sys.exit(f"{path}: no header row with Address and Source (not an ncu source CSV?)")
    header = rows[header_at]
    try:
        col = {name: header.index(name) for name in
               ("Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed")}
    except ValueError as e:
        sys.exit(f"{path}: {e} (was the report taken with --section SourceCounters?)")
    lines = []
    for r in rows[header_at + 1:]:
        try:
            lines.append((int(r[col["Address"]], 16), r[col["Source"]].strip(),
                          int(r[col["Warp Stall Sampling (All Samples)"]] or 0),
                          int(r[col["Instructions Executed"]] or 0)))
        except (ValueError, IndexError):
            continue
    if not lines:
        sys.exit(f"{path}: no SASS lines")
    return lines


def main_loop(lines):
    """(first, last) line index of the main loop."""
    index = {addr: i for i, (addr, *_rest) in enumerate(lines)}
    base = lines[0][0]
    spans = []
    for i, (_addr, text, _stall, _ex) in enumerate(lines):
        target = re.search(r"BRA\b.*?(0x[0-9a-f]+)\s*$", text)
        if not target:
            continue
        t = int(target.group(1), 16)
        t = t if t in index else t + base  # targets may be relative to the function
        if t in index and index[t] <= i and i - index[t] > 100:
            spans.append((index[t], i))
    if not spans:
        sys.exit("no backward branch over more than 100 instructions: no main loop found")
    return min(s[0] for s in spans), max(s[1] for s in spans)


def opcode(text):
    word = text.split()[1] if text.startswith("@") else text.split()[0]
    return word.split(".")[0]


def summarise(path, per):
    lines = load(path)
    lo, hi = main_loop(lines)
    total_ex = sum(x[3] for x in lines) or 1
    total_st = sum(x[2] for x in lines) or 1
    print(f"{path}: {len(lines)} SASS lines, {total_ex} warp instructions, {total_st} stall samples")
    for name, a, b in (("prologue", 0, lo), ("loop", lo, hi + 1), ("epilogue", hi + 1, len(lines))):
        ex = sum(x[3] for x in lines[a:b])
        st = sum(x[2] for x in lines[a:b])
        print(f"  {name:9s} {b - a:5d} lines {ex:10d} executed ({ex / total_ex:5.1%}) "
              f"{st:7d} samples ({st / total_st:5.1%})")
    mix = collections.Counter()
    stalls = collections.Counter()
    for _addr, text, st, ex in lines[lo:hi + 1]:
        mix[opcode(text)] += ex / per
        stalls[opcode(text)] += st
    return mix, stalls


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="+", help="one or two ncu source CSVs (.csv or .csv.gz)")
    ap.add_argument("--per", type=float, default=1.0,
                    help="divide the loop's counts by this (e.g. warps x KV tiles)")
    args = ap.parse_args()
    if len(args.csv) > 2:
        ap.error("at most two files")
    if args.per <= 0:
        ap.error("--per must be positive")
    results = [summarise(p, args.per) for p in args.csv]
    ops = sorted(set().union(*(m for m, _ in results)), key=lambda o: -results[0][0][o])
    names = [f"file {i + 1}" for i in range(len(results))]
    print(f"\nloop mix per {args.per:g}: " + ", ".join(f"{n} = {p}" for n, p in zip(names, args.csv)))
    print(f"{'opcode':10s}" + "".join(f"{n + ' instr':>14s}{'samples':>9s}" for n in names))
    for op in ops:
        print(f"{op:10s}" + "".join(f"{m[op]:14.1f}{s[op]:9d}" for m, s in results))
    print(f"{'all':10s}" + "".join(f"{sum(m.values()):14.1f}{sum(s.values()):9d}" for m, s in results))


if __name__ == "__main__":
    main()
