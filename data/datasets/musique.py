"""MuSiQue: JSON Lines records with `paragraphs` (gold marked `is_supporting`) and `question_decomposition`."""

from __future__ import annotations

import re
from pathlib import Path

from arag.data.datasets.declaration import Dataset, RecordFormat
from arag.data.datasets.fields import list_field, passage, unique
from arag.errors import DataError


def _parse(record: dict, where: str, path: Path) -> dict:
    qid = record.get("id")
    prefix = "paragraph" if qid is None else qid
    passages, supporting_titles = [], []
    for i, paragraph in enumerate(list_field(record, "paragraphs", where)):
        if not isinstance(paragraph, dict):
            raise DataError(f"{where}: paragraphs[{i}] must be an object")
        idx = paragraph.get("idx", i)
        found = passage(
            where, f"{prefix}-{idx}", paragraph.get("title"), paragraph.get("paragraph_text"),
            paragraph.get("is_supporting"),
        )
        passages.append(found)
        if found["is_supporting"]:
            supporting_titles.append(found["title"])
    answers = None
    if record.get("answer") is not None:
        answers = [record["answer"], *list_field(record, "answer_aliases", where)]
    meta = {key: record[key] for key in ("question_decomposition", "answerable") if key in record}
    return {
        "id": qid,
        "question": record.get("question"),
        "answers": answers,
        "dataset": "musique",
        "meta": meta,
        "passages": passages or None,
        "supporting_titles": unique(supporting_titles) or None,
    }


DATASET = Dataset(name="musique", precedence=30, pattern=re.compile(r"musique"), metrics=("em", "f1"),
                  meta_keys=("question_decomposition",),
                  formats=(RecordFormat("musique", _parse, lambda path, record: "paragraphs" in record),))
