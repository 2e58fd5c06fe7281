"""Building blocks programs compose: how a predictor is made for a given reasoning mode."""

import dspy

from arag.programs.params import Param

REASONING = Param("reasoning", "cot", "think step by step before the answer (cot) or answer directly",
                  choices=("cot", "direct"), tunable=False)


def predictor(signature: type[dspy.Signature], reasoning: str) -> dspy.Module:
    """`ChainOfThought` for "cot" (reasoning before the output fields), `Predict` for "direct"."""
    return dspy.ChainOfThought(signature) if reasoning == "cot" else dspy.Predict(signature)
