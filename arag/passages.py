"""Passages, the unit every retriever returns and every program reads, with the helpers methods need:
`Title | text` forms, stable ids, de-duplication, and the numbered strings signatures receive."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

TITLE_SEPARATOR = " | "


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
        return f"{self.title}{TITLE_SEPARATOR}{self.text}" if self.title else self.text


def split_title(long_text: str) -> tuple[str, str]:
    """`(title, text)` of a passage in the `Title | text` form (a one-line title before the first ` | `),
    else `("", long_text)`."""
    title, separator, text = long_text.partition(TITLE_SEPARATOR)
    if separator and title.strip() and "\n" not in title:
        return title, text
    return "", long_text


def text_id(long_text: str) -> str:
    """A stable id for a passage whose source gives none: the first 16 hex digits of its text's SHA-256."""
    return hashlib.sha256(long_text.encode("utf-8")).hexdigest()[:16]


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
