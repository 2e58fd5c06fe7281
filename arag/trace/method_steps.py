"""The step kinds of single methods: CRAG, Self-RAG, Adaptive-Note, GenGround, SuRe, the uncertainty gate and
Search-o1 (the kinds every program may record are in `arag.trace.steps`)."""

from __future__ import annotations

from typing import Any

from typing_extensions import TypedDict  # pydantic reads typing_extensions TypedDicts (traces read back: arag.runs)

from arag.trace.record import ABSENT, Step, declared
from arag.trace.steps import ScoredPassage, Token


class KeptStrip(TypedDict):
    source: str
    text: str
    score: float


# --- CRAG and Self-CRAG ------------------------------------------------------------------------------------


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


# --- Self-RAG ----------------------------------------------------------------------------------------------


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


# --- Adaptive-Note -----------------------------------------------------------------------------------------


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


# --- GenGround ---------------------------------------------------------------------------------------------


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


# --- SuRe --------------------------------------------------------------------------------------------------


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


# --- Uncertainty gate --------------------------------------------------------------------------------------


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


# --- Search-o1 ---------------------------------------------------------------------------------------------


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
