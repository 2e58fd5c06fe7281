"""A run folder's records, declared once (arag.runs.records): run.json as a RunRecord and each line of
predictions.jsonl as a Row, read back with their steps in their declared kinds, and what is not one of them refused
with one line naming the file and the field."""

import json

import dspy
import pytest
import ujson
from click.testing import CliRunner

from arag.cli import main
from arag.errors import ConfigError, DataError
from arag.evaluate import evaluate
from arag.programs import build_program
from arag.programs.crag.steps import Action, Evaluate
from arag.runs import Row, RunRecord, load_run, read_record, read_rows
from arag.testing import NUMBERED, TemplateRetriever, isolated_cache, scripted_lm
from arag.trace import STEP_KINDS, Answer, Retrieve, Stop, StopReason, UnreadStep, steps_of


@pytest.fixture(autouse=True)
def fresh_cache():
    with isolated_cache():
        yield


def judge(call):
    if "relevant" in call.output_fields:
        return {"relevant": "yes" if "Passage 1" in call.inputs["passage"] else "no"}
    return {field: "Budapest" if field == "answer" else "Because." for field in call.output_fields}


def crag_run(folder, n=2):
    questions = [dspy.Example(id=f"q{i}", question=f"Where is {i}?", answers=["Budapest"]).with_inputs("question")
                 for i in range(n)]
    with dspy.context(lm=scripted_lm(judge, logprobs=True, top_logprobs=5)):
        return evaluate(build_program("crag", TemplateRetriever(NUMBERED), k=3), questions, out_dir=folder,
                        progress=False)


def lines(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_run_folder_reads_back_into_its_records_and_writes_the_same_json(tmp_path):
    result = crag_run(tmp_path / "run")
    written = lines(tmp_path / "run" / "predictions.jsonl")
    rows = read_rows(tmp_path / "run")
    assert [row.to_json() for row in rows] == written == [row.to_json() for row in result.rows]
    record = read_record(tmp_path / "run")
    assert record.program == "crag" and record.params["k"] == 3 and record.prompts.startswith("sha256:")
    assert record.to_json() == json.loads((tmp_path / "run" / "run.json").read_text())
    assert RunRecord.from_json(record.to_json(), "again") == record


def test_a_rows_steps_are_read_back_into_their_declared_kinds(tmp_path):
    crag_run(tmp_path / "run")
    row = read_rows(tmp_path / "run")[0]
    assert all(isinstance(step, STEP_KINDS[step.kind]) for step in row.trace)
    (action,) = steps_of(row, Action)
    assert action.action in ("correct", "ambiguous", "incorrect") and isinstance(action.upper, float)
    assert [type(step) for step in steps_of(row, Retrieve, Evaluate)] == [Retrieve, Evaluate]
    assert all(isinstance(p["score"], float) for p in steps_of(row, Retrieve)[0].passages)
    (answer,) = steps_of(row, Answer)
    assert answer.answer == "Budapest" and 0 < answer.min_token_prob <= 1


def test_a_step_no_declaration_reads_is_kept_as_written(tmp_path):
    """A kind of another version, and a stop without its reason: kept as recorded, left out of steps_of."""
    other = {"step": "from_a_newer_version", "reason": "x"}
    stop = {"step": Stop.kind, "pieces": 2}
    line = {"id": "q0", "question": "?", "answers": ["a"], "prediction": "a", "metrics": {"em": 1.0},
            "trace": [other, stop, {"step": Stop.kind, "reason": "t_iu"}]}
    (tmp_path / "predictions.jsonl").write_text(json.dumps(line) + "\n")
    (row,) = read_rows(tmp_path)
    unread, broken, read = row.trace
    assert isinstance(unread, UnreadStep) and "no step kind 'from_a_newer_version'" in unread.problem
    assert isinstance(broken, UnreadStep) and broken.problem == "a stop step without its reason"
    assert steps_of(row, Stop) == [read] and read.reason is StopReason.T_IU
    assert row.to_json() == line


def test_a_run_written_before_a_field_existed_still_reads_and_resumes(tmp_path):
    """An older run.json (an undeclared key, no prompts or retriever) and rows without reused_prompt_tokens."""
    run = tmp_path / "run"
    crag_run(run, n=1)
    old = {"program": "crag", "params": read_record(run).params, "n": 1}
    (run / "run.json").write_text(json.dumps(old))
    rows = lines(run / "predictions.jsonl")
    for row in rows:
        del row["reused_prompt_tokens"]
    (run / "predictions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    loaded = load_run(run)
    assert loaded.record.other == {"n": 1} and loaded.record.to_json() == old
    assert loaded.rows[0].reused_prompt_tokens is None and loaded.rows[0].to_json() == rows[0]
    resumed = RunRecord(program="crag", params=old["params"], lm="another", retriever="x.jsonl", other={"n": 1})
    assert resumed.differences(loaded.record) == []  # lm and retriever were not recorded then
    assert RunRecord(program="crag", params={**old["params"], "k": 1}).differences(loaded.record) == ["n", "params"]


@pytest.mark.parametrize("run_json, message", [
    ('{"program": "crag", "params": [1, 2]}', "run.json: not a run description: params should be a JSON object"),
    ('{"program": 7}', "run.json: not a run description: program should be text, got 7"),
    ('{"schema": "yes"}', "run.json: not a run description: schema should be true or false"),
    ('"crag"', "run.json: not a run description (a JSON object)"),
])
def test_a_malformed_run_json_is_refused_with_one_line_naming_the_file_and_the_field(tmp_path, run_json, message):
    crag_run(tmp_path / "run", n=1)
    (tmp_path / "run" / "run.json").write_text(run_json)
    with pytest.raises(DataError) as refused:
        load_run(tmp_path / "run")
    assert message in str(refused.value)
    result = CliRunner().invoke(main, ["table", str(tmp_path / "run")])
    shown = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(shown) == 1
    assert shown[0].startswith(f"error: {tmp_path / 'run' / 'run.json'}: ") and message in shown[0]


def test_a_malformed_row_names_its_file_line_and_field(tmp_path):
    row = {"id": "q0", "question": "?", "answers": [], "metrics": {}, "trace": [], "lm_calls": "two"}
    (tmp_path / "predictions.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError, match=r"predictions.jsonl:1: not a row of arag's: lm_calls should be a whole "
                                        r"number, got 'two'"):
        read_rows(tmp_path)
    with pytest.raises(DataError, match="q0: not a row of arag's: it has no question"):
        Row.from_json({"id": "q0"}, "q0")


def test_evaluate_takes_a_record_or_its_json_and_refuses_a_malformed_one(tmp_path):
    program = build_program("no-retrieval")
    question = [dspy.Example(id="q0", question="What?", answers=["a"]).with_inputs("question")]
    lm = scripted_lm(lambda call: {field: "a" for field in call.output_fields})
    with dspy.context(lm=lm):
        with pytest.raises(DataError, match="run_info: not a run description: trial should be a whole number"):
            evaluate(program, question, out_dir=tmp_path, progress=False, run_info={"trial": "3"})
        evaluate(program, question, out_dir=tmp_path, progress=False, run_info=RunRecord(program="mine", trial=3))
        with pytest.raises(ConfigError, match=r"different settings \(trial\)"):
            evaluate(program, question, out_dir=tmp_path, progress=False, run_info={"program": "mine", "trial": 4})
    assert ujson.loads((tmp_path / "run.json").read_text()) == {"program": "mine", "trial": 3}
