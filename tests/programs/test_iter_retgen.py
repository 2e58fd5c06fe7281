"""Iter-RetGen: T rounds of retrieval with the previous generation and the question, each followed by a generation."""

import json

import dspy
import pytest

from arag.errors import ConfigError, QuestionFailed
from arag.programs.frame.registry import build_program, get_program
from arag.programs.iter_retgen import IterRetGen, generation_text, retrieval_query
from arag.testing import FOUND_FOR, GARBAGE_TEXT, TemplateRetriever, scripted_lm
from arag.trace import Answer, Generate, Retrieve, kinds_of, steps_of

QUESTION = "Which river runs through the city where Ada was born?"


class Script:
    """Generation t reasons "read <the first passage's text>" and answers "answer t"; `garbage_at` gives
    unreadable output at that generation."""

    def __init__(self, garbage_at=None):
        self.garbage_at = garbage_at
        self.generations = 0

    def __call__(self, call):
        self.generations += 1
        if self.generations == self.garbage_at:
            return GARBAGE_TEXT
        first = json.loads(call.inputs["passages"])[0]
        fields = {"answer": f"answer {self.generations}"}
        if "reasoning" in call.output_fields:
            fields = {"reasoning": f"read {first.split(' | ', 1)[1]}", **fields}
        return fields


def run(retriever=None, script=None, **params):
    retriever = retriever or TemplateRetriever(FOUND_FOR)
    script = script or Script()
    lm = scripted_lm(script)
    with dspy.context(lm=lm):
        prediction = IterRetGen(retriever, **params)(question=QUESTION)
    return prediction, lm, retriever


# --- parameters ---------------------------------------------------------------------------------


def test_defaults_and_the_tuned_parameter():
    program = IterRetGen(TemplateRetriever())
    assert (program.iterations, program.k, program.reasoning) == (2, 5, "cot")
    declared = {p.name: p for p in get_program("iter-retgen").params}
    assert declared["iterations"].searched and declared["iterations"].search_range == (1, 4)
    assert not declared["k"].searched
    assert program.follows


def test_each_iteration_reads_the_top_5_paragraphs_of_the_papers_section_4_4():
    prediction, lm, _ = run()
    assert [step["k"] for step in steps_of(prediction, Retrieve)] == [5, 5]
    assert [len(json.loads(call.inputs["passages"])) for call in lm.engine.calls] == [5, 5]
    declared = {p.name: p for p in get_program("iter-retgen").params}
    assert "4.4" in declared["k"].help and "4.4" in IterRetGen.follows


def test_cli_strings_are_coerced_and_bad_values_name_the_parameter():
    program = build_program("iter-retgen", TemplateRetriever(), iterations="3", k="4", reasoning="direct")
    assert (program.iterations, program.k, program.reasoning) == (3, 4, "direct")
    for bad, name in [({"iterations": 0}, "iterations"), ({"iterations": 8}, "iterations"),
                      ({"iterations": "many"}, "iterations"), ({"k": 0}, "k"), ({"reasoning": "deep"}, "reasoning"),
                      ({"rounds": 2}, "rounds")]:
        with pytest.raises(ConfigError, match=name):
            IterRetGen(TemplateRetriever(), **bad)
    with pytest.raises(ConfigError, match="needs a retriever"):
        IterRetGen()


# --- the loop ------------------------------------------------------------------------------------


def test_three_iterations_retrieve_with_the_previous_generation_then_the_question():
    prediction, lm, retriever = run(iterations=3, k=2)
    y1 = f"read Passage 0 found for: {QUESTION} answer 1"
    y2 = f"read Passage 0 found for: {y1}\n{QUESTION} answer 2"
    assert retriever.queries == [QUESTION, f"{y1}\n{QUESTION}", f"{y2}\n{QUESTION}"]
    assert lm.engine.count == prediction.lm_calls == 3
    assert prediction.retrieval_calls == 3
    # Each generation reads only its own retrieval's passages.
    for call, query in zip(lm.engine.calls, retriever.queries):
        assert json.loads(call.inputs["passages"]) == [f"[{r + 1}] About {query} | Passage {r} found for: {query}"
                                                       for r in range(2)]
        assert call.inputs["question"] == QUESTION
    generations = steps_of(prediction, Generate)
    assert [g["iteration"] for g in generations] == [1, 2, 3]
    assert [g["query"] for g in generations] == retriever.queries
    assert [g["answer"] for g in generations] == ["answer 1", "answer 2", "answer 3"]
    assert [g["passage_ids"] for g in generations] == [[f"{q}#0", f"{q}#1"] for q in retriever.queries]
    assert prediction.answer == "answer 3" and steps_of(prediction, Answer)[0]["answer"] == "answer 3"
    assert [s["why"] for s in steps_of(prediction, Retrieve)][0] == "question"
    assert kinds_of(prediction) == [Retrieve, Generate] * 3 + [Answer]


@pytest.mark.parametrize("iterations", [1, 2, 5])
def test_calls_and_retrievals_equal_the_iterations(iterations):
    prediction, lm, retriever = run(iterations=iterations, k=1)
    assert lm.engine.count == len(retriever.queries) == iterations
    assert prediction.answer == f"answer {iterations}"


def test_the_default_runs_two_iterations():
    prediction, lm, retriever = run()
    assert lm.engine.count == 2 and len(retriever.queries) == 2
    assert retriever.queries[1].endswith(f"\n{QUESTION}") and retriever.queries[1] != QUESTION


def test_direct_generation_carries_the_answer_alone_into_the_next_query():
    prediction, lm, retriever = run(iterations=2, reasoning="direct")
    assert retriever.queries == [QUESTION, f"answer 1\n{QUESTION}"]
    assert lm.engine.calls[0].output_fields == ["answer"]
    assert prediction.generation == "answer 2"


def test_an_unreadable_generation_fails_the_question_without_a_retry():
    with pytest.raises(QuestionFailed, match="generate") as failure:
        run(script=Script(garbage_at=2), iterations=3)
    assert failure.value.counts["lm_calls"] == 2
    assert [s["step"] for s in failure.value.trace] == [Retrieve.kind, Generate.kind, Retrieve.kind]


def test_query_and_generation_helpers():
    assert retrieval_query("q?", "") == retrieval_query("q?", "  ") == "q?"
    assert retrieval_query("q?", " y ") == "y\nq?"
    assert generation_text(dspy.Prediction(reasoning=" because ", answer="Paris")) == "because Paris"
    assert generation_text(dspy.Prediction(answer="Paris")) == "Paris"
    assert generation_text(dspy.Prediction(reasoning="", answer="")) == ""
