"""SuRe: the algorithm (`sure.py`) and its step kinds (`steps.py`)."""
