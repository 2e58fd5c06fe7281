"""Distillation export: an evaluation run's grounding calls as a chat fine-tuning set, and the paper's per-call
filters (malformed, no evidence, unrevised, revised wrongly)."""

import json
from dataclasses import replace

import dspy
import pytest
from click.testing import CliRunner

from arag.adapters import SchemaAdapter
from arag.cli import main
from arag.errors import DataError
from arag.evaluate import evaluate
from arag.optimizers.distillation import call_flaws, export_grounding
from arag.programs.genground.genground import GenGround
from arag.programs.genground.steps import Ground
from arag.runs import Row, read_rows
from arag.signatures.grounding import GroundAnswer
from arag.testing import TemplateRetriever, scripted_lm
from arag.trace import Answer, Retrieve, is_step, steps_of

EVIDENCE_RANK = 5  # with k=6 and b=3: the second batch cites it, so two grounding calls per question


def respond(call):
    if "finished" in call.output_fields:
        done = json.loads(call.inputs["history"]) != []
        fields = {"finished": done, "sub_question": "" if done else f"About {call.inputs['question']}",
                  "answer": "Paris" if done else "guess"}
    else:
        passages = json.loads(call.inputs["passages"])
        cited = [p for p in passages if f"Passage {EVIDENCE_RANK} on" in p]
        fields = {"evidence": cited, "revised_answer": "Paris" if cited else "guess"}
    return {"reasoning": "Checked.", **fields} if "reasoning" in call.output_fields else fields


DEVSET = [
    dspy.Example(id="right", question="Capital of France?", answers=["Paris"]).with_inputs("question"),
    dspy.Example(id="wrong", question="Third city of France?", answers=["Lyon"]).with_inputs("question"),
]


def make_run(out_dir, reasoning="cot"):
    lm = scripted_lm(respond)
    program = GenGround(TemplateRetriever(), k=6, batch_size=3, reasoning=reasoning)
    with dspy.context(lm=lm):
        evaluate(program, DEVSET, out_dir=out_dir, metrics=["em", "f1"], progress=False)
    return lm


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("reasoning", ["cot", "direct"])
def test_each_grounding_call_becomes_the_exact_prompt_and_answer(tmp_path, reasoning):
    lm = make_run(tmp_path / "run", reasoning)
    count = export_grounding(tmp_path / "run", tmp_path / "train.jsonl")
    examples = read_jsonl(tmp_path / "train.jsonl")
    sent = [call.prompt for call in lm.engine.calls if "evidence" in call.output_fields]
    assert count == len(examples) == len(sent) == 4
    for example in examples:
        assert [m["role"] for m in example["messages"]] == ["system", "user", "assistant"]
        assert all(set(m) == {"role", "content"} and isinstance(m["content"], str) for m in example["messages"])
    # The prompt a student model is trained on is the one the grounding step sends.
    assert [e["messages"][0]["content"] + "\n\n" + e["messages"][1]["content"] for e in examples] == sent
    traced = [step for row in read_jsonl(tmp_path / "run" / "predictions.jsonl") for step in row["trace"]
              if is_step(step, Ground)]
    signature = dspy.ChainOfThought(GroundAnswer).predict.signature if reasoning == "cot" else GroundAnswer
    for example, step in zip(examples, traced):
        assert SchemaAdapter().parse(signature, example["messages"][2]["content"]) == step["outputs"]
    assert ("reasoning" in traced[0]["outputs"]) == (reasoning == "cot")


def test_metadata_says_where_each_call_came_from_and_whether_the_answer_was_right(tmp_path):
    make_run(tmp_path / "run")
    export_grounding(tmp_path / "run" / "predictions.jsonl", tmp_path / "train.jsonl")
    meta = [e["metadata"] for e in read_jsonl(tmp_path / "train.jsonl")]
    assert [(m["id"], m["hop"], m["batch"], m["evidence_found"], m["final_answer_correct"]) for m in meta] == [
        ("right", 1, 1, False, True), ("right", 1, 2, True, True),
        ("wrong", 1, 1, False, False), ("wrong", 1, 2, True, False),
    ]
    assert meta[1]["passage_ids"] == [f"About Capital of France? #{r}" for r in (4, 5, 6)]
    assert meta[0]["metrics"] == {"em": 1.0, "f1": 1.0} and meta[2]["metrics"] == {"em": 0.0, "f1": 0.0}


def test_only_correct_keeps_the_calls_of_questions_answered_right(tmp_path):
    make_run(tmp_path / "run")
    assert export_grounding(tmp_path / "run", tmp_path / "right.jsonl", only_correct=True) == 2
    assert {e["metadata"]["id"] for e in read_jsonl(tmp_path / "right.jsonl")} == {"right"}
    assert export_grounding(tmp_path / "run", tmp_path / "f1.jsonl", True, metric="f1") == 2
    with pytest.raises(DataError, match="no 'match' score; the run has em, f1"):
        export_grounding(tmp_path / "run", tmp_path / "match.jsonl", True, metric="match")


def test_bare_messages_without_metadata(tmp_path):
    make_run(tmp_path / "run")
    export_grounding(tmp_path / "run", tmp_path / "bare.jsonl", with_metadata=False)
    assert all(set(e) == {"messages"} for e in read_jsonl(tmp_path / "bare.jsonl"))


def test_failed_rows_are_skipped_and_a_resumed_example_counts_once(tmp_path):
    make_run(tmp_path / "run")
    predictions = tmp_path / "run" / "predictions.jsonl"
    rows = read_jsonl(predictions)
    rerun = {**rows[1], "metrics": {"em": 1.0, "f1": 1.0}}
    failed = {"id": "broken", "question": "?", "answers": ["x"], "prediction": None, "metrics": {"em": 0.0},
              "trace": [], "error": "LMError: down"}
    predictions.write_text("".join(json.dumps(r) + "\n" for r in [*rows, failed, rerun]), encoding="utf-8")
    assert export_grounding(predictions, tmp_path / "train.jsonl", only_correct=True) == 4
    assert [e["metadata"]["id"] for e in read_jsonl(tmp_path / "train.jsonl")] == ["right", "right", "wrong", "wrong"]


def test_a_run_without_grounding_calls_is_refused(tmp_path):
    predictions = tmp_path / "predictions.jsonl"
    row = {"id": "q", "question": "?", "answers": ["a"], "prediction": "a", "metrics": {"em": 1.0},
           "trace": [{"step": Retrieve.kind, "query": "?"}, {"step": Answer.kind, "answer": "a"}]}
    predictions.write_text(json.dumps(row) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match="holds no grounding calls"):
        export_grounding(predictions, tmp_path / "train.jsonl")
    assert not (tmp_path / "train.jsonl").exists()
    with pytest.raises(DataError, match="file not found"):
        export_grounding(tmp_path / "absent", tmp_path / "train.jsonl")
    row["trace"].append({"step": Ground.kind, "inputs": {}})
    predictions.write_text(json.dumps(row) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match="example 'q': a ground step without its hop"):
        export_grounding(predictions, tmp_path / "train.jsonl")


def export_keys(tmp_path, **options):
    """(id, batch) of each call exported with these options."""
    export_grounding(tmp_path / "run", tmp_path / "train.jsonl", **options)
    return [(e["metadata"]["id"], e["metadata"]["batch"]) for e in read_jsonl(tmp_path / "train.jsonl")]


def edit_calls(tmp_path, edit):
    """Rewrite the run's grounding steps in place: `edit(id, step)` changes a step."""
    predictions = tmp_path / "run" / "predictions.jsonl"
    rows = read_jsonl(predictions)
    for row in rows:
        for step in row["trace"]:
            if is_step(step, Ground):
                edit(row["id"], step)
    predictions.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return rows


def test_each_call_lists_its_flaws(tmp_path):
    make_run(tmp_path / "run")
    export_grounding(tmp_path / "run", tmp_path / "train.jsonl")
    assert [(e["metadata"]["id"], e["metadata"]["batch"], e["metadata"]["flaws"])
            for e in read_jsonl(tmp_path / "train.jsonl")] == [
        ("right", 1, ["no evidence", "unrevised"]), ("right", 2, []),
        # "Paris", grounded in the second batch, is the final answer to a question whose gold answer is Lyon.
        ("wrong", 1, ["no evidence", "unrevised"]), ("wrong", 2, ["revised wrongly"]),
    ]


@pytest.mark.parametrize("options, kept", [
    ({}, [("right", 1), ("right", 2), ("wrong", 1), ("wrong", 2)]),
    ({"drop_no_evidence": True}, [("right", 2), ("wrong", 2)]),
    ({"drop_unrevised": True}, [("right", 2), ("wrong", 2)]),
    ({"drop_revised_wrongly": True}, [("right", 1), ("right", 2), ("wrong", 1)]),
    ({"drop_malformed": True}, [("right", 1), ("right", 2), ("wrong", 1), ("wrong", 2)]),
    ({"paper_filters": True}, [("right", 2)]),
])
def test_per_call_filters_drop_the_calls_with_their_flaw(tmp_path, options, kept):
    make_run(tmp_path / "run")
    assert export_keys(tmp_path, **options) == kept


def test_unrevised_compares_normalised_answers_whatever_the_evidence(tmp_path):
    make_run(tmp_path / "run")

    def edit(example_id, step):
        if (example_id, step["batch"]) == ("right", 2):  # evidence, and the candidate again in other words
            step["outputs"]["revised_answer"] = "The guess."
        if (example_id, step["batch"]) == ("wrong", 1):  # evidence that corrects the candidate
            step["outputs"].update(evidence=["Passage 1 says Lyon."], revised_answer="Lyon")

    edit_calls(tmp_path, edit)
    assert export_keys(tmp_path, drop_unrevised=True) == [("wrong", 1), ("wrong", 2)]
    assert export_keys(tmp_path, drop_no_evidence=True) == [("right", 2), ("wrong", 1), ("wrong", 2)]
    flaws = [e["metadata"]["flaws"] for e in read_jsonl(tmp_path / "train.jsonl")]
    assert flaws == [["unrevised"], [], ["revised wrongly"]]


def test_the_paper_filters_keep_a_grounding_that_confirms_the_candidate(tmp_path):
    make_run(tmp_path / "run")

    def edit(example_id, step):
        if (example_id, step["batch"]) == ("right", 2):  # evidence found, and it confirms the candidate
            step["outputs"]["revised_answer"] = "The guess."

    edit_calls(tmp_path, edit)
    assert export_keys(tmp_path, paper_filters=True) == [("right", 2)]
    assert [e["metadata"]["flaws"] for e in read_jsonl(tmp_path / "train.jsonl")] == [["unrevised"]]
    assert export_keys(tmp_path, paper_filters=True, drop_unrevised=True) == []


def test_badly_formed_outputs_are_dropped(tmp_path):
    make_run(tmp_path / "run")

    def edit(example_id, step):
        if (example_id, step["batch"]) == ("right", 1):
            del step["outputs"]["revised_answer"]
        if (example_id, step["batch"]) == ("right", 2):
            step["outputs"]["evidence"] = "Passage 5 on About Capital of France?."
        if (example_id, step["batch"]) == ("wrong", 1):
            step["outputs"].update(evidence=["Passage 1 says Lyon.", 7], revised_answer="Lyon")
        if (example_id, step["batch"]) == ("wrong", 2):
            step["outputs"]["revised_answer"] = "  "

    edit_calls(tmp_path, edit)
    assert export_keys(tmp_path, drop_malformed=True) == []
    assert export_keys(tmp_path, paper_filters=True) == []
    flaws = [call_flaws(step, row, row.metrics["em"] == 1.0) for row in read_rows(tmp_path / "run")
             for step in steps_of(row, Ground)]
    # A blank revised answer leaves the candidate standing, as GenGround does: unrevised.
    assert flaws == [["malformed", "no evidence", "unrevised"], ["malformed", "no evidence"],
                     ["malformed", "no evidence"], ["malformed", "unrevised"]]


def test_revised_wrongly_follows_the_metric_and_judges_only_the_last_hop(tmp_path):
    make_run(tmp_path / "run")
    predictions = tmp_path / "run" / "predictions.jsonl"
    rows = read_jsonl(predictions)
    rows[1]["metrics"] = {"em": 0.0, "f1": 1.0}
    predictions.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    assert export_keys(tmp_path, drop_revised_wrongly=True) == [("right", 1), ("right", 2), ("wrong", 1), ("wrong", 2)]
    assert export_keys(tmp_path, drop_revised_wrongly=True, metric="em") == [("right", 1), ("right", 2), ("wrong", 1)]

    wrong = Row.from_json(rows[1], "the wrong row")
    (wrong_call,) = [step for step in steps_of(wrong, Ground) if step.batch == 2]
    later_hop = replace(wrong_call, hop=2, inputs={**wrong_call.inputs, "candidate_answer": "Lyon"})
    two_hops = replace(wrong, trace=[*wrong.trace, later_hop])
    # "Paris" is still the final answer, but a later hop was grounded: the first hop's call is not judged.
    assert call_flaws(wrong_call, two_hops, final_answer_correct=False) == []
    assert call_flaws(later_hop, two_hops, final_answer_correct=False) == ["revised wrongly"]


def test_export_grounding_command_offers_the_filters(tmp_path):
    make_run(tmp_path / "run")
    runner = CliRunner()
    result = runner.invoke(main, ["export-grounding", str(tmp_path / "run"), "--out", str(tmp_path / "paper.jsonl"),
                                  "--paper-filters"], catch_exceptions=False)
    assert result.exit_code == 0 and "wrote 1 grounding examples" in result.output
    assert [e["metadata"]["id"] for e in read_jsonl(tmp_path / "paper.jsonl")] == ["right"]
    result = runner.invoke(main, ["export-grounding", str(tmp_path / "run"), "--out", str(tmp_path / "some.jsonl"),
                                  "--drop-no-evidence", "--drop-revised-wrongly"], catch_exceptions=False)
    assert "wrote 1 grounding examples" in result.output
    result = runner.invoke(main, ["export-grounding", str(tmp_path / "run"), "--out", str(tmp_path / "all.jsonl"),
                                  "--drop-unrevised"], catch_exceptions=False)
    assert "wrote 2 grounding examples" in result.output
    help_text = runner.invoke(main, ["export-grounding", "--help"]).output
    assert all(flag in help_text for flag in ("--drop-malformed", "--drop-no-evidence", "--drop-unrevised",
                                              "--drop-revised-wrongly", "--paper-filters"))
