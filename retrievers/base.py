"""The one retriever protocol every program uses, and the passage helpers every method needs."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable, Protocol, Sequence, runtime_checkable

MAX_K = 100


@dataclass(frozen=True)
class Passage:
    """One retrieved passage. `score` is the retriever's own score (higher is better)."""

    id: str
    title: str
    text: str
    score: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def long_text(self) -> str:
        """Title and text in the `Title | text` form ColBERTv2 servers return."""
        return f"{self.title} | {self.text}" if self.title else self.text


@runtime_checkable
class Retriever(Protocol):
    """Anything that returns the top-k passages for a query."""

    def retrieve(self, query: str, k: int) -> list[Passage]: ...

    def retrieve_batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]: ...


class BaseRetriever:
    """Gives `retrieve_batch` and k validation to retrievers that only implement `_search`."""

    def retrieve(self, query: str, k: int) -> list[Passage]:
        check_k(k)
        if not query or not query.strip():
            return []
        return self._search(query, k)

    def retrieve_batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        return [self.retrieve(q, k) for q in queries]

    def _search(self, query: str, k: int) -> list[Passage]:
        raise NotImplementedError

    def __deepcopy__(self, memo: dict) -> "BaseRetriever":
        # DSPy's optimizers deep-copy programs; an index is read-only and shared, never copied.
        return self


def check_k(k: int) -> int:
    from arag.errors import ConfigError

    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ConfigError(f"k must be an integer between 1 and {MAX_K}, got {k!r}")
    return k


def dedup(passages: Iterable[Passage], seen: set[str] | None = None) -> list[Passage]:
    """Passages whose id has not been seen, in order; `seen` (if given) is updated in place."""
    seen = set() if seen is None else seen
    fresh = []
    for p in passages:
        if p.id not in seen:
            seen.add(p.id)
            fresh.append(p)
    return fresh


def format_passages(passages: Sequence[Passage]) -> list[str]:
    """The passages as the numbered strings signatures receive: `[1] Title | text`."""
    return [f"[{i}] {p.long_text}" for i, p in enumerate(passages, 1)]
