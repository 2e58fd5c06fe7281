"""Retrievers: one protocol (`retrieve(query, k) -> list[Passage]`), its implementations, and `as_retriever`,
which brings DSPy's retrievers and plain search functions into it."""

import importlib

from arag.passages import Passage, dedup, format_passages
from arag.retrievers.base import (
    ACCEPTED_RETRIEVERS,
    MAX_K,
    BaseRetriever,
    CallableRetriever,
    Retriever,
    as_retriever,
    check_k,
)

_LAZY_EXPORTS = {
    "BM25Retriever": "arag.retrievers.bm25",
    "ColBERTRetriever": "arag.retrievers.colbert",
    "ColBERTv2Retriever": "arag.retrievers.colbert_client",
    "SearchServer": "arag.retrievers.colbert_server",
    "serve": "arag.retrievers.colbert_server",
    "DenseRetriever": "arag.retrievers.dense",
    "LuceneRetriever": "arag.retrievers.lucene",
    "INDEX_KINDS": "arag.retrievers.index",
    "MilvusRetriever": "arag.retrievers.milvus",
    "build_index": "arag.retrievers.index",
    "index_cache_root": "arag.retrievers.index",
    "index_for_corpus": "arag.retrievers.index",
    "open_index": "arag.retrievers.index",
    "open_retriever": "arag.retrievers.index",
}

__all__ = [
    "ACCEPTED_RETRIEVERS",
    "INDEX_KINDS",
    "MAX_K",
    "BM25Retriever",
    "BaseRetriever",
    "CallableRetriever",
    "ColBERTRetriever",
    "ColBERTv2Retriever",
    "DenseRetriever",
    "LuceneRetriever",
    "MilvusRetriever",
    "Passage",
    "Retriever",
    "SearchServer",
    "as_retriever",
    "build_index",
    "check_k",
    "dedup",
    "format_passages",
    "index_cache_root",
    "index_for_corpus",
    "open_index",
    "open_retriever",
    "serve",
]


def __getattr__(name: str):
    """Imports an implementation on first use of its name (torch and colbert-ai only when their retriever is used)."""
    if name not in _LAZY_EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY_EXPORTS[name]), name)
