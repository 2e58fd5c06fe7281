"""CRAG's knowledge refinement, decompose-then-recompose, as the paper describes it: split passages into
strips, score each strip with the retrieval evaluator, keep the top k strips scoring above a threshold,
and return them in their original reading order."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from arag.errors import ConfigError
from arag.passages import Passage
from arag.programs.crag.evaluator import RelevanceScorer
from arag.programs.frame.sentences import split_sentences

STRIP_MODES = ("sentences", "words", "passage")
SENTENCES_PER_STRIP = 3
WORDS_PER_STRIP = 50
MIN_TAIL_WORDS = 10


@dataclass(frozen=True)
class Strip:
    """A knowledge strip: a piece of one passage, where it sits in reading order, and its score."""

    source: str
    title: str
    text: str
    order: int
    score: float = math.nan

    @property
    def long_text(self) -> str:
        return f"{self.title} | {self.text}" if self.title else self.text


@dataclass(frozen=True)
class Refinement:
    """Every strip (scored, in reading order) and the ones kept (in reading order)."""

    strips: tuple[Strip, ...]
    kept: tuple[Strip, ...]

    @property
    def knowledge(self) -> list[str]:
        """The kept strips as the generator reads them: `Title | text`."""
        return [strip.long_text for strip in self.kept]


def decompose(text: str, mode: str) -> list[str]:
    """A passage's knowledge strips: `sentences` groups SENTENCES_PER_STRIP consecutive sentences;
    `words` cuts windows of WORDS_PER_STRIP words (a last window under MIN_TAIL_WORDS words joins
    the one before); `passage` keeps the whole passage as one strip."""
    if mode not in STRIP_MODES:
        raise ConfigError(f"parameter 'strip_mode' must be one of {list(STRIP_MODES)}, got {mode!r}")
    if not text.strip():
        return []
    if mode == "passage":
        return [" ".join(text.split())]
    if mode == "sentences":
        sentences = [" ".join(s.split()) for s in split_sentences(text.strip())]
        return [" ".join(sentences[i : i + SENTENCES_PER_STRIP]) for i in range(0, len(sentences), SENTENCES_PER_STRIP)]
    words = text.split()
    windows = [words[i : i + WORDS_PER_STRIP] for i in range(0, len(words), WORDS_PER_STRIP)]
    if len(windows) > 1 and len(windows[-1]) < MIN_TAIL_WORDS:
        tail = windows.pop()
        windows[-1] += tail
    return [" ".join(window) for window in windows]


def select_strips(scores: Sequence[float], top_k: int, threshold: float) -> list[int]:
    """Indices of the top_k highest scores strictly above `threshold` (ties go to the earlier strip),
    in their original order."""
    above = [i for i, score in enumerate(scores) if score > threshold]
    best = sorted(above, key=lambda i: (-scores[i], i))[:top_k]
    return sorted(best)


def refine(
    question: str,
    passages: Sequence[Passage],
    scorer: RelevanceScorer,
    *,
    mode: str = "sentences",
    top_k: int = 5,
    threshold: float = -0.5,
    in_score_order: bool = False,
    min_words: int = 0,
) -> Refinement:
    """Decompose-then-recompose: split the passages into strips, score every strip (`Title | text`)
    against the question in one scorer call, keep the top_k above `threshold`, in reading order (or in
    score order); strips under `min_words` words are not scored (the evaluator gives a blank text -1)."""
    pieces = [(passage, text) for passage in passages for text in decompose(passage.text, mode)]
    strips = [Strip(passage.id, passage.title, text, order) for order, (passage, text) in enumerate(pieces)]
    scores = scorer.score(question, [strip.long_text if len(strip.text.split()) >= min_words else ""
                                     for strip in strips])
    scored = tuple(replace(strip, score=score) for strip, score in zip(strips, scores))
    chosen = select_strips(scores, top_k, threshold)
    if in_score_order:
        chosen = sorted(chosen, key=lambda i: (-scores[i], i))
    return Refinement(scored, tuple(scored[i] for i in chosen))
