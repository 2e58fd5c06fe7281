"""The step kinds programs share, declared once: their facts, named and typed, and why a program stops. A method's
own kinds are declared beside it, in its `steps.py` (`programs/crag/steps.py`, ...), the same way.

A program records a step complete (`note(Answer(answer=text))`); the trace holds it as a JSON object whose
`step` key names its kind. Facts whose default is `ABSENT` appear only where the program has them.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import TypedDict  # pydantic reads typing_extensions TypedDicts (traces read back: arag.runs)

from arag.trace.record import ABSENT, DescribedEnum, Step, declared

Token = tuple[str, float]  # a token as a trace records it: [text, probability]


class StopReason(DescribedEnum):
    """Why a program stopped writing, searching or collecting (a `stop` step's `reason`)."""

    MODEL_ENDED = "model_ended", "the model ended its answer"
    FINAL_ANSWER = "final_answer", "the answer gave its final answer"
    TOKEN_BUDGET = "token_budget", "the token budget is spent"
    STEP_LIMIT = "step_limit", "the step limit is reached"
    ANSWER_IS = "answer_is", 'the sentence says "answer is"'
    SEARCH_CAP = "search_cap", "the model kept searching past the cap"
    DEDUCED = "deduced", "the deduction gave the final answer"
    NO_SUB_QUESTION = "no_sub_question", "the deduction asked no sub-question"
    HOP_BUDGET = "hop_budget", "the hop budget is spent"
    FOLLOW_UP_CAP = "follow_up_cap", "the follow-up cap is reached"
    NO_FOLLOW_UP = "no_follow_up", "no follow-up is needed"
    FOLLOW_UP_REPEATED = "follow_up_repeated", "a follow-up was asked again"
    T_IU = "t_iu", "the reviewer rejected t_iu updates of the note"
    T_CI = "t_ci", "t_ci collection iterations were spent"
    T_RP = "t_rp", "t_rp distinct passages were read"
    REPEATED_QUERY = "repeated_query", "every proposed query repeated one already asked"
    REPEATED_ACTION = "repeated_action", "the model called a tool again with the same arguments"


class ScoredPassage(TypedDict):
    id: str
    title: str
    score: float


# --- every program ---------------------------------------------------------------------------------------


@declared
class Retrieve(Step, kind="retrieve"):
    """A retriever call: why it was made, the query, the passages found and which of them were new."""

    why: str
    query: str
    k: int
    passages: list[ScoredPassage]
    new_ids: list[str]
    cut_ids: list[str] = ABSENT  # Adaptive-Note: new passages found but left unread (the T_RP cap)
    documents: list[dict[str, Any]] = ABSENT  # a knowledge search: the web documents behind the passages


@declared
class Answer(Step, kind="answer"):
    """The final answer, with its token probabilities when the LM returned them."""

    answer: Any
    min_token_prob: float = ABSENT
    mean_token_prob: float = ABSENT
    stated: str = ABSENT  # GenGround: the deduction's own words, read as yes or no
    summary: str = ABSENT  # SuRe: the chosen candidate's summary


@declared
class Stop(Step, kind="stop", decision="reason"):
    """Why a loop ended, with the counts that led there."""

    reason: StopReason
    pieces: int = ABSENT
    tokens: int = ABSENT
    searches: int = ABSENT
    hops: int = ABSENT
    follow_ups: int = ABSENT
    invalid_updates: int = ABSENT
    iterations: int = ABSENT
    distinct_passages: int = ABSENT


@declared
class Unreadable(Step, kind="unreadable"):
    """A judgement whose output could not be read: the documented fallback was taken."""

    signature: str
    fallback: str
    error: str


# --- writing piece by piece: FLARE, the multi-time baselines, IRCoT ------------------------------------------


@declared
class PieceStep(Step, decision="retrieved"):
    """A piece of a long answer: its text and tokens, and the retrieval made for it."""

    index: int
    retrieved: bool
    text: str
    tokens: list[Token] = ABSENT
    skipped: str = ABSENT  # why no retrieval was made
    lookahead: str = ABSENT  # FLARE: the draft, its least sure token, its tokens
    min_prob: float = ABSENT
    lookahead_tokens: list[Token] = ABSENT
    spans: list[str] = ABSENT  # FLARE's unsure spans, and the questions about them without a "?"
    dropped_questions: list[str] = ABSENT
    queries: list[str] = ABSENT
    passage_ids: list[str] = ABSENT
    rewrite: str = ABSENT  # "empty": the rewrite after retrieval came out empty, the draft stands


@declared
class Sentence(PieceStep, kind="sentence"):
    """A sentence of a long answer."""


@declared
class Window(PieceStep, kind="window"):
    """A fixed-length window of a long answer."""


@declared
class Write(Step, kind="write"):
    """FLARE-instruct: the text written up to a search marker, and the marker's query (None: none)."""

    index: int
    text: str
    search: str | None
    forbidden: list[int] = ABSENT  # the token ids forbidden just after a search


@declared
class Read(Step, kind="read"):
    """A reader answering from every passage held."""

    reader: str
    passage_ids: list[str]


# --- Iter-RetGen ---------------------------------------------------------------------------------------------


@declared
class Generate(Step, kind="generate"):
    """Iter-RetGen: one retrieval-then-generation iteration."""

    iteration: int
    query: str
    passage_ids: list[str]
    generation: str
    answer: Any
