"""The runs table: paired bootstrap intervals against a baseline, costs per question, and `arag table`."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from arag.cli import main
from arag.errors import ConfigError
from arag.runs import Row
from arag.runs.table import markdown, paired_difference, table_rows


def rows(scores, lm_calls=1, failed=()):
    return [Row(id=f"q{i}", question="?", answers=[], trace=[], metrics={"f1": s}, lm_calls=lm_calls,
                prompt_tokens=100 * lm_calls, seconds=2.0, error="boom" if i in failed else None)
            for i, s in enumerate(scores)]


def test_a_run_better_on_every_question_has_an_interval_above_zero():
    better = paired_difference({f"q{i}": 1.0 for i in range(20)}, {f"q{i}": 0.0 for i in range(20)})
    assert (better.mean, better.low, better.high, better.questions) == (1.0, 1.0, 1.0, 20)


def test_a_mixed_difference_has_an_interval_around_its_mean_that_holds_zero():
    scores = {f"q{i}": float(i % 2) for i in range(10)}
    baseline = {f"q{i}": float((i + 1) % 2 if i < 6 else i % 2) for i in range(10)}
    difference = paired_difference(scores, baseline)
    assert difference.mean == pytest.approx(0.0)
    assert difference.low < 0 < difference.high
    assert paired_difference(scores, baseline) == difference  # a fixed seed: the same interval every time


def test_only_shared_questions_are_compared():
    difference = paired_difference({"a": 1.0, "b": 1.0, "c": 0.0}, {"a": 0.0, "b": 0.5})
    assert difference.questions == 2 and difference.mean == pytest.approx(0.75)
    assert paired_difference({"a": 1.0}, {"b": 1.0}) is None


def test_table_rows_hold_means_differences_and_costs():
    runs = [("closed", rows([0.0, 0.0, 1.0, 0.0])), ("rag", rows([1.0, 1.0, 1.0, 0.0], lm_calls=3, failed={3}))]
    table = table_rows(runs, ["f1"], baseline="closed")
    assert table[0]["f1"] == 0.25 and "f1 vs closed" not in table[0]
    assert table[1]["f1"] == 0.75 and table[1]["failed"] == 1 and table[1]["lm_calls"] == 3.0
    assert table[1]["f1 vs closed"].mean == pytest.approx(0.5)
    text = markdown(table, ["f1"], "closed")
    assert "| closed | 4 | 0 | 0.250 | — |" in text and "| rag | 4 | 1 | 0.750 | +0.50 [" in text
    with pytest.raises(ConfigError, match="the baseline 'nope' is not one of the runs"):
        table_rows(runs, ["f1"], baseline="nope")


def test_a_count_that_some_rows_lack_is_left_out_not_averaged_over_the_others():
    older = rows([1.0, 1.0, 0.0])
    newer = [replace(row, id=f"new{i}", reused_prompt_tokens=80) for i, row in enumerate(rows([1.0, 0.0]))]
    [mixed, recorded] = table_rows([("mixed", older + newer[:1]), ("recorded", newer)], ["f1"])
    assert mixed["reused_prompt_tokens"] is None and mixed["prompt_tokens"] == 100.0
    assert recorded["reused_prompt_tokens"] == 80.0
    assert "| mixed | 4 | 0 | 0.750 | 1.0 | 100.0 | — |" in markdown([mixed, recorded], ["f1"])


def write_run(folder, scores):
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"program": folder.name}))
    with open(folder / "predictions.jsonl", "w") as handle:
        for row in rows(scores):
            handle.write(json.dumps({**row.to_json(), "question": "q?", "answers": ["a"]}) + "\n")


def test_arag_table_prints_the_runs_against_the_baseline(tmp_path):
    write_run(tmp_path / "no-retrieval", [0.0, 0.0, 0.0])
    write_run(tmp_path / "single-rag", [1.0, 1.0, 1.0])
    result = CliRunner().invoke(main, ["table", str(tmp_path / "no-retrieval"), str(tmp_path / "single-rag"),
                                       "--baseline", str(tmp_path / "no-retrieval"), "--metric", "f1"])
    assert result.exit_code == 0, result.output
    assert "| single-rag | 3 | 0 | 1.000 | +1.00 [+1.00, +1.00] |" in result.output
    missing = CliRunner().invoke(main, ["table", str(tmp_path / "single-rag"), "--baseline", str(tmp_path)])
    assert missing.exit_code == 2 and "is not one of the runs given" in missing.output
