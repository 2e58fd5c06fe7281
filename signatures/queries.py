"""Signatures that write retrieval queries: follow-up questions, keyword rewrites, sub-questions."""

import dspy


class QuestionForSpan(dspy.Signature):
    """Write one question whose answer is exactly the given span of the text's last sentence.
    Make the question stand on its own: name the people, places and things it is about
    instead of referring to them with pronouns."""

    text: str = dspy.InputField(desc="the answer so far, ending with the sentence that holds the span")
    span: str = dspy.InputField()
    question: str = dspy.OutputField()


class NextFollowUp(dspy.Signature):
    """Decompose the question into simpler follow-up questions, asked one at a time.
    Given the follow-ups asked so far and their intermediate answers, say whether another
    follow-up is needed before the question can be answered, and if so write it."""

    question: str = dspy.InputField()
    follow_ups: list[str] = dspy.InputField(desc="`Follow up: ... Intermediate answer: ...`, in the order asked")
    needs_follow_up: bool = dspy.OutputField(desc="whether another follow-up question is needed")
    follow_up: str = dspy.OutputField(desc="the next follow-up question; empty when none is needed")


class RewriteAsKeywords(dspy.Signature):
    """Rewrite the question as a web search query of at most three keywords or short key phrases:
    the people, places or things it is about, and what it asks about them."""

    question: str = dspy.InputField()
    keywords: list[str] = dspy.OutputField(desc="at most three keywords or key phrases, most important first")
