"""FLARE and FLARE-instruct: the algorithm (`flare.py`; the active-generation loop it shares with the multi-time
baselines is in `frame/`)."""
