"""SuRe: candidates, a summary per candidate, validity and both-order pair-wise ranking, the argmax chosen."""

import json

import dspy
import pytest

from arag.errors import ConfigError
from arag.programs.frame.registry import build_program, get_program
from arag.programs.sure.steps import Candidates, Pair, Select, Validity
from arag.programs.sure.sure import SuRe, best, distinct_candidates
from arag.testing import GARBAGE_TEXT, TemplateRetriever, Tokens, scripted_lm
from arag.trace import Answer, Unreadable, is_step, steps_of

QUESTION = "Which city hosted the 1900 Summer Olympics?"
GARBAGE = object()


def summary_of(candidate):
    return f"The passages point to {candidate}."


def candidate_in(summary):
    return summary.removeprefix("The passages point to ").removesuffix(".")


class Script:
    """A scripted SuRe model.

    `proposed`: the candidates, one per candidate field (blank for the fields beyond them). `supports`:
    candidate -> True/False, a probability of True (given as token log-probabilities), or GARBAGE.
    `prefer(first, second)`: the candidate the ranking call picks when shown the summaries of `first` then
    `second` (GARBAGE: unreadable); by default the one earlier in `order`.
    """

    def __init__(self, proposed=("Paris", "Lyon"), supports=None, prefer=None, order=None):
        self.proposed = list(proposed)
        self.supports = supports or {}
        self.order = order
        self.prefer = prefer or self.by_order

    def by_order(self, first, second):
        order = self.order or self.proposed
        return first if order.index(first) < order.index(second) else second

    def __call__(self, call):
        fields = call.output_fields
        if fields[0] == "candidate_1":
            padded = self.proposed + [""] * len(fields)
            return dict(zip(fields, padded))
        if fields == ["supporting_summary"]:
            return {"supporting_summary": summary_of(call.inputs["chosen_candidate"])}
        if fields == ["supports_candidate"]:
            verdict = self.supports.get(call.inputs["candidate"], True)
            if verdict is GARBAGE:
                return GARBAGE_TEXT
            if isinstance(verdict, float):
                chosen, other = ("true", "false") if verdict >= 0.5 else ("false", "true")
                p = verdict if verdict >= 0.5 else 1 - verdict
                return {"supports_candidate": Tokens([(chosen, p, {other: 1 - p})])}
            return {"supports_candidate": verdict}
        if fields == ["more_informative"]:
            first, second = candidate_in(call.inputs["summary_1"]), candidate_in(call.inputs["summary_2"])
            winner = self.prefer(first, second)
            if winner is GARBAGE:
                return GARBAGE_TEXT
            return {"more_informative": "1" if winner == first else "2"}
        raise AssertionError(f"unexpected call {fields}")


def run(script, lm_kwargs=None, **params):
    retriever = TemplateRetriever()
    lm = scripted_lm(script, **(lm_kwargs or {}))
    with dspy.context(lm=lm):
        prediction = SuRe(retriever, **params)(question=QUESTION)
    return prediction, lm, retriever


def kinds(lm):
    return [call.output_fields[0] for call in lm.engine.calls]


# --- parameters ---------------------------------------------------------------------------------


def test_defaults_are_the_papers_and_the_number_of_candidates_is_tuned():
    program = SuRe(TemplateRetriever())
    assert (program.k, program.candidates, program.validity_score) == (10, 2, "binary")
    declared = {p.name: p for p in get_program("sure").params}
    assert declared["candidates"].searched and declared["candidates"].search_range == (2, 4)
    assert program.follows


def test_cli_strings_are_coerced_and_bad_values_name_the_parameter():
    program = build_program("sure", TemplateRetriever(), k="5", candidates="3")
    assert (program.k, program.candidates) == (5, 3)
    for bad, name in [({"candidates": 1}, "candidates"), ({"candidates": 6}, "candidates"),
                      ({"candidates": "two"}, "candidates"), ({"k": 0}, "k"), ({"reasoning": "cot"}, "reasoning"),
                      ({"validity_score": "p"}, "validity_score")]:
        with pytest.raises(ConfigError, match=name):
            SuRe(TemplateRetriever(), **bad)


# --- the algorithm with K = 2 ---------------------------------------------------------------------


def test_two_candidates_make_seven_calls_in_the_papers_order():
    prediction, lm, retriever = run(Script(order=["Lyon", "Paris"]))
    assert kinds(lm) == ["candidate_1"] + ["supporting_summary"] * 2 + ["supports_candidate"] * 2 \
        + ["more_informative"] * 2
    assert lm.engine.count == prediction.lm_calls == 7
    assert retriever.queries == [QUESTION] and prediction.distinct_passages == 10
    propose, s1, s2, v1, v2, c1, c2 = lm.engine.calls
    assert len(json.loads(propose.inputs["passages"])) == 10 and propose.inputs["question"] == QUESTION
    assert propose.output_fields == ["candidate_1", "candidate_2"]
    for call, candidate in ((s1, "Paris"), (s2, "Lyon")):
        assert call.inputs["chosen_candidate"] == candidate
        assert json.loads(call.inputs["candidates"]) == ["Paris", "Lyon"]
        assert call.inputs["passages"] == propose.inputs["passages"]
    assert (v1.inputs["candidate"], v1.inputs["summary"]) == ("Paris", summary_of("Paris"))
    assert "passages" not in v1.inputs
    # Both orders of the pair: position bias cancels.
    assert (c1.inputs["summary_1"], c1.inputs["summary_2"]) == (summary_of("Paris"), summary_of("Lyon"))
    assert (c2.inputs["summary_1"], c2.inputs["summary_2"]) == (summary_of("Lyon"), summary_of("Paris"))
    # Both valid; Lyon's summary wins both orders: ranking decides.
    (select,) = steps_of(prediction, Select)
    assert select["validity"] == [1.0, 1.0] and select["ranking"] == [0.0, 1.0] and select["scores"] == [1.0, 2.0]
    assert prediction.answer == "Lyon" and select["chosen"] == "Lyon" and select["tie"] is False
    assert steps_of(prediction, Pair)[0]["winners"] == [1, 1]
    assert prediction.summary == summary_of("Lyon") and is_step(prediction.trace[-1], Answer)


def test_validity_decides_when_the_ranking_contradicts_itself():
    always_first = Script(supports={"Paris": False, "Lyon": True}, prefer=lambda first, second: first)
    prediction, lm, _ = run(always_first)
    (select,) = steps_of(prediction, Select)
    assert select["ranking"] == [0.5, 0.5] and select["validity"] == [0.0, 1.0]
    assert prediction.answer == "Lyon" and lm.engine.count == 7


def test_a_ranking_win_outweighs_nothing_when_only_the_other_summary_is_valid():
    # Paris wins both orders (1 point) but is judged unsupported; Lyon is supported (1 point): a tie.
    prediction, _, _ = run(Script(supports={"Paris": False}, order=["Paris", "Lyon"]))
    (select,) = steps_of(prediction, Select)
    assert select["scores"] == [1.0, 1.0] and select["tie"] is True
    assert prediction.answer == "Paris"


def test_a_tie_goes_to_the_first_candidate():
    prediction, _, _ = run(Script(proposed=["Lyon", "Paris"], prefer=lambda first, second: second))
    (select,) = steps_of(prediction, Select)
    assert select["scores"] == [1.5, 1.5] and select["tie"] is True
    assert prediction.answer == "Lyon" and select["chosen_index"] == 0


def test_validity_is_the_papers_binary_judgement_even_with_log_probabilities():
    # Both summaries judged True, with p(True) 0.9 and 0.6: each counts 1, and the ranking decides (Lyon wins both).
    script = Script(supports={"Paris": 0.9, "Lyon": 0.6}, prefer=lambda first, second: "Lyon")
    prediction, _, _ = run(script, lm_kwargs={"logprobs": True, "top_logprobs": 5})
    validity = steps_of(prediction, Validity)
    assert [(v["validity"], v["p_supports"]) for v in validity] == [(1.0, pytest.approx(0.9, abs=1e-4)),
                                                                    (1.0, pytest.approx(0.6, abs=1e-4))]
    assert steps_of(prediction, Select)[0]["scores"] == [1.0, 2.0] and prediction.answer == "Lyon"


@pytest.mark.parametrize(("p_paris", "p_lyon", "expected"), [(0.9, 0.6, "Paris"), (0.55, 0.8, "Lyon")])
def test_validity_score_probability_is_p_true_when_log_probabilities_exist(p_paris, p_lyon, expected):
    script = Script(supports={"Paris": p_paris, "Lyon": p_lyon}, prefer=lambda first, second: first)
    prediction, lm, _ = run(script, lm_kwargs={"logprobs": True, "top_logprobs": 5}, validity_score="probability")
    validity = steps_of(prediction, Validity)
    assert [v["p_supports"] for v in validity] == pytest.approx([p_paris, p_lyon], abs=1e-4)
    assert steps_of(prediction, Select)[0]["scores"] == pytest.approx([p_paris + 0.5, p_lyon + 0.5], abs=1e-4)
    assert prediction.answer == expected and lm.engine.count == 7


def test_without_log_probabilities_the_label_counts():
    prediction, _, _ = run(Script(supports={"Paris": 0.9, "Lyon": 0.3}, prefer=lambda first, second: first),
                           validity_score="probability")
    validity = steps_of(prediction, Validity)
    assert [(v["supports"], v["validity"]) for v in validity] == [(True, 1.0), (False, 0.0)]
    assert all("p_supports" not in v for v in validity)
    assert prediction.answer == "Paris"


# --- unreadable judgements ------------------------------------------------------------------------


def test_an_unreadable_validity_judgement_counts_zero_and_is_not_retried():
    prediction, lm, _ = run(Script(supports={"Paris": GARBAGE}, prefer=lambda first, second: first))
    assert lm.engine.count == 7
    (unreadable,) = steps_of(prediction, Unreadable)
    assert unreadable["signature"] == "JudgeSummarySupport"
    assert steps_of(prediction, Validity)[0] == {"step": Validity.kind, "candidate_index": 0, "candidate": "Paris",
                                                "supports": None, "validity": 0.0}
    assert prediction.answer == "Lyon"


def test_an_unreadable_order_leaves_the_decision_to_the_other_one():
    def prefer(first, second):
        return GARBAGE if first == "Paris" else second  # Lyon first: picks Paris

    prediction, lm, _ = run(Script(prefer=prefer))
    assert lm.engine.count == 7 and len(steps_of(prediction, Unreadable)) == 1
    (pair,) = steps_of(prediction, Pair)
    assert pair["winners"] == [None, 0] and pair["share"] == [1.0, 0.0]
    assert prediction.answer == "Paris"


def test_a_pair_with_both_orders_unreadable_splits_evenly():
    prediction, lm, _ = run(Script(proposed=["Paris", "Lyon"], supports={"Paris": False},
                                   prefer=lambda first, second: GARBAGE))
    assert lm.engine.count == 7 and len(steps_of(prediction, Unreadable)) == 2
    assert steps_of(prediction, Select)[0]["ranking"] == [0.5, 0.5]
    assert prediction.answer == "Lyon"


# --- more candidates, and candidates that collapse ------------------------------------------------


def test_three_candidates_rank_every_pair_in_both_orders():
    prediction, lm, _ = run(Script(proposed=["Paris", "Lyon", "Nice"], order=["Nice", "Lyon", "Paris"],
                                   supports={"Nice": False}), candidates=3)
    assert lm.engine.count == 1 + 3 + 3 + 6
    assert [p["candidate_indices"] for p in steps_of(prediction, Pair)] == [[0, 1], [0, 2], [1, 2]]
    (select,) = steps_of(prediction, Select)
    assert select["ranking"] == [0.0, 0.5, 1.0]  # points over the K-1 = 2 pairs each summary is in
    assert select["scores"] == [1.0, 1.5, 1.0]
    assert prediction.answer == "Lyon"


@pytest.mark.parametrize("k", [2, 3, 5])
def test_the_candidates_call_asks_for_k_candidates(k):
    prediction, lm, _ = run(Script(proposed=["Paris", "Lyon", "Nice", "Lille", "Lens"][:k]), candidates=k)
    assert lm.engine.calls[0].output_fields == [f"candidate_{n}" for n in range(1, k + 1)]
    assert steps_of(prediction, Candidates)[0]["proposed"] == ["Paris", "Lyon", "Nice", "Lille", "Lens"][:k]
    assert lm.engine.count == 1 + 2 * k + k * (k - 1)


@pytest.mark.parametrize(("proposed", "k"), [(["Paris", " paris. ", ""], 3), (["Paris"], 2)])
def test_one_distinct_candidate_is_the_answer_without_further_calls(proposed, k):
    prediction, lm, _ = run(Script(proposed=proposed), candidates=k)
    assert lm.engine.count == prediction.lm_calls == 1
    assert prediction.answer == "Paris"
    assert steps_of(prediction, Select) == [{"step": Select.kind, "reason": "one candidate", "chosen": "Paris"}]


def test_duplicates_leave_the_distinct_candidates_to_be_compared():
    prediction, lm, _ = run(Script(proposed=["Paris", "PARIS", "Lyon"]), candidates=3)
    assert steps_of(prediction, Candidates)[0]["candidates"] == ["Paris", "Lyon"]
    assert lm.engine.count == 1 + 2 + 2 + 2


def test_no_candidate_gives_an_empty_answer():
    prediction, lm, _ = run(Script(proposed=[" ", "?"]))
    assert prediction.answer == "" and lm.engine.count == 1
    assert steps_of(prediction, Select)[0]["reason"] == "no candidate"


def test_helpers():
    assert distinct_candidates([" A ", "a!", "B", "", "C"], 2) == ["A", "B"]
    assert best([0.5, 1.5, 1.5]) == (1, True)
    assert best([2.0, 1.0]) == (0, False)
