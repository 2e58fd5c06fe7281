"""The step kinds of the uncertainty gate: the closed-book draft and the gate's decision."""

from __future__ import annotations

from arag.trace.record import ABSENT, Step, declared
from arag.trace.steps import Token


@declared
class Draft(Step, kind="draft"):
    """Uncertainty gate: the closed-book draft answer, and the tokens its signal reads."""

    answer: str
    tokens: list[Token]


@declared
class Gate(Step, kind="gate", decision="retrieve"):
    """Uncertainty gate: the signal's score against the threshold, and whether to retrieve."""

    signal: str
    score: float | None
    threshold: float
    retrieve: bool
    values: list[float] = ABSENT  # what the score aggregates: per token, or per word (entropy_trend)
    words: list[str] = ABSENT
    needs_retrieval: bool | None = ABSENT  # ask: the LM's judgement (None: unreadable)
    today: str = ABSENT
    reason: str = ABSENT
