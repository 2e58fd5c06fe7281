"""The passive multi-time baselines of FLARE's frame (Jiang et al., 2023, section 6.1): they retrieve at
fixed points with what was already written, where FLARE retrieves when unsure with what comes next.

`prev-window` (RETRO, IC-RALM, kNN-LM): the answer is written `window` tokens at a time (a window
runs on to the end of the word it stops in), and before each window the previous window is the
query; its passages replace the ones in context.
`prev-sentence` (IRCoT): the answer is written a sentence at a time, and before each sentence the
previous sentence is the query; passages accumulate in context up to `max_passages`.
Both start from the passages for the question.
"""

from __future__ import annotations

from typing import Sequence

from arag.errors import ConfigError
from arag.lm import TokenLogprob
from arag.passages import dedup
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
from arag.programs.frame.registry import register

WINDOW = Param("window", 16, "tokens per window: retrieve every `window` tokens with the last `window` tokens",
               low=1, high=256, searched=True, search_range=(8, 64))
MAX_PASSAGES = Param("max_passages", 15, "cap on the passages accumulated in context (IRCoT's 15)", low=1, high=100,
                     searched=True, search_range=(5, 20))

WORD_END_TOKENS = 8  # drafted beyond a window, so that it can end where its last word ends


@register
class PreviousWindow(ActiveGeneration):
    """Previous-window: before each window of l tokens, retrieve with the previous window."""

    name = "prev-window"
    params = (WINDOW, FLARE_SETTING_K, MAX_TOKENS, PROMPT_STYLE)
    piece_step = "window"

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

    The new passages join those in context until `max_passages` are held; then retrieval stops.
    """

    name = "prev-sentence"
    params = (MAX_PASSAGES, FLARE_SETTING_K, LOOKAHEAD_TOKENS, MAX_TOKENS, PROMPT_STYLE)

    def check_params(self, config: dict) -> None:
        if config["max_passages"] < config["k"]:
            raise ConfigError(
                f"prev-sentence: parameter 'max_passages' ({config['max_passages']}) must be at least "
                f"k ({config['k']}), the passages of the first retrieval"
            )

    def before_drafting(self, answer: LongAnswer, step: dict) -> None:
        if not answer.pieces:
            return
        if len(answer.passages) >= self.max_passages:
            step["skipped"] = "the passage cap is reached"
            return
        found = self.search([answer.pieces[-1]], step, why="previous sentence")
        fresh = dedup(found, {passage.id for passage in answer.passages})
        answer.passages = (answer.passages + fresh)[: self.max_passages]
