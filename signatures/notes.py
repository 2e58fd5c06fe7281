"""Signatures that keep a note: write it, ask for what it lacks, extend it, judge it, answer from it."""

import dspy

from arag.signatures.answering import SHORT_ANSWER

PASSAGES = "retrieved passages, `[rank] Title | text`"
NOTE_CHARS = 2000  # a note gathers the facts of several passages: room beyond a short field's default


class WriteNote(dspy.Signature):
    """Take notes from the passages for answering the question.
    Gather every fact in them that bears on the question or on a step towards its answer,
    keeping the passages' own wording where you can. Use whatever layout suits the facts.
    Leave out what does not help, and add nothing the passages do not say."""

    question: str = dspy.InputField()
    passages: list[str] = dspy.InputField(desc=PASSAGES)
    note: str = dspy.OutputField(desc="the note", max_length=NOTE_CHARS)


class ProposeNextQuery(dspy.Signature):
    """Read the note kept so far for the question and decide what is still missing to answer it:
    an unknown entity, a fact one step further along the chain, an aspect not yet covered.
    Write one short search query, rich in keywords, that would retrieve that missing knowledge.
    It must differ from every query already asked. If `rejected_query` is not empty, you proposed
    it a moment ago and it repeats an asked query: propose something else."""

    question: str = dspy.InputField()
    note: str = dspy.InputField(desc="the best note so far")
    asked_queries: list[str] = dspy.InputField(desc="queries already searched")
    rejected_query: str = dspy.InputField(desc="your previous proposal, refused as a repeat; empty on the first try")
    query: str = dspy.OutputField(desc="one new search query")


class ProposeNextQueries(dspy.Signature):
    """Read the note kept so far for the question and decide what is still missing to answer it:
    unknown entities, facts one step further along the chain, aspects not yet covered.
    Write two short search queries, rich in keywords and different from each other, that would
    retrieve that missing knowledge. They must differ from every query already asked. If
    `rejected_queries` is not empty, you proposed them a moment ago and they repeat asked queries:
    propose others."""

    question: str = dspy.InputField()
    note: str = dspy.InputField(desc="the best note so far")
    asked_queries: list[str] = dspy.InputField(desc="queries already searched")
    rejected_queries: list[str] = dspy.InputField(desc="your previous proposals, refused as repeats")
    queries: list[str] = dspy.OutputField(desc="two new search queries")


class UpdateNote(dspy.Signature):
    """Extend the note with what the new passages add for answering the question.
    Faithful: copy facts in the passages' own wording rather than paraphrasing or guessing.
    Useful: take only what helps answer the question or a step towards it.
    Growing: add only knowledge the note lacks; keep what the note already holds.
    When the passages add nothing, return the note unchanged."""

    question: str = dspy.InputField()
    note: str = dspy.InputField(desc="the best note so far")
    passages: list[str] = dspy.InputField(desc="newly retrieved passages (may be none)")
    updated_note: str = dspy.OutputField(desc="the whole note, old content and new", max_length=NOTE_CHARS)


class CompareNotes(dspy.Signature):
    """Decide whether the new note is better than the best note for answering the question.
    First and foremost: does the new note hold new information, not merely restated,
    that the best note lacks? If not, it is not better. If it does, weigh the two notes on:
    key information that bears directly on the question; coverage of several aspects;
    enough detail; and usefulness for actually writing the answer."""

    question: str = dspy.InputField()
    best_note: str = dspy.InputField()
    new_note: str = dspy.InputField()
    better: bool = dspy.OutputField(desc="True if the new note is better, else False")


class AnswerFromNote(dspy.Signature):
    """Answer the question from the note. Give only the key answer, with no explanation."""

    question: str = dspy.InputField()
    note: str = dspy.InputField()
    answer: str = dspy.OutputField(desc=SHORT_ANSWER)


class WriteLongAnswerFromNote(dspy.Signature):
    """Answer the question from the note in a few well-formed paragraphs.
    When the question is ambiguous, name each reading it can have and answer each one.
    Be accurate and concise, keep a neutral tone, and state nothing the note does not support."""

    question: str = dspy.InputField()
    note: str = dspy.InputField()
    answer: str = dspy.OutputField(desc="a complete long-form answer", max_length=NOTE_CHARS)
