"""Self-RAG: `self_rag.py` is the algorithm (the segment-level beam search and its scores); `critics.py` the two
back-ends that write and critique candidates; `steps.py` its step kinds."""
