"""The step kinds of GenGround: deductions, grounding batches and each hop's outcome."""

from __future__ import annotations

from typing import Any

from arag.trace.record import ABSENT, Step, declared


@declared
class Deduce(Step, kind="deduce", decision="finished"):
    """GenGround: the next sub-question and the model's own answer, or the final answer."""

    hop: int
    finished: bool
    sub_question: str
    answer: Any
    reasoning: str = ABSENT


@declared
class Ground(Step, kind="ground", decision="evidence_found"):
    """GenGround: one batch of passages grounding a deduced answer: the call's inputs and outputs."""

    hop: int
    batch: int
    passage_ids: list[str]
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    evidence_found: bool


@declared
class Hop(Step, kind="hop", decision="revised"):
    """GenGround: a hop's outcome: the batches tried, the evidence and the answer kept."""

    hop: int
    sub_question: str
    deduced_answer: Any
    batches: list[list[str]]
    evidence: list[str]
    answer: Any
    revised: bool
