"""QA metrics: string-level scores, their DSPy-metric adapters, and which of them suit an example (a known
dataset declares its own in `datasets/`)."""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any, Callable, Sequence

from arag.data.datasets import dataset_named
from arag.errors import ConfigError

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
_YES_NO_SPECIAL = {"yes", "no", "noanswer"}
_LABEL_WORDS = {
    "yes": "yes",
    "true": "yes",
    "no": "no",
    "false": "no",
    "maybe": "maybe",
    "mixture": "mixture",
    "unproven": "unproven",
}
_ANSWER_PREFIX = re.compile(r"^\s*(?:the\s+)?(?:correct\s+|right\s+|final\s+)?answer(?:\s+is)?\s*[:\-]?\s*", re.I)
_LABEL_ALONE = re.compile(r"^\s*[(\[]?\s*([A-Za-z0-9])\s*[)\]]?\s*[.:]?\s*$")
_LABEL_PREFIX = re.compile(r"^\s*(?:[(\[]\s*([A-Za-z0-9])\s*[)\]]|([A-Za-z0-9])\s*[).:])(?:\s|$)")


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles (a/an/the), single spaces."""
    s = "".join(ch for ch in str(s).lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", s).split())


def _as_list(answers: str | Sequence[str]) -> list[str]:
    return [answers] if isinstance(answers, str) else list(answers)


def exact_match_score(prediction: str, answers: str | Sequence[str]) -> float:
    """1.0 when the normalised prediction equals any normalised answer."""
    predicted = normalize_answer(prediction)
    return float(any(predicted == normalize_answer(a) for a in _as_list(answers)))


def _token_f1(prediction: str, gold: str) -> float:
    predicted, expected = normalize_answer(prediction), normalize_answer(gold)
    if (predicted in _YES_NO_SPECIAL or expected in _YES_NO_SPECIAL) and predicted != expected:
        return 0.0
    predicted_tokens, gold_tokens = predicted.split(), expected.split()
    if not predicted_tokens or not gold_tokens:
        return float(predicted_tokens == gold_tokens)
    common = sum((Counter(predicted_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(predicted_tokens)
    recall = common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, answers: str | Sequence[str]) -> float:
    """SQuAD token F1, best over the answers; a yes/no/noanswer mismatch scores 0 (HotpotQA's rule)."""
    return max((_token_f1(prediction, a) for a in _as_list(answers)), default=0.0)


def match_score(prediction: str, answers: str | Sequence[str]) -> float:
    """1.0 when any normalised answer occurs inside the normalised prediction (PopQA/Self-RAG/CRAG accuracy)."""
    predicted = normalize_answer(prediction)
    return float(any(gold and gold in predicted for gold in map(normalize_answer, _as_list(answers))))


def _pair_hit(prediction_norm: str, pair: dict) -> bool:
    return any(gold and gold in prediction_norm for gold in map(normalize_answer, pair.get("short_answers") or []))


def str_em(prediction: str, qa_pairs: Sequence[dict]) -> float:
    """ASQA STR-EM: the fraction of qa_pairs with a short answer inside the prediction (both normalised)."""
    if not qa_pairs:
        return 0.0
    predicted = normalize_answer(prediction)
    return sum(_pair_hit(predicted, pair) for pair in qa_pairs) / len(qa_pairs)


def str_hit(prediction: str, qa_pairs: Sequence[dict]) -> float:
    """ASQA STR-HIT: 1.0 when every qa_pair has a short answer inside the prediction."""
    return float(bool(qa_pairs) and str_em(prediction, qa_pairs) == 1.0)


def _field(example: Any, name: str, default=None):
    if isinstance(example, dict):
        return example.get(name, default)
    return example.get(name, default) if hasattr(example, "get") else getattr(example, name, default)


def predicted_label(prediction: str) -> str | None:
    """The choice label a prediction names: "B", "(B)", "B)", "B.", "B: text", "Answer: B"; else None."""
    text = _ANSWER_PREFIX.sub("", str(prediction), count=1)
    alone = _LABEL_ALONE.match(text)
    if alone:
        return alone.group(1).upper()
    prefixed = _LABEL_PREFIX.match(text)
    if prefixed:
        return (prefixed.group(1) or prefixed.group(2)).upper()
    return None


def choice_accuracy(prediction: str, example: Any) -> float:
    """1.0 when the prediction names the right choice by label ("B", "(B)", "B) ...") or by its exact text."""
    choices = _field(example, "choices") or []
    label = _field(example, "answer_label")
    right_texts = [c["text"] for c in choices if label is not None and str(c["label"]).upper() == str(label).upper()]
    right_texts = right_texts or list(_field(example, "answers") or [])
    if label is not None and predicted_label(prediction) == str(label).strip().upper():
        return 1.0
    predicted = normalize_answer(prediction)
    return float(bool(predicted) and any(predicted == normalize_answer(t) for t in right_texts))


def _first_label_word(text: str) -> str | None:
    for word in normalize_answer(text).split():
        if word in _LABEL_WORDS:
            return _LABEL_WORDS[word]
    return None


def yes_no_accuracy(prediction: str, answers: str | Sequence[str]) -> float:
    """1.0 when the prediction's first yes/no/true/false/maybe word agrees with the gold label."""
    predicted = _first_label_word(prediction)
    golds = {_first_label_word(a) for a in _as_list(answers)} - {None}
    return float(predicted is not None and predicted in golds)


# ---------------------------------------------------------------- DSPy adapters


def prediction_text(pred: Any) -> str:
    """The answer text of a DSPy prediction (its `answer` field), or the string itself."""
    if pred is None:
        return ""
    if isinstance(pred, str):
        return pred
    answer = _field(pred, "answer")
    return "" if answer is None else str(answer)


def _answers_metric(score: Callable[[str, Sequence[str]], float]) -> Callable:
    def metric(example, pred, trace=None) -> float:
        return score(prediction_text(pred), _field(example, "answers") or [])

    metric.__name__ = score.__name__
    metric.__doc__ = score.__doc__
    return metric


def _qa_pairs(example) -> list[dict]:
    """ASQA's qa_pairs, or one pair holding all the answers when the example has none."""
    return _field(example, "qa_pairs") or [{"short_answers": list(_field(example, "answers") or [])}]


def _str_em_metric(example, pred, trace=None) -> float:
    return str_em(prediction_text(pred), _qa_pairs(example))


def _str_hit_metric(example, pred, trace=None) -> float:
    return str_hit(prediction_text(pred), _qa_pairs(example))


def _choice_metric(example, pred, trace=None) -> float:
    return choice_accuracy(prediction_text(pred), example)


METRICS: dict[str, Callable[..., float]] = {
    "em": _answers_metric(exact_match_score),
    "f1": _answers_metric(f1_score),
    "match": _answers_metric(match_score),
    "str_em": _str_em_metric,
    "str_hit": _str_hit_metric,
    "choice_acc": _choice_metric,
    "yes_no_acc": _answers_metric(yes_no_accuracy),
}

def get_metric(name: str) -> Callable[..., float]:
    """The DSPy metric `metric(example, pred, trace=None) -> float` called `name`."""
    try:
        return METRICS[name]
    except KeyError:
        raise ConfigError(f"unknown metric {name!r}; known: {', '.join(METRICS)}") from None


def default_metrics(example: Any) -> list[str]:
    """The metric names that suit an example: by its `dataset`, else choices or qa_pairs, else match/em/f1."""
    dataset = dataset_named(_field(example, "dataset"))
    if dataset is not None:
        return list(dataset.metrics)
    if _field(example, "choices"):
        return ["choice_acc"]
    if _field(example, "qa_pairs"):
        return ["str_em", "str_hit"]
    return ["match", "em", "f1"]


def score_all(example: Any, prediction: str | None, names: Sequence[str] | None = None) -> dict[str, float]:
    """The named metrics (default: the example's default metrics) applied to a prediction text."""
    names = default_metrics(example) if names is None else names
    return {name: get_metric(name)(example, prediction) for name in names}
