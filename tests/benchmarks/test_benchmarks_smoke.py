"""Each benchmark in benchmarks/ runs in its smallest configuration (--quick) and prints its ratio lines.

The figures themselves are the benchmarks' business (benchmarks/README.md); here only that they run,
and that the cost benchmark finds no LM call beyond what each algorithm requires.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from arag.programs import PROGRAMS

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = ("cost", "throughput", "overhead", "retrieval", "latency")


@pytest.fixture(scope="module")
def quick_runs(tmp_path_factory):
    """Every benchmark's --quick run (two at a time), by name."""
    dataset = Path(__file__).resolve().parents[2].parent / "shared" / "datasets" / "hotpotqa"
    if not dataset.exists():
        pytest.skip(f"{dataset} is not present")
    env = {**os.environ, "ARAG_HOME": str(tmp_path_factory.mktemp("home"))}

    def run(name: str) -> tuple[str, subprocess.CompletedProcess]:
        command = [sys.executable, str(BENCHMARKS / f"{name}.py"), "--quick", "--dataset", str(dataset)]
        return name, subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(run, SCRIPTS))


def ratio_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("ratio ")]


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_quick_run_prints_its_ratios(quick_runs, name):
    done = quick_runs[name]
    assert done.returncode == 0, done.stderr[-2000:]
    assert ratio_lines(done.stdout), done.stdout
    assert "Traceback" not in done.stderr


def test_no_program_makes_an_lm_call_its_algorithm_does_not_require(quick_runs):
    ratios = ratio_lines(quick_runs["cost"].stdout)
    assert sorted(line.split(":")[0].removeprefix("ratio ") for line in ratios) == sorted(PROGRAMS)
    for line in ratios:
        assert re.search(r"LM calls / required = 1\.000 \(0 extra over 0 questions, 0 failed\) ok$", line), line


def test_each_benchmark_reports_the_figures_its_target_is_about(quick_runs):
    assert re.search(r"^\| flare \| 4 \| 8 \|", quick_runs["throughput"].stdout, re.MULTILINE)
    assert "ratio framework CPU per LM call:" in quick_runs["overhead"].stdout
    assert re.search(r"^ratio crag: latency / critical path [\d.]+ one call at a time, [\d.]+ at once",
                     quick_runs["latency"].stdout, re.MULTILINE)
    retrieval = quick_runs["retrieval"].stdout
    assert "ratio bm25 single-query p50 at 3,000 passages:" in retrieval
    assert re.search(r"^\| BM25 .* \| [01]\.\d{3} \|", retrieval, re.MULTILINE)


@pytest.mark.parametrize("bad, message", [
    (["--trials", "0"], "--trials 0: a study needs at least 1 trial"),
    (["--programs", "flare,nope"], "--programs: unknown nope"),
    (["--n-tune", "0"], "--n-tune 1 or more"),
])
def test_local_tuning_refuses_bad_arguments_before_loading_a_model(tmp_path, bad, message):
    if not (Path(__file__).resolve().parents[3] / "shared" / "datasets" / "hotpotqa").exists():
        pytest.skip("the shared HotpotQA dataset is not present")
    done = subprocess.run([sys.executable, str(BENCHMARKS / "tuning_local.py"), "--out", str(tmp_path / "out"), *bad],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and message in done.stderr
    assert not (tmp_path / "out").exists()
