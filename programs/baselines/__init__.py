"""The baselines the adaptive methods compare against: no retrieval, single-time RAG, previous-window and
previous-sentence, Self-Ask, ReAct; `steps.py` declares Self-Ask's and ReAct's step kinds."""
