"""The uncertainty signals of a closed-book draft, each read from its tokens' log-probabilities: the score U that
the uncertainty gate compares with its threshold (higher U, less sure), and the per-token or per-word values it
aggregates, for the trace.

Entropies are read from the top `k` candidates an endpoint returns at each position (`top_logprobs`, at most 20 on
OpenAI-compatible servers): H = -sum p log p over them, in nats, as uqlm's top-K token entropy does. That is a
lower bound of the full-vocabulary entropy the papers use (lm-polygraph's EntropyCalculator), equal to it when the
candidates hold all the probability mass, and at most log k.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass
from typing import Sequence

from bm25s.stopwords import STOPWORDS_EN_PLUS

from arag.errors import ConfigError
from arag.lm import TokenLogprob

MARGIN_BETA = 1.0  # TARG's temperature of the margin link exp(-g / beta) (Eq. 2, beta = 1)
STOPWORDS = frozenset(STOPWORDS_EN_PLUS)  # NLTK's 179 English stopwords, as bm25s ships them
BOUNDARY_CHARACTERS = frozenset(string.whitespace + string.punctuation)


@dataclass(frozen=True)
class Reading:
    """A signal's score U over the draft, and the values it was aggregated from (per token, or per word)."""

    score: float
    values: list[float]
    words: list[str] | None = None


def candidates(token: TokenLogprob, k: int, signal: str) -> list[float]:
    """The log-probabilities of the token's top k candidates, most likely first."""
    if not token.top:
        raise ConfigError(f"uncertainty-gate: signal {signal!r} reads the top candidates of each token, and the LM "
                          "gives no top log-probabilities: use signal=ask, or an endpoint that returns top_logprobs")
    return sorted((logprob for _, logprob in token.top), reverse=True)[:k]


def token_entropy(token: TokenLogprob, k: int, signal: str = "mean_entropy") -> float:
    """-sum p log p over the token's top k candidates (a candidate of probability 0 adds nothing)."""
    return -sum(math.exp(lp) * lp for lp in candidates(token, k, signal) if lp > -math.inf)


def mean_entropy(tokens: Sequence[TokenLogprob], k: int) -> Reading:
    """Mean token entropy: AdaRAGUE's MeanTokenEntropy (Moskvoretskii et al., 2025, §3; lm-polygraph
    estimators/token_entropy.py) and TARG's entropy gate over the draft's prefix (Wang et al., 2025, Eq. 1)."""
    values = [token_entropy(token, k, "mean_entropy") for token in tokens]
    return Reading(sum(values) / len(values), values)


def max_entropy(tokens: Sequence[TokenLogprob], k: int) -> Reading:
    """Max token entropy: AdaRAGUE's MaxTokenEntropy (Moskvoretskii et al., 2025, §3; the Max of UC/utils.py
    calc_stats over lm-polygraph's per-token entropies)."""
    values = [token_entropy(token, k, "max_entropy") for token in tokens]
    return Reading(max(values), values)


def min_prob(tokens: Sequence[TokenLogprob], k: int) -> Reading:
    """1 - the least probability of a draft token: AdaRAGUE's MaxMaximumTokenProbability, the max over tokens
    of lm-polygraph's -p(token) (estimators/max_probability.py), shifted by 1 so that it lies in [0, 1)."""
    values = [token.prob for token in tokens]
    return Reading(1.0 - min(values), values)


def margin(tokens: Sequence[TokenLogprob], k: int) -> Reading:
    """TARG's margin gate (Wang et al., 2025, Eq. 2): the mean over draft tokens of exp(-g / beta), g the gap
    between the top-1 and top-2 logits (equal to the gap of their log-probabilities), beta = 1. A position whose
    only candidate holds all the mass has an infinite gap, and adds 0."""
    values = []
    for token in tokens:
        best = candidates(token, k, "margin")
        if len(best) < 2:
            if best[0] < -1e-9:
                raise ConfigError("uncertainty-gate: signal 'margin' needs the top 2 candidates of each token, and the "
                                  "LM gives one: use an endpoint that returns top_logprobs of 2 or more")
            values.append(0.0)
            continue
        values.append(math.exp(-(best[0] - best[1]) / MARGIN_BETA))
    return Reading(sum(values) / len(values), values)


def entropy_trend(tokens: Sequence[TokenLogprob], k: int) -> Reading:
    """ETC's entropy trend (arXiv 2511.09980, §3; official code pkuserc/ETC generate.py:234-322): the largest
    |smoothed second difference| of the entropy over the draft's content words.

    Tokens merge into words as the code's `merge_tokens` does; a word's entropy is the largest of its tokens'.
    First differences: each content word's entropy minus the nearest earlier content word's; second: each
    content word's first difference minus the nearest earlier non-zero one. A non-zero second difference D_t is
    smoothed as M_t = a D_t + (1 - a) D_{t-1} (D_{t-1}: the previous non-zero one, 0 at first), with
    a = 0.9 + 0.1 w, w = |D_{t-1} - E| / (|D_t - E| + |D_{t-1} - E|), E the running mean of the non-zero second
    differences (w = 0 when both distances are 0, where M_t = D_t whatever a is). Content words: words with a
    letter or digit outside the stopword list (the paper removes spaCy's stopwords; the code keeps spaCy's
    NOUN/ADJ/VERB/PROPN/NUM words); here NLTK's list as bm25s ships it, with no tagger to install.
    """
    words = merge_words(tokens)
    entropies = [max(token_entropy(token, k, "entropy_trend") for token in word) for word in words]
    texts = ["".join(token.token for token in word).strip() for word in words]
    content = [is_content_word(text) for text in texts]
    smoothed = smoothed_second_differences(entropies, content)
    return Reading(max((abs(value) for value in smoothed), default=0.0), smoothed, texts)


def merge_words(tokens: Sequence[TokenLogprob]) -> list[list[TokenLogprob]]:
    """Tokens grouped into words: a token starts a word when it is the first, begins with whitespace, or it or
    the token before it is a single whitespace or punctuation character (ETC's `merge_tokens`)."""
    words: list[list[TokenLogprob]] = []
    for index, token in enumerate(tokens):
        starts = (index == 0 or token.token[:1].isspace() or is_boundary(token.token)
                  or is_boundary(tokens[index - 1].token))
        if starts:
            words.append([token])
        else:
            words[-1].append(token)
    return words


def is_boundary(text: str) -> bool:
    return len(text) == 1 and text in BOUNDARY_CHARACTERS


def is_content_word(text: str) -> bool:
    bare = text.strip(string.punctuation + string.whitespace).lower()
    return any(c.isalnum() for c in bare) and bare not in STOPWORDS


def smoothed_second_differences(entropies: Sequence[float], content: Sequence[bool]) -> list[float]:
    """M_t for every word (0 where the second difference is 0 or undefined), as ETC's code computes them."""
    n = len(entropies)
    first, second, smoothed = [0.0] * n, [0.0] * n, [0.0] * n
    for i in range(1, n):
        earlier = next((j for j in range(i - 1, -1, -1) if content[j]), None)
        if content[i] and earlier is not None:
            first[i] = entropies[i] - entropies[earlier]
    for i in range(2, n):
        earlier = next((j for j in range(i - 1, 0, -1) if first[j] != 0), None)
        if content[i] and earlier is not None:
            second[i] = first[i] - first[earlier]
    previous, total, count = 0.0, 0.0, 0
    for i in range(2, n):
        if second[i] == 0:
            continue
        count += 1
        total += second[i]
        mean = total / count
        spread = abs(second[i] - mean) + abs(previous - mean)
        weight = abs(previous - mean) / spread if spread else 0.0
        alpha = 0.9 + 0.1 * weight
        smoothed[i] = alpha * second[i] + (1 - alpha) * previous
        previous = second[i]
    return smoothed


SIGNALS = {
    "mean_entropy": mean_entropy,
    "max_entropy": max_entropy,
    "min_prob": min_prob,
    "margin": margin,
    "entropy_trend": entropy_trend,
}
