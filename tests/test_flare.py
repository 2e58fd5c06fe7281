"""FLARE-direct and FLARE-instruct: when they retrieve, what they retrieve with, what they cost."""

import dataclasses
import math
import random
import uuid
import zlib

import dspy
import pytest
import ujson
from click.testing import CliRunner

from arag.cli import main
from arag.data import load_examples
from arag.data.corpus import load_corpus
from arag.errors import ConfigError, QuestionFailed
from arag.lm import TokenLogprob, build_lm
from arag.programs.flare import FLARE, WRITES_PAST_THE_CAP, FLAREInstruct, low_confidence_spans, split_at_search
from arag.programs.frame.active_generation import MARKUP_TOKENS
from arag.programs.frame.sentences import split_sentences
from arag.retrievers import BM25Retriever
from arag.testing import (
    FOUND_FOR,
    OpenAICompatibleServer,
    Scripted,
    ScriptedEngine,
    TemplateRetriever,
    Tokens,
    scripted_lm,
    tokenize,
)
from arag.trace import Sentence, Stop, StopReason, Write, is_step

QUESTION = "Which university did Joe Biden attend?"
# The look-ahead of the masking tests: its probabilities are chosen token by token.
BIDEN = [(" Joe", 0.95), (" Biden", 0.9), (" attended", 0.6), (" the", 0.3), (" University", 0.2), (" of", 0.4),
         (" Pennsylvania", 0.1), (".", 0.9)]
FINAL = ("So the answer is Delaware.", 0.95)


def joined(*values):
    return Tokens([(token.text, token.prob) for value in values for token in value.tokens])


def plan_responder(plan, regenerated=None, questions=None):
    """Writes `plan` (a list of Tokens, or (text, prob) pairs) one sentence per call. Each look-ahead also
    carries the next sentence at probability 0.01, which FLARE must drop. A call whose passages come from
    a retrieval other than the question's gets `regenerated(index)` when that is not None. Questions for spans are
    written as "What is <span>?" and recorded in `questions`."""
    plan = [value if isinstance(value, Tokens) else Scripted(*value) for value in plan]

    def respond(call):
        if call.output_fields == ["question"]:
            questions.append((call.inputs["text"], call.inputs["span"]))
            return {"question": f"What is {call.inputs['span']}?"}
        done = len(split_sentences(call.inputs["answer_so_far"]))
        if done >= len(plan):
            return {"continuation": ""}
        rewrite = regenerated(done) if regenerated else None
        if rewrite and "found for: " + QUESTION not in call.inputs["passages"]:
            return {"continuation": Scripted(rewrite, 1.0)}
        if done + 1 < len(plan):
            return {"continuation": joined(plan[done], Scripted(" " + plan[done + 1].text.strip(), 0.01))}
        return {"continuation": plan[done]}

    return respond


def run_flare(responder, retriever=None, **params):
    lm = scripted_lm(responder)
    retriever = retriever or TemplateRetriever(FOUND_FOR)
    with dspy.context(lm=lm):
        prediction = FLARE(retriever, **params)(question=QUESTION)
    return prediction, lm.engine, retriever


def sentences(prediction):
    return [step for step in prediction.trace if is_step(step, Sentence)]


# --- when to retrieve ----------------------------------------------------------------------------


def test_theta_zero_retrieves_only_at_the_start():
    plan = [("Biden studied history.", 0.05), ("He studied in Newark.", 0.05), ("So the answer is Delaware.", 0.05)]
    prediction, engine, retriever = run_flare(plan_responder(plan), theta=0.0)
    assert retriever.queries == [QUESTION] and prediction.retrieval_calls == 1
    assert [step["retrieved"] for step in sentences(prediction)] == [False, False, False]
    assert engine.count == prediction.lm_calls == 3  # one look-ahead per sentence, nothing rewritten
    assert prediction.long_answer == "Biden studied history. He studied in Newark. So the answer is Delaware."
    assert prediction.answer == "Delaware"


def test_theta_one_retrieves_for_every_sentence():
    plan = [("Biden studied history.", 1.0), ("He studied in Newark.", 1.0), ("So the answer is Delaware.", 1.0)]
    prediction, engine, retriever = run_flare(plan_responder(plan), theta=1.0)
    assert [step["retrieved"] for step in sentences(prediction)] == [True, True, True]
    assert retriever.queries == [QUESTION, "Biden studied history.", "He studied in Newark.",
                                 "So the answer is Delaware."]
    assert engine.count == prediction.lm_calls == 6  # a look-ahead and a rewrite per sentence


def test_an_empty_rewrite_keeps_the_lookahead():
    plan = [("Biden studied history.", 0.3), ("So the answer is Delaware.", 1.0)]
    drafts = plan_responder(plan)

    def responder(call):  # nothing at all from the passages retrieved for the unsure sentence
        retrieved = "found for: " + QUESTION not in call.inputs["passages"]
        return {"continuation": ""} if retrieved and not call.inputs["answer_so_far"] else drafts(call)

    prediction, engine, retriever = run_flare(responder, theta=0.5, beta=0.1)
    first = sentences(prediction)[0]
    assert first["retrieved"] and first["rewrite"] == "empty" and first["text"] == "Biden studied history."
    assert prediction.long_answer == "Biden studied history. So the answer is Delaware."


def test_only_the_first_sentence_of_the_lookahead_decides():
    plan = [("Biden studied history.", 0.9), ("So the answer is Delaware.", 0.9)]
    prediction, engine, retriever = run_flare(plan_responder(plan), theta=0.5)
    assert retriever.queries == [QUESTION]  # the dropped second sentence (probability 0.01) does not count
    assert [(s["lookahead"], s["min_prob"], s["text"]) for s in sentences(prediction)] == [
        ("Biden studied history.", 0.9, "Biden studied history."),
        ("So the answer is Delaware.", 0.9, "So the answer is Delaware."),
    ]
    assert engine.count == 2


def test_a_token_at_exactly_theta_triggers_retrieval():
    plan = [("Biden studied history.", 0.5), FINAL]
    prediction, _, retriever = run_flare(plan_responder(plan), theta=0.5)
    assert [step["retrieved"] for step in sentences(prediction)] == [True, False]


# --- what to retrieve ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "beta, query",
    [
        (0.0, "Joe Biden attended the University of Pennsylvania."),
        (0.4, "Joe Biden attended ."),  # " of" sits exactly at beta and is masked, as in the official code
        (0.92, "Joe"),
    ],
)
def test_masked_query_holds_exactly_the_tokens_above_beta(beta, query):
    prediction, _, retriever = run_flare(plan_responder([Tokens(BIDEN), FINAL]), theta=0.8, beta=beta)
    assert retriever.queries == [QUESTION, query]
    assert sentences(prediction)[0]["queries"] == [query]


def test_a_look_ahead_masked_whole_searches_nothing_and_is_kept():
    prediction, engine, retriever = run_flare(plan_responder([Tokens(BIDEN), FINAL]), theta=0.8, beta=0.99)
    assert retriever.queries == [QUESTION] and prediction.retrieval_calls == 1
    first = sentences(prediction)[0]
    assert first["queries"] == [] and not first["retrieved"] and "masked" in first["skipped"]
    assert first["text"] == "Joe Biden attended the University of Pennsylvania."
    assert engine.count == prediction.lm_calls == 2  # two look-aheads, nothing written again


def test_query_with_question_prepends_the_question():
    _, _, retriever = run_flare(plan_responder([Tokens(BIDEN), FINAL]), query_with_question=True)
    assert retriever.queries == [QUESTION, f"{QUESTION} Joe Biden attended ."]


def test_questions_mode_asks_one_question_per_unsure_term():
    asked = []
    prediction, engine, retriever = run_flare(
        plan_responder([Tokens(BIDEN), FINAL], questions=asked), query_mode="questions", beta=0.3
    )
    lookahead = "Joe Biden attended the University of Pennsylvania."
    # " the" and " University" are two tokens apart from " Pennsylvania": one term, tokens between included
    assert asked == [(lookahead, "the University of Pennsylvania")]
    assert retriever.queries == [QUESTION, "What is the University of Pennsylvania?"]
    step = sentences(prediction)[0]
    assert step["spans"] == ["the University of Pennsylvania"] and step["retrieved"]
    assert step["passage_ids"] == [
        "What is the University of Pennsylvania?#0", "What is the University of Pennsylvania?#1"
    ]
    assert engine.count == prediction.lm_calls == 2 + 1 + 1  # look-aheads + one question + one rewrite


def unsure(*pieces):
    return [TokenLogprob(text, math.log(prob)) for text, prob in pieces]


def test_unsure_terms_are_whole_words_and_far_apart_tokens_make_separate_terms():
    tokens = unsure((" He", 0.9), (" studied", 0.9), (" at", 0.9), (" Penn", 0.1), ("sylvania", 0.9), (" and", 0.9),
                    (" then", 0.9), (" moved", 0.9), (" to", 0.9), (" Wil", 0.9), ("ming", 0.2), ("ton", 0.9),
                    (" in", 0.9), (" 1970", 0.3), (",", 0.1))
    assert low_confidence_spans(tokens, 0.3) == ["Pennsylvania", "Wilmington in 1970,"]
    assert low_confidence_spans(unsure((" a", 0.9), (",", 0.1), (" b", 0.9)), 0.3) == []  # punctuation alone


def test_questions_that_are_not_questions_are_dropped():
    def respond(call):
        if call.output_fields == ["question"]:
            return {"question": "Pennsylvania is a state."}
        return plan_responder([Tokens(BIDEN), FINAL])(call)

    prediction, _, retriever = run_flare(respond, query_mode="questions", beta=0.3)
    lookahead = "Joe Biden attended the University of Pennsylvania."
    assert retriever.queries == [QUESTION, lookahead]  # no question left: the look-ahead is the query
    assert sentences(prediction)[0]["dropped_questions"] == ["Pennsylvania is a state."]


def test_questions_mode_without_a_span_below_beta_queries_with_the_lookahead():
    asked = []
    plan = [("Biden studied history.", 0.6), FINAL]
    prediction, engine, retriever = run_flare(plan_responder(plan, questions=asked), query_mode="questions")
    assert asked == [] and retriever.queries == [QUESTION, "Biden studied history."]
    assert engine.count == 3


# --- the sentence written again, the cost, the end --------------------------------------------------


def test_an_unsure_sentence_is_written_again_from_the_new_passages():
    plan = [("Biden studied history.", 0.5), FINAL]
    seen = []

    rewrite_first = plan_responder(plan, regenerated=lambda index: "Biden studied at Delaware." if index == 0 else None)

    def responder(call):
        seen.append(call.inputs.get("passages"))
        return rewrite_first(call)

    prediction, _, retriever = run_flare(responder)
    first = sentences(prediction)[0]
    assert (first["lookahead"], first["text"]) == ("Biden studied history.", "Biden studied at Delaware.")
    assert first["passage_ids"] == ["Biden studied history.#0", "Biden studied history.#1"]
    assert "found for: Biden studied history." in seen[1] and "found for: " + QUESTION not in seen[1]
    assert seen[2] == seen[1]  # the passages stay in context until the next retrieval
    assert prediction.long_answer == "Biden studied at Delaware. So the answer is Delaware."


def spelled(tokens):
    return "".join(text for text, _ in tokens).strip()


def test_sentence_steps_record_each_token_with_its_probability():
    rewrite = Tokens([(" Biden", 0.97), (" went", 0.8512345), (" to", 0.99), (" Delaware", 0.66667), (".", 0.9)])
    drafts = plan_responder([Tokens(BIDEN), FINAL])

    def responder(call):  # the unsure first sentence is written again, token by token
        retrieved = "found for: " + QUESTION not in call.inputs["passages"]
        return {"continuation": rewrite} if retrieved and not call.inputs["answer_so_far"] else drafts(call)

    prediction, _, _ = run_flare(responder)
    first, last = sentences(prediction)
    # the look-ahead's tokens, without those of the dropped next sentence (probability 0.01)
    assert first["lookahead_tokens"] == [list(pair) for pair in BIDEN]
    assert spelled(first["lookahead_tokens"]) == first["lookahead"]
    assert first["lookahead"] == "Joe Biden attended the University of Pennsylvania."
    assert min(p for _, p in first["lookahead_tokens"]) == first["min_prob"] == 0.1
    # the sentence written after retrieval: its own tokens, rounded as the trace rounds probabilities
    assert first["tokens"] == [[" Biden", 0.97], [" went", 0.8512], [" to", 0.99], [" Delaware", 0.6667], [".", 0.9]]
    assert spelled(first["tokens"]) == first["text"] == "Biden went to Delaware."
    # a kept look-ahead's tokens are recorded once
    assert "tokens" not in last and spelled(last["lookahead_tokens"]) == last["text"] == FINAL[0]
    assert {p for _, p in last["lookahead_tokens"]} == {0.95}


def test_lm_calls_are_lookaheads_plus_rewrites():
    probs = [0.9, 0.5, 0.85, 0.6, 0.95]  # at least beta: the masked query is the whole look-ahead
    plan = [(f"Fact number {n} holds.", p) for n, p in enumerate(probs[:-1])] + [("So the answer is Delaware.", 0.95)]
    prediction, engine, retriever = run_flare(plan_responder(plan), theta=0.8)
    unsure = sum(p <= 0.8 for p in probs)
    assert [step["retrieved"] for step in sentences(prediction)] == [p <= 0.8 for p in probs]
    assert engine.count == prediction.lm_calls == len(probs) + unsure
    assert prediction.retrieval_calls == 1 + unsure


def test_the_answer_ends_when_the_model_ends_it():
    plan = [("Biden studied history.", 0.9), ("He later studied law.", 0.9)]  # long form: no "so the answer is"
    prediction, engine, _ = run_flare(plan_responder(plan))
    assert engine.count == 3  # the third look-ahead comes back empty
    assert prediction.trace[-2] == {"step": Stop.kind, "reason": StopReason.MODEL_ENDED, "pieces": 2,
                                    "tokens": 9}
    assert prediction.long_answer == "Biden studied history. He later studied law."
    assert prediction.answer == "Biden studied history. He later studied law"  # no "so the answer is": all of it


def test_the_answer_ends_when_the_token_budget_is_spent():
    plan = [(f"Fact number {n} holds.", 0.9) for n in range(10)]
    prediction, engine, _ = run_flare(plan_responder(plan), max_tokens=12)
    assert engine.count == 3 and len(sentences(prediction)) == 3  # 5 tokens a sentence
    assert prediction.trace[-2]["reason"] == StopReason.TOKEN_BUDGET


def test_an_endpoint_without_logprobs_gets_a_clear_error():
    class NoLogprobs(ScriptedEngine):
        def complete(self, request):
            return dataclasses.replace(super().complete(request), logprobs=None)

    lm = dspy.LM(f"scripted/{uuid.uuid4().hex}", engine=NoLogprobs(plan_responder([FINAL])))
    with dspy.context(lm=lm), pytest.raises(QuestionFailed, match="LMError in .*log-probabilities"):
        FLARE(TemplateRetriever(FOUND_FOR))(question=QUESTION)


def test_a_raw_completion_model_takes_a_plain_prompt_and_decides_the_same():
    plan = [Scripted(" Biden studied history.", 0.5), Scripted(" He studied law.", 0.9),
            Scripted(" So the answer is Delaware.", 0.9)]
    prompts = []

    def complete(call):
        assert call.raw
        prompts.append(call.prompt)
        done = len(split_sentences(call.prompt.rpartition("Answer:")[2]))
        rest = plan[done:] + [Scripted("\n\nQuestion: an exemplar the stop sequence cuts off", 0.01)]
        return joined(*rest)

    prediction, engine, retriever = run_flare(complete, prompt_style="raw")
    assert [step["retrieved"] for step in sentences(prediction)] == [True, False, False]
    assert [spelled(step["lookahead_tokens"]) for step in sentences(prediction)] == [
        "Biden studied history.", "He studied law.", "So the answer is Delaware."]
    assert [{p for _, p in step["lookahead_tokens"]} for step in sentences(prediction)] == [{0.5}, {0.9}, {0.9}]
    assert retriever.queries == [QUESTION, "Biden studied history."]
    assert prediction.long_answer == "Biden studied history. He studied law. So the answer is Delaware."
    assert engine.count == 4
    assert prompts[0].startswith("Search results, most relevant first:\n[1] About " + QUESTION)
    assert prompts[0].endswith(f"Question: {QUESTION}\nAnswer:")
    assert prompts[-1].endswith("Answer: Biden studied history. He studied law.")


@pytest.mark.parametrize(
    "params, name",
    [({"theta": 1.5}, "theta"), ({"beta": -0.1}, "beta"), ({"query_mode": "both"}, "query_mode"),
     ({"lookahead_tokens": 0}, "lookahead_tokens"), ({"prompt_style": "chat"}, "prompt_style"),
     ({"max_tokens": "many"}, "max_tokens")],
)
def test_bad_parameters_name_themselves(params, name):
    with pytest.raises(ConfigError, match=f"'{name}'"):
        FLARE(TemplateRetriever(FOUND_FOR), **params)


def test_parameters_have_the_official_defaults_and_take_cli_strings():
    assert FLARE(TemplateRetriever(FOUND_FOR)).config == {
        "theta": 0.8, "beta": 0.4, "query_mode": "masked", "query_with_question": False, "k": 2,
        "lookahead_tokens": 64, "max_tokens": 256, "prompt_style": "signature",
    }
    program = FLARE(TemplateRetriever(FOUND_FOR), theta="0.5", query_mode="questions", k="3")
    assert (program.theta, program.query_mode, program.k) == (0.5, "questions", 3)


# --- FLARE-instruct ------------------------------------------------------------------------------


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


# --- on HotpotQA -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built_indexes():
    """BM25 indexes built once per module, by corpus folder."""
    return {}


@pytest.fixture
def hotpot(shared_dataset, built_indexes, tmp_path_factory):
    folder = shared_dataset("hotpotqa")
    if folder not in built_indexes:
        corpus = load_corpus(folder / "corpus.jsonl")
        built_indexes[folder] = BM25Retriever.build(corpus, tmp_path_factory.mktemp("hotpot") / "bm25")
    return folder, built_indexes[folder]


def hotpot_writer(call):
    """A fixed LM that ignores the passages: four sentences per question, with per-token probabilities
    drawn from a generator seeded by the question and the sentence's position."""
    if "continuation" not in call.output_fields:
        return {f: "A follow-up?" if f == "question" else "unused" for f in call.output_fields}
    question, done = call.inputs["question"], len(split_sentences(call.inputs["answer_so_far"]))
    plan = [f"The question is about {question.split()[-1].strip('?')}.", "The first passage names someone.",
            "The second passage connects them.", "So the answer is unknown."]
    if done >= len(plan):
        return {"continuation": ""}
    rng = random.Random(zlib.crc32(f"{question}|{done}".encode()))
    text = plan[done]
    # mostly confident tokens; 0.0005 off the thousandths, so that none sits at a tested theta or rounds onto one
    probs = [round(min(rng.betavariate(5, 1), 0.998), 3) + 0.0005 for _ in tokenize(text)]
    return {"continuation": Scripted(text, probs)}


def test_retrieval_share_grows_with_theta_on_hotpotqa(hotpot):
    folder, index = hotpot
    questions = load_examples(folder / "public.jsonl", limit=24)
    lm = scripted_lm(hotpot_writer)
    shares = []
    for theta in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0):
        program = FLARE(index, theta=theta)
        decisions = []
        with dspy.context(lm=lm):
            for example in questions:
                steps = sentences(program(question=example.question))
                assert [s["retrieved"] for s in steps] == [s["min_prob"] <= theta for s in steps]
                decisions += [s["retrieved"] for s in steps]
        assert len(decisions) == 4 * len(questions)
        shares.append(sum(decisions) / len(decisions))
    assert shares == sorted(shares)
    assert shares[0] == 0.0 and shares[-1] == 1.0 and len(set(shares)) >= 5


def run_eval(program, folder, index, out, server, *params):
    result = CliRunner().invoke(main, [
        "eval", "--program", program, "--dataset", str(folder / "public.jsonl"), "--retriever", str(index.index_dir),
        "--lm", f"openai/loopback-{uuid.uuid4().hex}", "--api-base", server.url, "--limit", "3", "--out", str(out),
        *[arg for param in params for arg in ("--param", param)],
    ], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = [ujson.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and not any("error" in row for row in rows)
    return rows


def test_arag_eval_runs_flare_over_a_loopback_server(hotpot, tmp_path, monkeypatch):
    monkeypatch.setenv("ARAG_HOME", str(tmp_path / "home"))
    folder, index = hotpot
    with OpenAICompatibleServer(hotpot_writer) as server:
        rows = run_eval("flare", folder, index, tmp_path / "flare", server, "theta=0.6", "query_mode=masked")
        chat = [r["body"] for r in server.requests if r["path"].endswith("/chat/completions")]
    assert chat and all(body["logprobs"] is True for body in chat)
    for row in rows:
        steps = [s for s in row["trace"] if is_step(s, Sentence)]
        assert len(steps) == 4 and row["prediction"] == "unknown"
        assert [s["retrieved"] for s in steps] == [s["min_prob"] <= 0.6 for s in steps]
        assert all(spelled(s["lookahead_tokens"]) == s["lookahead"] for s in steps)  # read from the server's logprobs
        assert [min(p for _, p in s["lookahead_tokens"]) for s in steps] == [s["min_prob"] for s in steps]
        assert row["retrieval_calls"] == 1 + sum(s["retrieved"] for s in steps)
        assert row["lm_calls"] == 4 + sum(s["retrieved"] for s in steps)
        assert row["outputs"]["long_answer"].endswith("So the answer is unknown.")
    assert {s["retrieved"] for row in rows for s in row["trace"] if is_step(s, Sentence)} == {True, False}


def test_arag_eval_runs_flare_instruct_over_a_loopback_server(hotpot, tmp_path, monkeypatch):
    monkeypatch.setenv("ARAG_HOME", str(tmp_path / "home"))
    folder, index = hotpot

    def searcher(call):
        if call.inputs["answer_so_far"]:
            return {"continuation": "who was born there. So the answer is unknown."}
        return {"continuation": f"It is about [Search({call.inputs['question'][:30]})] and more"}

    with OpenAICompatibleServer(searcher) as server:
        rows = run_eval("flare-instruct", folder, index, tmp_path / "instruct", server)
    for row in rows:
        writes = [s for s in row["trace"] if is_step(s, Write)]
        assert [w["search"] is not None for w in writes] == [True, False]
        assert row["retrieval_calls"] == 2 and row["lm_calls"] == 2 and row["prediction"] == "unknown"


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
