"""Signatures that write an answer piece by piece: continue it by a sentence, search inline while
writing it, or conclude it from a chain of follow-up questions or searches."""

import dspy

from arag.signatures.answering import SHORT_ANSWER

PASSAGES = "retrieved passages, `[rank] Title | text`, most relevant first"
ANSWER_SO_FAR = "the answer written so far (empty at the start); it may stop mid-sentence"


class ContinueAnswer(dspy.Signature):
    """Continue the answer to the question by one sentence, starting exactly where the answer so far
    stops (when it stops mid-sentence, finish that sentence). Use the passages when they help.
    Reason step by step, one fact per sentence. When the question has a short answer, the answer
    ends with the sentence "So the answer is X." where X is as short as possible.
    When the answer is already complete, return an empty continuation."""

    passages: list[str] = dspy.InputField(desc=PASSAGES)
    question: str = dspy.InputField()
    answer_so_far: str = dspy.InputField(desc=ANSWER_SO_FAR)
    continuation: str = dspy.OutputField(desc="the next sentence of the answer; empty when the answer is complete")


class ContinueAnswerWithSearch(dspy.Signature):
    """Continue the answer to the question from exactly where the answer so far stops, to its end.
    Use the passages when they help. When what you would write next needs a fact that the passages
    do not give and that you are not sure of, write [Search(query)] in its place, with a short search
    query for that fact, and stop right after it: the search results become the new passages and you
    will continue from there. Do not search when no searches are left.
    Reason step by step. When the question has a short answer, the answer ends with the sentence
    "So the answer is X." where X is as short as possible."""

    passages: list[str] = dspy.InputField(desc=PASSAGES)
    question: str = dspy.InputField()
    answer_so_far: str = dspy.InputField(desc=ANSWER_SO_FAR)
    searches_left: int = dspy.InputField(desc="how many more searches you may make")
    continuation: str = dspy.OutputField(
        desc="the rest of the answer, or the text up to and including one [Search(query)]",
        max_length=1200,  # a call may write up to flare-instruct's max_tokens (256)
    )


class AnswerFromFollowUps(dspy.Signature):
    """Answer the question from the follow-up questions asked about it and their intermediate answers."""

    question: str = dspy.InputField()
    follow_ups: list[str] = dspy.InputField(desc="`Follow up: ... Intermediate answer: ...`, in the order asked")
    answer: str = dspy.OutputField(desc=SHORT_ANSWER)


class AnswerBySearching(dspy.Signature):
    """Answer the question. Search the corpus for the facts the answer depends on, one hop at a time,
    before answering."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField(desc=SHORT_ANSWER)
