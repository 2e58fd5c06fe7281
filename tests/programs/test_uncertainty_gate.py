"""The uncertainty gate: each signal computed as its paper or code defines it, the threshold's two ends, TA-ARE's
judgement, and the answer after retrieval being single-rag's."""

import math

import dspy
import pytest

from arag.data import load_corpus, load_examples, sample_paths
from arag.errors import ConfigError
from arag.lm import TokenLogprob
from arag.programs import build_program
from arag.programs.uncertainty_gate.signals import (
    SIGNALS,
    entropy_trend,
    margin,
    max_entropy,
    mean_entropy,
    merge_words,
    min_prob,
    smoothed_second_differences,
)
from arag.programs.uncertainty_gate.steps import Draft, Gate
from arag.programs.uncertainty_gate.uncertainty_gate import ASK_DEMOS, NEVER, UncertaintyGate
from arag.retrievers import BM25Retriever
from arag.testing import FOUND_FOR, StandInModel, TemplateRetriever, Tokens, isolated_cache, no_logprobs_lm, scripted_lm
from arag.trace import Answer, Retrieve, steps_of

QUESTION = "Which river flows through Lyon?"
ALL_SIGNALS = ("ask", *SIGNALS)


def token(text, *probs):
    """A token whose own probability is the first of `probs`, the rest its other top candidates."""
    return TokenLogprob(text, math.log(probs[0]), top=tuple((f"c{i}", math.log(p)) for i, p in enumerate(probs)))


# --- the signals, against hand-computed values ------------------------------------------------------------


def test_token_entropy_is_minus_sum_p_log_p_over_the_top_candidates():
    tokens = [token(" Rh", 0.5, 0.3, 0.2), token("ône", 0.9, 0.1)]
    first = -(0.5 * math.log(0.5) + 0.3 * math.log(0.3) + 0.2 * math.log(0.2))  # 1.0297 nats
    second = -(0.9 * math.log(0.9) + 0.1 * math.log(0.1))  # 0.3251 nats
    assert mean_entropy(tokens, 20).score == pytest.approx((first + second) / 2)
    assert max_entropy(tokens, 20).score == pytest.approx(first)
    assert mean_entropy(tokens, 20).values == pytest.approx([first, second])
    # only the k most likely candidates count
    assert mean_entropy([token(" Rh", 0.5, 0.3, 0.2)], 2).score == pytest.approx(
        -(0.5 * math.log(0.5) + 0.3 * math.log(0.3)))


def test_min_prob_is_one_minus_the_least_token_probability():
    reading = min_prob([token(" The", 0.9, 0.1), token(" Rhône", 0.35, 0.3), token(".", 0.99)], 20)
    assert reading.score == pytest.approx(0.65) and reading.values == pytest.approx([0.9, 0.35, 0.99])


def test_margin_is_the_mean_of_exp_minus_the_top_two_gap():
    # gaps ln(0.6/0.3) = ln 2 and ln(0.8/0.1) = ln 8: exp(-gap) = 1/2 and 1/8
    reading = margin([token(" Rh", 0.6, 0.3, 0.1), token("ône", 0.8, 0.1)], 20)
    assert reading.values == pytest.approx([0.5, 0.125]) and reading.score == pytest.approx(0.3125)
    assert margin([TokenLogprob(".", 0.0, top=((".", 0.0),))], 20).score == 0.0  # all the mass on one candidate
    with pytest.raises(ConfigError, match="'margin' needs the top 2 candidates"):
        margin([TokenLogprob(".", math.log(0.7), top=((".", math.log(0.7)),))], 20)


def test_entropy_trend_smooths_second_differences_as_the_etc_code_does():
    # first differences 1, -1.5, 2.5, -2; second -2.5, 4, -4.5; running means -2.5, 0.75, -1
    smoothed = smoothed_second_differences([1.0, 2.0, 0.5, 3.0, 1.0], [True] * 5)
    first_weight, second_weight = 3.25 / 6.5, 5 / 8.5  # |D_{t-1} - E| / (|D_t - E| + |D_{t-1} - E|)
    assert smoothed == pytest.approx([
        0.0, 0.0,
        -2.5,  # the first: D_{t-1} = 0, weight 1, a = 1
        (0.9 + 0.1 * first_weight) * 4.0 + (0.1 - 0.1 * first_weight) * -2.5,  # 3.675
        (0.9 + 0.1 * second_weight) * -4.5 + (0.1 - 0.1 * second_weight) * 4.0,  # -4.15
    ])
    assert smoothed[3] == pytest.approx(3.675) and smoothed[4] == pytest.approx(-4.15)


def test_entropy_trend_skips_function_words():
    # word 2 is a function word: its entropy 9 counts in no difference
    smoothed = smoothed_second_differences([1.0, 2.0, 9.0, 0.5, 3.0], [True, True, False, True, True])
    assert smoothed[2] == 0.0 and smoothed[3] == pytest.approx(-2.5)  # (0.5 - 2) - (2 - 1)
    assert smoothed[4] == pytest.approx(3.675)  # (3 - 0.5) - (-1.5) = 4, smoothed as above


def test_words_merge_tokens_and_take_their_largest_entropy():
    tokens = [token(" The", 0.99, 0.01), token(" Rh", 0.5, 0.5), token("ône", 0.9, 0.1), token(",", 0.9, 0.1),
              token(" flows", 0.6, 0.4), token(" south", 0.7, 0.3)]
    assert ["".join(t.token for t in word) for word in merge_words(tokens)] == [" The", " Rhône", ",", " flows",
                                                                                 " south"]
    reading = entropy_trend(tokens, 20)
    assert reading.words == ["The", "Rhône", ",", "flows", "south"]
    entropy = {p: -(p * math.log(p) + (1 - p) * math.log(1 - p)) for p in (0.5, 0.6, 0.7)}
    # content words: Rhône (the larger of its two tokens' entropies, ln 2), flows, south; "The" and "," are not
    second = (entropy[0.7] - entropy[0.6]) - (entropy[0.6] - entropy[0.5])
    assert reading.values == pytest.approx([0, 0, 0, 0, second]) and reading.score == pytest.approx(abs(second))


# --- the program on scripted engines -------------------------------------------------------------------------


def draft_responder(draft, asked=None, answered="Rhône", needed=True):
    """The closed-book draft (Tokens), the single-rag answer after retrieval, and TA-ARE's judgement."""

    def respond(call):
        if call.output_fields == ["needs_retrieval"]:
            if asked is not None:
                asked.append(call)
            return {"needs_retrieval": needed}
        if "passages" in call.inputs:
            return {"reasoning": "The passages say so.", "answer": answered}
        return {"answer": draft}

    return respond


def run_gate(responder, lm=None, **params):
    lm = lm or scripted_lm(responder)
    retriever = TemplateRetriever(FOUND_FOR)
    with isolated_cache(enabled=False), dspy.context(lm=lm):
        prediction = UncertaintyGate(retriever, **params)(question=QUESTION)
    return prediction, lm.engine, retriever


UNSURE_DRAFT = Tokens([("Sa", 0.4, {"Rh": 0.35, "Lo": 0.25}), ("ône", 0.9, {"ine": 0.1})])


@pytest.mark.parametrize("signal", SIGNALS)
def test_a_score_at_the_threshold_retrieves_and_the_answer_is_single_rags(signal):
    prediction, engine, retriever = run_gate(draft_responder(UNSURE_DRAFT), signal=signal, threshold=0.0)
    gate = steps_of(prediction, Gate)[0]
    assert gate["signal"] == signal and gate["retrieve"] and gate["score"] >= 0.0
    assert retriever.queries == [QUESTION] and prediction.answer == "Rhône"
    assert engine.count == prediction.lm_calls == 2
    assert "passages" in engine.calls[1].inputs and engine.calls[1].output_fields == ["reasoning", "answer"]
    draft = steps_of(prediction, Draft)[0]
    assert draft["answer"] == "Saône" and [t for t, _ in draft["tokens"]] == ["Sa", "ône"]


@pytest.mark.parametrize("signal", SIGNALS)
def test_below_the_threshold_the_draft_is_the_answer(signal):
    prediction, engine, retriever = run_gate(draft_responder(UNSURE_DRAFT), signal=signal, threshold=NEVER)
    assert not steps_of(prediction, Gate)[0]["retrieve"]
    assert retriever.queries == [] and engine.count == prediction.lm_calls == 1
    assert prediction.answer == "Saône" and steps_of(prediction, Answer)[0]["min_token_prob"] == 0.4


def test_the_signal_reads_only_the_first_draft_tokens():
    draft = Tokens([("Sa", 0.9, {"Rh": 0.1}), ("ône", 0.2, {"ine": 0.8})])
    prediction, _, _ = run_gate(draft_responder(draft), signal="min_prob", threshold=0.5, draft_tokens=1)
    gate = steps_of(prediction, Gate)[0]
    assert gate["values"] == [0.9] and gate["score"] == pytest.approx(0.1) and not gate["retrieve"]


def test_an_empty_draft_retrieves():
    prediction, _, retriever = run_gate(draft_responder(""), signal="margin", threshold=NEVER)
    gate = steps_of(prediction, Gate)[0]
    assert gate["retrieve"] and gate["score"] is None and gate["reason"] == "the draft is empty"
    assert retriever.queries == [QUESTION]


@pytest.mark.parametrize("signal", SIGNALS)
def test_without_log_probabilities_a_signal_that_reads_them_says_so(signal):
    lm = no_logprobs_lm(draft_responder("Saône"))
    with pytest.raises(ConfigError, match=f"signal '{signal}' reads token log-probabilities and the LM gives none"):
        run_gate(None, lm=lm, signal=signal)


@pytest.mark.parametrize("needed", [True, False])
def test_ask_retrieves_when_the_lm_says_the_question_needs_it(needed):
    asked = []
    lm = no_logprobs_lm(draft_responder("Saône", asked, needed=needed))
    prediction, engine, retriever = run_gate(None, lm=lm, today="2024-02-29")
    gate = steps_of(prediction, Gate)[0]
    assert gate == {"step": "gate", "signal": "ask", "score": float(needed), "threshold": 0.5, "retrieve": needed,
                    "needs_retrieval": needed, "today": "2024-02-29"}
    assert retriever.queries == ([QUESTION] if needed else []) and engine.count == prediction.lm_calls == 2
    assert prediction.answer == ("Rhône" if needed else "Saône")
    prompt = asked[0].prompt
    assert asked[0].inputs == {"today": "2024-02-29", "question": QUESTION}
    assert all(question in prompt for question, _ in ASK_DEMOS) and prompt.count("2024-02-29") >= len(ASK_DEMOS) + 1


@pytest.mark.parametrize("signal", ALL_SIGNALS)
def test_the_threshold_reaches_never_and_always_on_the_sample_questions(signal, tmp_path):
    questions, corpus = sample_paths()
    retriever = BM25Retriever.build(load_corpus(corpus), tmp_path / "bm25")
    examples = load_examples(questions)
    lm = scripted_lm(StandInModel())
    for threshold, retrieves in ((0.0, True), (NEVER, False)):
        program = build_program("uncertainty-gate", retriever, signal=signal, threshold=threshold)
        with isolated_cache(enabled=False), dspy.context(lm=lm):
            predictions = [program(question=example.question) for example in examples]
        assert all(prediction.answer for prediction in predictions)
        assert [bool(steps_of(p, Retrieve)) for p in predictions] == [retrieves] * len(examples)
        assert all(p.lm_calls == program.required_lm_calls(p.trace) for p in predictions)


def test_parameters_have_their_defaults_and_ranges():
    program = UncertaintyGate(TemplateRetriever(FOUND_FOR))
    assert program.config == {"signal": "ask", "threshold": 0.5, "draft_tokens": 20, "top_logprobs": 20, "today": "",
                              "k": 5, "reasoning": "cot"}
    assert program.answer_from_passages.k == 5
    for params, name in (({"threshold": 10.5}, "threshold"), ({"signal": "perplexity"}, "signal"),
                         ({"top_logprobs": 1}, "top_logprobs"), ({"today": "29/02/2024"}, "today")):
        with pytest.raises(ConfigError, match=f"'{name}'"):
            UncertaintyGate(TemplateRetriever(FOUND_FOR), **params)
