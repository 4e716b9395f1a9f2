#!/usr/bin/env python3
"""Joins attnforge's and the peers' benchmark results by shape into one report: a markdown table
(our figure, each peer's, and ours/peer), a merged JSON file, a PNG plot, and a markdown section
for one suite:

  prefill  TFLOP/s; the plot draws TFLOP/s against sequence length (bars for the other shapes).
  paged    up to three tables, each against the FlashInfer calls that ran it: batch decode (bound
           by memory) in TB/s (the shape's `bytes`: Q, K, V read once, O written once), batch
           paged prefill (bound by compute) in TFLOP/s, its ratios from TFLOP/s, with a TB/s
           column beside, and the append of new tokens' K/V into the cache (where the shapes
           have one) in TB/s with its percentage of the device's measured copy bandwidth beside;
           the plot draws one panel of bars per table, in the table's figure, the TB/s panels
           beside the device's measured copy bandwidth.

Inputs are the JSON lines of the benchmark data contract (docs/benchmarking.md): ours from
`attnforge bench [--suite paged] --json-out`, the peers' from bench/peers.py, and the resolved
shape list from `attnforge bench [--suite paged] --print-shapes` (it gives the order and the
fields the plot groups by). A merged JSON written by this script can be read back instead
(`--merged`; it names its suite), so reports are regenerated from the raw results on any machine
with matplotlib.

`--self-test` checks the rendering of old and new result lines and that docs/benchmarks.md is
what this script generates from docs/results (bench/report_selftest.py).

`--doc FILE MERGED...` writes the whole of FILE (docs/benchmarks.md) from merged JSON files, one
section each (prefill sections by head dim, then paged), each linking the PNG of the same name
beside its JSON where there is one (`--plot` with `--doc` redraws them first).

A wrong attnforge result ("wrong: ...") makes the exit status 1 and blocks the markdown: a fast
wrong kernel is never published.

  python3 bench/report.py --shapes shapes-prefill.json --ours ours-prefill.jsonl \\
      --peers peers-prefill.jsonl --gpu "NVIDIA H200" --command "bash scripts/gpu-suite" \\
      --out-json merged-prefill.json --plot prefill.png --markdown-section section-prefill.md
  python3 bench/report.py --suite paged --shapes shapes-paged.json --ours ours-paged.jsonl \\
      --peers peers-paged.jsonl --out-json merged-paged.json --plot paged.png \\
      --markdown-section section-paged.md
  python3 bench/report.py --doc docs/benchmarks.md docs/results/*.json
"""

import argparse
import datetime
import json
import math
import os
import re
import sys

import peers_timing
from peers import IMPL_SCOPE, SUITE_IMPLS
from peers_shapes import (PAGED_APPEND, PAGED_DECODE, PAGED_PREFILL, SUITE_PAGED, SUITE_PREFILL,
                          paged_kind)

OURS = "attnforge"
# The figures a result line carries: field -> (unit, format); and the figures computed from one
# of them: field -> (the field, its function).
METRICS = {"tflops": ("TFLOP/s", "{:.1f}"), "tbps": ("TB/s", "{:.2f}"),
           "copy_pct": ("% of copy", "{:.0f}%")}
# Per suite: the section title, what the plot draws (its title), and for the prefill suite the
# result field that is the table's figure (the ratios' too). The paged suite's tables each name
# their own figure (PAGED_GROUPS).
SUITE_INFO = {
    SUITE_PREFILL: {"metric": "tflops", "title": "Prefill", "plot_units": "TFLOP/s"},
    SUITE_PAGED: {"title": "Paged KV cache: batch decode and paged prefill",
                  "plot_units": "TB/s (decode), TFLOP/s (paged prefill)"},
}
PAGED_TITLE_WITH_APPEND = "Paged KV cache: batch decode, paged prefill and append"
# The paged suite's tables: (title, kind of shape (peers_shapes.paged_kind), figure, extra
# columns). Decode is bound by memory (TB/s); paged prefill by compute (TFLOP/s, with its TB/s in
# an extra column); the append by memory (TB/s, with its share of the copy bandwidth).
PAGED_GROUPS = [("Batch decode", PAGED_DECODE, "tbps", []),
                ("Batch paged prefill", PAGED_PREFILL, "tflops", ["tbps"]),
                ("Append to the paged cache", PAGED_APPEND, "tbps", ["copy_pct"])]
# The device-to-device copy bandwidth of a run: the environment line scripts/gpu-suite writes
# ("device copy: X TB/s ..."), measured in the same run; for results without one, the figure
# measured earlier on the GPU the meta names (shared/peers/README.md: 4.3 TB/s on the H200). A
# GPU with neither gets no % of copy ("-") and no copy line in its plot: a ceiling is not assumed
# from another GPU.
DEVICE_COPY_LINE = re.compile(r"^device copy: ([0-9.]+) TB/s")
DEVICE_COPY_TBPS = {"NVIDIA H200": 4.3}
# The figures computed from another: field -> the field it is computed from (with the GPU's copy
# bandwidth, extra_cells).
DERIVED = {"copy_pct": "tbps"}
DEVICE_COPY_LABEL = "device copy bandwidth (measured)"
PAGED_Y_HEADROOM = 1.15  # room above the highest bar or the copy line for its label
# A paged shape's page table (thousands of page ids): left out of the merged JSON, which keeps the
# shape's lengths, page size and page count; `attnforge bench --suite paged --print-shapes` gives
# the table again.
PAGE_TABLE_FIELDS = ("kv_page_indptr", "kv_page_indices", "kv_last_page_len")
DOC_COMMAND = "python3 bench/report.py --doc docs/benchmarks.md docs/results/*.json"
PANEL_COLUMNS = 3
PANEL_SIZE_IN = (5.0, 3.6)
BAR_PANEL_WIDTH_PER_SHAPE_IN = 0.9
BAR_PANEL_MIN_WIDTH_IN = 8.0
BAR_PANEL_HEIGHT_IN = 4.6
PLOT_DPI = 110
LEGEND_SPACE_IN = 0.45  # per row of legend entries
LEGEND_ENTRY_WIDTH_IN = 2.6
TITLE_SPACE_IN = 0.5
TITLE_LINE_IN = 0.25  # more room when the title takes a second line


def read_jsonl(path, suite):
    """Result lines of one suite keyed by (shape, impl); the last line for a key wins."""
    results = {}
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            raw = raw.strip()
            if not raw:
                continue
            try:
                line = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not JSON: {exc}") from exc
            for field in ("shape", "impl", "status"):
                if field not in line:
                    raise ValueError(f"{path}:{n}: missing field {field!r}")
            if line.get("suite", suite) != suite:
                continue
            results[(line["shape"], line["impl"])] = line
    return results


def read_shapes(path, suite):
    with open(path) as f:
        raw = json.load(f)
    if isinstance(raw, dict):
        raw = raw.get(suite, [])
    if not isinstance(raw, list) or not all(isinstance(s, dict) and "name" in s for s in raw):
        raise ValueError(f"{path}: expected a JSON list of shapes with names")
    return raw


def build_merged(args):
    shapes = read_shapes(args.shapes, args.suite)
    results = read_jsonl(args.ours, args.suite)
    if args.peers:
        results.update(read_jsonl(args.peers, args.suite))
    env = []
    if args.env_file:
        with open(args.env_file) as f:
            env = [ln.rstrip("\n") for ln in f if ln.strip()]
    seen_impls = {impl for _, impl in results}
    impls = [OURS] + [p for p in SUITE_IMPLS[args.suite] if p in seen_impls]
    impls += sorted(seen_impls - set(impls))
    known = {s["name"] for s in shapes}
    stray = sorted({name for name, _ in results if name not in known})
    merged_shapes = []
    for s in shapes:
        entry = {k: v for k, v in s.items() if k not in PAGE_TABLE_FIELDS}
        entry["results"] = {i: results[(s["name"], i)] for i in impls if (s["name"], i) in results}
        merged_shapes.append(entry)
    date = args.date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    meta = {"date": date, "gpu": args.gpu, "command": args.command, "environment": env,
            "unmatched_result_shapes": stray}
    return {"suite": args.suite, "meta": meta, "impls": impls, "shapes": merged_shapes}


def suite_info(merged):
    if merged["suite"] not in SUITE_INFO:
        raise ValueError(f"unknown suite {merged['suite']!r}; known: {list(SUITE_INFO)}")
    return SUITE_INFO[merged["suite"]]


def is_ok(line, metric):
    return line is not None and line.get("status") == "ok" and bool(line.get(metric))


def status_kind(line):
    if line is None:
        return "absent"
    return line["status"].split(":", 1)[0].strip()


class Footnotes:
    """Numbers each distinct non-ok status text once."""

    def __init__(self):
        self.texts = []

    def ref(self, impl, line):
        if line:
            text, kind = f"{impl}: {line['status']}", status_kind(line)
        elif impl in IMPL_SCOPE:
            text, kind = f"{impl}: {IMPL_SCOPE[impl]}", "n/a"
        else:
            text, kind = f"{impl}: no result line", status_kind(line)
        if text not in self.texts:
            self.texts.append(text)
        return f"{kind} [{self.texts.index(text) + 1}]"

    def render(self):
        return [f"[{n}] {t}" for n, t in enumerate(self.texts, 1)]


def table_groups(merged):
    """[(title or None, shapes, impls, metric, extras)]: the prefill suite is one table of every
    impl in its suite's figure; the paged suite is a decode table (TB/s), a paged prefill table
    (TFLOP/s, extra column TB/s) and an append table (TB/s, extra column % of copy), those that
    have shapes, each with the impls that have a result line for one of its shapes (peers.py runs
    the decode wrappers on decode shapes only). `metric` is the result field of the table's
    figure and ratios, `extras` the fields shown beside it (METRICS, DERIVED)."""
    shapes = merged["shapes"]
    if merged["suite"] != SUITE_PAGED:
        return [(None, shapes, merged["impls"], suite_info(merged)["metric"], [])]
    groups = []
    for title, kind, metric, extras in PAGED_GROUPS:
        members = [s for s in shapes if paged_kind(s) == kind]
        present = {impl for s in members for impl in s["results"]}
        impls = [i for i in merged["impls"] if i == OURS or i in present]
        if members:
            groups.append((title, members, impls, metric, extras))
    return groups


def device_copy_tbps(merged):
    """The copy bandwidth of the GPU the result was measured on: measured in the run
    (DEVICE_COPY_LINE), else known for the GPU (DEVICE_COPY_TBPS), else None."""
    meta = merged.get("meta") or {}
    for line in meta.get("environment") or []:
        match = DEVICE_COPY_LINE.match(line)
        if match:
            return float(match.group(1))
    gpu = meta.get("gpu") or ""
    return next((tbps for name, tbps in DEVICE_COPY_TBPS.items() if gpu.startswith(name)), None)


def extra_cells(line, extras, copy_tbps):
    """The cells of a result line's extra figures (a derived one computed from its field, the %
    of copy from the GPU's copy bandwidth `copy_tbps`): "-" where it has none (its status is in
    the table's figure column, or the GPU's copy bandwidth is not known)."""
    cells = []
    for x in extras:
        field = DERIVED.get(x, x)
        if not is_ok(line, field) or (x == "copy_pct" and copy_tbps is None):
            cells.append("-")
            continue
        value = 100.0 * line[field] / copy_tbps if x == "copy_pct" else line[field]
        cells.append(METRICS[x][1].format(value))
    return cells


def has_host_time(shapes, impls):
    """Whether any result line of these shapes and impls carries a host time (result files
    written before host times were measured have none: their tables keep their columns)."""
    return any(s["results"].get(i, {}).get("host_us") for s in shapes for i in impls)


def figure_cell(line, metric, fmt):
    """The figure of an ok line, marked when it was timed back to back rather than by graph
    replay."""
    cell = fmt.format(line[metric])
    return cell + " (b2b)" if line.get("method") == peers_timing.METHOD_BACK_TO_BACK else cell


def host_cell(line):
    return f"{line['host_us']:.1f}" if line and line.get("host_us") else "-"


def markdown_table(merged):
    """Markdown lines of the tables (a heading above each when the suite has several), the
    ratio summary lines and the footnotes of the statuses other than ok. Each impl has a column
    of the table's figure, then one per extra figure ("-" unless ok), then its host time per call
    in microseconds (where the results carry host times), then, for a peer, the ratio ours/peer
    of the table's figure (the inverse ratio of the kernel times)."""
    notes = Footnotes()
    rows, summary = [], []
    copy_tbps = device_copy_tbps(merged)
    for title, shapes, impls, metric, extras in table_groups(merged):
        unit, fmt = METRICS[metric]
        peers = [i for i in impls if i != OURS]
        host = has_host_time(shapes, impls)
        host_head = ["host us"] if host else []
        head = ["shape", f"{OURS} {unit}"] + [f"{OURS} {METRICS[x][0]}" for x in extras]
        head += [f"{OURS} {h}" for h in host_head]
        for p in peers:
            head += [f"{p} {unit}"] + [f"{p} {METRICS[x][0]}" for x in extras]
            head += [f"{p} {h}" for h in host_head] + [f"{OURS}/{p}"]
        if title:
            rows += [f"### {title}", ""]
        rows += ["| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * (len(head) - 1)]
        ratios = {p: [] for p in peers}
        for s in shapes:
            res = s["results"]
            ours = res.get(OURS)
            cells = [s["name"], figure_cell(ours, metric, fmt) if is_ok(ours, metric)
                     else notes.ref(OURS, ours)]
            cells += extra_cells(ours, extras, copy_tbps) + ([host_cell(ours)] if host else [])
            for p in peers:
                line = res.get(p)
                cells.append(figure_cell(line, metric, fmt) if is_ok(line, metric)
                             else notes.ref(p, line))
                cells += extra_cells(line, extras, copy_tbps) + ([host_cell(line)] if host else [])
                if is_ok(ours, metric) and is_ok(line, metric):
                    r = ours[metric] / line[metric]
                    ratios[p].append((r, s["name"]))
                    cells.append(f"{r:.2f}x")
                else:
                    cells.append("-")
            rows.append("| " + " | ".join(cells) + " |")
        rows.append("")
        prefix = f"{title}: " if title else ""
        for p in peers:
            if ratios[p]:
                geo = math.exp(sum(math.log(r) for r, _ in ratios[p]) / len(ratios[p]))
                low = min(ratios[p])
                summary.append(f"{prefix}{OURS}/{p}: geometric mean {geo:.2f}x, lowest "
                               f"{low[0]:.2f}x ({low[1]}), over {len(ratios[p])} shapes")
            else:
                summary.append(f"{prefix}{OURS}/{p}: no shape where both ran")
    return rows[:-1], summary, notes.render()


def our_wrong(merged):
    return [s["name"] for s in merged["shapes"]
            if status_kind(s["results"].get(OURS)) == "wrong"]


def group_key(s):
    head_dims = (s.get("head_dim_qk"), s.get("head_dim_vo")) if "head_dim" not in s else None
    dim = f"D{s['head_dim']}" if head_dims is None else f"D{head_dims[0]}/{head_dims[1]}"
    title = f"{s['dtype']} {dim} h{s['num_qo_heads']}/{s['num_kv_heads']} " \
            f"{'causal' if s['causal'] else 'non-causal'}"
    if s.get("soft_cap"):
        title += f" soft-cap {s['soft_cap']:g}"
    if s.get("qk_accum") == "f16":
        title += " f16-QK"
    return title


def load_pyplot():
    import matplotlib  # noqa: PLC0415 (only needed for the plot)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    return plt


def bar_panel(ax, shapes, impls, colors, metric, unit):
    """One bar per (shape, impl) with an ok result, grouped by shape along x."""
    bar_w = 0.8 / max(1, len(impls))
    for n, impl in enumerate(impls):
        xs, ys = [], []
        for i, s in enumerate(shapes):
            line = s["results"].get(impl)
            if is_ok(line, metric):
                xs.append(i + (n - (len(impls) - 1) / 2) * bar_w)
                ys.append(line[metric])
        if xs:
            ax.bar(xs, ys, width=bar_w, label=impl, color=colors[impl])
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([s["name"] for s in shapes], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(unit)
    ax.grid(True, axis="y", alpha=0.3)


def finish_figure(plt, fig, axes, merged, path):
    """One legend for every panel, the title, and the PNG."""
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    meta = merged["meta"]
    what = f"{merged['suite']}: {suite_info(merged)['plot_units']} by kernel"
    where = f"{meta.get('gpu') or 'GPU ?'}, {meta.get('date')}"
    title = fig.suptitle(f"{what} — {where}", fontsize=12)
    title_space = TITLE_SPACE_IN
    if title.get_window_extent(fig.canvas.get_renderer()).width > fig.bbox.width:
        title.set_text(f"{what}\n{where}")  # too wide for the figure: two lines
        title_space += TITLE_LINE_IN
    ncol = max(1, min(len(labels), int(fig.get_figwidth() // LEGEND_ENTRY_WIDTH_IN)))
    fig.legend(handles, labels, loc="lower center", ncol=ncol, frameon=False)
    height = fig.get_figheight()
    legend_space = LEGEND_SPACE_IN * math.ceil(len(labels) / ncol) if labels else 0.0
    fig.tight_layout(rect=(0, legend_space / height, 1, 1 - title_space / height))
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)


def plot(merged, path):
    if merged["suite"] == SUITE_PAGED:
        plot_paged(merged, path)
    else:
        plot_prefill(merged, path)


def plot_prefill(merged, path):
    """TFLOP/s against sequence length, one panel per configuration with a series of single
    requests; bars for the shapes without a series (ragged batches, lone lengths)."""
    plt = load_pyplot()
    impls = merged["impls"]
    groups = {}
    for s in merged["shapes"]:
        if len(s["qo_lens"]) == 1:
            groups.setdefault(group_key(s), []).append(s)
    line_groups = {k: v for k, v in groups.items() if len({x["qo_lens"][0] for x in v}) >= 2}
    in_lines = {x["name"] for v in line_groups.values() for x in v}
    others = [s for s in merged["shapes"] if s["name"] not in in_lines]
    if not line_groups and not others:
        raise ValueError("nothing to plot: no shapes")
    cols = max(1, min(PANEL_COLUMNS, len(line_groups)))
    line_rows = math.ceil(len(line_groups) / cols)
    rows = line_rows + (1 if others else 0)
    width = max(PANEL_SIZE_IN[0] * cols, BAR_PANEL_WIDTH_PER_SHAPE_IN * len(others))
    fig = plt.figure(figsize=(width, PANEL_SIZE_IN[1] * rows + (1.0 if others else 0.0)))
    grid = fig.add_gridspec(rows, cols)
    flat = [fig.add_subplot(grid[n // cols, n % cols]) for n in range(len(line_groups))]
    colors = {impl: f"C{n}" for n, impl in enumerate(impls)}
    for ax, (title, shapes) in zip(flat, line_groups.items()):
        shapes = sorted(shapes, key=lambda x: x["qo_lens"][0])
        for impl in impls:
            pts = [(x["qo_lens"][0], x["results"][impl]["tflops"]) for x in shapes
                   if is_ok(x["results"].get(impl), "tflops")]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl,
                        color=colors[impl], linewidth=2.2 if impl == OURS else 1.4)
        ax.set_xscale("log", base=2)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("sequence length (qo = kv)")
        ax.set_ylabel("TFLOP/s")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    if others:
        bar_ax = fig.add_subplot(grid[line_rows, :])
        bar_panel(bar_ax, others, impls, colors, "tflops", "TFLOP/s")
        bar_ax.set_title("shapes without a sequence-length series", fontsize=10)
        flat.append(bar_ax)
    finish_figure(plt, fig, flat, merged, path)


def plot_paged(merged, path):
    """Bars per shape and impl, one panel per table in the table's figure: TB/s for decode and
    the append, with the device's measured copy bandwidth as a horizontal line (the ceiling a
    memory-bound kernel approaches), TFLOP/s for paged prefill (no line: the copy bandwidth
    bounds nothing there)."""
    groups = table_groups(merged)
    if not groups:
        raise ValueError("nothing to plot: no shapes")
    plt = load_pyplot()
    colors = {impl: f"C{n}" for n, impl in enumerate(merged["impls"])}
    copy_tbps = device_copy_tbps(merged)
    most = max(len(group[1]) for group in groups)
    width = max(BAR_PANEL_MIN_WIDTH_IN, BAR_PANEL_WIDTH_PER_SHAPE_IN * most)
    fig = plt.figure(figsize=(width, BAR_PANEL_HEIGHT_IN * len(groups) + 1.0))
    axes = []
    for n, (title, shapes, impls, metric, _) in enumerate(groups):
        ax = fig.add_subplot(len(groups), 1, n + 1)
        bar_panel(ax, shapes, impls, colors, metric, METRICS[metric][0])
        top = max([s["results"][i][metric] for s in shapes for i in impls
                   if is_ok(s["results"].get(i), metric)], default=0.0)
        if metric == "tbps" and copy_tbps is not None:
            ax.axhline(copy_tbps, color="black", linestyle="--", linewidth=1.0)
            ax.annotate(f"{DEVICE_COPY_LABEL}: {copy_tbps:g} TB/s",
                        (1.0, copy_tbps), xycoords=("axes fraction", "data"),
                        xytext=(-4, 3), textcoords="offset points", ha="right", va="bottom",
                        fontsize=8)
            top = max(top, copy_tbps)
        ax.set_ylim(0, (top or 1.0) * PAGED_Y_HEADROOM)
        ax.set_title(f"{title} ({METRICS[metric][0]})", fontsize=10)
        axes.append(ax)
    finish_figure(plt, fig, axes, merged, path)


def section_title(merged):
    """The suite's title; a prefill section whose shapes share one head dim names it."""
    title = suite_info(merged)["title"]
    if merged["suite"] == SUITE_PAGED and any(paged_kind(s) == PAGED_APPEND
                                              for s in merged["shapes"]):
        title = PAGED_TITLE_WITH_APPEND
    if merged["suite"] == SUITE_PREFILL:
        dims = {s.get("head_dim") or s.get("head_dim_qk") for s in merged["shapes"]}
        if len(dims) == 1 and None not in dims:
            title += f", head dim {dims.pop()}"
    return title


def method_line(merged, shapes_cmd):
    """The section's method: from the result lines' `method` fields (graph replay, with the
    implementations timed back to back named), or, for result files written before graph replay,
    the per-launch events those used."""
    common = (f"inputs rotated when they fit in L2; FLOPs and bytes from `{shapes_cmd}` for "
              "every kernel; every kernel checked against a float64 reference before its time "
              "is kept ([benchmarking.md](benchmarking.md)).")
    lines = [line for s in merged["shapes"] for line in s["results"].values()
             if line.get("status") == "ok"]
    if not any("method" in line for line in lines):
        return ("- Method: kernel time from CUDA events around each launch, after warm-up; the "
                "median of 50 to 200 launches (as many as fill about 300 ms of GPU time); "
                + common)
    t = peers_timing
    text = ("- Method: every implementation timed the same way: a CUDA graph of N launches "
            f"(N so that one replay lasts about {t.REPLAY_TARGET_MS:g} ms) replayed "
            f"{t.MIN_RUNS} to {t.MAX_RUNS} times (as many as fill about "
            f"{t.TARGET_TIMED_MS:g} ms of GPU time), each replay between two CUDA events; the "
            "figure is the median replay over N")
    back = sorted({line["impl"] for line in lines
                   if line.get("method") == t.METHOD_BACK_TO_BACK})
    if back:
        text += (f"; where a call could not be captured ({', '.join(back)}: cells marked b2b), "
                 "groups of N launches back to back behind a spin kernel")
    text += ("; host us = the median wall time of one call on the host (no synchronisation), "
             "reported apart from the kernel time; " + common)
    return text


def markdown_section(merged, plot_link, json_link):
    meta = merged["meta"]
    info = suite_info(merged)
    rows, summary, notes = markdown_table(merged)
    suite = merged["suite"]
    shapes_cmd = "attnforge bench --print-shapes" if suite == SUITE_PREFILL else \
        f"attnforge bench --suite {suite} --print-shapes"
    out = [f"## {section_title(merged)}", ""]
    out.append(f"- Date: {meta.get('date')}")
    out.append(f"- GPU: {meta.get('gpu') or 'not recorded'}")
    out.append(f"- Command: `{meta.get('command') or 'not recorded'}`")
    out.append(method_line(merged, shapes_cmd))
    if suite == SUITE_PAGED:
        copy_tbps = device_copy_tbps(merged)
        copy_note = (f"the device-to-device copy reaches about {copy_tbps:g} TB/s on this GPU"
                     if copy_tbps is not None else
                     "this GPU's device-to-device copy bandwidth is not recorded here "
                     "(bench/report.py DEVICE_COPY_TBPS), so no % of copy is given")
        out.append(f"- Figures: batch decode is bound by memory: TB/s = the shape's `bytes` (Q, "
                   f"K and V read once, O written once) over the median time; {copy_note}. "
                   "Batch paged prefill is bound by compute: TFLOP/s = the shape's `flops` over "
                   "the median time, and its ratios are of TFLOP/s; its TB/s is shown beside.")
        if len(merged["impls"]) > 1:
            out[-1] += (" Decode shapes (every query length 1) run FlashInfer's decode wrapper "
                        "without and with tensor cores; the others its FA2 paged prefill "
                        "wrapper. torch SDPA has no paged KV cache.")
        if any(paged_kind(s) == PAGED_APPEND for s in merged["shapes"]):
            out.append("- Append: TB/s = the shape's `bytes` (the new K/V rows read, the cache "
                       "written, f16 or one byte per fp8 code, and the index entries read) over "
                       "the median time, beside its percentage of the device copy bandwidth; "
                       "each append is checked against the host append bit for bit (a peer: "
                       "every new row where the page table puts it), not against a reference. "
                       "Its peer is FlashInfer's append_paged_kv_cache.")
    if merged["impls"] == [OURS]:
        out.append("- Peers: none in this run (attnforge alone).")
    if json_link:
        out.append(f"- Raw results: [`{json_link}`]({json_link})")
    out += ["", *rows, ""]
    out += [f"- {line}" for line in summary]
    if notes:
        out += ["", "Statuses other than ok:", ""] + [f"- {n}" for n in notes]
    if meta.get("environment"):
        out += ["", "Environment:", "", "```", *meta["environment"], "```"]
    if plot_link:
        alt = f"{suite} TFLOP/s against sequence length" if suite == SUITE_PREFILL else \
            f"{suite}: {info['plot_units']} by shape and kernel"
        out += ["", f"![{alt}]({plot_link})"]
    out.append("")
    return "\n".join(out)


def read_merged(path):
    with open(path) as f:
        merged = json.load(f)
    for field in ("suite", "meta", "impls", "shapes"):
        if field not in merged:
            raise ValueError(f"{path}: missing field {field!r}")
    suite_info(merged)
    return merged


def doc_order(item):
    """Prefill sections first, by head dim, then paged."""
    _, merged = item
    dims = [s.get("head_dim") or s.get("head_dim_qk") or 0 for s in merged["shapes"]]
    return (merged["suite"] != SUITE_PREFILL, min(dims, default=0), item[0])


def write_doc(doc_path, merged_paths, redraw):
    """Writes the whole benchmarks document: a header saying how it is generated, then one
    section per merged file. Returns the exit status (1 when a result of ours is wrong: nothing is
    written)."""
    items = sorted(((path, read_merged(path)) for path in merged_paths), key=doc_order)
    wrong = {path: our_wrong(m) for path, m in items if our_wrong(m)}
    if wrong:
        print(f"report.py: attnforge is WRONG in {wrong}; {doc_path} is not written",
              file=sys.stderr)
        return 1
    doc_dir = os.path.dirname(os.path.abspath(doc_path))
    out = ["# Benchmarks", "",
           f"<!-- Generated by bench/report.py; do not edit. Regenerate with: {DOC_COMMAND} -->",
           "",
           f"This file is generated from the merged results in `docs/results/` by `{DOC_COMMAND}`."
           " It holds the latest run of each benchmark suite; how to reproduce them, the timing "
           "method and the data format are in [benchmarking.md](benchmarking.md).", ""]
    out += [f"- [{section_title(m)}](#{anchor(section_title(m))}) ({m['meta'].get('date')})"
            for _, m in items]
    out.append("")
    for path, merged in items:
        png = os.path.splitext(path)[0] + ".png"
        if redraw:
            plot(merged, png)
        plot_link = os.path.relpath(png, doc_dir) if os.path.exists(png) else None
        json_link = os.path.relpath(path, doc_dir)
        out.append(markdown_section(merged, plot_link, json_link))
    with open(doc_path, "w") as f:
        f.write("\n".join(out).rstrip("\n") + "\n")
    return 0


def anchor(title):
    """GitHub's anchor for a heading."""
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", choices=list(SUITE_INFO), default=SUITE_PREFILL,
                    help="the suite of --shapes/--ours/--peers (a --merged file names its own)")
    src = ap.add_argument_group("inputs (either --shapes/--ours[/--peers] or --merged)")
    src.add_argument("--shapes", help="resolved shapes (attnforge bench --print-shapes)")
    src.add_argument("--ours", help="attnforge's JSON lines (attnforge bench --json-out)")
    src.add_argument("--peers", help="the peers' JSON lines (bench/peers.py --out)")
    src.add_argument("--merged", help="a merged JSON written earlier by this script")
    src.add_argument("--gpu", default="", help="GPU name for the header")
    src.add_argument("--command", default="", help="the exact command that produced the results")
    src.add_argument("--date", default="", help="YYYY-MM-DD (default: today, UTC)")
    src.add_argument("--env-file", help="text file of environment lines to record")
    dst = ap.add_argument_group("outputs (the table always goes to stdout)")
    dst.add_argument("--out-json", help="write the merged JSON here")
    dst.add_argument("--plot", nargs="?", const="", help="write the PNG plot here (with --doc, "
                     "no value: redraw each merged file's PNG beside it)")
    dst.add_argument("--markdown-section", help="write the suite's markdown section here")
    dst.add_argument("--plot-link", help="image path used in the markdown (default: the --plot "
                     "path relative to the markdown file)")
    dst.add_argument("--json-link", help="raw-results path used in the markdown")
    dst.add_argument("--doc", nargs="+", metavar=("FILE", "MERGED"),
                     help="write the whole FILE (docs/benchmarks.md) from these merged JSON files")
    ap.add_argument("--self-test", action="store_true",
                    help="check the rendering and that docs/benchmarks.md is generated from "
                         "docs/results (no GPU, no matplotlib)")
    args = ap.parse_args()

    if args.self_test:
        from report_selftest import self_test  # noqa: PLC0415 (imports this module)
        return 0 if self_test() else 1

    if args.doc:
        if len(args.doc) < 2:
            ap.error("--doc needs the output file and at least one merged JSON file")
        try:
            return write_doc(args.doc[0], args.doc[1:], args.plot is not None)
        except (OSError, ValueError) as exc:
            print(f"report.py: {exc}", file=sys.stderr)
            return 2
    try:
        if args.merged:
            merged = read_merged(args.merged)
        elif args.shapes and args.ours:
            merged = build_merged(args)
            suite_info(merged)
        else:
            ap.error("give --merged, or --shapes and --ours (and usually --peers), or --doc")
    except (OSError, ValueError) as exc:
        print(f"report.py: {exc}", file=sys.stderr)
        return 2

    rows, summary, notes = markdown_table(merged)
    print("\n".join(rows))
    print()
    for line in summary + notes:
        print(line)
    stray = merged["meta"].get("unmatched_result_shapes")
    if stray:
        print(f"report.py: results for shapes not in the shape list (ignored): {stray}")

    status = 0
    wrong = our_wrong(merged)
    if wrong:
        print(f"report.py: attnforge is WRONG on {len(wrong)} shapes: {wrong}; "
              "no markdown section is written", file=sys.stderr)
        status = 1
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump(merged, f, indent=1)
            f.write("\n")
    if args.plot:
        try:
            plot(merged, args.plot)
        except Exception as exc:  # the table and JSON are still worth having
            print(f"report.py: plot failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            status = status or 2
    if args.markdown_section and not wrong:
        link = args.plot_link
        if link is None and args.plot:
            link = os.path.relpath(args.plot,
                                   os.path.dirname(os.path.abspath(args.markdown_section)))
        with open(args.markdown_section, "w") as f:
            f.write(markdown_section(merged, link, args.json_link))
    return status


if __name__ == "__main__":
    sys.exit(main())
