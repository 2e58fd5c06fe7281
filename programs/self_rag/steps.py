"""The step kinds of Self-RAG: retrieval decisions, critiqued candidates, the beam and the chosen path."""

from __future__ import annotations

from arag.trace.record import ABSENT, Step, declared


@declared
class RetrievalDecision(Step, kind="retrieval_decision", decision="decision"):
    """Self-RAG: whether to retrieve before the next segment."""

    depth: int
    parent: str | None
    mode: str
    decision: str
    rule: str = ABSENT
    p_retrieve: float = ABSENT
    delta: float = ABSENT
    probabilities: dict[str, float] = ABSENT


@declared
class Candidate(Step, kind="candidate"):
    """Self-RAG: a candidate segment, its critiques and its scores."""

    id: str
    depth: int
    passage: str | None
    continued: bool
    text: str
    sequence_score: float
    sequence_prob: float
    critiques: dict[str, dict[str, float]]
    relevance: float
    support: float
    utility: float
    score: float
    path_score: float
    done: bool


@declared
class Beam(Step, kind="beam"):
    """Self-RAG: the paths kept at a depth, and those finished."""

    depth: int
    kept: list[str]
    finished: list[str]


@declared
class NoEvidence(Step, kind="no_evidence"):
    """Self-RAG: a retrieving step left no candidate; one is written without a passage."""

    depth: int
    parent: str | None
    reason: str


@declared
class Dropped(Step, kind="dropped"):
    """Self-RAG: candidates dropped by the hard constraints."""

    ids: list[str]
    reason: str


@declared
class ClosedSet(Step, kind="closed_set"):
    """Self-RAG: the total score of each answer, for a closed-set task."""

    totals: dict[str, float]


@declared
class Chosen(Step, kind="chosen"):
    """Self-RAG: the best finished path and the passages it used."""

    path: list[str]
    score: float
    passages: list[str | None]
