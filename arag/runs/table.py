"""A table of evaluation runs: quality, with a paired bootstrap interval of each run's difference from a baseline
run on the same questions, and cost per question.

    arag table runs/no-retrieval runs/single-rag --baseline runs/no-retrieval

How much a difference means: each question is resampled with replacement (10,000 times, a fixed seed), the
mean of (run's score − baseline's score) over the resampled questions is taken each time, and the 2.5th and
97.5th percentiles of those means bound the 95 % interval. An interval that holds 0 says the questions at hand
cannot tell the two runs apart. Failed questions score 0, as in the summary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from arag.errors import ConfigError
from arag.runs.records import Row

RESAMPLES = 10_000
LEVEL = 0.95
COST_COLUMNS = {
    "lm_calls": "LM calls/q",
    "prompt_tokens": "prompt tok/q",
    "reused_prompt_tokens": "of which reused/q",
    "completion_tokens": "compl. tok/q",
    "retrieval_calls": "retrievals/q",
    "seconds": "s/q",
}


@dataclass(frozen=True)
class Difference:
    """Mean of (run − baseline) over the questions both answered, with its bootstrap interval."""

    mean: float
    low: float
    high: float
    questions: int

    def __str__(self) -> str:
        return f"{self.mean:+.2f} [{self.low:+.2f}, {self.high:+.2f}]"


def paired_difference(scores: Mapping[str, float], baseline: Mapping[str, float], *, resamples: int = RESAMPLES,
                      seed: int = 0) -> Difference | None:
    """The difference of two runs' scores on the questions they share, or None when they share none."""
    shared = sorted(scores.keys() & baseline.keys())
    if not shared:
        return None
    differences = np.array([scores[q] - baseline[q] for q in shared], dtype=float)
    picks = np.random.default_rng(seed).integers(0, len(shared), size=(resamples, len(shared)))
    means = differences[picks].mean(axis=1)
    tail = (1 - LEVEL) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return Difference(float(differences.mean()), float(low), float(high), len(shared))


def question_scores(rows: Sequence[Row], metric: str) -> dict[str, float]:
    """Each question's score on ``metric`` (0 for a failed question or a missing metric)."""
    return {row.id: float(row.metrics.get(metric, 0.0)) for row in rows}


def table_rows(runs: Sequence[tuple[str, Sequence[Row]]], metrics: Sequence[str],
               baseline: str | None = None) -> list[dict[str, Any]]:
    """One row per (name, rows) run: questions, failures, each metric's mean and its difference from the
    baseline run's (named by its name), and each cost's mean per question (None when a row lacks that count, as
    rows written before the count existed do)."""
    named = dict(runs)
    if baseline is not None and baseline not in named:
        raise ConfigError(f"the baseline {baseline!r} is not one of the runs: {', '.join(named)}")
    table = []
    for name, rows in runs:
        n = len(rows)
        row: dict[str, Any] = {"run": name, "n": n, "failed": sum(r.failed for r in rows)}
        for metric in metrics:
            scores = question_scores(rows, metric)
            row[metric] = sum(scores.values()) / n if n else 0.0
            if baseline is not None and name != baseline:
                row[f"{metric} vs {baseline}"] = paired_difference(scores, question_scores(named[baseline], metric))
        for cost in COST_COLUMNS:
            counted = [float(value) for r in rows if (value := _cost(r, cost)) is not None]  # rows written before
            row[cost] = sum(counted) / n if counted and len(counted) == n else None  # a count existed lack it
        table.append(row)
    return table


def _cost(row: Row, cost: str) -> float | None:
    return row.seconds if cost == "seconds" else row.count(cost)


def markdown(table: Sequence[Mapping[str, Any]], metrics: Sequence[str], baseline: str | None = None) -> str:
    """The table as Markdown: differences as "mean [low, high]", costs to one decimal."""
    columns = ["run", "n", "failed"]
    for metric in metrics:
        columns.append(metric)
        if baseline is not None:
            columns.append(f"{metric} vs {baseline}")
    columns.extend(COST_COLUMNS)
    header = [COST_COLUMNS.get(c, c) for c in columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(columns)]
    for row in table:
        cells = []
        for column in columns:
            value = row.get(column)
            if value is None:
                cells.append("—")
            elif isinstance(value, float) and column in metrics:
                cells.append(f"{value:.3f}")
            elif isinstance(value, float):
                cells.append(f"{value:,.1f}")
            else:
                cells.append(str(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
