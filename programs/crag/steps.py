"""The step kinds of CRAG and Self-CRAG: the evaluator's scores, the action, the refined strips, the knowledge
search and the knowledge forms Self-CRAG gives Self-RAG."""

from __future__ import annotations

from typing_extensions import TypedDict  # pydantic reads typing_extensions TypedDicts (traces read back: arag.runs)

from arag.trace.record import ABSENT, Step, declared
from arag.trace.steps import ScoredPassage


class KeptStrip(TypedDict):
    source: str
    text: str
    score: float


@declared
class Evaluate(Step, kind="evaluate"):
    """CRAG: the retrieval evaluator's score of each passage."""

    scorer: str
    scores: list[ScoredPassage]


@declared
class Action(Step, kind="action", decision="action"):
    """CRAG: the action the highest score triggers, and the thresholds."""

    action: str
    max_score: float | None
    upper: float
    lower: float


@declared
class Refine(Step, kind="refine"):
    """CRAG: decompose-then-recompose: every strip's score and the strips kept."""

    source: str
    mode: str
    refinement: str
    strip_scores: list[float]
    kept: list[KeptStrip]


@declared
class Search(Step, kind="search", decision="reason"):
    """CRAG: a knowledge search that was skipped, and why."""

    skipped: bool
    reason: str


@declared
class Rewrite(Step, kind="rewrite"):
    """CRAG: the question rewritten as search keywords."""

    query: str
    reason: str = ABSENT


@declared
class AnswerFromQuestion(Step, kind="answer_from_question"):
    """CRAG: no knowledge was left, so the answer comes from the question alone."""

    reason: str


@declared
class Contexts(Step, kind="contexts"):
    """Self-CRAG: which knowledge forms a retrieving step gave Self-RAG."""

    depth: int
    given: list[str]
    empty: list[str]
