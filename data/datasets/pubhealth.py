"""PubHealth: health claims labelled true/false/mixture/unproven, in Self-RAG's processed JSON Lines (retrieved
`ctxs`) or with the `claim` and `label` of the original release."""

from __future__ import annotations

import re
from pathlib import Path

from arag.data.datasets.declaration import Dataset, RecordFormat
from arag.data.datasets.fields import ctx_passages

_LABELS = {"true", "false", "mixture", "unproven"}


def _detect(path: Path, record: dict) -> bool:
    if "claim" in record:
        return True
    answers = record.get("answers")
    return (
        "ctxs" in record
        and isinstance(answers, list)
        and bool(answers)
        and all(isinstance(a, str) and a.strip().lower() in _LABELS for a in answers)
    )


def _parse(record: dict, where: str, path: Path) -> dict:
    answers = record.get("answers")
    if answers is None and isinstance(record.get("label"), str):
        answers = [record["label"]]
    if isinstance(answers, list):
        answers = [a.strip().lower() if isinstance(a, str) else a for a in answers]
    meta = {key: record[key] for key in ("claim", "label") if key in record}
    qid = record.get("id")
    return {
        "id": qid,
        "question": record.get("question", record.get("claim")),
        "answers": answers,
        "dataset": "pubhealth",
        "meta": meta,
        "passages": ctx_passages(record, "ctxs", where, qid, "ctx"),
    }


DATASET = Dataset(name="pubhealth", precedence=100, pattern=re.compile(r"pubhealth|health_claims"),
                  metrics=("yes_no_acc",),
                  formats=(RecordFormat("pubhealth", _parse, _detect),))
