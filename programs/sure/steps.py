"""The step kinds of SuRe: candidates, their summaries, validity and pair-wise comparisons, and the choice."""

from __future__ import annotations

from arag.trace.record import ABSENT, Step, declared


@declared
class Candidates(Step, kind="candidates"):
    """SuRe: the answers proposed, and the distinct candidates kept."""

    proposed: list[str]
    candidates: list[str]


@declared
class Summary(Step, kind="summary"):
    """SuRe: a summary arguing for one candidate."""

    candidate_index: int
    candidate: str
    summary: str


@declared
class Validity(Step, kind="validity", decision="supports"):
    """SuRe: whether a candidate's summary supports it, and its validity score."""

    candidate_index: int
    candidate: str
    supports: bool | None
    p_supports: float = ABSENT
    validity: float


@declared
class Pair(Step, kind="pair"):
    """SuRe: a pair of summaries compared in both orders, and each one's share of the points."""

    candidate_indices: list[int]
    winners: list[int | None]
    share: list[float]


@declared
class Compare(Step, kind="compare"):
    """SuRe: one pair-wise comparison, in one order."""

    order: list[int]
    shown: list[str]
    winner: int | None


@declared
class Select(Step, kind="select", decision="reason"):
    """SuRe: the candidate chosen, and why (with the scores that decided)."""

    reason: str
    validity: list[float] = ABSENT
    ranking: list[float] = ABSENT
    scores: list[float] = ABSENT
    chosen_index: int = ABSENT
    chosen: str
    tie: bool = ABSENT
