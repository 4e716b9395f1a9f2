"""Tabulates a run of FlashInfer's tests against attnforge (scripts/run-flashinfer-tests).

Reads the JSON lines our conftest.py wrote, one file per test file (FILE.jsonl in the results
folder), and writes summary.md there (also printed): one row per test file with its counts, then
per file the reasons of failures, refusals (attnforge's NotImplementedError) and skips, grouped,
with one test id each. A test that started but has no result was running when its file's
pytest was killed (time limit or crash): it counts as failed, as "killed"; the tests after it
count as not run, with those the time cap skipped.

Usage: python3 summarize.py RESULTS_DIR [SECONDS_FILE]
SECONDS_FILE holds lines "FILE SECONDS EXIT_STATUS" written by the runner. Exits 1 when a test
failed, errored or was killed, or a file's pytest ended otherwise than with 0 or 1 (a collection
error, a kill).
"""

import collections
import glob
import json
import os
import re
import sys

COLUMNS = [
    ("passed", "passed"),
    ("failed", "failed"),
    ("error", "errors"),
    ("killed", "killed"),
    ("not_implemented", "refused (NotImplementedError)"),
    ("skipped", "skipped by the test"),
    ("xfailed", "xfail"),
    ("xpassed", "xpass"),
    ("time_cap", "not run (time cap)"),
]
FAILING = ("failed", "error", "killed")


def read(path):
    head, results, started = {}, {}, []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
            if "collected" in record:
                head = record
            elif "start" in record:
                started.append(record["start"])
            elif "test" in record:
                results[record["test"]] = record
    for test in started:
        if test not in results:
            results[test] = {"test": test, "outcome": "killed", "message": "no result: killed"}
    return head, results


def reason(outcome, message):
    """The message with its numbers and values folded, so alike failures group together."""
    if outcome == "not_implemented":
        match = re.match(r"attnforge\.flashinfer: (\w+)=", message)
        if match:
            return f"{match.group(1)}: {message.split(' is not supported: ', 1)[-1]}"
    folded = re.sub(r"(?<![A-Za-z_])\d+(\.\d+)?(e[-+]?\d+)?", "N", message)
    return folded[:160]


def main():
    folder = sys.argv[1]
    timings = {}
    if len(sys.argv) > 2 and os.path.exists(sys.argv[2]):
        with open(sys.argv[2], encoding="utf-8") as f:
            for line in f:
                name, seconds, status = line.split()
                timings[name] = (int(seconds), int(status))
    rows, details, totals = [], [], collections.Counter()
    for path in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
        name = os.path.basename(path)[: -len(".jsonl")]
        head, results = read(path)
        counts = collections.Counter(r["outcome"] for r in results.values())
        counts["time_cap"] += max(0, head.get("selected", 0) - len(results))  # after a kill
        totals.update(counts)
        totals["collected"] += head.get("collected", 0)
        totals["selected"] += head.get("selected", 0)
        seconds, status = timings.get(name, ("?", "?"))
        rows.append(
            [name, str(head.get("collected", "?")), str(head.get("selected", "?"))]
            + [str(counts[key]) for key, _ in COLUMNS]
            + [str(seconds), str(status)]
        )
        groups = collections.defaultdict(list)
        for record in results.values():
            if record["outcome"] != "passed":
                groups[(record["outcome"], reason(record["outcome"], record["message"]))].append(
                    record["test"]
                )
        if groups:
            details.append(f"\n### {name}\n")
            ordered = sorted(groups.items(), key=lambda g: (g[0][0] not in FAILING, -len(g[1])))
            for (outcome, text), tests in ordered:
                details.append(f"- {outcome} ×{len(tests)}: {text}  \n  e.g. `{tests[0]}`")
    header = ["file", "collected", "selected"] + [title for _, title in COLUMNS] + ["s", "exit"]
    total = ["all", str(totals["collected"]), str(totals["selected"])]
    total += [str(totals[key]) for key, _ in COLUMNS] + ["", ""]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows + [total]]
    text = "\n".join(["## FlashInfer's tests on attnforge", ""] + lines + details) + "\n"
    with open(os.path.join(folder, "summary.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    broken = [name for name, (_, status) in timings.items() if status not in (0, 1)]
    if broken:
        print(f"pytest did not finish normally for: {', '.join(broken)} (see FILE.log)")
    sys.exit(1 if broken or any(totals[key] for key in FAILING) else 0)


if __name__ == "__main__":
    main()
