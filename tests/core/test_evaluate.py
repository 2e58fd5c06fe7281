"""The evaluation harness: rows, summary, resumption, failures, and run folders that are not arag's to resume."""

import os
import subprocess
import sys

import dspy
import pytest
import ujson

from arag.errors import AragError, ConfigError, DataError
from arag.evaluate import evaluate
from arag.programs import build_program
from arag.runs import last_rows, read_rows
from arag.testing import NUMBERED, Faults, TemplateRetriever, scripted_lm


def examples(n):
    return [
        dspy.Example(id=f"q{i}", question=f"What is item {i}?", answers=[f"item {i}"], dataset="jsonl")
        .with_inputs("question")
        for i in range(n)
    ]


def echo_item(call):
    """Answers 'item N' for even N and 'unknown' for odd N."""
    number = int(call.inputs["question"].split()[-1].rstrip("?"))
    answer = f"item {number}" if number % 2 == 0 else "unknown"
    return {f: answer if f == "answer" else "." for f in call.output_fields}


def test_rows_and_summary(tmp_path):
    lm = scripted_lm(echo_item)
    program = build_program("no-retrieval")
    with dspy.context(lm=lm):
        result = evaluate(program, examples(6), out_dir=tmp_path, threads=3, progress=False,
                          run_info={"program": "no-retrieval"})
    rows = [ujson.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == [f"q{i}" for i in range(6)]
    required = {"id", "question", "answers", "prediction", "metrics", "lm_calls", "prompt_tokens",
                "completion_tokens", "retrieval_calls", "distinct_passages", "trace"}
    assert all(required <= set(r) and "error" not in r for r in rows)
    assert [row.to_json() for row in read_rows(tmp_path)] == rows
    summary = ujson.loads((tmp_path / "summary.json").read_text())
    assert summary == result.summary
    assert summary["n"] == 6 and summary["complete"] and summary["program"] == "no-retrieval"
    assert summary["metrics"]["em"] == pytest.approx(0.5)
    assert summary["totals"]["lm_calls"] == 6 == lm.engine.count


def test_rerun_skips_finished_examples(tmp_path):
    program = build_program("no-retrieval")
    first = scripted_lm(echo_item)
    with dspy.context(lm=first):
        evaluate(program, examples(4), out_dir=tmp_path, progress=False)
    second = scripted_lm(echo_item, name=first.model)  # the same model: the run records its name
    with dspy.context(lm=second):
        result = evaluate(program, examples(7), out_dir=tmp_path, progress=False)
    assert second.engine.count == 3
    assert [r.id for r in result.rows] == [f"q{i}" for i in range(7)]
    assert len(read_rows(tmp_path)) == 7


def test_answers_from_the_cache_of_an_earlier_run_cost_the_tokens_they_first_cost(tmp_path):
    program = build_program("no-retrieval")
    first = scripted_lm(echo_item)
    with dspy.context(lm=first):
        fresh = evaluate(program, examples(3), out_dir=tmp_path / "first", progress=False)
    again = scripted_lm(echo_item, name=first.model)  # the same model name: DSPy's cache answers every call
    with dspy.context(lm=again):
        cached = evaluate(program, examples(3), out_dir=tmp_path / "again", progress=False)
    assert again.engine.count == 0
    assert [row.prediction for row in cached.rows] == [row.prediction for row in fresh.rows]
    assert [(row.lm_calls, row.prompt_tokens, row.completion_tokens) for row in cached.rows] == \
        [(row.lm_calls, row.prompt_tokens, row.completion_tokens) for row in fresh.rows]
    assert all(row.prompt_tokens > 0 and row.completion_tokens > 0 for row in fresh.rows)
    assert cached.summary["totals"]["prompt_tokens"] == fresh.summary["totals"]["prompt_tokens"]


def test_failed_examples_are_recorded_then_retried(tmp_path):
    program = build_program("no-retrieval", reasoning="direct")
    # Every call fails with a 500 that DSPy's retries cannot fix within the run.
    broken = scripted_lm(echo_item, faults=Faults(server_error=1.0, seed=1), num_retries=0)
    with dspy.context(lm=broken):
        result = evaluate(program, examples(3), out_dir=tmp_path, progress=False)
    assert result.summary["n_failed"] == 3
    assert all(r.error and r.prediction is None and set(r.metrics.values()) == {0.0} for r in result.rows)
    healthy = scripted_lm(echo_item, name=broken.model)  # the endpoint mended
    with dspy.context(lm=healthy):
        result = evaluate(program, examples(3), out_dir=tmp_path, progress=False)
    assert healthy.engine.count == 3 and result.summary["n_failed"] == 0


def test_consecutive_failures_stop_the_run_and_keep_finished_rows(tmp_path):
    program = build_program("no-retrieval", reasoning="direct")
    good = scripted_lm(echo_item)
    with dspy.context(lm=good):
        evaluate(program, examples(2), out_dir=tmp_path, progress=False)
    broken = scripted_lm(echo_item, faults=Faults(server_error=1.0, seed=1), num_retries=0, name=good.model)
    with dspy.context(lm=broken), pytest.raises(AragError, match="3 failed examples in a row"):
        evaluate(program, examples(20), out_dir=tmp_path, progress=False, max_errors=3)
    summary = ujson.loads((tmp_path / "summary.json").read_text())
    assert summary["complete"] is False and summary["n"] >= 5 and summary["n_failed"] >= 3


def test_a_half_written_last_line_is_dropped(tmp_path):
    program = build_program("no-retrieval")
    first = scripted_lm(echo_item)
    with dspy.context(lm=first):
        evaluate(program, examples(2), out_dir=tmp_path, progress=False)
    with open(tmp_path / "predictions.jsonl", "a") as f:
        f.write('{"id": "q2", "question": "What is it')
    lm = scripted_lm(echo_item, name=first.model)
    with dspy.context(lm=lm):
        result = evaluate(program, examples(3), out_dir=tmp_path, progress=False)
    assert lm.engine.count == 1 and result.summary["n"] == 3
    assert len(read_rows(tmp_path)) == 3


def test_a_whole_last_row_without_its_newline_is_kept(tmp_path):
    program = build_program("no-retrieval")
    first = scripted_lm(echo_item)
    with dspy.context(lm=first):
        evaluate(program, examples(2), out_dir=tmp_path, progress=False)
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_bytes(predictions.read_bytes().rstrip(b"\n"))
    assert [row.id for row in last_rows(tmp_path)] == ["q0", "q1"]
    lm = scripted_lm(echo_item, name=first.model)
    with dspy.context(lm=lm):
        result = evaluate(program, examples(3), out_dir=tmp_path, progress=False)
    assert lm.engine.count == 1 and result.summary["n"] == 3
    assert [row.id for row in read_rows(tmp_path)] == ["q0", "q1", "q2"]


def test_resume_with_other_settings_is_refused(tmp_path):
    program = build_program("no-retrieval")
    with dspy.context(lm=scripted_lm(echo_item)):
        evaluate(program, examples(1), out_dir=tmp_path, progress=False, run_info={"program": "a", "params": {"k": 1}})
        with pytest.raises(ConfigError, match=r"different settings \(params\)"):
            evaluate(program, examples(1), out_dir=tmp_path, progress=False,
                     run_info={"program": "a", "params": {"k": 2}})


def test_duplicate_ids_are_refused():
    with pytest.raises(DataError, match="'q0' appears twice"):
        evaluate(build_program("no-retrieval"), examples(1) * 2, progress=False)


def test_no_lm_is_a_clear_error():
    with pytest.raises(ConfigError, match="no LM is configured"):
        evaluate(build_program("no-retrieval"), examples(1), progress=False)


FOREIGN = b'{"id": "q0", "note": "not a row of arag\'s"}\n{"id": "q1", "half a line'


def test_a_folder_arag_did_not_start_is_refused_and_left_as_it_was(tmp_path):
    (tmp_path / "predictions.jsonl").write_bytes(FOREIGN)
    lm = scripted_lm(echo_item)
    with dspy.context(lm=lm), pytest.raises(ConfigError, match="holds predictions.jsonl but no run.json"):
        evaluate(build_program("no-retrieval"), examples(2), out_dir=tmp_path, progress=False)
    assert (tmp_path / "predictions.jsonl").read_bytes() == FOREIGN and lm.engine.count == 0
    assert [p.name for p in tmp_path.iterdir()] == ["predictions.jsonl"]


def test_rows_are_never_cut_or_written_through_a_symbolic_link(tmp_path):
    program = build_program("no-retrieval")
    with dspy.context(lm=scripted_lm(echo_item)):
        evaluate(program, examples(1), out_dir=tmp_path / "run", progress=False)
    elsewhere = tmp_path / "someone-elses.jsonl"
    elsewhere.write_bytes(FOREIGN)
    (tmp_path / "run" / "predictions.jsonl").unlink()
    (tmp_path / "run" / "predictions.jsonl").symlink_to(elsewhere)
    with dspy.context(lm=scripted_lm(echo_item)), pytest.raises(ConfigError, match="is a symbolic link"):
        evaluate(program, examples(2), out_dir=tmp_path / "run", progress=False)
    assert elsewhere.read_bytes() == FOREIGN


@pytest.mark.parametrize("run_json, rows, message", [
    (b"[]", b"", r"run.json: not a run description \(a JSON object\)"),
    (b"{not json", b"", "run.json: not valid JSON"),
    (b"{}", b'[1, 2]\n', r"predictions.jsonl:1: not a row of arag's"),
    (b"{}", b'{"question": "no id", "metrics": {}}\n', r"predictions.jsonl:1: not a row of arag's"),
    (b"{}", b'{"id": "q0", "prediction": "no metrics"}\n', r"predictions.jsonl:1: not a row of arag's"),
    (b"{}", b'{"id": "q0", "question": "?", "answers": [], "metrics": {}, "trace": []}\n"a string"\n',
     r"predictions.jsonl:2: not a row of arag's"),
])
def test_a_broken_run_json_or_row_is_a_data_error_and_nothing_is_lost(tmp_path, run_json, rows, message):
    (tmp_path / "run.json").write_bytes(run_json)
    (tmp_path / "predictions.jsonl").write_bytes(rows)
    lm = scripted_lm(echo_item)
    with dspy.context(lm=lm), pytest.raises(DataError, match=message):
        evaluate(build_program("no-retrieval"), examples(2), out_dir=tmp_path, progress=False, run_info={})
    assert lm.engine.count == 0
    assert (tmp_path / "run.json").read_bytes() == run_json and (tmp_path / "predictions.jsonl").read_bytes() == rows


def test_a_run_folder_is_held_by_one_process_at_a_time(tmp_path):
    """A second process's lock on the folder, taken through a real subprocess, refuses this run with its holder."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         f"fd = os.open({str(tmp_path / 'run.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\nos.write(fd, b'pid 4242 on elsewhere')\n"
         "print('held', flush=True)\nsys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        lm = scripted_lm(echo_item)
        with dspy.context(lm=lm), pytest.raises(ConfigError, match=r"in use by another arag run \(pid 4242 on "
                                                                   r"elsewhere\)"):
            evaluate(build_program("no-retrieval"), examples(2), out_dir=tmp_path, progress=False)
        assert lm.engine.count == 0 and not (tmp_path / "run.json").exists()
    finally:
        holder.communicate("")
    with dspy.context(lm=scripted_lm(echo_item)):
        assert evaluate(build_program("no-retrieval"), examples(2), out_dir=tmp_path, progress=False).summary["n"] == 2
    assert "pid" in (tmp_path / "run.lock").read_text()


# ----------------------------------------------------------------------------------------------------
# What a run is, when the caller does not say: one folder holds one program's run


def test_two_programs_evaluated_into_one_folder_are_refused_not_mixed(tmp_path):
    """The README's `arag.evaluate(program, devset, out_dir=...)`, no run_info: single-rag, then no-retrieval into
    the same folder. The second must fail, not answer with single-rag's rows."""
    lm = scripted_lm(echo_item)
    single = build_program("single-rag", TemplateRetriever(NUMBERED), k=2)
    with dspy.context(lm=lm):
        evaluate(single, examples(3), out_dir=tmp_path, progress=False)
        calls = lm.engine.count
        with pytest.raises(ConfigError, match=r"different settings \(params, program, prompts\)"):
            evaluate(build_program("no-retrieval"), examples(3), out_dir=tmp_path, progress=False)
    assert lm.engine.count == calls
    info = ujson.loads((tmp_path / "run.json").read_text())
    assert info == {"program": "single-rag", "params": single.config, "prompts": info["prompts"], "lm": lm.model,
                    "dataset": "jsonl"}
    summary = ujson.loads((tmp_path / "summary.json").read_text())
    assert summary["program"] == "single-rag" and summary["lm"] == lm.model and summary["n"] == 3


def test_a_run_of_another_lm_or_of_the_same_program_with_demos_is_refused(tmp_path):
    program = build_program("no-retrieval")
    with dspy.context(lm=scripted_lm(echo_item)):
        evaluate(program, examples(2), out_dir=tmp_path, progress=False)
    with dspy.context(lm=scripted_lm(echo_item)), pytest.raises(ConfigError, match=r"different settings \(lm\)"):
        evaluate(program, examples(2), out_dir=tmp_path, progress=False)
    name = ujson.loads((tmp_path / "run.json").read_text())["lm"]
    demo = {"question": "What is item 9?", "answer": "item 9"}
    program.named_predictors()[0][1].demos = [demo]
    with dspy.context(lm=scripted_lm(echo_item, name=name)), \
            pytest.raises(ConfigError, match=r"different settings \(prompts\)"):
        evaluate(program, examples(2), out_dir=tmp_path, progress=False)
    program.named_predictors()[0][1].demos = []
    lm = scripted_lm(echo_item, name=name)  # the same model, another engine: a resumed run
    with dspy.context(lm=lm):
        assert evaluate(program, examples(3), out_dir=tmp_path, progress=False).summary["n"] == 3
    assert lm.engine.count == 1


# ----------------------------------------------------------------------------------------------------
# run.lock: arag's own file, or nothing written


def a_fifo(path):
    os.mkfifo(path)


def a_hard_link_to_notes(path):
    notes = path.parent.parent / "notes.txt"
    notes.write_bytes(b"my notes, not a lock\n")
    os.link(notes, path)


def foreign_text(path):
    path.write_bytes(b"my notes, not a lock\n")


def a_holders_line_then_more(path):
    path.write_bytes(b"pid 12 on host, since 2024-01-01 10:00:00\nand a second line of someone's\n")


@pytest.mark.parametrize("make_lock, message", [
    (a_hard_link_to_notes, r"run.lock is a hard link \(2 names for one file\)"),
    (foreign_text, r"run.lock is not a run lock of arag's \(it holds other text\)"),
    (a_holders_line_then_more, r"run.lock is not a run lock of arag's"),
    (a_fifo, r"run.lock is not a plain file"),
])
def test_a_run_lock_that_is_not_arags_is_refused_and_never_written(tmp_path, make_lock, message):
    folder = tmp_path / "run"
    folder.mkdir()
    make_lock(folder / "run.lock")
    before = {p.name: (p.read_bytes() if p.is_file() else None) for p in tmp_path.rglob("*") if not p.is_dir()}
    lm = scripted_lm(echo_item)
    with dspy.context(lm=lm), pytest.raises(ConfigError, match=message):
        evaluate(build_program("no-retrieval"), examples(2), out_dir=folder, progress=False)
    after = {p.name: (p.read_bytes() if p.is_file() else None) for p in tmp_path.rglob("*") if not p.is_dir()}
    assert after == before and lm.engine.count == 0


def test_a_lock_left_by_an_earlier_run_is_taken_over(tmp_path):
    with dspy.context(lm=scripted_lm(echo_item)):
        evaluate(build_program("no-retrieval"), examples(1), out_dir=tmp_path, progress=False)
    (tmp_path / "run.lock").write_text("")  # made, never written: a run killed at its start
    lm = scripted_lm(echo_item, name=ujson.loads((tmp_path / "run.json").read_text())["lm"])
    with dspy.context(lm=lm):
        assert evaluate(build_program("no-retrieval"), examples(2), out_dir=tmp_path, progress=False).summary["n"] == 2
    assert (tmp_path / "run.lock").read_text().startswith(f"pid {os.getpid()} on ")


def test_rows_are_never_appended_through_a_hard_link(tmp_path):
    with dspy.context(lm=scripted_lm(echo_item)):
        evaluate(build_program("no-retrieval"), examples(1), out_dir=tmp_path / "run", progress=False)
    backup = tmp_path / "backup.jsonl"
    os.link(tmp_path / "run" / "predictions.jsonl", backup)  # `cp -al`: a copy that shares the file
    kept = backup.read_bytes()
    with dspy.context(lm=scripted_lm(echo_item)), pytest.raises(ConfigError, match="is a hard link"):
        evaluate(build_program("no-retrieval"), examples(2), out_dir=tmp_path / "run", progress=False)
    assert backup.read_bytes() == kept
