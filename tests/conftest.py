"""Test isolation: DSPy's disk cache, hubs and cost-map downloads are kept out of every test, and tests that load
llama.cpp run in child processes of their own."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

# Before dspy is imported anywhere: a private disk cache (DSPy's cache key ignores the engine
# object, so scripted LMs of the same name would answer each other across runs), no hub access.
os.environ["DSPY_CACHEDIR"] = tempfile.mkdtemp(prefix="arag-test-dspy-cache-")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

SHARED_DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


@pytest.fixture
def shared_dataset():
    """Path of a set in ../shared/datasets, or a skip when that folder is absent."""

    def _get(name: str) -> Path:
        path = SHARED_DATASETS / name
        if not path.exists():
            pytest.skip(f"{path} is not present")
        return path

    return _get


# Tests marked `local_model` load llama.cpp, native code that can die of a signal (a segmentation fault on a
# CPU whose kernels misbehave). Each runs in a child pytest process of its own, so that a crash fails that
# test, naming the signal and showing the child's last lines, and the suite goes on.
CHILD_REPORTS = "ARAG_TEST_CHILD_REPORTS"
CHILD_TIMEOUT_S = 900
CHILD_TAIL_LINES = 40


def pytest_runtest_protocol(item, nextitem):
    if os.environ.get(CHILD_REPORTS) or item.get_closest_marker("local_model") is None:
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for report in _run_in_child(item):
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _run_in_child(item):
    """The child's setup, call and teardown reports, or a failed one when it died or hung."""
    with tempfile.TemporaryDirectory(prefix="arag-test-child-") as folder:
        reports_path = Path(folder) / "reports.jsonl"
        command = [sys.executable, "-m", "pytest", item.nodeid, "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                   "--capture=tee-sys"]  # printed lines reach the output kept for a crash, too
        env = {**os.environ, CHILD_REPORTS: str(reports_path)}
        started = time.monotonic()
        try:
            child = subprocess.run(command, cwd=item.config.rootpath, env=env, capture_output=True, text=True,
                                   errors="replace", timeout=CHILD_TIMEOUT_S)
            output, returncode = child.stdout + child.stderr, child.returncode
        except subprocess.TimeoutExpired as timeout:
            output = (timeout.stdout or b"").decode(errors="replace") + (timeout.stderr or b"").decode(errors="replace")
            returncode = None
        lines = reports_path.read_text().splitlines() if reports_path.exists() else []
        reports = [item.config.hook.pytest_report_from_serializable(config=item.config, data=json.loads(line))
                   for line in lines]
    for report in reports:
        if isinstance(report.longrepr, list):  # a skip's (path, line, reason), which JSON made a list
            report.longrepr = tuple(report.longrepr)
    if returncode is not None and returncode >= 0 and any(r.when == "teardown" for r in reports):
        return reports
    if returncode is None:
        why = f"the child process running this test passed its {CHILD_TIMEOUT_S} s limit and was killed"
    elif returncode < 0:
        why = f"the child process running this test was killed by {signal.Signals(-returncode).name}"
    else:
        why = f"the child process running this test exited with status {returncode} before the test ended"
    tail = "\n".join(output.splitlines()[-CHILD_TAIL_LINES:])
    crashed = pytest.TestReport(item.nodeid, item.location, {name: 1 for name in item.keywords}, "failed",
                         f"{why}; its last lines:\n{tail}", "call", duration=time.monotonic() - started)
    return [*(r for r in reports if r.when == "setup"), crashed]


class _ChildReports:
    """In a child process: each report, serialised for the parent to log as its own."""

    def __init__(self, config, path):
        self.config, self.path = config, path

    def pytest_runtest_logreport(self, report):
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(data) + "\n")


def pytest_configure(config):
    if os.environ.get(CHILD_REPORTS):
        config.pluginmanager.register(_ChildReports(config, os.environ[CHILD_REPORTS]))
