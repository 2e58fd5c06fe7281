"""Retrievers: one protocol (`retrieve(query, k) -> list[Passage]`) and its implementations."""

from arag.retrievers.base import MAX_K, BaseRetriever, Passage, Retriever, check_k, dedup, format_passages

__all__ = ["MAX_K", "BaseRetriever", "Passage", "Retriever", "check_k", "dedup", "format_passages"]
