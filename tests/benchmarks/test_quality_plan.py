"""The quality table's plan (benchmarks/quality_plan.py): which questions a cell answers, and how many."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import dspy
import pytest

from arag.runs import Row

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from quality_plan import (  # noqa: E402
    CORE_N,
    DATASETS,
    MOST_N,
    split_of,
    table_questions,
    target_n,
    training_questions,
)


def rows(scores: list[float], start: int = 0) -> list[Row]:
    return [Row(id=f"q{start + i}", question="?", answers=[], trace=[], metrics={"f1": score})
            for i, score in enumerate(scores)]


def test_core_programs_take_their_dataset_count_and_others_start_at_a_first_block():
    assert target_n("single-rag", "hotpotqa", rows([1.0] * 5), rows([1.0] * 5)) == (CORE_N["hotpotqa"], "core")
    assert target_n("self-ask", "2wiki", rows([1.0] * 5), rows([1.0] * 60)) == (20, "first block")


def test_a_core_program_answered_again_on_any_machine_takes_its_count_and_a_variant_does_not():
    for rerun in ("single-rag-rerun", "single-rag-rerun-intel", "flare-rerun-2"):
        assert target_n(rerun, "2wiki", rows([1.0] * 5), rows([1.0] * 40)) == (CORE_N["2wiki"], "core")
    for grown in ("self-ask-rerun-intel", "flare-compiled", "single-rag-tuned-3", "single-rag-rerun-Intel"):
        assert target_n(grown, "2wiki", rows([1.0] * 5), rows([1.0] * 40)) == (20, "first block")


def test_a_cell_grows_by_a_block_only_while_its_interval_holds_0_and_is_wide():
    baseline = rows([0.0, 1.0] * 30)
    # a wide interval around 0: the cell disagrees with single-rag on every question, half either way
    wide = rows([1.0, 0.0] * 10)
    assert target_n("self-ask", "hotpotqa", wide, baseline) == (30, "growing")
    assert target_n("self-ask", "hotpotqa", rows([1.0, 0.0] * 30), baseline) == (MOST_N, f"at most {MOST_N}")
    # every question better: the interval lies above 0
    assert target_n("self-ask", "hotpotqa", rows([1.0] * 20), baseline)[1] == "interval excludes 0"
    # the same scores as single-rag: an interval of width 0 around 0 decides that they are level
    assert target_n("self-ask", "hotpotqa", rows([0.0, 1.0] * 10), baseline)[1] == "interval within ±0.10"
    # single-rag has not answered all of the cell's questions yet
    assert target_n("self-ask", "hotpotqa", wide, rows([0.0] * 10)) == (20, "waits on single-rag")


def test_a_cell_grows_no_further_than_single_rags_own_count_on_its_dataset():
    baseline = rows([0.0, 1.0] * 20)  # 2Wiki: single-rag answers its 40
    assert target_n("self-ask", "2wiki", rows([1.0, 0.0] * 15), baseline) == (40, "growing")
    assert target_n("self-ask", "2wiki", rows([1.0, 0.0] * 20), baseline) == (40, "at most 40")
    assert target_n("self-ask", "2wiki", rows([1.0, 0.0] * 25), baseline) == (50, "at most 40")


def test_the_table_leaves_out_the_questions_kept_for_training(shared_dataset):
    shared = shared_dataset("hotpotqa").parent
    in_file = [json.loads(line)["id"] for line in (shared / "hotpotqa" / "public.jsonl").read_text().splitlines()]
    table = [e.id for e in table_questions(DATASETS["hotpotqa"], shared, 25)]
    assert table == in_file[:20] + in_file[80:85]
    assert [e.id for e in training_questions(DATASETS["hotpotqa"], shared, 5, 20)] == in_file[20:25]


def test_popqa_takes_only_the_questions_that_carry_passages(shared_dataset):
    shared = shared_dataset("popqa_longtail").parent
    questions = table_questions(DATASETS["popqa"], shared, 1000)
    assert len(questions) == CORE_N["popqa"] and all(e.passages for e in questions)


def test_2wiki_takes_its_dev_questions_first_and_the_table_says_the_split(shared_dataset):
    shared = shared_dataset("2wikimultihopqa").parent
    dev = table_questions(DATASETS["2wiki"], shared, 40)
    assert split_of(dev) == "dev"
    assert split_of(table_questions(DATASETS["2wiki"], shared, 120)) == "dev 111 + train 9"
    assert DATASETS["2wiki"].corpus(shared).exists()


@pytest.mark.parametrize("meta, expected", [({}, "test"), ({"split_in_source": "train"}, "train")])
def test_a_question_without_a_split_is_of_its_dataset_s_split(meta, expected):
    assert split_of([dspy.Example(question="q", meta=meta)], DATASETS["popqa"].split) == expected
