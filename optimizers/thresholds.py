"""Calibrating CRAG's action thresholds on labelled (question, passage, relevant?) pairs.

CRAG sets upper and lower per benchmark to maximise S = (TP + TN)/n − α·FP/n_neg: accuracy with a
false-positive penalty. Each threshold is one binary decision, and S is taken for that decision:

- upper: a pair is called relevant when its score is >= upper (what makes an action Correct).
  TP: relevant pairs called relevant; TN: irrelevant pairs not; FP: irrelevant pairs called
  relevant; n_neg: the irrelevant pairs.
- lower: a pair is called irrelevant when its score is < lower (what makes an action Incorrect).
  Its positives are the irrelevant pairs: TP: irrelevant pairs below lower; TN: relevant pairs
  not; FP: relevant pairs below lower; n_neg: the relevant pairs.

With α = 0 both are the accuracy-maximising threshold and Ambiguous never happens; α > 0 moves
upper up and lower down (never lower above upper: among equally good thresholds the fit takes
the highest upper and the lowest lower), widening the Ambiguous band. The paper does not give
α; DEFAULT_ALPHA is this module's choice. A penalty term whose n_neg is 0 counts as 0.

Candidate thresholds are -1, 1 and the midpoints between consecutive distinct scores, so a fitted
threshold never sits exactly on an observed score.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from arag.data import load_examples
from arag.data._io import base_suffix, iter_jsonl
from arag.errors import ConfigError, DataError
from arag.programs.crag.evaluator import CORRECT, INCORRECT, trigger

DEFAULT_ALPHA = 1.0
SIDES = ("upper", "lower")


@dataclass(frozen=True)
class LabelledPair:
    question: str
    passage: str
    relevant: bool


@dataclass(frozen=True)
class ThresholdFit:
    """Fitted thresholds, the objective each reaches, and the share of questions each action would take."""

    upper: float
    lower: float
    alpha: float
    s_upper: float
    s_lower: float
    correct_share: float
    incorrect_share: float

    @property
    def ambiguous_share(self) -> float:
        return 1.0 - self.correct_share - self.incorrect_share


def _arrays(scores: Sequence[float], relevant: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
    scores_array = np.asarray(scores, dtype=float)
    labels = np.asarray(relevant, dtype=bool)
    if scores_array.shape != labels.shape or scores_array.ndim != 1:
        raise ConfigError(f"scores and labels must be two lists of one length, got {len(scores)} and {len(relevant)}")
    if not len(scores_array):
        raise ConfigError("no labelled pairs to calibrate on")
    return scores_array, labels


def _objectives(scores: np.ndarray, relevant: np.ndarray, thresholds: np.ndarray, alpha: float,
                side: str) -> np.ndarray:
    """S at each threshold for one side (vectorised over the thresholds)."""
    if side not in SIDES:
        raise ConfigError(f"side must be one of {list(SIDES)}, got {side!r}")
    n = len(scores)
    positives, negatives = np.sort(scores[relevant]), np.sort(scores[~relevant])
    pos_below = np.searchsorted(positives, thresholds, side="left")
    neg_below = np.searchsorted(negatives, thresholds, side="left")
    pos_at_or_above, neg_at_or_above = len(positives) - pos_below, len(negatives) - neg_below
    if side == "upper":
        right, false_positives, n_neg = pos_at_or_above + neg_below, neg_at_or_above, len(negatives)
    else:
        right, false_positives, n_neg = neg_below + pos_at_or_above, pos_below, len(positives)
    penalty = alpha * false_positives / n_neg if n_neg else 0.0
    return right / n - penalty


def crag_objective(scores: Sequence[float], relevant: Sequence[bool], threshold: float,
                   alpha: float = DEFAULT_ALPHA, side: str = "upper") -> float:
    """S = (TP + TN)/n − α·FP/n_neg for the `upper` (score >= threshold means relevant) or `lower`
    (score < threshold means irrelevant) decision."""
    scores_array, labels = _arrays(scores, relevant)
    return float(_objectives(scores_array, labels, np.asarray([threshold], dtype=float), alpha, side)[0])


def candidate_thresholds(scores: Sequence[float]) -> np.ndarray:
    """-1, 1 and the midpoints between consecutive distinct scores, ascending."""
    distinct = np.unique(np.clip(np.asarray(scores, dtype=float), -1.0, 1.0))
    return np.unique(np.concatenate([[-1.0], (distinct[:-1] + distinct[1:]) / 2, [1.0]]))


def fit_thresholds(scores: Sequence[float], relevant: Sequence[bool], alpha: float = DEFAULT_ALPHA,
                   questions: Sequence[str] | None = None) -> ThresholdFit:
    """The upper and lower thresholds maximising S, each for its own decision, and the share of questions each
    action would take: Correct when some of a question's passages scores >= upper, Incorrect when all score
    < lower. `questions` names each pair's question (without it, every pair counts as a question of its own)."""
    if alpha < 0:
        raise ConfigError(f"alpha must be non-negative, got {alpha}")
    scores_array, labels = _arrays(scores, relevant)
    candidates = candidate_thresholds(scores_array)
    s_upper = _objectives(scores_array, labels, candidates, alpha, "upper")
    s_lower = _objectives(scores_array, labels, candidates, alpha, "lower")
    best_upper = int(np.flatnonzero(s_upper == s_upper.max())[-1])
    best_lower = int(np.flatnonzero(s_lower == s_lower.max())[0])
    upper, lower = float(candidates[best_upper]), float(candidates[best_lower])
    if questions is None:
        questions = range(len(scores_array))
    elif len(questions) != len(scores_array):
        raise ConfigError(f"questions must name the question of each of the {len(scores_array)} pairs, "
                          f"got {len(questions)}")
    by_question: dict[Any, list[float]] = {}
    for question, score in zip(questions, scores_array):
        by_question.setdefault(question, []).append(float(score))
    actions = [trigger(question_scores, upper, min(lower, upper)) for question_scores in by_question.values()]
    return ThresholdFit(
        upper=upper,
        lower=lower,
        alpha=alpha,
        s_upper=float(s_upper[best_upper]),
        s_lower=float(s_lower[best_lower]),
        correct_share=actions.count(CORRECT) / len(actions),
        incorrect_share=actions.count(INCORRECT) / len(actions),
    )


def roc_auc(scores: Sequence[float], relevant: Sequence[bool]) -> float:
    """The probability that a random relevant pair outscores a random irrelevant one (ties count half)."""
    scores_array, labels = _arrays(scores, relevant)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if not n_pos or not n_neg:
        raise ConfigError("ROC-AUC needs both relevant and irrelevant pairs")
    order = np.argsort(scores_array, kind="mergesort")
    sorted_scores = scores_array[order]
    ranks = np.empty(len(scores_array))
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], len(sorted_scores)]
    for start, end in zip(starts, ends):
        ranks[order[start:end]] = (start + end + 1) / 2  # mean 1-based rank of a tie group
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def score_pairs(scorer, pairs: Sequence[LabelledPair]) -> list[float]:
    """Each pair's score, from one scorer call per run of consecutive pairs sharing a question."""
    scores: list[float] = []
    start = 0
    while start < len(pairs):
        end = start
        while end < len(pairs) and pairs[end].question == pairs[start].question:
            end += 1
        scores += scorer.score(pairs[start].question, [pair.passage for pair in pairs[start:end]])
        start = end
    return scores


def load_pairs(path: str | Path, limit: int | None = None) -> list[LabelledPair]:
    """Labelled pairs from a JSONL file of `{"question", "passage", "relevant"}` records, or from a
    dataset whose examples carry passages marked `is_supporting` (e.g. HotpotQA's distractor
    setting: 2 supporting and 8 distractor paragraphs per question); `limit` counts questions.
    A dataset passage is read as `Title | text`, as the programs score it."""
    path = Path(path)
    if base_suffix(path) == ".jsonl":
        records = iter_jsonl(path)
        first = next(records)
        if "relevant" in first[1]:
            return _pair_records(path, chain([first], records), limit)
    pairs = []
    for example in load_examples(path, limit=limit):
        marked = [p for p in example.get("passages") or [] if p.get("is_supporting") is not None]
        pairs += [
            LabelledPair(example.question, f"{p['title']} | {p['text']}" if p.get("title") else p["text"],
                         bool(p["is_supporting"]))
            for p in marked
        ]
    if not pairs:
        raise DataError(f"{path}: no passages marked relevant or not (is_supporting) to calibrate on")
    return pairs


def _pair_records(path: Path, records: Iterable[tuple[int, dict]], limit: int | None) -> list[LabelledPair]:
    pairs: list[LabelledPair] = []
    questions: set[str] = set()
    for line_no, record in records:
        question, passage, relevant = record.get("question"), record.get("passage"), record.get("relevant")
        if not isinstance(question, str) or not isinstance(passage, str) or not isinstance(relevant, bool):
            raise DataError(f'{path}, line {line_no}: expected {{"question": str, "passage": str, "relevant": bool}}')
        if limit is not None and question not in questions and len(questions) == limit:
            break
        questions.add(question)
        pairs.append(LabelledPair(question, passage, relevant))
    return pairs
