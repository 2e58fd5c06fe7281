"""The step kind of Adaptive-RAG: the complexity label and the strategy it chose."""

from __future__ import annotations

from arag.trace.record import ABSENT, Step, declared


@declared
class Route(Step, kind="route", decision="label"):
    """Adaptive-RAG: the complexity label and the strategy it chose."""

    label: str
    strategy: str
    classifier: str
    probabilities: dict[str, float] = ABSENT

