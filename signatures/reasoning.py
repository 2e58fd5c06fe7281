"""Signatures of reasoning interleaved with search (Search-o1): the reasoning that writes its own search
queries between markers, and the Reason-in-Documents step that condenses what a search found."""

import dspy

BEGIN_QUERY, END_QUERY = "<|begin_search_query|>", "<|end_search_query|>"
BEGIN_RESULT, END_RESULT = "<|begin_search_result|>", "<|end_search_result|>"


class ReasonWithSearch(dspy.Signature):
    __doc__ = f"""Answer the question by reasoning step by step, one short step per line. Whenever a step needs a
    fact you do not know for certain, search for it: write {BEGIN_QUERY} followed by a short search query and
    then {END_QUERY}, and stop there. The search's findings will be added to your reasoning between
    {BEGIN_RESULT} and {END_RESULT}, and you will continue from there. Search again as often as you need,
    within the search limit, and never repeat a query you already made. Continue the reasoning so far exactly
    where it stops. Once you know the answer, end with the final answer written as \\boxed{{ANSWER}}, as short
    as possible (a name, a date, a number, yes or no)."""

    question: str = dspy.InputField()
    search_limit: int = dspy.InputField(desc="the most searches you may make for this question")
    reasoning_so_far: str = dspy.InputField(desc="your reasoning so far, search results included (empty at first)")
    next_reasoning: str = dspy.OutputField(
        desc=f"the next steps of the reasoning: up to and including one {BEGIN_QUERY}query{END_QUERY}, or to the "
             "final \\boxed{ANSWER}",
        max_length=2000,
    )


NOTHING_FOUND = "The searched documents give nothing useful for this query."


class ReasonInDocuments(dspy.Signature):
    __doc__ = f"""Read the searched documents in the light of the reasoning so far and the current search query.
    Pick out the facts in them that answer the query and move the reasoning forward, checking each against
    the documents, and state those facts briefly and accurately, ready to be inserted into the reasoning.
    When the documents hold nothing useful for the query, answer exactly: {NOTHING_FOUND}"""

    previous_reasoning: str = dspy.InputField(desc="the reasoning so far as `Step i: ...`; `...` marks left-out steps")
    search_query: str = dspy.InputField()
    documents: list[str] = dspy.InputField(desc="the searched documents, `[rank] Title | text`, most relevant first")
    final_information: str = dspy.OutputField(desc=f"the helpful facts, or exactly: {NOTHING_FOUND}")
