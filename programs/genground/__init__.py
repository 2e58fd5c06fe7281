"""GenGround: the algorithm (`genground.py`) and its step kinds (`steps.py`)."""
