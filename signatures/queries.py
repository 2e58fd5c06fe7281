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
    """Self-ask: break the question into simple follow-up questions and ask them one at a time.
    A question needs follow-ups when its answer rests on a fact it does not state: a person, place,
    work or date it names only by description ("the director of the film X", "the city where Y was
    born"), or two things it compares. Each follow-up asks for one such fact, naming what an earlier
    intermediate answer found. With no follow-ups asked yet, such a question needs one.
    Once the intermediate answers hold every fact the answer needs, no more follow-ups are needed."""

    question: str = dspy.InputField()
    follow_ups: list[str] = dspy.InputField(desc="`Follow up: ... Intermediate answer: ...`, in the order asked")
    needs_follow_up: bool = dspy.OutputField(desc="are follow-up questions needed here: whether the answer still "
                                                  "needs a fact that no intermediate answer gives")
    follow_up: str = dspy.OutputField(desc="the next follow-up question, for one fact; empty when none is needed")


class RewriteAsKeywords(dspy.Signature):
    """Rewrite the question as a web search query of at most three keywords or short key phrases:
    the people, places or things it is about, and what it asks about them."""

    question: str = dspy.InputField()
    keywords: list[str] = dspy.OutputField(desc="at most three keywords or key phrases, most important first")
