"""What the programs of runs decided, counted over their questions: for every step kind that records a decision
(the field its declaration names: CRAG's action, Self-RAG's retrieval decision, FLARE's retrieval before a
sentence, a stop's reason, ...), how often each value was taken and in how many questions.

    arag decisions runs/crag runs/self-rag
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

from arag.runs.records import Row
from arag.trace import ABSENT


@dataclass(frozen=True)
class DecisionCount:
    """One value of one kind's decision in a run: the steps that took it, and the questions they are in."""

    kind: str
    field: str
    value: str
    steps: int
    questions: int


def decision_value(value: Any) -> str:
    """A decision as the table shows it: JSON's spelling for booleans and null, else the value's text."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return str(value)


def decision_counts(rows: Sequence[Row]) -> list[DecisionCount]:
    """The decisions in the traces of `rows` (a run's rows), by kind, field and value; steps no declaration reads
    (another version's), and decisions a step leaves out, are not counted."""
    steps: Counter[tuple[str, str, str]] = Counter()
    questions: Counter[tuple[str, str, str]] = Counter()
    for row in rows:
        taken = set()
        for step in row.trace:
            field = step.decision_field
            value = getattr(step, field) if field is not None else ABSENT
            if value is ABSENT:
                continue
            key = (step.kind, field, decision_value(value))
            steps[key] += 1
            taken.add(key)
        questions.update(taken)
    return [DecisionCount(*key, steps=steps[key], questions=questions[key]) for key in sorted(steps)]


def markdown(runs: Sequence[tuple[str, Sequence[Row]]]) -> str:
    """The decisions of each (name, rows) run as a Markdown table, one line a value taken."""
    lines = ["| run | step | decision | taken | per question | in questions |", "|---|---|---|---|---|---|"]
    for name, rows in runs:
        n = len(rows)
        counts = decision_counts(rows)
        if not counts:
            lines.append(f"| {name} | — | none recorded | 0 | 0.00 | 0 of {n} |")
        for count in counts:
            lines.append(f"| {name} | {count.kind} | {count.field} = {count.value} | {count.steps} | "
                         f"{count.steps / n:.2f} | {count.questions} of {n} |")
    return "\n".join(lines)
