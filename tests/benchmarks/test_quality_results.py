"""The quality table's committed results (benchmarks/results/), read through their declared type (KeptRow) and
written back unchanged; a run's rows kept as the results keep them."""

import json
import sys
from pathlib import Path

import dspy
import pytest

from arag.errors import DataError
from arag.lm.local import cpu_kind
from arag.runs import Row
from arag.runs.table import table_rows
from arag.trace import Answer, Retrieve, read_step

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from quality_results import KeptRow, read_results  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
COMMITTED = sorted(RESULTS.glob("**/*.jsonl"))


def test_the_results_hold_files_to_read():
    assert len(COMMITTED) > 20


@pytest.mark.parametrize("path", COMMITTED, ids=lambda path: str(path.relative_to(RESULTS)))
def test_a_committed_results_file_reads_and_writes_back_unchanged(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = read_results(path)
    assert len(kept) == len(lines)
    assert [json.dumps(row.to_json(), ensure_ascii=False) for row in kept.values()] == lines


def test_a_committed_cell_reads_as_a_run_for_the_table():
    path = RESULTS / "quality" / "qwen2.5-coder-1.5b" / "hotpotqa" / "flare.jsonl"
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    examples = [dspy.Example(id=line["id"], question="?", answers=["a"]) for line in lines]
    rows = [row.as_row(example) for row, example in zip(read_results(path).values(), examples)]
    (table,) = table_rows([("flare", rows)], ["f1"])
    assert table["n"] == len(lines) and table["failed"] == sum("error_kind" in line for line in lines)
    assert table["f1"] == pytest.approx(sum(line["metrics"]["f1"] for line in lines) / len(lines))
    assert table["lm_calls"] == pytest.approx(sum(line["lm_calls"] for line in lines) / len(lines))


def test_a_run_row_is_kept_without_its_text_and_a_failure_by_its_kind():
    trace = [read_step({"step": Retrieve.kind, "why": "question", "query": "q", "k": 1, "passages": [],
                        "new_ids": []}), read_step({"step": Answer.kind, "answer": "a"})]
    answered = Row(id="q0", question="Q?", answers=["a"], metrics={"em": 1.0}, trace=trace, prediction="a",
                   seconds=1.5, lm_calls=1, prompt_tokens=10, completion_tokens=2, retrieval_calls=1,
                   distinct_passages=1)
    assert KeptRow.of(answered, "abc1234").to_json() == {
        "id": "q0", "prediction": "a", "metrics": {"em": 1.0}, "lm_calls": 1, "prompt_tokens": 10,
        "completion_tokens": 2, "retrieval_calls": 1, "distinct_passages": 1, "seconds": 1.5,
        "steps": {"retrieve": 1, "answer": 1}, "commit": "abc1234", "cpu": cpu_kind()}
    failed = Row(id="q1", question="Q?", answers=["a"], metrics={"em": 0.0}, trace=[], error="LMError: down",
                 error_kind="LMError", error_step=None, seconds=0.5)
    kept = KeptRow.of(failed, "abc1234")
    assert kept.to_json() == {"id": "q1", "prediction": None, "metrics": {"em": 0.0}, "seconds": 0.5,
                              "error_kind": "LMError", "error_step": None, "steps": {}, "commit": "abc1234",
                              "cpu": cpu_kind()}
    assert kept.as_row(dspy.Example(question="Q?", answers=["a"])).failed


def test_a_malformed_kept_row_names_its_file_line_and_field(tmp_path):
    path = tmp_path / "flare.jsonl"
    path.write_text('{"id": "q0", "metrics": {"f1": 1.0}, "steps": {}, "commit": "abc"}\n'
                    '{"id": "q1", "metrics": {"f1": "high"}, "steps": {}, "commit": "abc"}\n')
    with pytest.raises(DataError, match=r"flare.jsonl:2: not a kept row of the quality table: metrics should be a "
                                        r"number, got \{'f1': 'high'\}"):
        read_results(path)
