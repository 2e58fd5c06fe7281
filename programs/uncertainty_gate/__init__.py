"""The uncertainty gate: the program (`uncertainty_gate.py`), the signals it reads (`signals.py`) and its step
kinds (`steps.py`)."""
