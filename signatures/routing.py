"""Routing a question by its complexity: Adaptive-RAG's classifier, asked of the LM."""

from typing import Literal

import dspy


class ClassifyComplexity(dspy.Signature):
    """Label how much searching the question needs before it can be answered.
    A: it is simple, and you know the answer without searching.
    B: one search for one fact is enough to answer it.
    C: it needs several searches, each one building on what the last one found."""

    question: str = dspy.InputField()
    complexity: Literal["A", "B", "C"] = dspy.OutputField()
