"""DRAGIN's prompts: raw completions with worked examples (question, short step-by-step answer, "So the answer is
X."), as the official code writes them (src/data.py; no chat template), with examples and wording of our own.

Without documents: the examples, an instruction line, the question and the answer so far. With documents, after a
trigger: the examples, "Context:" with the numbered documents, a line asking for the examples' format, then the
same. Each answer is one line: a generation ends at the line's end (`END_OF_ANSWER`).
"""

from __future__ import annotations

from typing import Sequence

from arag.passages import Passage, format_passages

END_OF_ANSWER = "\n"
ANSWER_CUE = "So the answer is"

EXAMPLES = (
    ("Which city is the capital of the country where the Eiffel Tower stands?",
     "The Eiffel Tower stands in Paris, France. The capital of France is Paris. So the answer is Paris."),
    ("Are Mount Everest and K2 in the same mountain range?",
     "Mount Everest is in the Himalayas. K2 is in the Karakoram. The Himalayas and the Karakoram are different "
     "ranges. So the answer is no."),
    ("Who was born first, Albert Einstein or Niels Bohr?",
     "Albert Einstein was born on 14 March 1879. Niels Bohr was born on 7 October 1885. 1879 comes before 1885. "
     "So the answer is Albert Einstein."),
    ("What instrument did the composer of the Moonlight Sonata play?",
     "The Moonlight Sonata was composed by Ludwig van Beethoven. Beethoven was a pianist. So the answer is piano."),
    ("In which year was the university where Barack Obama studied law founded?",
     "Barack Obama studied law at Harvard Law School, part of Harvard University. Harvard University was founded in "
     "1636. So the answer is 1636."),
    ("In which English county was the author of Pride and Prejudice born?",
     "Pride and Prejudice was written by Jane Austen. Jane Austen was born in Steventon, Hampshire. So the answer is "
     "Hampshire."),
)
INSTRUCTION = "Answer the next question as the examples do: one fact per sentence, then \"So the answer is X.\""
WITH_CONTEXT = "Answer in the examples' format, using the context above where it helps."


def examples() -> str:
    return "".join(f"Question: {question}\nAnswer: {answer}\n" for question, answer in EXAMPLES)


def case(question: str, written: str) -> str:
    """The question and the answer written so far (its text follows "Answer:" after a space)."""
    return f"Question: {question}\nAnswer:" + (f" {written}" if written else "")


def closed_book(question: str, written: str) -> str:
    """The prompt of a generation without documents."""
    return f"{examples()}\n{INSTRUCTION}\n{case(question, written)}"


def with_documents(question: str, written: str, passages: Sequence[Passage]) -> str:
    """The prompt of the continuation after a trigger: the documents retrieved for it before the question."""
    context = "\n".join(format_passages(passages))
    return f"{examples()}\nContext:\n{context}\n{WITH_CONTEXT}\n{case(question, written)}"


def joined(*parts: str) -> str:
    """Texts joined by single spaces, blank ones left out (as the code joins the answer's parts)."""
    return " ".join(part.strip() for part in parts if part.strip())
