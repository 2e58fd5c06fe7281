"""The step kinds of DRAGIN: each generation's RIND reading and its decision, the query QFS formed, the continuation
written from the documents, and the answer completed after "So the answer is"."""

from __future__ import annotations

from arag.trace.record import ABSENT, Step, declared


@declared
class RindCheck(Step, kind="rind", decision="triggered"):
    """DRAGIN: a generation without new documents, and RIND over its words: H (mean token entropy), a (attention
    from later tokens, rescaled to mean 1 in its sentence), S = H × a × s (s = 0 for a stopword); triggered when a
    word's S exceeds the threshold, at the first such word."""

    index: int
    text: str
    words: list[str]
    entropies: list[float]
    attention: list[float]
    scores: list[float]
    threshold: float
    triggered: bool
    stopped: str  # why the generation ended: eos (an end of sequence or other special token), stop (the end of the
    # answer's line) or length
    trigger: str = ABSENT  # the first word whose S exceeds the threshold, its position among the words and its S
    trigger_index: int = ABSENT
    trigger_score: float = ABSENT
    kept: str = ABSENT  # the generation's text kept before the trigger (truncate=sentence: the sentences before it)
    dropped: str = ABSENT  # the rest, dropped


@declared
class FocusedQuery(Step, kind="qfs"):
    """DRAGIN: the query QFS formed: the content words before the trigger that it attends to most, in their
    order, with the attention each received."""

    trigger: str
    candidates: int  # the content words before the trigger QFS chose from
    query: str
    weights: list[float]


@declared
class Continuation(Step, kind="continuation"):
    """DRAGIN: the generation from the retrieved documents after a trigger, and the first sentence kept of it."""

    index: int
    text: str
    kept: str
    passage_ids: list[str]


@declared
class AnswerCompletion(Step, kind="answer_completion"):
    """DRAGIN: the long answer gave no "the answer is": "So the answer is" was appended and completed."""

    text: str
    tokens: int = ABSENT
