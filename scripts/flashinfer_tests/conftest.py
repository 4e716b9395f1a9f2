"""attnforge's pytest configuration for FlashInfer's own attention tests.

`scripts/flashinfer-tests` copies this file to the root of the folder it generates (beside
FlashInfer's test files, in place of FlashInfer's own `tests/conftest.py`, which imports
FlashInfer's JIT internals). It changes no test and no assertion; it only:

- selects a sample of each test function's parametrizations (`--fi-per-test`, `--fi-part`,
  taken after pytest's `-k` and `-m`):
  the items of one function are ranked by a hash of their test id and every Nth rank is kept, so
  a sample spreads over all parameter values and the parts 0..N-1 cover the grid exactly once;
  the kept tests run one of each function in turn (they are independent: only the order changes);
- skips the tests not started by a deadline (`--fi-deadline-at`), with a reason that says so;
- reports a `NotImplementedError` raised inside the `attnforge` package (an argument attnforge
  refuses on purpose) as an expected failure whose reason is the error's message, so those are
  counted apart from real failures; any other exception, assertion errors included, fails as
  before;
- writes one JSON line per test (`--fi-results`) for `summarize.py`, flushed as it goes, with a
  line when each test starts, so a run killed by a timeout still tells what ran and what hung.
"""

import json
import os
import time
import zlib

import pytest

NOT_IMPLEMENTED = "attnforge refuses: "
TIME_CAP = "not run: the time cap of this file was reached"


def pytest_addoption(parser):
    group = parser.getgroup("attnforge", "attnforge's run of FlashInfer's tests")
    group.addoption(
        "--fi-per-test",
        type=int,
        default=0,
        help="keep about this many parametrizations of each test function (0: all)",
    )
    group.addoption(
        "--fi-part",
        type=int,
        default=0,
        help="which of the disjoint samples to keep (0, 1, ...; taken modulo their number)",
    )
    group.addoption(
        "--fi-deadline-at",
        type=float,
        default=0.0,
        help="Unix time after which tests not yet started are skipped (0: none)",
    )
    group.addoption("--fi-results", default="", help="write one JSON line per test here")


class _Results:
    """The JSON-lines log of one pytest process."""

    def __init__(self, path):
        self._path = path

    def write(self, record):
        if self._path:
            with open(self._path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")


# The results log of this process (the logstart and logreport hooks receive no config).
_STATE = {}


def _log(record):
    results = _STATE.get("results")
    if results is not None:
        results.write(record)


def pytest_configure(config):
    _STATE["results"] = _Results(config.getoption("--fi-results"))


def _rank_key(item):
    return (zlib.crc32(item.nodeid.encode()), item.nodeid)


@pytest.hookimpl(trylast=True)  # after -k / -m, so the sample is taken from what they keep
def pytest_collection_modifyitems(config, items):
    per_test = config.getoption("--fi-per-test")
    part = config.getoption("--fi-part")
    groups = {}
    for item in items:
        groups.setdefault(item.nodeid.split("[", 1)[0], []).append(item)
    samples = []
    for group in groups.values():
        stride = 1 if per_test <= 0 else max(1, -(-len(group) // per_test))
        ranked = sorted(group, key=_rank_key)
        samples.append([item for rank, item in enumerate(ranked) if rank % stride == part % stride])
    # One test of each function in turn, so a time cap leaves no function without a run.
    selected = [
        s[i] for i in range(max(map(len, samples), default=0)) for s in samples if i < len(s)
    ]
    keep = {item.nodeid for item in selected}
    deselected = [item for item in items if item.nodeid not in keep]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = selected
    _log(
        {
            "collected": len(selected) + len(deselected),
            "selected": len(selected),
            "functions": {name: len(group) for name, group in groups.items()},
            "per_test": per_test,
            "part": part,
        }
    )


def pytest_runtest_setup(item):
    deadline = item.config.getoption("--fi-deadline-at")
    if deadline and time.time() > deadline:
        pytest.skip(TIME_CAP)


def pytest_runtest_logstart(nodeid, location):
    _log({"start": nodeid})


def _attnforge_dir():
    try:
        import attnforge
    except ImportError:
        return None
    return os.path.dirname(os.path.abspath(attnforge.__file__))


def _raised_by_attnforge(excinfo):
    package = _attnforge_dir()
    if package is None or not excinfo.errisinstance(NotImplementedError):
        return False
    innermost = os.path.abspath(str(excinfo.traceback[-1].path))
    return innermost.startswith(package + os.sep)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when == "call" and call.excinfo is not None and _raised_by_attnforge(call.excinfo):
        report.outcome = "skipped"
        report.wasxfail = NOT_IMPLEMENTED + str(call.excinfo.value)


def _message(report):
    """The one line that says why a test did not pass."""
    longrepr = report.longrepr
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message.strip().splitlines()[0] if crash.message.strip() else ""
    text = str(longrepr).strip().splitlines()
    return text[-1] if text else ""


def _outcome(report):
    if hasattr(report, "wasxfail"):
        if report.wasxfail.startswith(NOT_IMPLEMENTED):
            return "not_implemented", report.wasxfail[len(NOT_IMPLEMENTED) :]
        return ("xpassed" if report.passed else "xfailed"), report.wasxfail
    if report.skipped:
        message = _message(report)
        return ("time_cap" if message == TIME_CAP else "skipped"), message
    if report.failed:
        return ("failed" if report.when == "call" else "error"), _message(report)
    return "passed", ""


def pytest_runtest_logreport(report):
    final = report.when == "call" or (report.when == "setup" and not report.passed)
    final = final or (report.when == "teardown" and report.failed)
    if not final:
        return
    outcome, message = _outcome(report)
    _log(
        {
            "test": report.nodeid,
            "outcome": outcome,
            "message": message[:400],
            "seconds": round(report.duration, 3),
        }
    )
