"""Signatures of answer-candidate summaries: candidates proposed from passages, a summary of the passages
written for each candidate, and the two judgements that pick among the summaries."""

from typing import Literal

import dspy

CANDIDATE_CHARS = 40
SUMMARY_CHARS = 600


class ProposeAnswerCandidates(dspy.Signature):
    """Read the passages and propose different possible answers to the question, one per candidate field.
    Each candidate is a short answer (a name, a date, a number, yes or no) of at most three words,
    and no two candidates say the same thing. Put the most likely answer first."""

    passages: list[str] = dspy.InputField(desc="retrieved passages, `[rank] Title | text`")
    question: str = dspy.InputField()


def candidate_field(number: int) -> str:
    return f"candidate_{number}"


def propose_candidates(count: int) -> type[dspy.Signature]:
    """`ProposeAnswerCandidates` with `count` short string outputs, `candidate_1` (the most likely) onwards."""
    signature = ProposeAnswerCandidates
    for number in range(1, count + 1):
        desc = "the most likely answer" if number == 1 else "another possible answer, different from the others"
        signature = signature.append(candidate_field(number), dspy.OutputField(desc=desc, max_length=CANDIDATE_CHARS),
                                     type_=str)
    return signature


class SummarizeForCandidate(dspy.Signature):
    """Write a short passage that makes the case for the chosen candidate as the answer to the question,
    using only facts stated in the retrieved passages. Gather the facts that bear on the chosen candidate
    from every passage that has them, and say how they lead to it. Invent nothing: when the passages
    do not back the candidate, say what they do state."""

    passages: list[str] = dspy.InputField(desc="retrieved passages, `[rank] Title | text`")
    question: str = dspy.InputField()
    candidates: list[str] = dspy.InputField(desc="every candidate answer under consideration")
    chosen_candidate: str = dspy.InputField(desc="the candidate the summary argues for")
    supporting_summary: str = dspy.OutputField(desc="a few sentences drawn from the passages",
                                               max_length=SUMMARY_CHARS)


class JudgeSummarySupport(dspy.Signature):
    """Decide whether the summary correctly supports the candidate as the answer to the question:
    True when the facts it states show that the candidate answers the question, False when they do not,
    when they point to another answer, or when the summary only asserts the candidate without facts."""

    question: str = dspy.InputField()
    candidate: str = dspy.InputField()
    summary: str = dspy.InputField()
    supports_candidate: bool = dspy.OutputField(desc="True or False")


class CompareSummaries(dspy.Signature):
    """Two summaries each argue for an answer to the question. Decide which one is more informative
    and relevant for answering the question: the one whose stated facts bear more directly on it."""

    question: str = dspy.InputField()
    summary_1: str = dspy.InputField()
    summary_2: str = dspy.InputField()
    more_informative: Literal["1", "2"] = dspy.OutputField(desc="1 for summary_1, 2 for summary_2")
