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

For example, f16 D=128 seq 1024 non-causal on the 128-row tile: 1024 warps x 16 tiles of 64 keys,
so --per 16384.

With --reasons, also the loop's stall samples per reason (the CSV's `stall_*` columns, which ncu
writes when the report has per-instruction sampling), each with the opcodes that take most of
them: `wait` on HMMA is a fixed-latency dependency chain, `long_sb` on an integer instruction a
register still to be read by an earlier copy, and so on.

  python3 bench/ncu_loop_mix.py ours.csv.gz theirs.csv.gz --per 131072 --reasons
"""
import argparse
import collections
import csv
import gzip
import re
import sys


def load(path):
    """(address, SASS text, stall samples, executed warp instructions) per line, and per line the
    stall samples by reason ({} when the CSV has no `stall_*` columns)."""
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
    # Per-reason samples of all warps (not the "(Not Issued)" copies of the same columns).
    reason_cols = {name[len("stall_"):]: i for i, name in enumerate(header)
                   if name.startswith("stall_") and "(" not in name}
    lines, reasons = [], []
    for r in rows[header_at + 1:]:
        try:
            lines.append((int(r[col["Address"]], 16), r[col["Source"]].strip(),
                          int(r[col["Warp Stall Sampling (All Samples)"]] or 0),
                          int(r[col["Instructions Executed"]] or 0)))
            reasons.append({k: int(r[i] or 0) for k, i in reason_cols.items()})
        except (ValueError, IndexError):
            continue
    if not lines:
        sys.exit(f"{path}: no SASS lines")
    return lines, reasons


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


def summarise(path, lines, lo, hi, per):
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


def loop_reasons(path, lines, reasons, lo, hi):
    """Stall samples of the main loop per reason, and per reason per opcode."""
    total = collections.Counter()
    by_op = collections.defaultdict(collections.Counter)
    for (_addr, text, _st, _ex), rs in zip(lines[lo:hi + 1], reasons[lo:hi + 1]):
        for reason, n in rs.items():
            total[reason] += n
            by_op[reason][opcode(text)] += n
    if not total:
        sys.exit(f"{path}: no stall_* columns (take the report with --section SourceCounters "
                 "and --section WarpStateStats)")
    return total, by_op


def print_reasons(results):
    order = sorted(set().union(*(t for t, _ in results)), key=lambda r: (-results[0][0][r], r))
    print("\nloop stall samples per reason (share of the file's loop samples; top opcodes)")
    for reason in order:
        cells = []
        for total, by_op in results:
            n = total[reason]
            if n == 0:
                cells.append(f"{0:8d}        ")
                continue
            share = n / (sum(total.values()) or 1)
            top = ", ".join(f"{op} {c}" for op, c in by_op[reason].most_common(3))
            cells.append(f"{n:8d} ({share:5.1%}) {top}")
        if any(total[reason] for total, _ in results):
            print(f"  {reason:18s} " + "  |  ".join(cells))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="+", help="one or two ncu source CSVs (.csv or .csv.gz)")
    ap.add_argument("--per", type=float, default=1.0,
                    help="divide the loop's counts by this (e.g. warps x KV tiles)")
    ap.add_argument("--reasons", action="store_true",
                    help="also the loop's stall samples per reason, with the opcodes behind them")
    args = ap.parse_args()
    if len(args.csv) > 2:
        ap.error("at most two files")
    if args.per <= 0:
        ap.error("--per must be positive")
    loaded = []
    for path in args.csv:
        lines, reasons = load(path)
        loaded.append((path, lines, reasons, *main_loop(lines)))
    results = [summarise(path, lines, lo, hi, args.per) for path, lines, _r, lo, hi in loaded]
    ops = sorted(set().union(*(m for m, _ in results)), key=lambda o: (-results[0][0][o], o))
    names = [f"file {i + 1}" for i in range(len(results))]
    print(f"\nloop mix per {args.per:g}: " + ", ".join(f"{n} = {p}" for n, p in zip(names, args.csv)))
    print(f"{'opcode':10s}" + "".join(f"{n + ' instr':>14s}{'samples':>9s}" for n in names))
    for op in ops:
        print(f"{op:10s}" + "".join(f"{m[op]:14.1f}{s[op]:9d}" for m, s in results))
    print(f"{'all':10s}" + "".join(f"{sum(m.values()):14.1f}{sum(s.values()):9d}" for m, s in results))
    if args.reasons:
        print_reasons([loop_reasons(*item) for item in loaded])


if __name__ == "__main__":
    main()
