"""Adaptive-RAG's router, trained from arag's own evaluation runs (Jeong et al., 2024, section 3.2).

    arag train-router RUN... --out router.json [--metric em] [--correct-at 1] [--hops DATASET=single|multi]
                      [--held-out 0.2]

The runs are folders written by `arag eval`: for each dataset, one run of each strategy (`no-retrieval`,
`single-rag`, `ircot`) over the same questions. Each question is labelled as the paper labels it: A when the
no-retrieval run answered it correctly (its `--metric` at least `--correct-at`, 1 by default), else B when the
single-step run did, else C when the multi-step run did; when none did, by its dataset's nature: B for a
single-hop set, C for a multi-hop one. So the multi-step run decides a label only for a single-hop question that
the other two missed (`questions_needing_multi_step`): elsewhere it may be absent, and a multi-hop set needs none.
A seeded share of the questions (`--held-out`) is kept apart; a logistic regression over all-MiniLM-L6-v2
embeddings of the other questions is fitted and saved. On the held-apart questions: the router's accuracy (next
to always answering the most frequent label), and, on those the multi-step run answered, what routing would have
cost and scored, read from the runs, against always the multi-step strategy.
"""

from __future__ import annotations

import random
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from arag.errors import ConfigError
from arag.programs.adaptive_rag.adaptive_rag import STRATEGIES
from arag.programs.adaptive_rag.router import embed_questions, logistic_regression, write_router_file
from arag.retrievers.dense import DEFAULT_MODEL
from arag.runs import Row, Run, load_run

HOPS = ("single", "multi")
UNANSWERED_LABEL = {"single": "B", "multi": "C"}
KNOWN_HOPS = {  # a dataset file's folder or name containing the key: its questions' nature
    "hotpotqa": "multi", "2wiki": "multi", "musique": "multi", "strategyqa": "multi", "bamboogle": "multi",
    "nq": "single", "triviaqa": "single", "squad": "single", "popqa": "single",
}
MULTI_STEP = "C"


@dataclass(frozen=True)
class LabelledQuestion:
    """A question with its silver label, and each strategy's LM calls and score on it."""

    id: str
    question: str
    dataset: str
    label: str
    by: str  # "answer": the simplest strategy that answered correctly; "dataset": the dataset's nature
    lm_calls: Mapping[str, int]  # by label; no MULTI_STEP entry where its run did not answer the question
    scores: Mapping[str, float]


@dataclass(frozen=True)
class RouterReport:
    """What training printed: the labels, the split and the held-apart figures."""

    questions: int
    labels: dict[str, int]
    labelled_by: dict[str, int]
    trained_on: int
    held_out: int
    accuracy: float
    majority_label: str
    majority_accuracy: float
    compared: int  # held-apart questions the multi-step run answered: the cost and score figures are theirs
    lm_calls_routed: float
    lm_calls_multi_step: float
    score_routed: float
    score_multi_step: float
    metric: str
    correct_at: float

    def lines(self) -> list[str]:
        labels = ", ".join(f"{label} {self.labels.get(label, 0)}" for label in sorted(STRATEGIES))
        lines = [
            f"labelled {self.questions} questions: {labels} (by a correct answer {self.labelled_by.get('answer', 0)}"
            f", by the dataset's nature {self.labelled_by.get('dataset', 0)}; correct: {self.metric} >= "
            f"{self.correct_at:g})",
            f"trained on {self.trained_on}, held apart {self.held_out}",
            f"router accuracy on the held-apart questions: {self.accuracy:.3f} "
            f"(always {self.majority_label}, the most frequent training label: {self.majority_accuracy:.3f})",
        ]
        if not self.compared:
            return [*lines, "no held-apart question has a multi-step answer to compare routing's cost with"]
        saved = 1 - self.lm_calls_routed / self.lm_calls_multi_step if self.lm_calls_multi_step else 0.0
        which = (f" with a multi-step answer ({self.compared} of {self.held_out})" if self.compared < self.held_out
                 else "")
        return [
            *lines,
            f"LM calls per held-apart question{which}: routed {self.lm_calls_routed:.2f}, always multi-step "
            f"{self.lm_calls_multi_step:.2f} ({saved:.0%} saved; the router itself makes none)",
            f"{self.metric} on the held-apart questions{which}: routed {self.score_routed:.3f}, always multi-step "
            f"{self.score_multi_step:.3f}",
        ]


def parse_hops(pairs: Sequence[str]) -> dict[str, str]:
    """`DATASET=single|multi` pairs into a dict; a ConfigError for a malformed one."""
    hops = {}
    for pair in pairs:
        name, sep, nature = pair.partition("=")
        if not sep or not name.strip() or nature.strip() not in HOPS:
            raise ConfigError(f"--hops expects DATASET=single or DATASET=multi, got {pair!r}")
        hops[name.strip().lower()] = nature.strip()
    return hops


def dataset_name(path: str) -> str:
    """A dataset's short name: its file's folder for `public.jsonl`-style files, else the file's stem."""
    file = Path(path)
    return file.parent.name if file.stem in {"public", "dev", "test", "train", "questions"} else file.stem


def dataset_hops(name: str, given: Mapping[str, str]) -> str:
    """Whether a dataset's questions are single- or multi-hop: from `given`, else from known dataset names."""
    lowered = name.lower()
    for table in (given, KNOWN_HOPS):
        for key, nature in table.items():
            if key in lowered:
                return nature
    raise ConfigError(f"dataset {name!r}: is it single- or multi-hop? say so with --hops {name}=single|multi")


def silver_label(scores: Mapping[str, float], nature: str, correct_at: float = 1.0) -> tuple[str, str] | None:
    """(label, by) from each strategy's score on a question (by label; MULTI_STEP's may be absent): the simplest
    strategy that answered (by "answer"), else the dataset's nature (by "dataset"); None while the label waits on
    the multi-step score, which decides only a single-hop question the other two missed."""
    for label in sorted(STRATEGIES):
        if label in scores and scores[label] >= correct_at:
            return label, "answer"
    if MULTI_STEP not in scores and UNANSWERED_LABEL[nature] != MULTI_STEP:
        return None
    return UNANSWERED_LABEL[nature], "dataset"


def label_runs(runs: Sequence[str | Path | Run], metric: str = "em", hops: Mapping[str, str] | None = None,
               correct_at: float = 1.0) -> list[LabelledQuestion]:
    """The questions that the no-retrieval and single-step runs of their dataset both hold, each with its silver
    label (a strategy answered correctly when its `metric` is at least `correct_at`), less those whose label waits
    on a multi-step answer the runs lack. `runs`: run folders, or runs already loaded."""
    labelled = []
    for question in _scored_questions(runs, metric, hops):
        silver = silver_label(question.scores, question.nature, correct_at)
        if silver is not None:
            labelled.append(LabelledQuestion(
                id=question.id, question=question.question, dataset=question.dataset, label=silver[0], by=silver[1],
                lm_calls=question.lm_calls, scores=question.scores))
    if not labelled:
        raise ConfigError("no question can be labelled: the no-retrieval and single-step runs share none, or every "
                          "one they share waits on a multi-step answer the runs lack")
    return labelled


def questions_needing_multi_step(runs: Sequence[str | Path | Run], metric: str = "em",
                                 hops: Mapping[str, str] | None = None, correct_at: float = 1.0) -> set[str]:
    """The ids of the questions whose label waits on a multi-step answer: on a single-hop set, those that the
    no-retrieval and single-step runs both hold and both missed. `runs`: theirs (a multi-step run is ignored)."""
    return {question.id for question in _scored_questions(runs, metric, hops)
            if silver_label({label: score for label, score in question.scores.items() if label != MULTI_STEP},
                            question.nature, correct_at) is None}


@dataclass(frozen=True)
class _ScoredQuestion:
    id: str
    question: str
    dataset: str
    nature: str
    lm_calls: dict[str, int]  # by label, for the runs that hold the question
    scores: dict[str, float]


def _scored_questions(runs: Sequence[str | Path | Run], metric: str, hops: Mapping[str, str] | None):
    """Every question that its dataset's no-retrieval and single-step runs both hold, with each run's score and
    LM calls on it (the multi-step run's where it holds the question too)."""
    by_dataset: dict[str, dict[str, Run]] = {}
    strategy_label = {program: label for label, program in STRATEGIES.items()}
    for given in runs:
        run = given if isinstance(given, Run) else load_run(given)
        folder, program, dataset = run.path, run.record.program, run.record.dataset
        if program not in strategy_label:
            raise ConfigError(f"{folder}: a run of {program!r}; the router learns from runs of "
                              f"{', '.join(STRATEGIES.values())}")
        if not dataset:
            raise ConfigError(f"{folder}: its run.json names no dataset")
        strategies = by_dataset.setdefault(dataset, {})
        if strategy_label[program] in strategies:
            raise ConfigError(f"{folder}: a second {program} run of {dataset}")
        strategies[strategy_label[program]] = run
    simpler = [label for label in sorted(STRATEGIES) if label != MULTI_STEP]
    for dataset, strategies in by_dataset.items():
        missing = [STRATEGIES[label] for label in simpler if label not in strategies]
        if missing:
            raise ConfigError(f"{dataset}: no run of {', '.join(missing)}; each dataset needs a run of "
                              f"{' and '.join(STRATEGIES[label] for label in simpler)} (and of "
                              f"{STRATEGIES[MULTI_STEP]} where their answers leave a label open)")
        name = dataset_name(dataset)
        nature = dataset_hops(name, hops or {})
        rows = {label: {row.id: row for row in run.rows} for label, run in strategies.items()}
        for row in strategies[simpler[0]].rows:
            held = [label for label in sorted(strategies) if row.id in rows[label]]
            if not all(label in held for label in simpler):
                continue
            yield _ScoredQuestion(
                id=row.id, question=row.question, dataset=name, nature=nature,
                lm_calls={label: rows[label][row.id].lm_calls or 0 for label in held},
                scores={label: _score(rows[label][row.id], metric, strategies[label].path) for label in held})


def _score(row: Row, metric: str, run: Path) -> float:
    if metric not in row.metrics:
        raise ConfigError(f"{run}: question {row.id} has no {metric!r} score (it has {', '.join(row.metrics)})")
    return float(row.metrics[metric]) if not row.failed else 0.0


def train_router(labelled: Sequence[LabelledQuestion], out: str | Path, *, held_out: float = 0.2, seed: int = 0,
                 metric: str = "em", correct_at: float = 1.0, encoder: str = DEFAULT_MODEL) -> RouterReport:
    """Fit the router on all but a seeded `held_out` share of the questions, save it to `out`, and measure it on
    that share."""
    if not 0 < held_out < 1:
        raise ConfigError(f"--held-out must be between 0 and 1, got {held_out}")
    regression = logistic_regression(max_iter=1000, random_state=seed)  # before any work: scikit-learn present?
    ordered = sorted(labelled, key=lambda q: (q.dataset, q.id))
    random.Random(seed).shuffle(ordered)
    cut = round(len(ordered) * held_out)
    test, train = ordered[:cut], ordered[cut:]
    if not test or not train:
        raise ConfigError(f"{len(ordered)} questions cannot be split {1 - held_out:.0%} / {held_out:.0%}: "
                          "give more questions or another --held-out")
    train_labels = [q.label for q in train]
    if len(set(train_labels)) < 2:
        raise ConfigError(f"every training question is labelled {train_labels[0]}: a classifier needs two labels "
                          "(more questions, or a more lenient --metric or --correct-at, such as f1 at 0.5)")
    regression.fit(embed_questions([q.question for q in train], encoder), train_labels)
    predicted = [str(label) for label in regression.predict(embed_questions([q.question for q in test], encoder))]
    write_router_file(out, regression, encoder, {
        "questions": len(train), "labels": dict(Counter(train_labels)), "metric": metric,
        "correct_at": correct_at, "seed": seed,
        "datasets": sorted({q.dataset for q in train}),
        "ids": {dataset: sorted(q.id for q in train if q.dataset == dataset)
                for dataset in sorted({q.dataset for q in train})},
    })
    majority = Counter(train_labels).most_common(1)[0][0]
    compared = [(p, q) for p, q in zip(predicted, test) if MULTI_STEP in q.scores]
    return RouterReport(
        questions=len(ordered), labels=dict(Counter(q.label for q in ordered)),
        labelled_by=dict(Counter(q.by for q in ordered)), trained_on=len(train), held_out=len(test),
        accuracy=statistics.fmean(p == q.label for p, q in zip(predicted, test)),
        majority_label=majority, majority_accuracy=statistics.fmean(q.label == majority for q in test),
        compared=len(compared),
        lm_calls_routed=_mean(q.lm_calls[p] for p, q in compared),
        lm_calls_multi_step=_mean(q.lm_calls[MULTI_STEP] for _, q in compared),
        score_routed=_mean(q.scores[p] for p, q in compared),
        score_multi_step=_mean(q.scores[MULTI_STEP] for _, q in compared),
        metric=metric, correct_at=correct_at,
    )


def _mean(values) -> float:
    values = list(values)
    return statistics.fmean(values) if values else 0.0
