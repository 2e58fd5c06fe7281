"""The step kinds of the baselines that search their own way: Self-Ask's follow-ups, ReAct's actions and what
their tools returned."""

from __future__ import annotations

from typing import Any

from arag.trace.record import ABSENT, Step, declared


@declared
class FollowUp(Step, kind="follow_up"):
    """Self-Ask: a follow-up question and its intermediate answer."""

    question: str
    intermediate_answer: str
    passage_ids: list[str]


@declared
class Act(Step, kind="act", decision="tool"):
    """ReAct: a thought and the tool call it chose."""

    thought: str
    tool: str
    args: dict[str, Any]


@declared
class Observation(Step, kind="observation"):
    """ReAct: what a tool returned, or the error it raised."""

    tool: str
    observation: Any = ABSENT
    error: str = ABSENT
