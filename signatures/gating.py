"""Asking the LM whether a question needs retrieval before it is answered (TA-ARE's time-aware judgement)."""

import dspy


class NeedsRetrieval(dspy.Signature):
    """Decide whether answering the question correctly needs external resources (a search engine, an
    encyclopedia, a database) rather than only what you already know. Facts that change over time, recent
    events and little-known people, places or works need them; settled common knowledge does not.
    Take today's date into account: a question about the present may have a different answer today than
    when you were trained."""

    today: str = dspy.InputField(desc="today's date, YYYY-MM-DD")
    question: str = dspy.InputField()
    needs_retrieval: bool = dspy.OutputField(desc="true: search before answering; false: answer from memory")
