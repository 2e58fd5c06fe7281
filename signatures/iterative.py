"""Signatures of iterative retrieval-generation: each generation reads passages retrieved with the previous one."""

import dspy

from arag.signatures.answering import SHORT_ANSWER


class AnswerFromIterationPassages(dspy.Signature):
    """Answer the question using the passages, which are ranked most relevant first.
    They were retrieved with the question together with an earlier attempt at answering it, so they
    may hold facts that the earlier attempt lacked or got wrong: trust the passages over that attempt.
    Work through the facts the question needs one at a time, combining several passages when it takes
    more than one step. When the passages fall short, answer from what you already know."""

    passages: list[str] = dspy.InputField(desc="retrieved passages, `[rank] Title | text`")
    question: str = dspy.InputField()
    answer: str = dspy.OutputField(desc=SHORT_ANSWER)
