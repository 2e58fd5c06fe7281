"""DRAGIN's two readings of the model (Su et al., ACL 2024, §3.1-3.2), over a generation's tokens, their entropies
and the last layer's attention:

RIND: a word's score S = H × a × s, where H is the mean full-vocabulary entropy of its tokens, a the attention that
later generated tokens pay to it (per token: the largest any later token pays, averaged over heads; summed over the
word's tokens), rescaled so that a sentence's words average 1, and s = 0 for a stopword (or a word with no letter or
digit), else 1. Retrieval is triggered at the first word whose S exceeds the threshold.

QFS: the words of the preceding text that the triggering word attends to most (the last layer's attention from its
tokens over the tokens before it, averaged over heads, each row renormalised over those tokens, averaged over the
word's tokens and summed over each earlier word's), the top n content words, in their original order.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Collection, Sequence

import numpy as np
from bm25s.stopwords import STOPWORDS_EN_PLUS

from arag.programs.frame.sentences import split_sentences

STOPWORDS = frozenset(STOPWORDS_EN_PLUS)  # NLTK's 179 English stopwords, as bm25s ships them
EDGES = string.punctuation + string.whitespace


@dataclass(frozen=True)
class Word:
    """A word of a tokenised text: its text (with the whitespace before it), where it starts in the text, and the
    positions of its tokens."""

    text: str
    start: int
    tokens: range

    @property
    def bare(self) -> str:
        """The word without the whitespace and punctuation around it."""
        return self.text.strip(EDGES)


@dataclass(frozen=True)
class ScoredWord:
    """A generated word as RIND reads it: H, a (summed over its tokens), a rescaled in its sentence, s and S."""

    word: Word
    entropy: float
    attention: float
    rescaled: float
    content: bool

    @property
    def score(self) -> float:
        return self.entropy * self.rescaled * self.content


def merge_words(pieces: Sequence[str], special: Collection[int] = ()) -> list[Word]:
    """Tokens grouped into words, as the official code merges subwords: a token begins a word when it is the first,
    when its text begins with whitespace or the text before it ends with whitespace (the tokenisers' space marker,
    and a line break), or when it or the token before it is special (the positions in ``special``)."""
    words: list[Word] = []
    start = 0
    for index, piece in enumerate(pieces):
        begins = (index == 0 or piece[:1].isspace() or pieces[index - 1][-1:].isspace()
                  or index in special or index - 1 in special)
        if begins:
            words.append(Word(piece, start, range(index, index + 1)))
        else:
            last = words[-1]
            words[-1] = Word(last.text + piece, last.start, range(last.tokens.start, index + 1))
        start += len(piece)
    return words


def is_content(word: Word, special: Collection[int] = ()) -> bool:
    """s = 1: a word with a letter or digit that is no stopword (and no special token)."""
    if any(index in special for index in word.tokens):
        return False
    bare = word.bare.lower()
    return any(c.isalnum() for c in bare) and bare not in STOPWORDS


def max_later_attention(attention: np.ndarray) -> np.ndarray:
    """Per token: the most attention any later token pays to it, averaged over heads (0 for the last token).
    ``attention`` is [head, query, key]."""
    tokens = attention.shape[-1]
    later = np.tril(np.ones((tokens, tokens), dtype=bool), k=-1)  # query strictly after key
    masked = np.where(later, attention, 0.0)
    return masked.max(axis=1).mean(axis=0) if tokens else np.zeros(0)


def sentence_of(words: Sequence[Word], text: str) -> list[int]:
    """The index of the sentence (pysbd's) in which each word's first visible character lies."""
    ends, position = [], 0
    for sentence in split_sentences(text):
        position = text.find(sentence, position) + len(sentence)
        ends.append(position)
    found = []
    for word in words:
        first = word.start + len(word.text) - len(word.text.lstrip())
        found.append(next((i for i, end in enumerate(ends) if first < end), max(len(ends) - 1, 0)))
    return found


def rind(pieces: Sequence[str], entropies: Sequence[float], attention: np.ndarray,
         special: Collection[int] = ()) -> list[ScoredWord]:
    """Every generated word with its H, a, rescaled a, s and S (the official code's word and sentence forms);
    ``special``: the positions of special tokens, never content."""
    words = merge_words(pieces, special)
    per_token = max_later_attention(attention)
    raw = [float(sum(per_token[i] for i in word.tokens)) for word in words]
    sentences = sentence_of(words, "".join(pieces))
    scored = []
    for index, word in enumerate(words):
        same = [raw[j] for j in range(len(words)) if sentences[j] == sentences[index]]
        total = sum(same)
        rescaled = raw[index] / total * len(same) if total > 0 else 0.0
        entropy = float(np.mean([entropies[i] for i in word.tokens]))
        scored.append(ScoredWord(word, entropy, raw[index], rescaled, is_content(word, special)))
    return scored


def first_trigger(scored: Sequence[ScoredWord], threshold: float) -> int | None:
    """The index of the first word whose S exceeds the threshold, if any."""
    return next((i for i, word in enumerate(scored) if word.score > threshold), None)


@dataclass(frozen=True)
class Query:
    """QFS's query: the chosen words, in their original order, the attention each received, and how many content
    words it chose from."""

    words: list[str]
    weights: list[float]
    candidates: int

    @property
    def text(self) -> str:
        return " ".join(self.words)


def focused_query(pieces: Sequence[str], special: Collection[int], attention: np.ndarray, top_n: int) -> Query:
    """QFS over a text that ends with the triggering word: the ``top_n`` content words before it that its tokens
    attend to most (``attention`` [head, query, key] over the text's tokens; ``special``: the positions of special
    tokens, never chosen)."""
    words = merge_words(pieces, special)
    trigger, earlier = words[-1], words[:-1]
    first = trigger.tokens.start
    mean = attention.mean(axis=0)
    received = np.zeros(first)
    for row in trigger.tokens:
        weights = mean[row, :first]
        received += weights / weights.sum() if weights.sum() > 0 else weights
    received /= len(trigger.tokens)
    candidates = [(float(sum(received[i] for i in word.tokens)), position)
                  for position, word in enumerate(earlier) if is_content(word, special)]
    chosen = sorted(sorted(candidates, key=lambda pair: (-pair[0], pair[1]))[:top_n], key=lambda pair: pair[1])
    return Query([earlier[position].bare for _, position in chosen], [weight for weight, _ in chosen], len(candidates))
