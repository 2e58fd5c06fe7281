"""Long-form generation one piece at a time with retrieval between pieces: the frame that FLARE and
the passive multi-time baselines share (Jiang et al., 2023, sections 2 and 6.1).

Every program of the frame retrieves with the question first, then writes the answer piece by piece;
each piece is drafted from [passages, question, answer so far] without new retrieval. The programs
differ only in WHEN and WHAT they retrieve, which each decides in one of two hooks:

    program        before drafting a piece                 after drafting it
    -------------  --------------------------------------  ---------------------------------------------
    prev-window    each window: the previous window        keep the draft
    prev-sentence  each sentence: the previous sentence    keep the draft
                   (passages accumulate up to a cap)
    ircot          as prev-sentence, K passages per        keep the draft; stop at "answer is" or the step
                   sentence up to 15                       limit, then a reader answers from every passage
    flare          -                                       unsure draft: query from it, retrieve, and
                                                           write the sentence again

The answer ends when the model ends it (an empty continuation, or a last sentence "So the answer is
X."), or when the token budget is spent (`stop_reason`; prev-sentence and ircot may add a step limit and
stop at "answer is"). The short answer is then read from the long one, unless the program answers
otherwise (`finish`: ircot's reader). The LM's tokens come with their log-probabilities, read through
`arag.lm` (`field_logprobs` for a signature, `complete_raw` for a raw completion model); an endpoint
that returns none gets an LMError.

Each piece's step records its text and `tokens`, the kept piece's tokens as [text, probability] pairs
(FLARE records its look-ahead's as `lookahead_tokens`, and `tokens` only where the kept sentence's differ).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import ClassVar, Sequence

import dspy

from arag.lm import TokenLogprob, complete_raw, field_logprobs, raw_prompt_lm, require_lm
from arag.passages import Passage, dedup, format_passages
from arag.programs.frame.base import RAGProgram
from arag.programs.frame.params import Param
from arag.programs.frame.sentences import ends_with_final_answer, final_answer, split_sentences
from arag.signatures.generation import ContinueAnswer
from arag.trace import Answer, PieceStep, Sentence, Stop, StopReason, shown_probability, steps_of, stop_reason

LOOKAHEAD_TOKENS = Param("lookahead_tokens", 64, "tokens drafted per step, of which the first sentence is kept",
                         low=4, high=1024)
MAX_TOKENS = Param("max_tokens", 256, "answer length budget, in LM tokens", low=8, high=8192)
PROMPT_STYLE = Param(
    "prompt_style", "signature",
    "signature: a typed DSPy signature (chat LMs, compilable); raw: a plain prompt, sent to the LM's "
    "/v1/completions (or a local model without its chat template)",
    choices=("signature", "raw"), tunable=False,
)

MARKUP_TOKENS = 32  # room for the adapter's field markers around a signature's output
PARAGRAPH_END = "\n\n"  # where a raw completion model ends its answer


@dataclass(frozen=True)
class Piece:
    """Generated text and the LM's tokens for it."""

    text: str
    tokens: tuple[TokenLogprob, ...] = ()

    @property
    def min_prob(self) -> float:
        return min((token.prob for token in self.tokens), default=1.0)


@dataclass
class LongAnswer:
    """The answer being written: its pieces, the passages in context, the tokens spent."""

    question: str
    passages: list[Passage]
    pieces: list[str] = field(default_factory=list)
    tokens_used: int = 0

    @property
    def text(self) -> str:
        return " ".join(self.pieces)

    def add(self, piece: Piece) -> None:
        self.pieces.append(piece.text)
        self.tokens_used += max(len(piece.tokens), 1)

    def finish(self, program: RAGProgram) -> dict:
        """The short answer read from the long one ("So the answer is X."), and the long one."""
        short = final_answer(self.text)
        program.note(Answer(answer=short))
        return {"answer": short, "long_answer": self.text}


class ActiveGeneration(RAGProgram):
    """The generation loop. Subclasses decide when and what to retrieve in `before_drafting` (from what
    is written) and `review` (from the draft), and may change the piece (`cut`, `draft_tokens`), when to
    stop (`stop_reason`) and the result (`finish`)."""

    piece_step: ClassVar[type[PieceStep]] = Sentence

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        # top_logprobs too: some servers (llama-cpp-python) return no log-probabilities for logprobs alone
        self.continue_answer = dspy.Predict(ContinueAnswer, logprobs=True, top_logprobs=1)

    def required_lm_calls(self, trace: list[dict]) -> int:
        """One draft per piece, plus the empty draft with which the model ends its answer."""
        return len(steps_of(trace, self.piece_step)) + (stop_reason(trace) == StopReason.MODEL_ENDED)

    def run(self, question: str) -> dict:
        answer = LongAnswer(question, self.retrieve(question, why="question"))
        while True:
            step = {"index": len(answer.pieces), "retrieved": False}
            self.before_drafting(answer, step)
            draft = self.draft(answer)
            if not draft.text:
                stop = StopReason.MODEL_ENDED
                break
            piece = self.review(answer, draft, step)
            answer.add(piece)
            tokens = shown_tokens(piece.tokens)
            kept = {"tokens": tokens} if tokens != step.get("lookahead_tokens") else {}
            self.note(self.piece_step(**step, text=piece.text, **kept))
            stop = self.stop_reason(answer)
            if stop:
                break
        self.note(Stop(reason=stop, pieces=len(answer.pieces), tokens=answer.tokens_used))
        return self.finish(answer)

    def finish(self, answer: LongAnswer) -> dict:
        """The result once writing stops: the short answer read from the long one."""
        return answer.finish(self)

    def before_drafting(self, answer: LongAnswer, step: dict) -> None:
        """Retrieve from what is already written, before the next piece is drafted (passive baselines)."""

    def review(self, answer: LongAnswer, draft: Piece, step: dict) -> Piece:
        """The piece to keep, given its draft (FLARE retrieves and writes it again here)."""
        return draft

    @property
    def draft_tokens(self) -> int:
        return self.lookahead_tokens

    def draft(self, answer: LongAnswer) -> Piece:
        """The next piece from [passages, question, answer so far], without new retrieval."""
        budget = min(self.draft_tokens, self.max_tokens - answer.tokens_used)
        return self.cut(*self.generate(answer, budget))

    def cut(self, text: str, tokens: Sequence[TokenLogprob]) -> Piece:
        """The piece kept from a continuation: its first sentence."""
        return first_sentence(text, tokens)

    def generate(self, answer: LongAnswer, max_tokens: int) -> tuple[str, list[TokenLogprob]]:
        """A continuation of the answer (at most `max_tokens` tokens) and its tokens."""
        if self.prompt_style == "raw":
            return complete_raw(raw_prompt_lm(require_lm()), raw_prompt(answer), max_tokens=max_tokens,
                                stop=[PARAGRAPH_END])
        prediction = self.continue_answer(
            passages=format_passages(answer.passages),
            question=answer.question,
            answer_so_far=answer.text,
            config={"max_tokens": max_tokens + MARKUP_TOKENS},
        )
        text = prediction.continuation.strip()
        return text, field_logprobs(prediction, "continuation") if text else []

    def search(self, queries: Sequence[str], step: dict, *, why: str) -> list[Passage]:
        """Retrieve for every query; the results merged rank by rank into the top k distinct passages."""
        results = [self.retrieve(query, why=why) for query in queries]
        by_rank = (passage for rank in itertools.zip_longest(*results) for passage in rank if passage is not None)
        merged = dedup(by_rank)[: self.k]
        step.update(retrieved=True, queries=list(queries), passage_ids=[p.id for p in merged])
        return merged

    def stop_reason(self, answer: LongAnswer) -> StopReason | None:
        if ends_with_final_answer(answer.text):
            return StopReason.FINAL_ANSWER
        if answer.tokens_used >= self.max_tokens:
            return StopReason.TOKEN_BUDGET
        return None


def raw_prompt(answer: LongAnswer) -> str:
    """The plain prompt for a completion model: passages before the input, then the answer so far."""
    passages = "\n".join(format_passages(answer.passages))
    written = f" {answer.text}" if answer.pieces else ""
    return (
        f"Search results, most relevant first:\n{passages}\n\n"
        "Answer the question step by step, using the search results where they help. "
        'When the answer is short, end with "So the answer is X."\n\n'
        f"Question: {answer.question}\nAnswer:{written}"
    )


def shown_tokens(tokens: Sequence[TokenLogprob]) -> list[list]:
    """Tokens as a trace records them: [text, probability] pairs, probabilities rounded by `shown_probability`."""
    return [[token.token, shown_probability(token.prob)] for token in tokens]


def token_spans(text: str, tokens: Sequence[TokenLogprob]) -> list[tuple[TokenLogprob, int, int]]:
    """Each token with its character span in `text`; tokens outside `text` (markup, leading
    whitespace) get spans that end at or before 0 or start at or after `len(text)`."""
    joined = "".join(token.token for token in tokens)
    position = -max(joined.find(text), 0)
    spans = []
    for token in tokens:
        spans.append((token, position, position + len(token.token)))
        position += len(token.token)
    return spans


def first_sentence(text: str, tokens: Sequence[TokenLogprob]) -> Piece:
    """The first sentence of `text` with the tokens that make it up."""
    text = text.strip()
    sentences = split_sentences(text)
    if not sentences:
        return Piece("")
    sentence = sentences[0].strip()
    start = text.find(sentence)
    end = start + len(sentence)
    kept = tuple(token for token, left, right in token_spans(text, tokens) if left < end and right > start)
    return Piece(sentence, kept)


def first_tokens(text: str, tokens: Sequence[TokenLogprob], count: int) -> Piece:
    """The first `count` tokens of `text`, extended up to the next whitespace so that a piece never
    ends inside a word (the next piece then starts where a space was)."""
    text = text.strip()
    inside = [span for span in token_spans(text, tokens) if span[1] < len(text) and span[2] > 0]
    kept = inside[:count]
    for span in inside[count:]:
        if span[0].token[:1].isspace():
            break
        kept.append(span)
    if not kept:
        return Piece("")
    return Piece(text[: min(kept[-1][2], len(text))].strip(), tuple(span[0] for span in kept))

