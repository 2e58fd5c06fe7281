"""StrategyQA: yes/no questions (JSON records with `qid`, a boolean `answer`, annotator `facts`, `decomposition`)."""

from __future__ import annotations

import re
from pathlib import Path

from arag.data.datasets.declaration import Dataset, RecordFormat
from arag.data.datasets.fields import list_field, passage
from arag.errors import DataError


def _detect(path: Path, record: dict) -> bool:
    return "qid" in record and "answers" not in record


def _parse(record: dict, where: str, path: Path) -> dict:
    qid = record.get("qid", record.get("id"))
    answer = record.get("answer")
    if isinstance(answer, str) and answer.strip().lower() in {"yes", "no", "true", "false"}:
        answer = answer.strip().lower() in {"yes", "true"}
    if answer is not None and not isinstance(answer, bool):
        raise DataError(f"{where}: StrategyQA answer must be true/false, got {answer!r}")
    facts = list_field(record, "facts", where)
    prefix = "fact" if qid is None else f"{qid}-f"
    passages = [passage(where, f"{prefix}{i}", "", fact, is_supporting=True) for i, fact in enumerate(facts)]
    meta = {key: record[key] for key in ("term", "description", "decomposition", "evidence") if key in record}
    return {
        "id": qid,
        "question": record.get("question"),
        "answers": None if answer is None else ["yes" if answer else "no"],
        "dataset": "strategyqa",
        "meta": meta,
        "passages": passages or None,
    }


DATASET = Dataset(name="strategyqa", precedence=40, pattern=re.compile(r"strategy_?qa"), metrics=("yes_no_acc",),
                  meta_keys=("decomposition",), formats=(RecordFormat("strategyqa", _parse, _detect),))
