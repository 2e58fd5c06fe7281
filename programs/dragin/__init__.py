"""DRAGIN: the program (`dragin.py`), RIND and QFS over the model's entropies and attention (`rind.py`), its
prompts (`prompts.py`) and its step kinds (`steps.py`); the model is `arag.lm.attention`'s."""
