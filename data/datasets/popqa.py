"""PopQA: its original TSV (`possible_answers` a JSON list, popularity in `s_pop`/`o_pop`). Self-RAG's long-tail
release with retrieved passages is the `popqa-selfrag` format of `shared_formats.py`."""

from __future__ import annotations

import json
import re
from pathlib import Path

from arag.data.datasets.declaration import Dataset, RecordFormat
from arag.data.datasets.fields import unique
from arag.errors import DataError


def _parse(record: dict, where: str, path: Path) -> dict:
    raw = record.get("possible_answers")
    answers = None
    if raw is not None and raw.strip():
        try:
            answers = json.loads(raw)
        except json.JSONDecodeError:
            raise DataError(f"{where}: possible_answers is not a JSON list: {raw[:80]!r}") from None
        obj = (record.get("obj") or "").strip()
        answers = unique([obj, *answers] if obj and isinstance(answers, list) else answers)
    meta = {key: record[key] for key in ("subj", "prop", "obj", "s_wiki_title") if record.get(key)}
    for key in ("s_pop", "o_pop"):
        if (record.get(key) or "").strip().isdigit():
            meta[key] = int(record[key])
    return {"id": record.get("id"), "question": record.get("question"), "answers": answers, "dataset": "popqa",
            "meta": meta}


DATASET = Dataset(name="popqa", precedence=50, pattern=re.compile(r"popqa"), metrics=("match", "em", "f1"),
                  meta_keys=("s_pop", "prop"), formats=(RecordFormat("popqa", _parse, suffix=".tsv"),))
