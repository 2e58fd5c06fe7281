"""The step kinds of Search-o1: the reasoning's turns, Reason-in-Documents, and the back-off."""

from __future__ import annotations

from arag.trace.record import ABSENT, Step, declared


@declared
class Turn(Step, kind="turn", decision="action"):
    """Search-o1: one generation of the reasoning, the query it ends on, and what followed it."""

    turn: int
    text: str
    query: str | None
    action: str  # search, limit_notice, repeat_notice or finished


@declared
class Condense(Step, kind="condense"):
    """Search-o1: Reason-in-Documents: the documents a query found, condensed into the result inserted into
    the reasoning."""

    turn: int
    query: str
    passage_ids: list[str]
    previous_reasoning: str
    analysis: str = ABSENT
    result: str
    found_nothing: bool


@declared
class BackOff(Step, kind="back_off"):
    """Search-o1: the reasoning gave no final answer; the answer comes from reasoning without retrieval."""

    reason: str

