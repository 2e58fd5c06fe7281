"""Signatures that answer from refined knowledge: strips selected from retrieved and searched documents."""

import dspy

from arag.signatures.answering import SHORT_ANSWER


class AnswerFromRefinedKnowledge(dspy.Signature):
    """Answer the question using the knowledge: excerpts kept because they bear on the question,
    from the retrieved documents and, where those fell short, from a search, in reading order.
    Combine excerpts when the question needs more than one step.
    When the knowledge falls short, answer from what you already know."""

    knowledge: list[str] = dspy.InputField(desc="relevant excerpts, `Title | text`")
    question: str = dspy.InputField()
    answer: str = dspy.OutputField(desc=SHORT_ANSWER)
