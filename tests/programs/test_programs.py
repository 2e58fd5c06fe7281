"""The program frame: traces, counts and the two first programs, with scripted LMs over BM25."""

import dspy
import pytest

from arag.data import load_corpus, sample_paths
from arag.programs import build_program
from arag.programs.frame.sentences import final_answer, split_sentences
from arag.retrievers import BM25Retriever
from arag.testing import Scripted, scripted_lm
from arag.trace import Answer, Retrieve, current_trace, is_step, kinds_of, recording


@pytest.fixture(scope="module")
def sample_retriever(tmp_path_factory):
    _, corpus = sample_paths()
    return BM25Retriever.build(load_corpus(corpus), tmp_path_factory.mktemp("idx") / "bm25")


def answer_with(text, probs=1.0):
    def responder(call):
        return {f: Scripted(text, probs) if f == "answer" else "Reasoning." for f in call.output_fields}

    return responder


def test_single_rag_traces_one_retrieval_and_the_answer(sample_retriever):
    lm = scripted_lm(answer_with("Paris"))
    program = build_program("single-rag", sample_retriever, k=3)
    with dspy.context(lm=lm):
        pred = program(question="Which river flows through the capital of France?")
    assert pred.answer == "Paris"
    assert kinds_of(pred) == [Retrieve, Answer]
    retrieved = pred.trace[0]
    assert retrieved["why"] == "question" and len(retrieved["passages"]) == 3
    assert retrieved["new_ids"] == [p["id"] for p in retrieved["passages"]]
    assert (pred.lm_calls, pred.retrieval_calls, pred.distinct_passages) == (1, 1, 3)
    assert lm.engine.count == 1
    assert pred.prompt_tokens > 0 and pred.completion_tokens > 0
    prompt_passages = lm.engine.calls[0].inputs["passages"]
    for p in retrieved["passages"]:
        assert p["title"] in prompt_passages


def test_no_retrieval_never_retrieves_and_direct_mode_has_no_reasoning_field():
    lm = scripted_lm(answer_with("1889"))
    program = build_program("no-retrieval", reasoning="direct")
    with dspy.context(lm=lm):
        pred = program(question="When was the Eiffel Tower finished?")
    assert pred.answer == "1889" and pred.retrieval_calls == 0 and pred.distinct_passages == 0
    assert lm.engine.calls[0].output_fields == ["answer"]


def test_answer_step_carries_token_probabilities_when_the_lm_returns_them():
    lm = scripted_lm(answer_with("Chief of Protocol", [0.9, 0.5, 0.8]), logprobs=True, top_logprobs=3)
    with dspy.context(lm=lm):
        pred = build_program("no-retrieval")(question="q?")
    step = pred.trace[-1]
    assert is_step(step, Answer)
    assert step["min_token_prob"] == pytest.approx(0.5)
    assert step["mean_token_prob"] == pytest.approx((0.9 + 0.5 + 0.8) / 3, abs=1e-4)


def test_cached_calls_count_as_lm_calls_but_spend_no_tokens():
    lm = scripted_lm(answer_with("x"))
    program = build_program("no-retrieval")
    with dspy.context(lm=lm):
        first = program(question="same question")
        second = program(question="same question")
    assert first.lm_calls == second.lm_calls == 1
    assert lm.engine.count == 1
    assert second.prompt_tokens == 0 and first.prompt_tokens > 0


def test_nested_programs_share_one_trace(sample_retriever):
    lm = scripted_lm(answer_with("y"))
    inner = build_program("single-rag", sample_retriever, k=2)
    with dspy.context(lm=lm), recording() as outer:
        inner(question="first")
        inner(question="second")
        assert current_trace() is outer
    assert outer.lm_calls == 2 and outer.retrieval_calls == 2
    assert [s["step"] for s in outer.steps] == [Retrieve.kind, Answer.kind, Retrieve.kind, Answer.kind]
    assert current_trace() is None


def test_split_sentences_keeps_the_text_and_abbreviations():
    text = "Mr. Smith went to Washington D.C. in 1999. He stayed! Did he leave? No."
    sentences = split_sentences(text)
    assert sentences == ["Mr. Smith went to Washington D.C. in 1999. ", "He stayed! ", "Did he leave? ", "No."]
    assert "".join(sentences) == text
    assert split_sentences("   ") == []


@pytest.mark.parametrize(
    "text, expected",
    [
        ("She was born in 1928. So the answer is: Chief of Protocol.", "Chief of Protocol"),
        ("The answer is 42", "42"),
        ("First, the answer is A. Later we see the final answer is B.", "B"),
        ("Paris.", "Paris"),
    ],
)
def test_final_answer(text, expected):
    assert final_answer(text) == expected
