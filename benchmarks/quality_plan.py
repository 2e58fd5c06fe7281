"""Which questions each cell of the quality table answers: the datasets, the questions kept apart for training,
and how many questions a cell takes before its difference from single-rag decides something.

Every row is measured on questions its program never learned from. HotpotQA's questions 21-80 are kept apart:
the compiled programs were bootstrapped on them, the thresholds tuned on 21-40, adaptive-rag's router trained on
21-50; the table takes questions 1-20 and then 81 on. adaptive-rag's router also learned from PopQA's questions
21-50 (its file names them), which its PopQA cell leaves out or routes with a second router trained apart from
them (quality.py --second-router). 2WikiMultihopQA's dev questions come first
in its file, before the train questions the source adds; MuSiQue's are all dev.

How many: the core programs answer CORE_N questions of each dataset, and so do their reruns. Every other row
starts at FIRST_N and grows by BLOCK while its F1 interval against single-rag holds 0 and is wider than ±WIDE, to
at most MOST_N, and never past CORE_N, the count single-rag answers and pairs with; the table says which rule
stopped each cell.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import dspy
from quality_cells import is_rerun, own_program

import arag
from arag.runs import Row
from arag.runs.table import paired_difference, question_scores

CORE = ("no-retrieval", "single-rag", "flare", "ircot", "iter-retgen", "crag", "self-rag", "adaptive-rag",
        "adaptive-note", "uncertainty-gate", "search-o1", "dragin")
CORE_N = {"hotpotqa": 60, "popqa": 57, "2wiki": 40, "musique": 40}
FIRST_N, BLOCK, MOST_N, WIDE = 20, 10, 60, 0.10


@dataclass(frozen=True)
class Dataset:
    """A shared dataset as the table reads it: its questions, its corpus, the file positions kept for training."""

    name: str
    label: str
    folder: str
    with_passages: bool = False  # keep only the questions that carry passages (PopQA's long tail)
    training: range = range(0)  # 0-based positions (after the passage filter) kept apart for training
    split: str = "dev"  # the source's split, where the questions do not say theirs

    def questions(self, shared: Path) -> list[dspy.Example]:
        examples = arag.load_examples(str(shared / self.folder / "public.jsonl"))
        return [e for e in examples if getattr(e, "passages", None)] if self.with_passages else examples

    def corpus(self, shared: Path) -> Path:
        return shared / self.folder / "corpus.jsonl"


DATASETS = {
    "hotpotqa": Dataset("hotpotqa", "HotpotQA", "hotpotqa", training=range(20, 80)),
    "popqa": Dataset("popqa", "PopQA", "popqa_longtail", with_passages=True, split="test"),
    "2wiki": Dataset("2wiki", "2WikiMQA", "2wikimultihopqa"),
    "musique": Dataset("musique", "MuSiQue", "musique"),
}


def table_questions(dataset: Dataset, shared: Path, n: int) -> list[dspy.Example]:
    """The table's first n questions: the file's order, less the positions kept for training."""
    return [e for i, e in enumerate(dataset.questions(shared)) if i not in dataset.training][:n]


def training_questions(dataset: Dataset, shared: Path, n: int, skip: int) -> list[dspy.Example]:
    """The n questions after the first `skip` in the file's order (--skip: the runs that train or tune)."""
    return dataset.questions(shared)[skip:skip + n]


def split_of(examples: list[dspy.Example], default: str = "dev") -> str:
    """Which split of the source the questions come from, as the table says it ("dev", "dev 111 + train 9"); a
    question that does not say its split is of `default`."""
    counts: dict[str, int] = {}
    for example in examples:
        split = (getattr(example, "meta", None) or {}).get("split_in_source", default)
        counts[split] = counts.get(split, 0) + 1
    return " + ".join(f"{split} {count}" for split, count in counts.items()) if len(counts) > 1 else next(iter(counts),
                                                                                                          "—")


def target_n(program: str, dataset: str, rows: list[Row], baseline: list[Row]) -> tuple[int, str]:
    """How many questions a cell should have answered, given what it and single-rag have answered, and why."""
    if program in CORE or (is_rerun(program) and own_program(program) in CORE):  # a core program answered again
        return CORE_N[dataset], "core"
    n = len(rows)
    if n < FIRST_N:
        return FIRST_N, "first block"
    most = min(MOST_N, CORE_N[dataset])  # past single-rag's own count no question could be paired with it
    difference = paired_difference(question_scores(rows, "f1"), question_scores(baseline, "f1"))
    if difference is None or difference.questions < min(n, most):
        return n, "waits on single-rag"
    if difference.low > 0 or difference.high < 0:
        return n, "interval excludes 0"
    if (difference.high - difference.low) / 2 <= WIDE:
        return n, f"interval within ±{WIDE:.2f}"
    if n >= most:
        return n, f"at most {most}"
    return min(n + BLOCK, most), "growing"
