"""A tuning run killed with SIGKILL in the middle of a trial and run again completes the study with the
uninterrupted run's trials, in the same order, and its best parameters."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ujson
from sample_readers import evidence_reader

from arag.data import sample_paths
from arag.testing import OpenAICompatibleServer


def trials_by_state(out: Path) -> dict[str, list[dict]]:
    with open(out / "trials.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return {state: [row for row in rows if row["state"] == state] for state in {row["state"] for row in rows}}


@pytest.mark.slow
def test_a_tuning_run_killed_mid_trial_resumes_to_the_uninterrupted_result(tmp_path):
    questions, corpus = sample_paths()
    # The same `arag tune` command, with Optuna's heartbeat shortened from 10 s / 30 s grace so that the trial
    # the kill left "running" is declared failed after 2 s instead of 30 (the rerun waits for that).
    entry = ("import importlib, sys; tuning = importlib.import_module('arag.optimizers.tuning.run'); "
             "tuning.HEARTBEAT_S, tuning.GRACE_PERIOD_S = 1, 2; "
             "from arag.cli import main; sys.argv[0] = 'arag'; main()")

    def command(out: Path) -> list[str]:
        return [sys.executable, "-c", entry, "tune", "--program", "single-rag", "--devset", str(questions),
                "--limit", "8", "--corpus", str(corpus), "--lm", "openai/tuned", "--api-base", server.url,
                "--objective", "em", "--param", "reasoning=direct", "--range", "k=1:3", "--pruner", "none",
                "--trials", "6", "--seed", "0", "--no-plots", "--out", str(out)]

    def env(cache: str) -> dict:
        return {**os.environ, "ARAG_HOME": str(tmp_path / "home"), "DSPY_CACHEDIR": str(tmp_path / cache)}

    killed = tmp_path / "killed"
    with OpenAICompatibleServer(evidence_reader, latency=0.05) as server:
        subprocess.run(command(tmp_path / "whole"), check=True, capture_output=True, env=env("cache-whole"),
                       timeout=300)
        proc = subprocess.Popen(command(killed), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=env("cache-killed"))
        third_trial = killed / "trials" / "single-rag-em" / "0002" / "predictions.jsonl"
        deadline = time.time() + 120
        while time.time() < deadline and not (third_trial.exists() and third_trial.read_text().count("\n") >= 2):
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert not (killed / "best_params.json").exists(), "the run finished before it could be killed"
        time.sleep(2.5)
        subprocess.run(command(killed), check=True, capture_output=True, env=env("cache-killed"), timeout=300)

    whole, resumed = trials_by_state(tmp_path / "whole"), trials_by_state(killed)
    assert len(whole["complete"]) == len(resumed["complete"]) == 6 and len(resumed.get("fail", [])) == 1
    # The same trials, in the same order, with the same values: resuming is reproducible.
    assert ([(row["k"], row["em"]) for row in resumed["complete"]]
            == [(row["k"], row["em"]) for row in whole["complete"]])
    best = [ujson.loads((out / "best_params.json").read_text()) for out in (tmp_path / "whole", killed)]
    assert best[0]["params"] == best[1]["params"] and best[0]["values"] == best[1]["values"]
