"""Retrievers: one protocol (`retrieve(query, k) -> list[Passage]`) and its implementations."""

import importlib

from arag.retrievers.base import MAX_K, BaseRetriever, Passage, Retriever, check_k, dedup, format_passages

_LAZY_EXPORTS = {
    "BM25Retriever": "arag.retrievers.bm25",
    "INDEX_KINDS": "arag.retrievers.index",
    "build_index": "arag.retrievers.index",
    "index_cache_root": "arag.retrievers.index",
    "index_for_corpus": "arag.retrievers.index",
    "open_index": "arag.retrievers.index",
    "open_retriever": "arag.retrievers.index",
}

__all__ = [
    "INDEX_KINDS",
    "MAX_K",
    "BM25Retriever",
    "BaseRetriever",
    "Passage",
    "Retriever",
    "build_index",
    "check_k",
    "dedup",
    "format_passages",
    "index_cache_root",
    "index_for_corpus",
    "open_index",
    "open_retriever",
]


def __getattr__(name: str):
    """Imports bm25s (and numba) only when an index name is first used, keeping `import arag` fast."""
    if name not in _LAZY_EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY_EXPORTS[name]), name)
