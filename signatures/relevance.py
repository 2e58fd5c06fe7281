"""Judging whether a passage helps answer a question: CRAG's LM evaluator and Self-RAG's IsREL critic."""

from typing import Literal

import dspy


class JudgeRelevance(dspy.Signature):
    """Judge whether the passage contains information that helps answer the question.
    Answer yes when it states a fact the answer depends on, no otherwise."""

    question: str = dspy.InputField()
    passage: str = dspy.InputField()
    relevant: Literal["yes", "no"] = dspy.OutputField()
