"""The trace format: every step kind declared once, its JSON schema generated from the declarations and
committed as docs/trace.schema.json, and every program's trace valid under it."""

import dataclasses
import json
from pathlib import Path

import dspy
import jsonschema
import pytest

from arag.data import load_corpus, load_examples, sample_paths
from arag.errors import QuestionFailed
from arag.programs import PROGRAMS, build_program
from arag.retrievers import BM25Retriever
from arag.testing import StandInModel, isolated_cache, scripted_lm
from arag.trace import (
    ABSENT,
    STEP_KINDS,
    Answer,
    Retrieve,
    Stop,
    StopReason,
    UnreadStep,
    is_step,
    kinds_of,
    note,
    read_step,
    recording,
    steps_of,
    stop_reason,
    trace_schema,
    trace_schema_text,
)

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = ROOT / "docs" / "trace.schema.json"


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory):
    questions, corpus = sample_paths()
    retriever = BM25Retriever.build(load_corpus(corpus), tmp_path_factory.mktemp("idx") / "bm25")
    return retriever, load_examples(questions, limit=2)


def test_the_committed_schema_is_the_one_the_declarations_generate():
    assert SCHEMA_FILE.read_text(encoding="utf-8") == trace_schema_text(), \
        "regenerate docs/trace.schema.json with arag.trace.trace_schema_text()"
    jsonschema.Draft202012Validator.check_schema(trace_schema())


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_every_program_records_steps_the_schema_accepts(name, sample_run):
    retriever, questions = sample_run
    validator = jsonschema.Draft202012Validator(trace_schema())
    lm = scripted_lm(StandInModel(), logprobs=True, top_logprobs=1)
    program = build_program(name, retriever)
    with isolated_cache(enabled=False), dspy.context(lm=lm):
        for example in questions:
            try:
                trace = program(question=example.question).trace
            except QuestionFailed as failure:
                trace = failure.trace
            errors = [f"{error.json_path}: {error.message}"[:300] for error in validator.iter_errors(trace)]
            assert trace and not errors, errors
            assert json.loads(json.dumps(trace)) == trace
            assert program.required_lm_calls(trace) >= 1
            read = [read_step(step) for step in json.loads(json.dumps(trace))]  # as a run's row is read back
            assert [type(step) for step in read] == [STEP_KINDS[step["step"]] for step in trace]
            assert json.loads(json.dumps([step.as_json() for step in read])) == trace


def test_a_step_is_recorded_complete_and_leaves_out_the_facts_it_lacks():
    with recording() as trace:
        note(Answer(answer="Paris"))
        note(Stop(reason=StopReason.MODEL_ENDED, pieces=2, tokens=ABSENT))
    assert trace.steps == [{"step": Answer.kind, "answer": "Paris"},
                           {"step": Stop.kind, "reason": StopReason.MODEL_ENDED.value, "pieces": 2}]
    assert kinds_of(trace.steps) == [Answer, Stop] and stop_reason(trace.steps) is StopReason.MODEL_ENDED
    assert steps_of({"trace": trace.steps}, Stop, Answer) == trace.steps
    assert is_step(trace.steps[0], Answer) and not is_step(trace.steps[0], Retrieve)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Answer(answer="Paris").answer = "Lyon"


def test_a_step_no_declaration_reads_is_kept_as_recorded_and_is_of_no_kind():
    unknown = read_step({"step": "from_a_newer_version", "x": 1})
    broken = read_step({"step": Stop.kind, "reason": "the model ended"})
    read = read_step({"step": Stop.kind, "reason": "t_iu", "pieces": 2})
    assert isinstance(unknown, UnreadStep) and unknown.as_json() == {"step": "from_a_newer_version", "x": 1}
    assert isinstance(broken, UnreadStep) and broken.problem.startswith("a stop step whose reason does not fit")
    assert read == Stop(reason=StopReason.T_IU, pieces=2) and read.tokens is ABSENT and not ABSENT
    trace = [unknown, broken, read]
    assert kinds_of(trace) == [None, None, Stop] and steps_of(trace, Stop) == [read]
    assert stop_reason(trace) is StopReason.T_IU and is_step(read, Stop) and not is_step(broken, Stop)


def test_every_kind_is_declared_once_with_a_description():
    assert len(STEP_KINDS) == len({kind.kind for kind in STEP_KINDS.values()})
    assert all(kind.__doc__ and not kind.__doc__.startswith(kind.__name__ + "(") for kind in STEP_KINDS.values())
    assert len({reason.value for reason in StopReason}) == len(StopReason)
    assert all(reason.description for reason in StopReason)



def test_the_schema_refuses_an_undeclared_fact_a_missing_one_and_a_sentence_for_a_stop_reason():
    validator = jsonschema.Draft202012Validator(trace_schema())
    assert validator.is_valid([{"step": Retrieve.kind, "why": "question", "query": "q", "k": 1,
                                "passages": [{"id": "a", "title": "A", "score": 1.0}], "new_ids": ["a"]}])
    assert not validator.is_valid([{"step": Answer.kind, "answer": "Paris", "confidence": 1.0}])
    assert not validator.is_valid([{"step": Stop.kind, "pieces": 2}])
    assert not validator.is_valid([{"step": Stop.kind, "reason": StopReason.MODEL_ENDED.description}])
    assert not validator.is_valid([{"step": "unknown"}])
