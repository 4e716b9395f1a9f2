"""The self-test of bench/report.py (`python3 bench/report.py --self-test`), on any machine, no
GPU, torch or matplotlib needed:

  - the committed docs/benchmarks.md is exactly what report.py generates from docs/results/*.json
    (result files of any age: those written before graph replay have no method or host fields);
  - a merged result in today's format renders a host-time column per implementation, the graph
    replay method line (naming a peer timed back to back), the ratios, and "n/a" with its reason
    where a peer runs only some shapes;
  - the paged suite's append shapes get their own table (TB/s and % of the copy bandwidth),
    apart from the decode table, with the section's title and its note on the append;
  - a wrong result of ours blocks the document.
"""

import glob
import json
import os
import tempfile

import report
from peers import (IMPL_FA3, IMPL_FI_APPEND, IMPL_FI_DECODE, IMPL_FI_FA3, IMPL_SCOPE,
                   IMPL_TORCH_CUDNN)
from peers_append import FP8_MISSING
from peers_shapes import SUITE_PAGED, SUITE_PREFILL

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "benchmarks.md")
RESULTS = os.path.join(ROOT, "docs", "results", "*.json")


def _line(shape, impl, tflops, method="graph", host_us=12.5, status="ok", tbps=1.0):
    ok = status == "ok"
    return {"suite": SUITE_PREFILL, "shape": shape, "impl": impl, "status": status,
            "median_ms": 1.0 if ok else None, "tflops": tflops if ok else None,
            "tbps": tbps if ok else None, "runs": 50 if ok else 0, "method": method,
            "launches": 4, "host_us": host_us, "host_calls": 100}


def _shape(name, dtype, results):
    return {"name": name, "qo_lens": [4096], "kv_lens": [4096], "num_qo_heads": 32,
            "num_kv_heads": 32, "head_dim": 128, "causal": True, "dtype": dtype,
            "soft_cap": None, "qk_accum": "f32", "flops": 1.0, "bytes": 1.0,
            "results": {r["impl"]: r for r in results}}


def _merged(shapes, impls):
    return {"suite": SUITE_PREFILL, "impls": impls, "shapes": shapes,
            "meta": {"date": "2026-01-01", "gpu": "GPU", "command": "cmd", "environment": [],
                     "unmatched_result_shapes": []}}


def self_test():
    failures = []

    def check(cond, what):
        print(f"  {'ok  ' if cond else 'FAIL'} {what}")
        if not cond:
            failures.append(what)

    print("report self-test:")
    merged_files = sorted(glob.glob(RESULTS))
    check(bool(merged_files), f"result files found ({len(merged_files)})")
    with tempfile.NamedTemporaryFile("r", suffix=".md", dir=os.path.dirname(DOC)) as tmp:
        status = report.write_doc(tmp.name, merged_files, redraw=False)
        generated = tmp.read()
    with open(DOC) as f:
        committed = f.read()
    check(status == 0 and generated == committed,
          "docs/benchmarks.md is what report.py generates from docs/results")

    impls = [report.OURS, IMPL_FI_FA3, IMPL_FA3, IMPL_TORCH_CUDNN]
    f16 = _shape("f16-x", "f16", [_line("f16-x", report.OURS, 600.0),
                                  _line("f16-x", IMPL_FI_FA3, 500.0),
                                  _line("f16-x", IMPL_FA3, None,
                                        status="missing: fa3-fwd is built without fp16"),
                                  _line("f16-x", IMPL_TORCH_CUDNN, 400.0, "back-to-back", 80.0)])
    bf16 = _shape("bf16-x", "bf16", [_line("bf16-x", report.OURS, 700.0, host_us=6.0),
                                     _line("bf16-x", IMPL_FA3, 560.0, host_us=40.0)])
    merged = _merged([f16, bf16], impls)
    rows, summary, notes = report.markdown_table(merged)
    head = rows[0]
    for impl in impls:
        check(f"{impl} host us" in head, f"a host-time column for {impl}")
    bf16_row = next(r for r in rows if r.startswith("| bf16-x "))
    check("| 6.0 |" in bf16_row and "| 40.0 |" in bf16_row, "host times in the row")
    check("1.25x" in bf16_row, "ratio ours/fa3 = 700/560")
    check("n/a [" in bf16_row and any(IMPL_SCOPE[IMPL_FI_FA3] in n for n in notes),
          "a peer that runs only some shapes: n/a with its reason")
    f16_row = next(r for r in rows if r.startswith("| f16-x "))
    check("400.0 (b2b)" in f16_row, "a back-to-back figure is marked")
    check(any("missing: fa3-fwd is built without fp16" in n for n in notes),
          "fa3's missing f16 is a footnote")
    check(any(s.startswith(f"{report.OURS}/{IMPL_FA3}: geometric mean 1.25x") for s in summary),
          "the ratio summary")
    section = report.markdown_section(merged, None, None)
    check("CUDA graph of N launches" in section and f"({IMPL_TORCH_CUDNN}: cells marked b2b)"
          in section and "host us = the median wall time" in section,
          "the method line: graph replay, the back-to-back peer, host time")

    old = json.loads(json.dumps(merged))
    for s in old["shapes"]:
        for line in s["results"].values():
            for field in ("method", "launches", "host_us", "host_calls"):
                line.pop(field)
    rows_old, _, _ = report.markdown_table(old)
    check("host us" not in rows_old[0], "results without host times: no host columns")
    check("around each launch" in report.markdown_section(old, None, None),
          "results without a method field: the per-launch method line")

    _paged_self_test(check)

    wrong = json.loads(json.dumps(merged))
    wrong["shapes"][0]["results"][report.OURS]["status"] = "wrong: rel err 1.0"
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "wrong.json")
        with open(path, "w") as f:
            json.dump(wrong, f)
        doc = os.path.join(d, "doc.md")
        check(report.write_doc(doc, [path], redraw=False) == 1 and not os.path.exists(doc),
              "a wrong result of ours blocks the document")
    print(f"report self-test: {'PASS' if not failures else f'FAIL ({len(failures)})'}")
    return not failures


def _paged_shape(name, qo_lens, append, results):
    shape = {**_shape(name, "f16", results), "qo_lens": qo_lens, "kv_lens": [4096] * len(qo_lens),
             "num_qo_heads": 8 if append else 32, "num_kv_heads": 8, "causal": False,
             "page_size": 16, "num_pages": 512, "flops": 0.0 if append else 1.0}
    if append:
        shape["append"] = True
    return shape


def _paged_self_test(check):
    """A paged result with a decode shape and two append shapes (one over an fp8 cache, where
    the peer is missing)."""
    def line(shape, impl, tbps, status="ok"):
        return {**_line(shape, impl, None if tbps else 1.0, status=status, tbps=tbps),
                "suite": SUITE_PAGED}

    decode = _paged_shape("decode-x", [1, 1], False, [line("decode-x", report.OURS, 4.0),
                                                      line("decode-x", IMPL_FI_DECODE, 3.2)])
    append = _paged_shape("append-x", [1, 1], True, [line("append-x", report.OURS, 3.44),
                                                     line("append-x", IMPL_FI_APPEND, 1.72)])
    fp8 = _paged_shape("append-x-e4m3", [1, 1], True,
                       [line("append-x-e4m3", report.OURS, 2.15),
                        line("append-x-e4m3", IMPL_FI_APPEND, None, status=FP8_MISSING)])
    merged = {**_merged([decode, append, fp8], [report.OURS, IMPL_FI_DECODE, IMPL_FI_APPEND]),
              "suite": SUITE_PAGED}
    merged["meta"] = {**merged["meta"], "gpu": "NVIDIA H200, driver 580"}
    rows, summary, notes = report.markdown_table(merged)
    text = "\n".join(rows)
    decode_table = text.split("### Append to the paged cache")[0]
    check("### Batch decode" in text and "### Append to the paged cache" in text
          and "append-x" not in decode_table and IMPL_FI_APPEND not in decode_table,
          "paged: the append shapes have their own table, apart from decode")
    check("### Batch paged prefill" not in text, "paged: no table without shapes")
    head = next(r for r in rows if r.startswith("| shape") and "% of copy" in r)
    check(f"{report.OURS} % of copy" in head and f"{IMPL_FI_APPEND} % of copy" in head,
          "paged: the append table's % of copy columns")
    row = next(r for r in rows if r.startswith("| append-x "))
    check("| 3.44 | 80% |" in row and "| 1.72 | 40% |" in row and "2.00x" in row,
          "paged: an append row in TB/s, % of the copy bandwidth and the ratio")
    fp8_row = next(r for r in rows if r.startswith("| append-x-e4m3 "))
    check("| 2.15 | 50% |" in fp8_row and "missing [" in fp8_row
          and any(FP8_MISSING in n for n in notes), "paged: the missing fp8 peer is a footnote")
    check(any(s.startswith(f"Append to the paged cache: {report.OURS}/{IMPL_FI_APPEND}: "
                           "geometric mean 2.00x") for s in summary), "paged: the append summary")
    section = report.markdown_section(merged, None, None)
    check(section.startswith(f"## {report.PAGED_TITLE_WITH_APPEND}")
          and "- Append: TB/s" in section and "about 4.3 TB/s on this GPU" in section,
          "paged: the section's title, its note on the append and the GPU's copy bandwidth")
    # A GPU whose copy bandwidth is not recorded: no % of copy, said so; not the H200's ceiling.
    other = {**merged, "meta": {**merged["meta"], "gpu": "NVIDIA H100 80GB HBM3, driver 580"}}
    rows, _, _ = report.markdown_table(other)
    row = next(r for r in rows if r.startswith("| append-x "))
    check("| 3.44 | - |" in row and "| 1.72 | - |" in row and "2.00x" in row,
          "paged: no % of copy on a GPU whose copy bandwidth is not recorded")
    section = report.markdown_section(other, None, None)
    check("4.3 TB/s" not in section and "no % of copy is given" in section,
          "paged: the section says the GPU's copy bandwidth is not recorded")
    # The copy bandwidth measured in the run (gpu-suite's environment line) comes first.
    measured = {**other, "meta": {**other["meta"], "environment": [
        "host: x", "device copy: 3.44 TB/s (torch copy_ of 1 GiB, read and write, median of 20)"]}}
    rows, _, _ = report.markdown_table(measured)
    row = next(r for r in rows if r.startswith("| append-x "))
    check("| 3.44 | 100% |" in row and "| 1.72 | 50% |" in row,
          "paged: the % of copy of the copy bandwidth measured in the run")
    check("about 3.44 TB/s on this GPU" in report.markdown_section(measured, None, None),
          "paged: the section gives the copy bandwidth measured in the run")
