"""Search-o1: the markers parsed as the official code parses them, the search limit and repeat notices, the steps
Reason-in-Documents reads, the \\boxed{} answer, the back-off, and the loop on scripted engines."""

import dspy
import pytest

from arag.data import load_corpus, load_examples, sample_paths
from arag.errors import ConfigError
from arag.programs import build_program
from arag.programs.search_o1.markers import (
    LIMIT_NOTICE,
    REPEAT_NOTICE,
    boxed_answer,
    closed_turn,
    previous_reasoning,
    turn_query,
)
from arag.programs.search_o1.search_o1 import SearchO1
from arag.programs.search_o1.steps import BackOff, Condense, Turn
from arag.retrievers import BM25Retriever
from arag.signatures.reasoning import BEGIN_QUERY, BEGIN_RESULT, END_QUERY, END_RESULT, NOTHING_FOUND
from arag.testing import FOUND_FOR, StandInModel, TemplateRetriever, isolated_cache, scripted_lm
from arag.trace import Answer, Stop, StopReason, steps_of

QUESTION = "Who directed the film in which Ana de Armas played Marilyn Monroe?"


def searching(query, before="I need a fact."):
    """A turn that asks for `query`; the text after the end marker is what the stop sequence cuts off."""
    return f"{before}\n{BEGIN_QUERY}{query}{END_QUERY}\nnever generated"


# --- the markers ------------------------------------------------------------------------------------------


def test_a_turn_stopped_at_the_end_marker_gets_it_back_and_searches_its_last_query():
    cut = f"Step.\n{BEGIN_QUERY}Blonde 2022 film{END_QUERY} seen.\n{BEGIN_QUERY} Blonde director "
    closed = closed_turn(cut)
    assert closed == cut + END_QUERY and turn_query(closed) == "Blonde director"
    assert closed_turn("No search here.") == "No search here." and turn_query("No search here.") is None
    assert turn_query(f"{BEGIN_QUERY}a{END_QUERY} and then more text") is None  # it does not end on the marker
    assert turn_query(closed_turn(f"{BEGIN_QUERY}  ")) is None  # an empty query ends the reasoning


def test_the_boxed_answer_is_the_last_one_read_to_its_matching_brace():
    assert boxed_answer("First \\boxed{A}. Then \\boxed{\\text{Andrew Dominik}}.") == "Andrew Dominik"
    assert boxed_answer("So \\boxed{(Andrew Dominik)}") == "Andrew Dominik"
    assert boxed_answer("\\boxed{f(x) = {1}} and {braces} later") == "f(x) = {1}"  # nested braces kept
    # the official regex runs to the line's last brace: "Dominik} (see {note"
    assert boxed_answer("\\boxed{Dominik} (see {note})") == "Dominik"
    assert boxed_answer("\\boxed{Dominik} then \\boxed{cut off") == "Dominik"
    assert boxed_answer("no answer") is None


def test_reason_in_documents_sees_four_steps_whole():
    reasoning = "A.\n\nB.\nC.\nD."
    assert previous_reasoning(reasoning) == "Step 1: A.\n\nStep 2: B.\n\nStep 3: C.\n\nStep 4: D."


def test_past_four_steps_it_sees_the_first_the_last_three_and_the_marked_ones():
    lines = ["S1", "S2", f"{BEGIN_QUERY}q{END_QUERY}", "S4", "S5", f"{BEGIN_RESULT}r{END_RESULT}", "S7", "S8", "S9",
             "S10"]
    assert previous_reasoning("\n".join(lines)).split("\n\n") == [
        "Step 1: S1", "...", f"Step 3: {BEGIN_QUERY}q{END_QUERY}", "...", f"Step 6: {BEGIN_RESULT}r{END_RESULT}",
        "...", "Step 8: S8", "Step 9: S9", "Step 10: S10"]
    assert previous_reasoning("S1\nS2\nS3\nS4\nS5").split("\n\n") == [
        "Step 1: S1", "...", "Step 3: S3", "Step 4: S4", "Step 5: S5"]


# --- the loop on scripted engines ------------------------------------------------------------------------------


def responder(turns, condensed="Blonde (2022) was directed by Andrew Dominik.", seen=None):
    """Answers the reasoning turn by turn from `turns` (the last repeated), and condenses any documents."""

    def respond(call):
        if call.output_fields == ["reasoning", "final_information"]:
            if seen is not None:
                seen.append(call.inputs)
            return {"reasoning": "Page 1 names the director.", "final_information": condensed}
        if call.output_fields == ["reasoning", "answer"]:
            return {"reasoning": "From memory.", "answer": "Martin Scorsese"}
        done = call.inputs["reasoning_so_far"].count(BEGIN_RESULT)
        return {"next_reasoning": turns[min(done, len(turns) - 1)]}

    return respond


def run_search_o1(respond, **params):
    lm, retriever = scripted_lm(respond), TemplateRetriever(FOUND_FOR)
    with isolated_cache(enabled=False), dspy.context(lm=lm):
        prediction = SearchO1(retriever, **params)(question=QUESTION)
    return prediction, lm.engine, retriever


def test_each_query_is_searched_condensed_and_inserted_and_the_answer_is_boxed():
    seen = []
    turns = [searching("Ana de Armas Marilyn Monroe film"), searching("Blonde 2022 director", "The film is Blonde."),
             "So the director is \\boxed{Andrew Dominik}."]
    prediction, engine, retriever = run_search_o1(responder(turns, seen=seen))
    assert retriever.queries == ["Ana de Armas Marilyn Monroe film", "Blonde 2022 director"]
    assert prediction.answer == "Andrew Dominik"
    assert [(t["turn"], t["query"], t["action"]) for t in steps_of(prediction, Turn)] == [
        (1, "Ana de Armas Marilyn Monroe film", "search"), (2, "Blonde 2022 director", "search"), (3, None, "finished")]
    condensed = steps_of(prediction, Condense)
    assert [c["passage_ids"] for c in condensed] == [[f"Ana de Armas Marilyn Monroe film#{i}" for i in range(10)],
                                                     [f"Blonde 2022 director#{i}" for i in range(10)]]
    assert all(c["result"] == "Blonde (2022) was directed by Andrew Dominik." and not c["found_nothing"]
               for c in condensed)
    # Reason-in-Documents reads the steps, the query and the documents, not the question
    assert set(seen[1]) == {"previous_reasoning", "search_query", "documents"}
    assert seen[1]["search_query"] == "Blonde 2022 director"
    assert seen[1]["previous_reasoning"].endswith(f"Step 5: {BEGIN_QUERY}Blonde 2022 director{END_QUERY}")
    result = f"\n\n{BEGIN_RESULT}Blonde (2022) was directed by Andrew Dominik.{END_RESULT}\n\n"
    assert prediction.reasoning == (f"I need a fact.\n{BEGIN_QUERY}Ana de Armas Marilyn Monroe film{END_QUERY}{result}"
                                    f"The film is Blonde.\n{BEGIN_QUERY}Blonde 2022 director{END_QUERY}{result}"
                                    "So the director is \\boxed{Andrew Dominik}.")
    assert "never generated" not in prediction.reasoning
    assert steps_of(prediction, Stop) == [{"step": "stop", "reason": StopReason.FINAL_ANSWER, "searches": 2,
                                           "iterations": 3}]
    assert engine.count == prediction.lm_calls == prediction_required(prediction) == 3 + 2


def prediction_required(prediction):
    return SearchO1(TemplateRetriever(FOUND_FOR)).required_lm_calls(prediction.trace)


def test_past_the_search_limit_a_query_gets_a_notice_and_the_turn_limit_stops_the_reasoning():
    turns = [searching(f"query {n}") for n in range(1, 6)]

    def respond(call):
        if call.output_fields == ["next_reasoning"]:
            done = call.inputs["reasoning_so_far"].count(BEGIN_QUERY)
            return {"next_reasoning": turns[min(done, len(turns) - 1)]}
        return responder([])(call)

    prediction, engine, retriever = run_search_o1(respond, max_searches=2, max_turns=4)
    assert retriever.queries == ["query 1", "query 2"]  # no third search
    assert [t["action"] for t in steps_of(prediction, Turn)] == ["search", "search", "limit_notice", "limit_notice"]
    assert prediction.reasoning.count(LIMIT_NOTICE) == 2
    assert steps_of(prediction, Stop)[0]["reason"] == StopReason.STEP_LIMIT
    # no \boxed{} answer: the back-off answers by reasoning without retrieval
    assert steps_of(prediction, BackOff) and prediction.answer == "Martin Scorsese"
    assert engine.count == prediction.lm_calls == prediction_required(prediction) == 4 + 2 + 1


def test_a_repeated_query_gets_a_notice_instead_of_a_search():
    turns = [searching("Blonde director"), searching("Blonde director"), "\\boxed{Andrew Dominik}"]

    def respond(call):
        if call.output_fields == ["next_reasoning"]:
            done = call.inputs["reasoning_so_far"].count(BEGIN_RESULT)
            return {"next_reasoning": turns[min(done, 2)]}
        return responder([])(call)

    prediction, _, retriever = run_search_o1(respond)
    assert retriever.queries == ["Blonde director"]
    assert [t["action"] for t in steps_of(prediction, Turn)] == ["search", "repeat_notice", "finished"]
    assert REPEAT_NOTICE in prediction.reasoning and prediction.answer == "Andrew Dominik"


def test_documents_with_nothing_useful_give_the_fixed_sentence():
    prediction, _, _ = run_search_o1(responder([searching("q"), "\\boxed{x}"], condensed=""))
    condensed = steps_of(prediction, Condense)[0]
    assert condensed["result"] == NOTHING_FOUND and condensed["found_nothing"]
    assert f"{BEGIN_RESULT}{NOTHING_FOUND}{END_RESULT}" in prediction.reasoning


def test_without_a_search_or_an_answer_the_reasoning_ends_and_backs_off_unless_told_not_to():
    prediction, engine, retriever = run_search_o1(responder(["I am not sure."]), back_off=False)
    assert retriever.queries == [] and steps_of(prediction, Stop)[0]["reason"] == StopReason.MODEL_ENDED
    assert prediction.answer == "" and not steps_of(prediction, BackOff) and engine.count == 1
    assert steps_of(prediction, Answer) == [{"step": "answer", "answer": ""}]


def test_a_raw_completion_model_continues_the_prompt_with_the_reasoning():
    prompts = []

    def complete(call):
        assert call.raw
        prompts.append(call.prompt)
        if BEGIN_RESULT not in call.prompt.partition("Reasoning:\n")[2]:
            return f" Let me search.\n{BEGIN_QUERY}Blonde director{END_QUERY}\nQuestion: cut off"
        return "So \\boxed{Andrew Dominik}."

    def respond(call):
        return complete(call) if call.raw else responder([])(call)

    prediction, engine, retriever = run_search_o1(respond, prompt_style="raw", max_searches=3)
    assert retriever.queries == ["Blonde director"] and prediction.answer == "Andrew Dominik"
    assert prompts[0].endswith(f"Question: {QUESTION}\n\nReasoning:\n") and "at most 3 times" in prompts[0]
    assert prompts[1].endswith(f"Reasoning:\n Let me search.\n{BEGIN_QUERY}Blonde director{END_QUERY}\n\n"
                               f"{BEGIN_RESULT}Blonde (2022) was directed by Andrew Dominik.{END_RESULT}\n\n")
    assert engine.count == prediction.lm_calls == 3


def test_the_sample_questions_are_answered_on_the_stand_in(tmp_path):
    questions, corpus = sample_paths()
    retriever = BM25Retriever.build(load_corpus(corpus), tmp_path / "bm25")
    program = build_program("search-o1", retriever)
    with isolated_cache(enabled=False), dspy.context(lm=scripted_lm(StandInModel())):
        predictions = [program(question=example.question) for example in load_examples(questions)]
    assert all(p.answer and p.retrieval_calls == 1 for p in predictions)
    assert all(p.lm_calls == program.required_lm_calls(p.trace) == 3 for p in predictions)


def test_parameters_have_the_official_defaults():
    assert SearchO1(TemplateRetriever(FOUND_FOR)).config == {
        "max_searches": 10, "max_turns": 15, "k": 10, "max_tokens": 8192, "prompt_style": "signature",
        "back_off": True}
    with pytest.raises(ConfigError, match="'max_turns'"):
        SearchO1(TemplateRetriever(FOUND_FOR), max_turns=0)
