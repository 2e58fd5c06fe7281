"""GenGround: answer deduction, instructed grounding in batches, the hop budget, the yes/no variant, the CLI."""

import json
import uuid

import dspy
import pytest
from click.testing import CliRunner
from dspy.utils.exceptions import AdapterParseError

from arag.cli import main
from arag.errors import ConfigError, QuestionFailed
from arag.programs.frame.registry import build_program
from arag.programs.genground.genground import GenGround, cited_evidence, yes_no_label
from arag.programs.genground.steps import Deduce, Ground, Hop
from arag.testing import OpenAICompatibleServer, TemplateRetriever, scripted_lm
from arag.trace import Answer, Retrieve, Stop, StopReason, is_step, kinds_of, steps_of


def _with_reasoning(call, fields):
    return {"reasoning": "Step by step.", **fields} if "reasoning" in call.output_fields else fields


def responder(*, finish_after=None, final="Paris", evidence_rank=None, stated_revision="checked",
              concluded="concluded"):
    """A scripted GenGround model.

    Deduction asks "sub-question N" and answers "guess N" until the history holds `finish_after` hops, then
    finishes with `final`. Grounding cites evidence only for a batch holding the passage of rank
    `evidence_rank(hop)` (None: never), revising the answer to "<stated_revision> N"; without evidence it
    still states `stated_revision`, which the program must ignore. The closing call answers `concluded`.
    """

    def respond(call):
        if "finished" in call.output_fields:
            hop = len(json.loads(call.inputs["history"])) + 1
            done = finish_after is not None and hop > finish_after
            fields = {"finished": done, "sub_question": "" if done else f"sub-question {hop}",
                      "answer": final if done else f"guess {hop}"}
        elif "evidence" in call.output_fields:
            hop = int(call.inputs["sub_question"].split()[-1])
            rank = evidence_rank(hop) if evidence_rank else None
            passages = json.loads(call.inputs["passages"])
            cited = [p for p in passages if rank is not None and f"Passage {rank} on" in p]
            fields = {"evidence": cited, "revised_answer": f"{stated_revision} {hop}"}
        else:
            fields = {"answer": concluded}
        return _with_reasoning(call, fields)

    return respond


def run(program_or_params, respond, question="Which city?", **lm_kwargs):
    program = (program_or_params if isinstance(program_or_params, GenGround)
               else GenGround(TemplateRetriever(), **program_or_params))
    lm = scripted_lm(respond, **lm_kwargs)
    with dspy.context(lm=lm):
        prediction = program(question=question)
    return prediction, lm


def grounding_calls(lm, hop):
    return [c for c in lm.engine.calls
            if "evidence" in c.output_fields and c.inputs["sub_question"] == f"sub-question {hop}"]


# --- parameters ---------------------------------------------------------------------------------


def test_defaults_are_the_papers():
    program = GenGround(TemplateRetriever())
    assert (program.k, program.batch_size, program.max_hops, program.answer_type) == (10, 3, 7, "short")


def test_cli_strings_are_coerced_and_bad_values_name_the_parameter():
    program = build_program("genground", TemplateRetriever(), k="6", batch_size="2", max_hops="4", answer_type="yes_no")
    assert (program.k, program.batch_size, program.max_hops, program.answer_type) == (6, 2, 4, "yes_no")
    for bad, name in [({"batch_size": 0}, "batch_size"), ({"k": 101}, "k"), ({"max_hops": "many"}, "max_hops"),
                      ({"answer_type": "long"}, "answer_type"), ({"hops": 3}, "hops")]:
        with pytest.raises(ConfigError, match=name):
            GenGround(TemplateRetriever(), **bad)
    with pytest.raises(ConfigError, match="needs a retriever"):
        GenGround()


# --- batch grounding ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("k", "b", "rank", "calls"),
    [(10, 3, 1, 1), (10, 3, 3, 1), (10, 3, 4, 2), (10, 3, 8, 3), (10, 3, 10, 4), (10, 3, None, 4),
     (7, 2, None, 4), (7, 2, 6, 3), (5, 5, 5, 1), (4, 10, None, 1)],
)
def test_grounding_calls_per_hop_are_the_batches_until_the_first_evidence(k, b, rank, calls):
    prediction, lm = run({"k": k, "batch_size": b, "reasoning": "direct"},
                         responder(finish_after=1, evidence_rank=lambda hop: rank))
    assert len(grounding_calls(lm, 1)) == calls
    expected_batches = [[f"sub-question 1 #{r}" for r in range(start, min(start + b, k + 1))]
                        for start in range(1, k + 1, b)][:calls]
    (hop,) = steps_of(prediction, Hop)
    assert hop["batches"] == expected_batches
    assert [step["passage_ids"] for step in steps_of(prediction, Ground)] == expected_batches
    found = [step["evidence_found"] for step in steps_of(prediction, Ground)]
    assert found == [False] * (calls - 1) + [rank is not None]
    assert lm.engine.count == prediction.lm_calls == 2 + calls
    assert prediction.retrieval_calls == 1 and prediction.distinct_passages == k


def test_each_hop_grounds_its_own_sub_question_and_the_history_carries_the_grounded_answers():
    ranks = {1: 5, 2: None, 3: 2}
    prediction, lm = run({}, responder(finish_after=3, evidence_rank=ranks.get))
    assert [len(grounding_calls(lm, hop)) for hop in (1, 2, 3)] == [2, 4, 1]
    assert [(h["sub_question"], h["deduced_answer"], h["answer"], h["revised"]) for h in steps_of(prediction, Hop)] == [
        ("sub-question 1", "guess 1", "checked 1", True),
        ("sub-question 2", "guess 2", "guess 2", False),
        ("sub-question 3", "guess 3", "checked 3", True),
    ]
    assert [h["evidence"] for h in steps_of(prediction, Hop)] == [
        ["[2] Doc 5 | Passage 5 on sub-question 1."], [], ["[2] Doc 2 | Passage 2 on sub-question 3."]
    ]
    last_deduction = [c for c in lm.engine.calls if "finished" in c.output_fields][-1]
    assert json.loads(last_deduction.inputs["history"]) == prediction.hops == [
        {"sub_question": "sub-question 1", "answer": "checked 1",
         "evidence": ["[2] Doc 5 | Passage 5 on sub-question 1."]},
        {"sub_question": "sub-question 2", "answer": "guess 2", "evidence": []},
        {"sub_question": "sub-question 3", "answer": "checked 3",
         "evidence": ["[2] Doc 2 | Passage 2 on sub-question 3."]},
    ]
    queries = [s["query"] for s in steps_of(prediction, Retrieve)]
    assert queries == ["sub-question 1", "sub-question 2", "sub-question 3"]
    assert prediction.answer == "Paris"


def test_a_hop_without_evidence_keeps_the_deduced_answer_whatever_the_grounding_call_states():
    prediction, lm = run({"k": 6}, responder(finish_after=1, evidence_rank=None, stated_revision="overridden"))
    (hop,) = steps_of(prediction, Hop)
    assert len(hop["batches"]) == 2
    assert all(s["outputs"]["revised_answer"] == "overridden 1" for s in steps_of(prediction, Ground))
    assert (hop["answer"], hop["evidence"], hop["revised"]) == ("guess 1", [], False)
    assert prediction.hops == [{"sub_question": "sub-question 1", "answer": "guess 1", "evidence": []}]


def test_the_papers_empty_marker_counts_as_no_evidence():
    assert cited_evidence(["Empty", " ", "none."]) == []
    assert cited_evidence([" Paris is the capital. ", "Empty"]) == ["Paris is the capital."]


def test_the_trace_records_each_grounding_calls_inputs_and_outputs():
    prediction, lm = run({"k": 3}, responder(finish_after=1, evidence_rank=lambda hop: 2))
    (ground,) = steps_of(prediction, Ground)
    assert ground["inputs"] == {
        "question": "Which city?", "sub_question": "sub-question 1", "candidate_answer": "guess 1",
        "passages": [f"[{r}] Doc {r} | Passage {r} on sub-question 1." for r in (1, 2, 3)],
    }
    assert ground["outputs"] == {"reasoning": "Step by step.", "evidence": ["[2] Doc 2 | Passage 2 on sub-question 1."],
                                 "revised_answer": "checked 1"}


# --- how the loop ends ----------------------------------------------------------------------------


def test_a_final_answer_ends_the_loop():
    prediction, lm = run({}, responder(finish_after=2, evidence_rank=lambda hop: 1))
    (deduce_calls, ground_calls) = (sum("finished" in c.output_fields for c in lm.engine.calls),
                                    sum("evidence" in c.output_fields for c in lm.engine.calls))
    assert (deduce_calls, ground_calls, lm.engine.count) == (3, 2, 5)
    assert steps_of(prediction, Stop) == [{"step": Stop.kind, "reason": StopReason.DEDUCED, "hops": 2}]
    assert steps_of(prediction, Answer)[0]["answer"] == prediction.answer == "Paris"
    assert is_step(prediction.trace[-1], Answer)


@pytest.mark.parametrize("max_hops", [7, 2])
def test_the_hop_budget_ends_a_model_that_never_finishes(max_hops):
    params = {} if max_hops == 7 else {"max_hops": max_hops}
    prediction, lm = run(params, responder(finish_after=None, evidence_rank=lambda hop: 1, concluded="Lyon"))
    kinds = [("finished" in c.output_fields, "evidence" in c.output_fields) for c in lm.engine.calls]
    assert kinds.count((True, False)) == max_hops  # deductions
    assert kinds.count((False, True)) == max_hops  # one grounding call per hop: evidence in the first batch
    assert kinds[-1] == (False, False) and lm.engine.count == 2 * max_hops + 1  # one closing answer
    assert steps_of(prediction, Stop) == [{"step": Stop.kind, "reason": StopReason.HOP_BUDGET, "hops": max_hops}]
    assert prediction.answer == "Lyon" and len(prediction.hops) == max_hops
    closing = lm.engine.calls[-1]
    assert len(json.loads(closing.inputs["history"])) == max_hops


# --- the yes/no variant ---------------------------------------------------------------------------


@pytest.mark.parametrize(("stated", "expected", "closing_calls"),
                         [("Yes.", "yes", 0), ("no, it is not", "no", 0), ("False", "no", 0), ("Probably", "no", 1)])
def test_yes_no_final_answers_are_normalised(stated, expected, closing_calls):
    prediction, lm = run({"answer_type": "yes_no", "k": 3},
                         responder(finish_after=1, final=stated, evidence_rank=lambda hop: 1, concluded="no"))
    assert prediction.answer == expected
    assert lm.engine.count == 2 + 1 + closing_calls
    answer_step = steps_of(prediction, Answer)[0]
    assert answer_step["answer"] == expected


def test_yes_no_closing_answer_is_typed():
    program = GenGround(TemplateRetriever(), answer_type="yes_no", max_hops=1, k=3)
    with pytest.raises(QuestionFailed, match="AdapterParseError in conclude") as failure:
        run(program, responder(finish_after=None, concluded="perhaps"))
    assert isinstance(failure.value.cause, AdapterParseError)
    prediction, _ = run(program, responder(finish_after=None, concluded="yes"), question="Is it?")
    assert prediction.answer == "yes" and steps_of(prediction, Stop)[0]["reason"] == StopReason.HOP_BUDGET


def test_yes_no_label():
    assert [yes_no_label(t) for t in ("Yes", " no.", "TRUE, because", "Not really", "yesterday", "")] == [
        "yes", "no", "yes", None, None, None
    ]


# --- arag eval over a loopback OpenAI-compatible server -------------------------------------------


def served_responder(call):
    """Deduces the question itself as one sub-question, grounds it on the first passage, and finishes with
    the grounded answer, or with "Yes" when the prompt asks for yes or no."""
    if "finished" in call.output_fields:
        history = json.loads(call.inputs["history"])
        if history:
            final = "Yes" if "when finished: yes or no" in call.prompt else history[-1]["answer"]
            return _with_reasoning(call, {"finished": True, "sub_question": "", "answer": final})
        return _with_reasoning(call, {"finished": False, "sub_question": call.inputs["question"], "answer": "unknown"})
    if "evidence" in call.output_fields:
        first = json.loads(call.inputs["passages"])[0]
        title = first.split("] ", 1)[1].split(" | ", 1)[0]
        return _with_reasoning(call, {"evidence": [first], "revised_answer": title})
    return _with_reasoning(call, {"answer": "no"})


@pytest.fixture(scope="module")
def arag_home(tmp_path_factory):
    """One index cache for the module, so the HotpotQA corpus is indexed once."""
    with pytest.MonkeyPatch.context() as patch:
        home = tmp_path_factory.mktemp("arag-home")
        patch.setenv("ARAG_HOME", str(home))
        yield home


@pytest.mark.parametrize(("dataset", "params", "metric"),
                         [("hotpotqa", [], "f1"), ("strategyqa", ["--param", "answer_type=yes_no"], "yes_no_acc")])
def test_arag_eval_runs_genground_over_a_loopback_server(dataset, params, metric, shared_dataset, arag_home, tmp_path):
    data = shared_dataset(dataset) / "public.jsonl"
    corpus = shared_dataset("hotpotqa") / "corpus.jsonl"
    out = tmp_path / "run"
    with OpenAICompatibleServer(served_responder) as server:
        result = CliRunner().invoke(main, [
            "eval", "--program", "genground", "--dataset", str(data), "--corpus", str(corpus), "--limit", "2",
            "--lm", f"openai/genground-{uuid.uuid4().hex}", "--api-base", server.url, "--out", str(out), *params,
        ])
        assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and not any("error" in row for row in rows)
    assert sum(row["lm_calls"] for row in rows) == len(server.requests) == 2 * 3
    for row in rows:
        kinds = kinds_of(row)
        assert kinds == [Deduce, Retrieve, Ground, Hop, Deduce, Stop, Answer]
        retrieve, ground, hop = row["trace"][1:4]
        assert retrieve["query"] == row["question"] and retrieve["k"] == 10
        assert ground["passage_ids"] == [p["id"] for p in retrieve["passages"][:3]]
        assert hop["answer"] == retrieve["passages"][0]["title"] and hop["revised"]
    if dataset == "strategyqa":
        assert [row["prediction"] for row in rows] == ["yes", "yes"]
    else:
        assert [row["prediction"] for row in rows] == [row["trace"][3]["answer"] for row in rows]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["program"] == "genground" and metric in summary["metrics"] and summary["n"] == 2
    assert summary["params"] == {"k": 10, "batch_size": 3, "max_hops": 7,
                                 "answer_type": "yes_no" if params else "short", "reasoning": "cot"}


def test_a_deduction_without_a_sub_question_ends_with_its_answer_and_retrieves_nothing():
    def respond(call):
        if "finished" in call.output_fields:
            return _with_reasoning(call, {"finished": False, "sub_question": "  ", "answer": "Paris"})
        raise AssertionError(f"nothing but the deduction may be called: {call.output_fields}")

    retriever = TemplateRetriever()
    prediction, _ = run(GenGround(retriever, k=3), respond)
    assert retriever.queries == [] and prediction.answer == "Paris"
    assert steps_of(prediction, Stop)[0]["reason"] == StopReason.NO_SUB_QUESTION
