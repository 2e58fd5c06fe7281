"""Signatures that generate an answer first and ground it afterwards (GenGround): answer deduction,
instructed grounding against a batch of passages, and the closing answer when the hop budget runs out."""

from typing import Literal

import dspy
import pydantic

from arag.signatures.answering import SHORT_ANSWER


class GroundedHop(pydantic.BaseModel):
    """One answered sub-question: its answer after grounding, and the evidence quoted for it."""

    sub_question: str
    answer: str
    evidence: list[str] = []


HISTORY = "sub-questions answered so far, oldest first, each with its grounded answer and the evidence quoted for it"


class DeduceNextHop(dspy.Signature):
    """Work towards the answer of a complex question one simple step at a time, starting from what you know.
    The history holds the single-hop sub-questions answered so far; their answers were checked against
    retrieved evidence, so prefer them to your own memory.
    If the history already settles the question, set finished to true and give the final answer.
    Otherwise set finished to false, write the next single-hop sub-question that moves towards the answer
    (one fact, naming its entities outright rather than pointing back at earlier steps), and answer it
    directly from your own knowledge, with your best guess when unsure."""

    question: str = dspy.InputField(desc="the complex question")
    history: list[GroundedHop] = dspy.InputField(desc=HISTORY)
    finished: bool = dspy.OutputField(desc="true when the history settles the question")
    sub_question: str = dspy.OutputField(desc="the next single-hop sub-question; empty when finished")
    answer: str = dspy.OutputField(
        desc=f"your own answer to the sub-question, or the final answer when finished: {SHORT_ANSWER}"
    )


class DeduceNextHopYesNo(DeduceNextHop):
    # DeduceNextHop's instructions, for questions whose final answer is yes or no.
    answer: str = dspy.OutputField(
        desc=f"your own answer to the sub-question ({SHORT_ANSWER}), or the final answer when finished: yes or no"
    )


class GroundAnswer(dspy.Signature):
    """Check a candidate answer to a sub-question against a few retrieved passages.
    Quote, word for word, the sentences of the passages that answer the sub-question, whether they agree
    with the candidate answer or contradict it, and give the answer they support, correcting the candidate
    where the passages say otherwise.
    If no passage answers the sub-question, give no evidence and repeat the candidate answer unchanged.
    The complex question is context only: what you check is the answer to the sub-question."""

    question: str = dspy.InputField(desc="the complex question the sub-question serves")
    sub_question: str = dspy.InputField()
    candidate_answer: str = dspy.InputField(desc="an answer from the model's own knowledge, not yet checked")
    passages: list[str] = dspy.InputField(desc="retrieved passages, `[rank] Title | text`")
    evidence: list[str] = dspy.OutputField(
        desc="sentences quoted from the passages that answer the sub-question; an empty list when none does"
    )
    revised_answer: str = dspy.OutputField(
        desc=f"the answer the evidence supports, or the candidate answer unchanged without evidence: {SHORT_ANSWER}"
    )


class ConcludeFromHistory(dspy.Signature):
    """Give the final answer to a complex question from the sub-questions answered so far.
    Their answers were checked against retrieved evidence; where they fall short, use what you know."""

    question: str = dspy.InputField(desc="the complex question")
    history: list[GroundedHop] = dspy.InputField(desc=HISTORY)
    answer: str = dspy.OutputField(desc=SHORT_ANSWER)


class ConcludeYesNo(ConcludeFromHistory):
    # ConcludeFromHistory's instructions, for questions whose answer is yes or no.
    answer: Literal["yes", "no"] = dspy.OutputField()
