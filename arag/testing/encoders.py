"""A deterministic text encoder for tests and benchmarks of dense indexes: no model, no download, thousands of
passages a second. It is not a semantic model: texts are near when they share words, never when they only share
meaning."""

from __future__ import annotations

import hashlib
import re
import time

import numpy as np

WORD = re.compile(r"\w+")


class HashingEncoder:
    """Each text is the sum of one fixed pseudo-random unit vector per distinct lower-cased word (seeded by the
    word's hash), so equal texts always get equal vectors and texts sharing words get similar ones.

    `delay` (seconds) is slept on every `encode` call, to make a build slow enough to interrupt in a test;
    `encoded` counts the texts encoded so far, for tests of what a resumed build embeds again.
    """

    def __init__(self, dim: int = 64, delay: float = 0.0):
        self.dim = dim
        self.delay = delay
        self.name = f"hashing-{dim}"
        self.encoded = 0
        self._word_vectors: dict[str, np.ndarray] = {}

    def encode(self, texts: list[str]) -> np.ndarray:
        if self.delay:
            time.sleep(self.delay)
        self.encoded += len(texts)
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in sorted(set(WORD.findall(text.lower()))):  # one summation order in every process
                vectors[row] += self._word_vector(word)
        return vectors

    def _word_vector(self, word: str) -> np.ndarray:
        vector = self._word_vectors.get(word)
        if vector is None:
            seed = int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "little")
            vector = np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32)
            vector /= np.linalg.norm(vector)
            self._word_vectors[word] = vector
        return vector
