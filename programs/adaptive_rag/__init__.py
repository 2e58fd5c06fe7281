"""Adaptive-RAG: the routing program (`adaptive_rag.py`) and its query-complexity classifiers (`router.py`)."""
