"""Datasets, corpora and metrics: files turned into passages and `dspy.Example`s, and the QA scores. Each dataset
that arag knows is one module of `datasets/`."""

from arag.data.corpus import CORPUS_FORMATS, corpus_format, iter_corpus, load_corpus
from arag.data.datasets import dataset_from_text
from arag.data.loaders import FORMATS, detect_format, load_examples
from arag.data.metrics import (
    METRICS,
    choice_accuracy,
    default_metrics,
    exact_match_score,
    f1_score,
    get_metric,
    match_score,
    normalize_answer,
    prediction_text,
    score_all,
    str_em,
    str_hit,
    yes_no_accuracy,
)
from arag.data.sample_set import sample_paths

__all__ = [
    "CORPUS_FORMATS",
    "FORMATS",
    "METRICS",
    "choice_accuracy",
    "corpus_format",
    "dataset_from_text",
    "default_metrics",
    "detect_format",
    "exact_match_score",
    "f1_score",
    "get_metric",
    "iter_corpus",
    "load_corpus",
    "load_examples",
    "match_score",
    "normalize_answer",
    "prediction_text",
    "score_all",
    "sample_paths",
    "str_em",
    "str_hit",
    "yes_no_accuracy",
]
