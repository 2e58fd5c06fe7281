"""Typed DSPy signatures, grouped by the job they do. The docstring is the instruction."""

from arag.signatures.answering import AnswerFromKnowledge, AnswerFromPassages
from arag.signatures.relevance import JudgeRelevance

__all__ = ["AnswerFromKnowledge", "AnswerFromPassages", "JudgeRelevance"]
