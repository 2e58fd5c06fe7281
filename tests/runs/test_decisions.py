"""`arag decisions`: the choices recorded in traces (the field each step kind declares), counted per run."""

from __future__ import annotations

import json

import dspy
import pytest
from click.testing import CliRunner

from arag.cli import main
from arag.programs import build_program
from arag.programs.adaptive_note.steps import Review
from arag.programs.crag.steps import Action
from arag.runs import Row
from arag.runs.decisions import DecisionCount, decision_counts, markdown
from arag.testing import NUMBERED, TemplateRetriever, isolated_cache, scripted_lm
from arag.trace import Answer, Retrieve, Stop, StopReason, read_step
from arag.trace.record import Step, declared


@pytest.fixture(autouse=True)
def fresh_cache():
    with isolated_cache():
        yield


def row(question_id, *steps):
    return Row(id=question_id, question="q?", answers=["a"], metrics={"em": 0.0},
               trace=[step if isinstance(step, Step) else read_step(step) for step in steps])


def test_each_value_counts_its_steps_and_the_questions_that_took_it():
    rows = [
        row("q1", Review(iteration=1, better=True), Review(iteration=2, better=False),
            Stop(reason=StopReason.T_IU), Answer(answer="a")),
        row("q2", Review(iteration=1, better=False), Review(iteration=2, better=False),
            Stop(reason=StopReason.T_IU)),
        row("q3", Retrieve(why="question", query="q", k=1, passages=[], new_ids=[]), Stop(reason=StopReason.T_CI)),
    ]
    assert decision_counts(rows) == [
        DecisionCount("review", "better", "false", steps=3, questions=2),
        DecisionCount("review", "better", "true", steps=1, questions=1),
        DecisionCount("stop", "reason", "t_ci", steps=1, questions=1),
        DecisionCount("stop", "reason", "t_iu", steps=2, questions=2),
    ]


def test_steps_of_unknown_kinds_or_without_their_decision_are_not_counted():
    rows = [row("q1", {"step": "from_a_newer_version", "reason": "x"}, {"step": "stop"}, {"no": "kind"}), row("q2")]
    assert decision_counts(rows) == []
    assert "| none recorded | 0 | 0.00 | 0 of 2 |" in markdown([("plain", rows)])


def test_a_decision_must_name_a_field_of_its_step():
    with pytest.raises(TypeError, match="its decision 'verdict' is none of its fields"):
        @declared
        class Misdeclared(Step, decision="verdict"):
            reason: str


def test_crags_action_is_counted_from_a_programs_own_trace():
    def judge(call):
        if "relevant" in call.output_fields:
            return {"relevant": "yes" if "Passage 1" in call.inputs["passage"] else "no"}
        return {field: "Budapest" if field == "answer" else "Because." for field in call.output_fields}

    with dspy.context(lm=scripted_lm(judge, logprobs=True, top_logprobs=5)):
        prediction = build_program("crag", TemplateRetriever(NUMBERED), k=3)(question="Where?")
    counts = decision_counts([row("q1", *prediction.trace)])
    actions = [count for count in counts if count.kind == Action.kind]
    assert len(actions) == 1 and actions[0].value in ("correct", "ambiguous", "incorrect")
    assert actions[0].value == next(s["action"] for s in prediction.trace if s["step"] == Action.kind)


def test_arag_decisions_prints_each_runs_decisions(tmp_path):
    folder = tmp_path / "adaptive-note"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"program": "adaptive-note"}))
    rows = [row("q1", Stop(reason=StopReason.T_IU)), row("q2", Stop(reason=StopReason.REPEATED_QUERY))]
    with open(folder / "predictions.jsonl", "w") as handle:
        for r in rows:
            handle.write(json.dumps(r.to_json()) + "\n")
    result = CliRunner().invoke(main, ["decisions", str(folder)])
    assert result.exit_code == 0, result.output
    assert "| adaptive-note | stop | reason = t_iu | 1 | 0.50 | 1 of 2 |" in result.output
    assert "| adaptive-note | stop | reason = repeated_query | 1 | 0.50 | 1 of 2 |" in result.output
    missing = CliRunner().invoke(main, ["decisions", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "is not a run folder" in missing.output
