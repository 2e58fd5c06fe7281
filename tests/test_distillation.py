"""Distillation export: an evaluation run's grounding calls as a chat fine-tuning set."""

import json

import dspy
import pytest

from arag.adapters import SchemaAdapter
from arag.data.distillation import export_grounding, grounding_messages
from arag.errors import DataError
from arag.evaluate import evaluate
from arag.programs.genground import GenGround
from arag.retrievers import BaseRetriever, Passage
from arag.signatures.grounding import GroundAnswer
from arag.testing import scripted_lm

EVIDENCE_RANK = 5  # with k=6 and b=3: the second batch cites it, so two grounding calls per question


class RankedRetriever(BaseRetriever):
    def _search(self, query, k):
        return [Passage(f"{query} #{rank}", f"Doc {rank}", f"Passage {rank} on {query}.") for rank in range(1, k + 1)]


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
    program = GenGround(RankedRetriever(), k=6, batch_size=3, reasoning=reasoning)
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
              if step["step"] == "ground"]
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
           "trace": [{"step": "retrieve", "query": "?"}, {"step": "answer", "answer": "a"}]}
    predictions.write_text(json.dumps(row) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match="holds no grounding calls"):
        export_grounding(predictions, tmp_path / "train.jsonl")
    assert not (tmp_path / "train.jsonl").exists()
    with pytest.raises(DataError, match="file not found"):
        export_grounding(tmp_path / "absent", tmp_path / "train.jsonl")
    with pytest.raises(DataError, match="without its outputs"):
        grounding_messages({"step": "ground", "inputs": {}})
