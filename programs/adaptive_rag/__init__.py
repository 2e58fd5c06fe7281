"""Adaptive-RAG: the routing program (`adaptive_rag.py`), its query-complexity classifiers (`router.py`) and its
step kind (`steps.py`)."""
