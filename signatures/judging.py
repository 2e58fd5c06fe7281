"""Signatures that judge: is a passage relevant, is an answer supported, which of two is better."""

from typing import Literal

import dspy


class JudgeRelevance(dspy.Signature):
    """Judge whether the passage contains information that helps answer the question.
    Answer yes when it states a fact the answer depends on, no otherwise."""

    question: str = dspy.InputField()
    passage: str = dspy.InputField()
    relevant: Literal["yes", "no"] = dspy.OutputField()
