"""FLARE-instruct: it writes until it asks to search, retrieves for its query and writes on; the search cap,
the marker's parsing, and the logit bias for the marker and against it after a search."""

import uuid

import dspy
import pytest
from test_flare import QUESTION

from arag.errors import ConfigError
from arag.lm import build_lm
from arag.programs.flare.flare import WRITES_PAST_THE_CAP, FLAREInstruct, split_at_search
from arag.programs.frame.active_generation import MARKUP_TOKENS
from arag.testing import FOUND_FOR, OpenAICompatibleServer, TemplateRetriever, scripted_lm
from arag.trace import Stop, StopReason, Write, is_step


def instruct_responder(first, then, seen):
    def respond(call):
        seen.append(call.inputs)
        return {"continuation": first if not call.inputs["answer_so_far"] else then}

    return respond


def run_instruct(responder, **params):
    lm, retriever = scripted_lm(responder), TemplateRetriever(FOUND_FOR)
    with dspy.context(lm=lm):
        prediction = FLAREInstruct(retriever, **params)(question=QUESTION)
    return prediction, lm.engine, retriever


def test_instruct_stops_at_the_search_marker_retrieves_and_continues():
    seen = []
    responder = instruct_responder(
        "Biden went to [Search(Joe Biden university)] and this text is never generated.",
        "the University of Delaware. So the answer is Delaware.", seen,
    )
    prediction, engine, retriever = run_instruct(responder)
    assert retriever.queries == [QUESTION, "Joe Biden university"]
    assert engine.count == prediction.lm_calls == 2  # one call per search, plus the last
    assert "found for: Joe Biden university" in seen[1]["passages"]
    assert "found for: " + QUESTION not in seen[1]["passages"]
    assert [inputs["searches_left"] for inputs in seen] == ["3", "2"]
    assert prediction.long_answer == "Biden went to the University of Delaware. So the answer is Delaware."
    assert prediction.answer == "Delaware"
    writes = [step for step in prediction.trace if is_step(step, Write)]
    assert [(w["text"], w["search"]) for w in writes] == [("Biden went to", "Joe Biden university"),
                                                         ("the University of Delaware. So the answer is Delaware.",
                                                          None)]


def test_instruct_writes_on_without_searching_once_the_cap_is_reached():
    seen = []

    def respond(call):
        seen.append(call.inputs)
        replies = {"2": "He went to [Search(Biden college)]", "1": "and [Search(Biden college again)]",
                   "0": "and [Search(one more)]" if len(seen) == 3 else "Delaware. So the answer is Delaware."}
        return {"continuation": replies[call.inputs["searches_left"]]}

    prediction, engine, retriever = run_instruct(respond, max_searches=2)
    assert retriever.queries == [QUESTION, "Biden college", "Biden college again"]  # no third search
    assert [inputs["searches_left"] for inputs in seen] == ["2", "1", "0", "0"] and engine.count == 4
    assert prediction.trace[-2] == {"step": Stop.kind, "reason": StopReason.MODEL_ENDED, "searches": 2}
    assert prediction.long_answer == "He went to and and Delaware. So the answer is Delaware."
    assert prediction.answer == "Delaware"


def test_instruct_stops_a_model_that_keeps_searching_past_the_cap():
    seen = []
    responder = instruct_responder("He went to [Search(Biden college)]", "and [Search(Biden college again)]", seen)
    prediction, engine, retriever = run_instruct(responder, max_searches=1)
    assert retriever.queries == [QUESTION, "Biden college"]
    assert engine.count == 2 + WRITES_PAST_THE_CAP
    assert prediction.trace[-2]["reason"] == StopReason.SEARCH_CAP


def test_split_at_search_drops_whatever_follows_the_marker():
    assert split_at_search("Red is for [Search(Ghana flag red)] the blood") == ("Red is for", "Ghana flag red")
    assert split_at_search("Red is for [Search(Ghana flag red") == ("Red is for", "Ghana flag red")
    assert split_at_search("No search here.") == ("No search here.", None)


def test_a_search_query_keeps_its_parentheses():
    assert split_at_search("It was [Search(Hypocrite (film) director)] who") == ("It was", "Hypocrite (film) director")
    # generation stops at ")]", so the marker arrives unclosed
    assert split_at_search("It was [Search(Hypocrite (film) director") == ("It was", "Hypocrite (film) director")


def test_instruct_sends_logit_bias_only_when_set():
    def responder(call):
        return {"continuation": "So the answer is Delaware."}

    with OpenAICompatibleServer(responder) as server:
        lm = build_lm(f"openai/loopback-{uuid.uuid4().hex}", api_base=server.url)
        with dspy.context(lm=lm):
            FLAREInstruct(TemplateRetriever(FOUND_FOR), search_logit_bias="58:2, 1234:-1.5")(question=QUESTION)
            FLAREInstruct(TemplateRetriever(FOUND_FOR))(question="Another question?")
    biased, plain = (request["body"] for request in server.requests)
    assert biased["logit_bias"] == {"58": 2.0, "1234": -1.5} and "logit_bias" not in plain
    assert biased["stop"] == plain["stop"] == [")]"]


@pytest.mark.parametrize("spec", ["58", "x:2", "58:300", "58:2,:1"])
def test_instruct_refuses_a_malformed_logit_bias(spec):
    with pytest.raises(ConfigError, match="'search_logit_bias'"):
        FLAREInstruct(TemplateRetriever(FOUND_FOR), search_logit_bias=spec)


def test_instruct_forbids_the_search_marker_for_the_first_tokens_after_a_search():
    def responder(call):
        if call.inputs["answer_so_far"] == "":
            return {"continuation": "Biden went to [Search(Joe Biden university)]"}
        if call.inputs["answer_so_far"] == "Biden went to":
            return {"continuation": "the University of Dela"}  # cut inside a word by the token budget
        return {"continuation": "Delaware. So the answer is Delaware."}

    with OpenAICompatibleServer(responder) as server:
        lm = build_lm(f"openai/loopback-{uuid.uuid4().hex}", api_base=server.url)
        with dspy.context(lm=lm):
            prediction = FLAREInstruct(TemplateRetriever(FOUND_FOR), forbid_after_search=6, search_token_ids="58, 510",
                                       search_logit_bias="58:2")(question=QUESTION)
    bodies = [request["body"] for request in server.requests]
    assert [b["logit_bias"] for b in bodies] == [{"58": 2.0}, {"58": -100.0, "510": -100.0}, {"58": 2.0}]
    assert bodies[1]["max_tokens"] == 6 + MARKUP_TOKENS  # six tokens of text, and the output's markup
    assert prediction.long_answer == "Biden went to the University of Delaware. So the answer is Delaware."


def test_forbidding_the_marker_needs_its_token_ids():
    with pytest.raises(ConfigError, match="'search_token_ids'"):
        FLAREInstruct(TemplateRetriever(FOUND_FOR), forbid_after_search=4)
    with pytest.raises(ConfigError, match="'search_token_ids'"):
        FLAREInstruct(TemplateRetriever(FOUND_FOR), forbid_after_search=4, search_token_ids="[")
