"""Predictors every program composes: chain of thought or direct, and judgements that may fall back."""

from __future__ import annotations

import dspy
from dspy.utils.exceptions import AdapterParseError

from arag.programs.frame.params import Param
from arag.trace import Unreadable, note

REASONING = Param("reasoning", "cot", "think step by step before the answer (cot) or answer directly",
                  choices=("cot", "direct"), tunable=False)


def predictor(signature: type[dspy.Signature], reasoning: str) -> dspy.Module:
    """`ChainOfThought` for "cot" (reasoning before the output fields), `Predict` for "direct"."""
    return dspy.ChainOfThought(signature) if reasoning == "cot" else dspy.Predict(signature)


def judged(predictor: dspy.Module, fallback: str, **inputs) -> dspy.Prediction | None:
    """A judgement's prediction, or None when the LM's output cannot be read even under the signature's schema:
    the program then takes the documented `fallback` action, which the trace records as an `unreadable` step.
    Only parse failures fall back; a failed LM call still fails the question."""
    try:
        return predictor(**inputs)
    except AdapterParseError as exc:
        note(Unreadable(signature=predictor.signature.__name__, fallback=fallback,
                        error=str(exc).splitlines()[0][:300]))
        return None

