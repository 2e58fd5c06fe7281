"""FLARE-direct: when it retrieves, what it retrieves with, what it writes again and what it costs."""

import dataclasses
import math
import uuid

import dspy
import pytest

from arag.errors import ConfigError, QuestionFailed
from arag.lm import TokenLogprob
from arag.programs.flare.flare import FLARE, low_confidence_spans
from arag.programs.frame.sentences import split_sentences
from arag.testing import FOUND_FOR, Scripted, ScriptedEngine, TemplateRetriever, Tokens, scripted_lm
from arag.trace import Sentence, Stop, StopReason, is_step

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
