"""Setting up a run in one place (arag.RunSpec): validated once when made, the same refusal from Python and from
the command line, before anything is built; then the retriever, the LM, the program and the run's record."""

import json
import os
import subprocess
import sys
from pathlib import Path

import dspy
import pytest

import arag
from arag.data import sample_paths
from arag.errors import ConfigError, DataError
from arag.optimizers.saving import save_program
from arag.programs import build_program
from arag.programs.frame import params as frame_params
from arag.runs import RunRecord, read_record
from arag.setup import LMSetup, RunSpec
from arag.testing import NUMBERED, TemplateRetriever, isolated_cache, scripted_lm


@pytest.fixture(autouse=True)
def fresh_cache():
    with isolated_cache():
        yield


def answer_budapest(call):
    return {field: "Budapest" if field == "answer" else "Because." for field in call.output_fields}


def questions(n=2):
    return [dspy.Example(id=f"q{i}", question=f"Where is {i}?", answers=["Budapest"], dataset="towns")
            .with_inputs("question") for i in range(n)]


def cli_eval(tmp_path, *options):
    """`arag eval` in a process of its own, against a server nothing listens at (any LM call would fail), with an
    index cache of its own."""
    question_file, corpus = sample_paths()
    env = {**{k: v for k, v in os.environ.items() if k not in {"ARAG_LM", "ARAG_API_BASE"}},
           "ARAG_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "arag.cli", "eval", "--dataset", str(question_file), "--corpus",
                           str(corpus), "--lm", "openai/x", "--api-base", "http://127.0.0.1:9/v1", "--out",
                           str(tmp_path / "out"), *options], capture_output=True, text=True, env=env, timeout=120)
    return done.returncode, done.stderr.strip().splitlines()


@pytest.mark.parametrize("program, params, message", [
    ("flare", {"theta": "2"}, "flare: parameter 'theta' must be in [0.0, 1.0], got 2.0"),
    ("single-rag", {"kk": "3"}, "single-rag: unknown parameter(s) kk; known: k, reasoning"),
    # checked together, before the LM is built (once only when the program was built, after the LM and the index)
    ("prev-sentence", {"k": "3", "max_passages": "2"},
     "prev-sentence: parameter 'max_passages' (2) must be at least k (3), the passages of the first retrieval"),
])
def test_a_bad_value_is_refused_once_with_the_same_line_from_python_and_the_command_line(
        tmp_path, monkeypatch, program, params, message):
    checked = []
    original = frame_params.Param.validate
    monkeypatch.setattr(frame_params.Param, "validate", lambda self, value, where="": checked.append(self.name)
                        or original(self, value, where))
    monkeypatch.setattr(LMSetup, "build", lambda self: pytest.fail("the LM was built"))
    with pytest.raises(ConfigError) as refused:
        RunSpec(program=program, params=params, lm="openai/x", corpus="corpus.jsonl")
    assert str(refused.value) == message
    assert len(checked) == len(set(checked)), "a parameter was validated twice"
    code, lines = cli_eval(tmp_path, "--program", program, *[f"--param={k}={v}" for k, v in params.items()])
    assert code == 2 and lines == [f"error: {message}"]
    assert not (tmp_path / "out" / "predictions.jsonl").exists()
    assert not (tmp_path / "home").exists(), "the corpus was indexed before the refusal"


def test_what_a_spec_settles_when_made(tmp_path):
    spec = RunSpec(program="crag", preset="official-popqa", params={"k": 4}, lm="openai/x")
    assert spec.program_name == "crag" and spec.config["k"] == 4 and isinstance(spec.lm, LMSetup)
    assert spec.config == build_program("crag", TemplateRetriever(NUMBERED), preset="official-popqa", k=4).config
    with pytest.raises(ConfigError, match="no LM configured"):
        RunSpec(program="single-rag", lm=LMSetup(None))
    with pytest.raises(ConfigError, match="no program: give one by name"):
        RunSpec()
    with pytest.raises(ConfigError, match="no preset 'nope'"):
        RunSpec(program="crag", preset="nope")
    with pytest.raises(ConfigError, match="no retriever: pass --corpus PATH"):
        RunSpec(program="single-rag").build_retriever()
    assert RunSpec(program="no-retrieval").build_retriever() is None


def test_a_compiled_file_names_its_program_and_may_not_choose_an_endpoint(tmp_path):
    path = save_program(build_program("single-rag", TemplateRetriever(NUMBERED), k=2), tmp_path / "c.json")
    spec = RunSpec(compiled=path, params={"k": 3})
    assert spec.program_name == "single-rag" and spec.config["k"] == 3
    assert spec.build_program(TemplateRetriever(NUMBERED)).config == spec.config
    with pytest.raises(ConfigError, match="holds a compiled 'single-rag' program, not 'crag'"):
        RunSpec(program="crag", compiled=path)
    document = json.loads(path.read_text())
    document["params"]["reasoning"] = "http://elsewhere.example/api"
    path.write_text(json.dumps(document))
    with pytest.raises(DataError, match=r"params\['reasoning'\] names an address"):
        RunSpec(compiled=path)


def test_a_spec_evaluates_and_records_its_run(tmp_path):
    lm = scripted_lm(answer_budapest)
    spec = RunSpec(program="single-rag", params={"k": 2}, lm=lm, retriever=TemplateRetriever(NUMBERED))
    result = spec.evaluate(questions(), out_dir=tmp_path, progress=False)
    assert result.summary["n"] == 2 and result.summary["metrics"]["em"] == 1.0 and lm.engine.count == 2
    record = read_record(tmp_path)
    assert record == spec.record("towns")
    assert record.to_json() == {"compiled": None, "program": "single-rag", "params": {"k": 2, "reasoning": "cot"},
                                "dataset": "towns", "lm": lm.model}
    again = spec.evaluate(questions(3), out_dir=tmp_path, progress=False)  # resumed: one question left
    assert again.summary["n"] == 3 and lm.engine.count == 3
    other = RunSpec(program="single-rag", params={"k": 3}, lm=lm, retriever=TemplateRetriever(NUMBERED))
    with pytest.raises(ConfigError, match=r"different settings \(params\)"):
        other.evaluate(questions(), out_dir=tmp_path, progress=False)


def test_the_command_line_records_what_it_recorded_before():
    spec = RunSpec(program="single-rag", lm=LMSetup("openai/x", schema=False), corpus="corpus.jsonl")
    record = spec.record("/data/dev.jsonl")
    assert record.to_json() == {
        "compiled": None, "program": "single-rag", "params": {"k": 5, "reasoning": "cot"},
        "dataset": "/data/dev.jsonl", "retriever": str(Path("corpus.jsonl").resolve()),
        "lm": "openai/x", "schema": False}
    assert RunRecord.from_json(record.to_json(), "run.json") == record


def test_arag_exports_the_spec():
    assert arag.RunSpec is RunSpec and arag.LMSetup is LMSetup


def test_every_programs_defaults_validate_before_it_is_built():
    for name, cls in arag.PROGRAMS.items():
        assert RunSpec(program=name).config == {param.name: param.default for param in cls.params}, name
