"""Sentences of a written answer, and the short final answer it ends on."""

from __future__ import annotations

import functools
import re
import threading

import pysbd

_segmenters = threading.local()
_ANSWER_CUE = re.compile(r"\bthe\s+(?:final\s+)?answer\s+is\s*:?\s*", re.IGNORECASE)


def split_sentences(text: str) -> list[str]:
    """The sentences of `text` (pysbd's rule-based splitter), each with its trailing space kept,
    so that `"".join(split_sentences(t)) == t` for text without leading whitespace."""
    return list(_sentences(text)) if text.strip() else []


@functools.lru_cache(maxsize=4096)
def _sentences(text: str) -> tuple[str, ...]:
    # Programs split the same growing answer again and again; pysbd compiles regexes on every call.
    segmenter = getattr(_segmenters, "segmenter", None)
    if segmenter is None:
        segmenter = _segmenters.segmenter = pysbd.Segmenter(language="en", clean=False)
    return tuple(s for s in segmenter.segment(text) if s.strip())


def final_answer(text: str) -> str:
    """The short answer a long-form output ends on ("... so the answer is X."), else the whole text."""
    cues = list(_ANSWER_CUE.finditer(text))
    if cues:
        rest = text[cues[-1].end():]
        text = (split_sentences(rest) or [rest])[0]
    return text.strip().rstrip(".").strip()


def ends_with_final_answer(text: str) -> bool:
    """Whether the last sentence of `text` is complete and gives the final answer ("So the answer is X.")."""
    sentences = split_sentences(text)
    if not sentences:
        return False
    last = sentences[-1].strip()
    return last.endswith((".", "!", "?")) and final_answer(last) != last.rstrip(".").strip()
