"""Signatures that write the final answer."""

import dspy

SHORT_ANSWER = "the answer alone, in as few words as possible (a name, a date, a number, yes or no)"


class AnswerFromKnowledge(dspy.Signature):
    """Answer the question from what you already know."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField(desc=SHORT_ANSWER)


class AnswerFromPassages(dspy.Signature):
    """Answer the question using the passages, which are ranked most relevant first.
    Combine facts from several passages when the question needs more than one step.
    When the passages fall short, answer from what you already know."""

    passages: list[str] = dspy.InputField(desc="retrieved passages, `[rank] Title | text`")
    question: str = dspy.InputField()
    answer: str = dspy.OutputField(desc=SHORT_ANSWER)
