"""HotpotQA: its original JSON (a list of records with `context` = [[title, [sentences]]] and `supporting_facts`
= [[title, sentence index]]), a shape 2WikiMultihopQA shares."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from arag.data.datasets.declaration import Dataset, RecordFormat
from arag.data.datasets.fields import list_field, passage, unique
from arag.errors import DataError


def has_multihop_context(record: dict) -> bool:
    """Whether a record has HotpotQA's shape: a `context` and an `_id` or `supporting_facts`."""
    return "context" in record and ("_id" in record or "supporting_facts" in record)


def _multihop_context_fields(record: dict, where: str, dataset: str) -> dict:
    """Example fields of a record in HotpotQA's shape, each context entry a passage (supporting when its title is
    among the supporting facts)."""
    supporting = list_field(record, "supporting_facts", where)
    supporting_titles = unique(fact[0] for fact in supporting if isinstance(fact, list) and fact)
    passages = []
    for i, entry in enumerate(list_field(record, "context", where)):
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list)):
            raise DataError(f"{where}: context[{i}] must be [title, [sentences]]")
        title, sentences = entry
        text = " ".join(s.strip() for s in sentences if isinstance(s, str) and s.strip())
        passages.append(passage(where, title, title, text, title in supporting_titles))
    meta = {key: record[key] for key in ("type", "level", "supporting_facts", "evidences") if key in record}
    return {
        "id": record.get("_id", record.get("id")),
        "question": record.get("question"),
        "answers": record.get("answer"),
        "dataset": dataset,
        "meta": meta,
        "passages": passages or None,
        "supporting_titles": supporting_titles or None,
    }


def multihop_context_format(name: str, detect: Callable[[Path, dict], bool]) -> RecordFormat:
    """A format in HotpotQA's shape whose examples belong to the dataset `name`."""
    return RecordFormat(name, lambda record, where, path: _multihop_context_fields(record, where, name), detect)


DATASET = Dataset(name="hotpotqa", precedence=20, pattern=re.compile(r"hotpot"), metrics=("em", "f1"),
                  formats=(multihop_context_format("hotpotqa", lambda path, record: has_multihop_context(record)),))
