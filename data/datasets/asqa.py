"""ASQA: ambiguous questions with one `qa_pairs` entry per reading, in ALCE's JSON (retrieved `docs`); scored by
STR-EM and STR-HIT."""

from __future__ import annotations

import re
from pathlib import Path

from arag.data.datasets.declaration import Dataset, RecordFormat
from arag.data.datasets.fields import answer_list, ctx_passages, list_field
from arag.errors import DataError


def _parse(record: dict, where: str, path: Path) -> dict:
    qa_pairs = []
    for i, pair in enumerate(list_field(record, "qa_pairs", where)):
        short_answers = pair.get("short_answers") if isinstance(pair, dict) else None
        if not isinstance(short_answers, list) or not short_answers:
            raise DataError(f"{where}: qa_pairs[{i}] needs a non-empty 'short_answers' list")
        qa_pairs.append({"question": pair.get("question", ""), "short_answers": answer_list(short_answers, where)})
    qid = record.get("sample_id", record.get("id"))
    meta = {}
    long_answers = [a["long_answer"] for a in list_field(record, "annotations", where)
                    if isinstance(a, dict) and a.get("long_answer")]
    if long_answers or record.get("answer"):
        meta["long_answers"] = long_answers or [record["answer"]]
    if "wikipages" in record:
        meta["wikipages"] = record["wikipages"]
    return {
        "id": qid,
        "question": record.get("question", record.get("ambiguous_question")),
        "answers": [a for pair in qa_pairs for a in pair["short_answers"]],
        "dataset": "asqa",
        "meta": meta,
        "qa_pairs": qa_pairs or None,
        "passages": ctx_passages(record, "docs", where, qid, "doc"),
    }


DATASET = Dataset(name="asqa", precedence=110, pattern=re.compile(r"asqa"), metrics=("str_em", "str_hit"),
                  formats=(RecordFormat("asqa", _parse, lambda path, record: "qa_pairs" in record),))
