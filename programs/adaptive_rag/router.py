"""Adaptive-RAG's query-complexity classifiers. One protocol, `classify(question) -> Routing`:

- `lm` (LMClassifier): the configured LM labels the question (`ClassifyComplexity`), one call. The label is the
  one it writes; with log-probabilities each label's probability at the label token is recorded too. An
  unreadable label routes to C, the strategy that answers every kind of question.
- a router file (TrainedRouter): written by `arag train-router` (`arag.optimizers.router_training`): a logistic
  regression (scikit-learn) over all-MiniLM-L6-v2 embeddings of the question; no LM call.

A router file is JSON: the encoder, the labels, the regression's weights and what it was trained on (the ids of the
questions it learned from, by dataset, so that it is measured on others).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

import dspy
import numpy as np

from arag.concurrency import shared_model
from arag.errors import ConfigError, LMError
from arag.lm import label_probabilities
from arag.programs.frame.predictors import judged
from arag.retrievers.dense import DEFAULT_MODEL, load_sentence_model, model_path
from arag.signatures.routing import ClassifyComplexity
from arag.trust import check_file_settings

LABELS = ("A", "B", "C")
FALLBACK_LABEL = "C"
ROUTER_FORMAT = "arag-router/1"
TOP_LOGPROBS = 5
CLASSIFIER_PARAMETER = "parameter 'classifier'"  # how a router file given to the program is named in errors


@dataclass(frozen=True)
class Routing:
    """A classifier's label for a question and, when known, each label's probability."""

    label: str
    probabilities: dict[str, float] | None = None


class ComplexityClassifier(Protocol):
    def classify(self, question: str) -> Routing: ...


class LMClassifier(dspy.Module):
    """The configured LM labels the question."""

    def __init__(self) -> None:
        super().__init__()
        self.classify_complexity = dspy.Predict(ClassifyComplexity, logprobs=True, top_logprobs=TOP_LOGPROBS)

    def __str__(self) -> str:
        return "lm"

    def classify(self, question: str) -> Routing:
        prediction = judged(self.classify_complexity, f"route to {FALLBACK_LABEL}", question=question)
        if prediction is None:
            return Routing(FALLBACK_LABEL)
        try:
            probabilities = label_probabilities(prediction, "complexity", LABELS)
        except LMError:  # an endpoint without log-probabilities: the written label decides alone
            probabilities = None
        return Routing(prediction.complexity, probabilities if probabilities and any(probabilities.values()) else None)


def embed_questions(questions: Sequence[str], encoder: str = DEFAULT_MODEL) -> np.ndarray:
    """L2-normalised sentence embeddings of the questions, the encoder loaded once per process."""
    path = str(model_path(encoder))
    model, lock = shared_model("sentence-transformers", path, lambda: load_sentence_model(path))
    with lock:
        return model.encode(list(questions), normalize_embeddings=True, convert_to_numpy=True)


def logistic_regression(**params: Any) -> Any:
    """An unfitted scikit-learn LogisticRegression; a ConfigError naming the extra where scikit-learn is absent."""
    try:
        from sklearn.linear_model import LogisticRegression
    except ImportError:
        raise ConfigError("a trained router needs scikit-learn and sentence-transformers: "
                          "pip install 'dspy-arag[router]'") from None
    return LogisticRegression(**params)


class TrainedRouter:
    """A router file's logistic regression over question embeddings."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        stored = read_router_file(self.path)
        self.encoder = stored["encoder"]
        self.regression = logistic_regression()
        self.regression.classes_ = np.array(stored["labels"])
        self.regression.coef_ = np.array(stored["coef"], dtype=float)
        self.regression.intercept_ = np.array(stored["intercept"], dtype=float)

    def __str__(self) -> str:
        return str(self.path)

    def __deepcopy__(self, memo: dict) -> TrainedRouter:
        return self

    def classify(self, question: str) -> Routing:
        probabilities = self.regression.predict_proba(embed_questions([question], self.encoder))[0]
        by_label = {str(label): float(p) for label, p in zip(self.regression.classes_, probabilities)}
        return Routing(max(by_label, key=by_label.get), by_label)


def open_classifier(spec: str) -> LMClassifier | TrainedRouter:
    """The classifier a `classifier` parameter names: `lm`, or the path of a router file."""
    return LMClassifier() if spec == "lm" else TrainedRouter(spec)


def write_router_file(path: str | Path, regression: Any, encoder: str, trained_on: dict[str, Any]) -> None:
    """Save a fitted scikit-learn LogisticRegression over `encoder` embeddings as a router file."""
    stored = {"format": ROUTER_FORMAT, "encoder": encoder, "labels": [str(c) for c in regression.classes_],
              "coef": regression.coef_.tolist(), "intercept": regression.intercept_.tolist(),
              "trained_on": trained_on}
    Path(path).write_text(json.dumps(stored, indent=1), encoding="utf-8")


def read_router_file(path: Path, given_as: str = CLASSIFIER_PARAMETER) -> dict[str, Any]:
    """A router file's contents, checked; a ConfigError naming where it was given, the file and what is wrong."""
    where = f"{given_as}: {path}"
    if not path.is_file():
        choices = "`lm`, or a file" if given_as == CLASSIFIER_PARAMETER else "a file"
        raise ConfigError(f"{where} is not a router file (give {choices} written by `arag train-router`)")
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where} is not JSON ({exc})") from None
    if not isinstance(stored, dict) or stored.get("format") != ROUTER_FORMAT:
        raise ConfigError(f"{where} is not a router file of format {ROUTER_FORMAT} (written by `arag train-router`)")
    check_file_settings(where, {k: v for k, v in stored.items() if k != "trained_on"}, key="router", hint=None)
    labels, coef, intercept = stored.get("labels"), stored.get("coef"), stored.get("intercept")
    try:
        shape = np.array(coef, dtype=float).shape
        fits = (isinstance(labels, list) and set(labels) <= set(LABELS) and len(labels) >= 2
                and len(np.array(intercept, dtype=float)) == shape[0] == (1 if len(labels) == 2 else len(labels)))
    except (TypeError, ValueError, IndexError):
        fits = False
    if not fits:
        raise ConfigError(f"{where}: its labels, weights and intercepts do not fit together")
    return stored


def learned_questions(path: str | Path, given_as: str = CLASSIFIER_PARAMETER) -> dict[str, set[str]]:
    """The ids of the questions a router file learned from, by dataset (not those it held apart)."""
    trained_on = read_router_file(Path(path), given_as).get("trained_on")
    ids = trained_on.get("ids") if isinstance(trained_on, dict) else None
    if not (isinstance(ids, dict) and all(isinstance(v, list) for v in ids.values())):
        raise ConfigError(f"{given_as}: router file {path} does not name the questions it learned from: train it again "
                          "(`arag train-router`) to measure it on other questions")
    return {dataset: {str(i) for i in values} for dataset, values in ids.items()}
