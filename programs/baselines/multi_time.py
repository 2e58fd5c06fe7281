"""The passive multi-time baselines of FLARE's frame (Jiang et al., 2023, section 6.1): they retrieve at
fixed points with what was already written, where FLARE retrieves when unsure with what comes next.

`prev-window` (RETRO, IC-RALM, kNN-LM): the answer is written `window` tokens at a time (a window
runs on to the end of the word it stops in), and before each window the previous window is the
query; its passages replace the ones in context.
`prev-sentence` (IRCoT-style): the answer is written a sentence at a time, and before each sentence the
previous sentence is the query; passages accumulate in context up to `max_passages`.
Both start from the passages for the question.

`PreviousSentence` is also IRCoT's loop: `ircot` (programs/ircot.py) is this program with the paper's
settings, which are parameters here: `max_steps` (a step limit; prev-sentence has none and stops only at
its final answer or `max_tokens`), `stop_rule` (prev-sentence stops once the written answer ends on a
complete "So the answer is X."; IRCoT at the first sentence that says "answer is") and `reader` (prev-sentence
reads the short answer from what it wrote; IRCoT asks a reader, with or without reasoning, to answer from
every passage collected). `max_passage_words` cuts each passage shown to the LM to its first words (IRCoT's 350).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Sequence

from arag.errors import ConfigError
from arag.lm import TokenLogprob
from arag.passages import Passage, dedup, format_passages
from arag.programs.frame.active_generation import (
    LOOKAHEAD_TOKENS,
    MAX_TOKENS,
    PROMPT_STYLE,
    ActiveGeneration,
    LongAnswer,
    Piece,
    first_tokens,
)
from arag.programs.frame.params import FLARE_SETTING_K, Param
from arag.programs.frame.predictors import predictor
from arag.programs.frame.registry import register
from arag.signatures import AnswerFromPassages
from arag.trace import Read, StopReason, Window, steps_of

WINDOW = Param("window", 16, "tokens per window: retrieve every `window` tokens with the last `window` tokens",
               low=1, high=256, searched=True, search_range=(8, 64))
MAX_PASSAGES = Param("max_passages", 15, "cap on the passages accumulated in context (IRCoT's 15)", low=1, high=100,
                     searched=True, search_range=(5, 20))
MAX_STEPS = Param("max_steps", 0, "the most sentences written before the answer stops (0: no limit but max_tokens)",
                  low=0, high=64)
STOP_RULE = Param(
    "stop_rule", "final-answer",
    'final-answer: stop once the answer ends on a complete "So the answer is X." sentence; answer-is: stop at '
    'the first sentence that says "answer is", wherever in it',
    choices=("final-answer", "answer-is"), tunable=False,
)
MAX_PASSAGE_WORDS = Param("max_passage_words", 0, "each passage is shown cut to its first this many words "
                          "(0: whole)", low=0, high=10000, tunable=False)
READER = Param(
    "reader", "none",
    'none: the short answer is read from the written answer ("So the answer is X."); cot / direct: once writing '
    "stops, a separate call answers the question from every passage collected, reasoning first (cot) or not",
    choices=("none", "cot", "direct"), tunable=False,
)

WORD_END_TOKENS = 8  # drafted beyond a window, so that it can end where its last word ends
ANSWER_IS = re.compile(r"\banswer\s+is\b", re.IGNORECASE)  # stop_rule=answer-is


@register
class PreviousWindow(ActiveGeneration):
    """Previous-window: before each window of l tokens, retrieve with the previous window."""

    name = "prev-window"
    lm_calls_formula = "one draft per window (+1 ending)"
    params = (WINDOW, FLARE_SETTING_K, MAX_TOKENS, PROMPT_STYLE)
    piece_step = Window

    def before_drafting(self, answer: LongAnswer, step: dict) -> None:
        if answer.pieces:
            answer.passages = self.search([answer.pieces[-1]], step, why="previous window")

    @property
    def draft_tokens(self) -> int:
        return self.window + WORD_END_TOKENS

    def cut(self, text: str, tokens: Sequence[TokenLogprob]) -> Piece:
        return first_tokens(text, tokens, self.window)


@register
class PreviousSentence(ActiveGeneration):
    """Previous-sentence (IRCoT-style): before each sentence, retrieve with the previous one; passages accumulate.

    The new passages join those in context until `max_passages` are held; then retrieval stops. Writing
    stops by `stop_rule`, at `max_steps` sentences, or when `max_tokens` are spent; with a `reader`, a last
    call answers from every passage held.
    """

    name = "prev-sentence"
    lm_calls_formula = "one draft per sentence (+1 ending)"
    params = (MAX_PASSAGES, FLARE_SETTING_K, LOOKAHEAD_TOKENS, MAX_TOKENS, PROMPT_STYLE, MAX_STEPS, STOP_RULE, READER,
              MAX_PASSAGE_WORDS)

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        if self.reader != "none":
            self.generate_answer = predictor(AnswerFromPassages, self.reader)

    def check_params(self, config: dict) -> None:
        if config["max_passages"] < config["k"]:
            raise ConfigError(
                f"{self.name}: parameter 'max_passages' ({config['max_passages']}) must be at least "
                f"k ({config['k']}), the passages of the first retrieval"
            )

    def retrieve(self, query: str, k: int | None = None, *, why: str) -> list[Passage]:
        """The top-k passages, each cut to its first `max_passage_words` words when that is set."""
        passages = super().retrieve(query, k, why=why)
        return [first_words(p, self.max_passage_words) for p in passages] if self.max_passage_words else passages

    def before_drafting(self, answer: LongAnswer, step: dict) -> None:
        if not answer.pieces:
            return
        if len(answer.passages) >= self.max_passages:
            step["skipped"] = "the passage cap is reached"
            return
        found = self.search([answer.pieces[-1]], step, why="previous sentence")
        fresh = dedup(found, {passage.id for passage in answer.passages})
        answer.passages = (answer.passages + fresh)[: self.max_passages]

    def stop_reason(self, answer: LongAnswer) -> StopReason | None:
        if self.stop_rule == "answer-is" and ANSWER_IS.search(answer.pieces[-1]):
            return StopReason.ANSWER_IS
        stop = super().stop_reason(answer)
        if stop is None and self.max_steps and len(answer.pieces) >= self.max_steps:
            return StopReason.STEP_LIMIT
        return stop

    def finish(self, answer: LongAnswer) -> dict:
        """Without a reader, the short answer read from the written one; with one, the reader's answer from
        every passage held, the written answer kept as `long_answer`."""
        if self.reader == "none":
            return super().finish(answer)
        self.note(Read(reader=self.reader, passage_ids=[passage.id for passage in answer.passages]))
        prediction = self.generate_answer(passages=format_passages(answer.passages), question=answer.question)
        return {"answer": self.answered(prediction), "long_answer": answer.text}

    def required_lm_calls(self, trace: list[dict]) -> int:
        """One draft per sentence (+1 ending), and the reader's call when there is one."""
        return super().required_lm_calls(trace) + len(steps_of(trace, Read))


def first_words(passage: Passage, count: int) -> Passage:
    """The passage with its text cut to its first `count` words."""
    words = passage.text.split()
    return passage if len(words) <= count else replace(passage, text=" ".join(words[:count]))
