"""Adaptive-Note: the algorithm (`adaptive_note.py`) and its step kinds (`steps.py`)."""
