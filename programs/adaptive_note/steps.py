"""The step kinds of Adaptive-Note: the notes written and updated, the proposed queries, the reviewer's decisions."""

from __future__ import annotations

from arag.trace.record import ABSENT, Step, declared


@declared
class Note(Step, kind="note"):
    """Adaptive-Note: the note written (iteration 0) or updated from the passages a query found."""

    iteration: int
    query: str = ABSENT
    new_ids: list[str]
    seen_ids: list[str]
    note: str


@declared
class Query(Step, kind="query", decision="repeated"):
    """Adaptive-Note: a proposed query, and whether it repeats one already asked."""

    iteration: int
    query: str
    repeated: bool


@declared
class Review(Step, kind="review", decision="better"):
    """Adaptive-Note: whether the updated note is better than the best one."""

    iteration: int
    better: bool
    p_better: float = ABSENT
