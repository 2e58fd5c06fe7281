"""Search-o1: the algorithm (`search_o1.py`), its markers and reasoning steps (`markers.py`) and its step kinds
(`steps.py`)."""
