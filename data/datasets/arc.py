"""ARC (AI2 Reasoning Challenge): multiple choice, in AI2's JSON Lines (`question` = {stem, choices}, `answerKey`)
or Self-RAG's processed file (flat `question`, `choices` = {label: [...], text: [...]}, retrieved `ctxs`)."""

from __future__ import annotations

import re
from pathlib import Path

from arag.data.datasets.declaration import Dataset, RecordFormat
from arag.data.datasets.fields import checked_label, choice_list, ctx_passages
from arag.errors import DataError


def _detect(path: Path, record: dict) -> bool:
    return isinstance(record.get("question"), dict) or "answerKey" in record


def _parse(record: dict, where: str, path: Path) -> dict:
    question = record.get("question")
    choices = record.get("choices")
    if isinstance(question, dict):
        question, choices = question.get("stem"), question.get("choices")
    if choices is None:
        raise DataError(f"{where}: missing choices")
    choices = choice_list(choices, where)
    label = record.get("answerKey", record.get("answer_label"))
    answers, meta = None, {}
    if label is not None:
        label = checked_label(label, choices, where)
        index = [c["label"] for c in choices].index(label)
        answers, meta["answer_index"] = [choices[index]["text"]], index
    qid = record.get("id")
    return {
        "id": qid,
        "question": question,
        "answers": answers,
        "dataset": "arc",
        "meta": meta,
        "choices": choices,
        "answer_label": label,
        "passages": ctx_passages(record, "ctxs", where, qid, "ctx"),
    }


DATASET = Dataset(name="arc", precedence=60, pattern=re.compile(r"(?<![a-z])arc(?![a-z])"), metrics=("choice_acc",),
                  meta_keys=("choices",), formats=(RecordFormat("arc", _parse, _detect),))
