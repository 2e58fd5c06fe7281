"""Signatures for Self-RAG's prompted critics and its segment writer: decide retrieval, judge support,
rate utility, and write the next part of an answer. Relevance is judged with `relevance.JudgeRelevance`."""

from typing import Literal

import dspy

CONTINUATION = (
    "the next part of the answer, not repeating the answer so far; a question with a short factual answer "
    "gets the answer alone (a name, a date, a number, yes or no)"
)


class DecideRetrieval(dspy.Signature):
    """Decide whether writing the next part of the answer to the question needs facts looked up in a
    document collection.
    Answer yes when it needs facts that neither general knowledge nor the evidence already given provides,
    no when it can be written without looking anything up, and continue when the evidence already given
    covers it."""

    question: str = dspy.InputField()
    answer_so_far: str = dspy.InputField(desc="the answer written so far; empty before the first part")
    evidence: str = dspy.InputField(desc="the passage the last part was written from; empty when there is none")
    retrieve: Literal["yes", "no", "continue"] = dspy.OutputField()


class JudgeSupport(dspy.Signature):
    """Judge how far the passage supports the statement, written as part of an answer to the question.
    fully supported: everything in the statement worth checking is stated in the passage.
    partially supported: some of it is in the passage, and some is missing from it or goes beyond it.
    no support: the passage does not back the statement, or contradicts it."""

    question: str = dspy.InputField()
    passage: str = dspy.InputField()
    statement: str = dspy.InputField()
    support: Literal["fully supported", "partially supported", "no support"] = dspy.OutputField()


class RateUtility(dspy.Signature):
    """Rate how useful the response is as an answer to the question, whether or not it is true:
    5 answers it completely and helpfully, 4 answers it with minor gaps, 3 answers part of it,
    2 touches on it without answering, 1 is off topic or no help."""

    question: str = dspy.InputField()
    response: str = dspy.InputField()
    utility: Literal["5", "4", "3", "2", "1"] = dspy.OutputField()


class ContinueAnswerFromKnowledge(dspy.Signature):
    """Continue the answer to the question from what you know, or begin it when the answer so far is empty."""

    question: str = dspy.InputField()
    answer_so_far: str = dspy.InputField(desc="empty before the first part")
    continuation: str = dspy.OutputField(desc=CONTINUATION)


class ContinueAnswerFromPassage(dspy.Signature):
    """Continue the answer to the question using the passage, or begin it when the answer so far is empty.
    Keep to what the passage states where it bears on the question."""

    question: str = dspy.InputField()
    passage: str = dspy.InputField(desc="`Title | text`")
    answer_so_far: str = dspy.InputField(desc="empty before the first part")
    continuation: str = dspy.OutputField(desc=CONTINUATION)
