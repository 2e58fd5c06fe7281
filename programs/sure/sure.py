"""SuRe (Kim et al., ICLR 2024): summarizing retrievals using answer candidates.

    Input: question q, passages per retrieval N, candidates K
    C_N = ret(q, N)
    y_1 .. y_K = LM(C_N, q)                       one call proposes K different short candidates
    for each candidate y_k:
        s_k = LM(C_N, q, y_1..y_K, y_k)           a summary of C_N that makes the case for y_k
        v(s_k) = LM(q, y_k, s_k) in {True, False}  instance-wise validity: does s_k support y_k?
    for each pair (s_i, s_j), asked in both orders:
        LM(q, s_i, s_j) in {1, 2}                 pair-wise ranking: which summary is more informative?
    score(y_k) = v(s_k) + r(s_k)
    return argmax_k score(y_k)

Validity v(s_k) is the paper's binary judgement, 1 for True and 0 for False; an unreadable judgement counts
0, as the official code counts a "Cannot" or "Unknown" reply as False. With `validity_score=probability`
it is the probability of True (normalised over True and False) when the LM returns token log-probabilities
(an LM built with `logprobs=True, top_logprobs=k`, `--logprobs`), else the judgement's 1 or 0 still; the
trace records that probability (`p_supports`) whenever it is there.

Ranking: the two orders of a pair share one point between its summaries, half a point per order to the
summary chosen in it; an unreadable order leaves the decision to the other one, and a pair with both orders
unreadable splits the point evenly (the official code's rules). r(s_k) is the points s_k won divided by the
K-1 pairs it is in, so it lies in [0, 1] like v; with K = 2 this is exactly the paper's score. Ties go to the
first candidate in the LM's order, as in the official code.

The candidates call has one short string output per candidate (`candidate_1` .. `candidate_K`), which
even a small model fills in. Candidates are stripped, blank ones dropped and repeats (the same words, ignoring
case and punctuation) merged. When one distinct candidate is left it is the answer, and no summary,
validity or ranking call is made: there is nothing to choose between (the official code writes no summary
and no validity judgement then, but still asks its ranking question of two placeholder summaries). When
none is left the answer is empty.

LM calls per question with K' distinct candidates (K' >= 2): 1 + K' summaries + K' validity judgements +
K'(K'-1) ranking judgements (both orders of each pair); K = 2: 7. With K' <= 1: 1. Retrievals: 1.

Follows the paper for the algorithm and the official code (bbuing9/ICLR24_SuRe) for the settings: N = 10
passages, K = 2 candidates, the summary shown every candidate and the one it argues for, validity judged from
the summary alone, True or False, both orders of each pair, and its handling of unreadable judgements and ties.
"""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

import dspy

from arag.lm import has_top_logprobs, label_probabilities
from arag.passages import format_passages
from arag.programs.frame.base import RAGProgram
from arag.programs.frame.params import Param, passages_per_retrieval
from arag.programs.frame.predictors import judged
from arag.programs.frame.registry import register
from arag.programs.sure.steps import Candidates, Compare, Pair, Select, Summary, Validity
from arag.signatures.summaries import (
    CompareSummaries,
    JudgeSummarySupport,
    SummarizeForCandidate,
    candidate_field,
    propose_candidates,
)
from arag.trace import ABSENT, Answer, shown_probability, steps_of

K = passages_per_retrieval(10, "SuRe's N = 10 retrieved passages")
CANDIDATES = Param("candidates", 2, "answer candidates (K) proposed in one call, each summarised and judged",
                   low=2, high=5, searched=True, search_range=(2, 4))
VALIDITY_SCORE = Param("validity_score", "binary",
                       "a summary's validity v: binary, the paper's 1 for True and 0 for False; probability, "
                       "p(True) from the LM's log-probabilities where it returns them",
                       choices=("binary", "probability"), tunable=False)

TIE_TOLERANCE = 1e-9


@register
class SuRe(RAGProgram):
    """SuRe: K answer candidates, a summary of the passages for each, and the best-supported one chosen."""

    name = "sure"
    lm_calls_formula = "1 + K summaries + K validity + K(K-1) pair-wise"
    follows = ("the paper (Kim et al., 2024) with the official code's settings (bbuing9/ICLR24_SuRe): N=10, "
               "K=2, binary validity, both orders of each pair, its unreadable-verdict and tie rules")
    params = (K, CANDIDATES, VALIDITY_SCORE)

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        self.propose = dspy.Predict(propose_candidates(self.candidates))
        self.summarize = dspy.Predict(SummarizeForCandidate)
        self.judge_support = dspy.Predict(JudgeSummarySupport)
        self.compare = dspy.Predict(CompareSummaries)

    def required_lm_calls(self, trace: list[dict]) -> int:
        """The candidates, then per distinct candidate a summary and a validity judgement, two per pair."""
        return 1 + len(steps_of(trace, Summary)) + len(steps_of(trace, Validity)) + len(steps_of(trace, Compare))

    def run(self, question: str) -> dict[str, Any]:
        passages = format_passages(self.retrieve(question, why="question"))
        # Candidate generation: K different answers in one call.
        proposal = self.propose(passages=passages, question=question)
        proposed = [proposal[candidate_field(number)] for number in range(1, self.candidates + 1)]
        candidates = distinct_candidates(proposed, self.candidates)
        self.note(Candidates(proposed=proposed, candidates=candidates))
        if len(candidates) < 2:
            answer = candidates[0] if candidates else ""
            self.note(Select(reason="one candidate" if candidates else "no candidate", chosen=answer))
            self.note(Answer(answer=answer))
            return {"answer": answer, "candidates": candidates}

        # Conditional summarization: one summary per candidate, arguing for it.
        summaries = []
        for index, candidate in enumerate(candidates):
            summary = self.summarize(passages=passages, question=question, candidates=candidates,
                                     chosen_candidate=candidate).supporting_summary
            summaries.append(summary)
            self.note(Summary(candidate_index=index, candidate=candidate, summary=summary))

        # Selection: instance-wise validity plus pair-wise ranking.
        validity = [self.validity(question, index, candidate, summary)
                    for index, (candidate, summary) in enumerate(zip(candidates, summaries))]
        ranking = self.ranking(question, candidates, summaries)
        scores = [v + r for v, r in zip(validity, ranking)]
        chosen, tied = best(scores)
        self.note(Select(reason="highest score", validity=_shown(validity), ranking=_shown(ranking),
                         scores=_shown(scores), chosen_index=chosen, chosen=candidates[chosen], tie=tied))
        self.note(Answer(answer=candidates[chosen], summary=summaries[chosen]))
        return {"answer": candidates[chosen], "candidates": candidates, "summary": summaries[chosen]}

    def validity(self, question: str, index: int, candidate: str, summary: str) -> float:
        """v(s_k): 1 for True and 0 for False, or p(True) with validity_score=probability where log-probabilities
        exist; 0 when unreadable."""
        prediction = judged(self.judge_support, "validity 0: counted as not supported", question=question,
                            candidate=candidate, summary=summary)
        if prediction is None:
            self.note(Validity(candidate_index=index, candidate=candidate, supports=None, validity=0.0))
            return 0.0
        supports = bool(prediction.supports_candidate)
        value = 1.0 if supports else 0.0
        p_supports = ABSENT
        if has_top_logprobs(prediction, "supports_candidate"):
            probabilities = label_probabilities(prediction, "supports_candidate", ["True", "False"])
            if sum(probabilities.values()) > 0:
                p_supports = shown_probability(probabilities["True"])
                if self.validity_score == "probability":
                    value = probabilities["True"]
        self.note(Validity(candidate_index=index, candidate=candidate, supports=supports, p_supports=p_supports,
                           validity=shown_probability(value)))
        return value

    def ranking(self, question: str, candidates: Sequence[str], summaries: Sequence[str]) -> list[float]:
        """r(s_k): the share of its pairs' points each summary won, over the K-1 pairs it is in; each pair is
        asked in both orders."""
        points = [0.0] * len(candidates)
        for i in range(len(candidates)):
            for j in range(i + 1, len(candidates)):
                winners = [self.verdict(question, candidates, summaries, first, second)
                           for first, second in ((i, j), (j, i))]
                readable = [winner for winner in winners if winner is not None]
                share_i = sum(winner == i for winner in readable) / len(readable) if readable else 0.5
                points[i] += share_i
                points[j] += 1.0 - share_i
                self.note(Pair(candidate_indices=[i, j], winners=winners, share=_shown([share_i, 1.0 - share_i])))
        return [p / (len(candidates) - 1) for p in points]

    def verdict(self, question: str, candidates: Sequence[str], summaries: Sequence[str], first: int,
                second: int) -> int | None:
        """The index of the summary the LM finds more informative, shown `first` then `second`; None when its
        verdict cannot be read."""
        prediction = judged(self.compare, "no verdict: the pair's other order decides (an even split without one)",
                            question=question, summary_1=summaries[first], summary_2=summaries[second])
        winner = None if prediction is None else (first if prediction.more_informative == "1" else second)
        self.note(Compare(order=[first, second], shown=[candidates[first], candidates[second]], winner=winner))
        return winner


def candidate_key(text: str) -> str:
    """A candidate reduced to its lower-cased words, for spotting repeats."""
    return " ".join(re.findall(r"\w+", text.lower()))


def distinct_candidates(proposed: Sequence[str], limit: int) -> list[str]:
    """The first `limit` candidates, stripped, without blank ones and without repeats."""
    kept, seen = [], set()
    for candidate in proposed:
        text, key = candidate.strip(), candidate_key(candidate)
        if key and key not in seen:
            seen.add(key)
            kept.append(text)
    return kept[:limit]


def best(scores: Sequence[float]) -> tuple[int, bool]:
    """The index of the highest score (the first of tied ones) and whether another score ties with it."""
    top = max(scores)
    tied = [index for index, score in enumerate(scores) if math.isclose(score, top, abs_tol=TIE_TOLERANCE)]
    return tied[0], len(tied) > 1


def _shown(values: Sequence[float]) -> list[float]:
    return [round(value, 4) for value in values]
