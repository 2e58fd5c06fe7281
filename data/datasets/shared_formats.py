"""The formats that serve several datasets, each example's dataset told by its record or file name: the project's
own JSON Lines shape (`jsonl`, what ../shared/datasets uses) and Self-RAG's files with retrieved `ctxs`
(`popqa-selfrag`: PopQA long-tail, or the dataset the file name says)."""

from __future__ import annotations

from pathlib import Path

from arag.data.datasets import dataset_from_text, dataset_of_meta
from arag.data.datasets.declaration import RecordFormat
from arag.data.datasets.fields import checked_label, choice_list, ctx_passages, list_field, passage
from arag.errors import DataError


def _project_dataset(record: dict, meta: dict, path: Path) -> str:
    """The dataset a record names, else the one its `meta` keys, `source` or path point to, else "jsonl"."""
    declared = record.get("dataset")
    if isinstance(declared, str) and declared.strip():
        return dataset_from_text(declared) or declared.strip().lower()
    if name := dataset_of_meta(meta):
        return name
    source = record.get("source")
    if isinstance(source, str) and (name := dataset_from_text(source.rsplit(":", 1)[-1])):
        return name
    return dataset_from_text(f"{path.parent.name}/{path.name}") or "jsonl"


def _parse_project_jsonl(record: dict, where: str, path: Path) -> dict:
    meta = record.get("meta") or {}
    if not isinstance(meta, dict):
        raise DataError(f"{where}: 'meta' must be an object")
    meta = dict(meta)
    if record.get("source"):
        meta["source"] = record["source"]
    answers = record.get("answers", record.get("answer"))
    fields = {
        "id": record.get("id"),
        "question": record.get("question"),
        "answers": answers,
        "dataset": _project_dataset(record, meta, path),
        "meta": meta,
    }
    passages = []
    for i, entry in enumerate(list_field(record, "passages", where)):
        if not isinstance(entry, dict):
            raise DataError(f"{where}: passages[{i}] must be an object")
        passages.append(passage(where, entry.get("id"), entry.get("title"), entry.get("text"),
                                entry.get("is_supporting")))
    fields["passages"] = passages or None
    if "supporting_titles" in record:
        fields["supporting_titles"] = list(list_field(record, "supporting_titles", where))
    choices = meta.get("choices", record.get("choices"))
    if choices is not None:
        fields["choices"] = choice_list(choices, where)
        label = meta.get("answer_label", record.get("answer_label"))
        fields["answer_label"] = checked_label(label, fields["choices"], where) if label is not None else None
    return fields


def _has_question_and_answers(path: Path, record: dict) -> bool:
    return "question" in record and ("answers" in record or "answer" in record)


def _parse_self_rag(record: dict, where: str, path: Path) -> dict:
    meta = {key: record[key] for key in ("prop", "s_wiki_title") if key in record}
    popularity = record.get("s_pop", record.get("pop"))
    if popularity is not None:
        meta["s_pop"] = popularity
    qid = record.get("id")
    return {
        "id": qid,
        "question": record.get("question"),
        "answers": record.get("answers"),
        "dataset": dataset_from_text(path.name) or "popqa",
        "meta": meta,
        "passages": ctx_passages(record, "ctxs", where, qid, "ctx"),
    }


SELF_RAG_FILES = RecordFormat("popqa-selfrag", _parse_self_rag, lambda path, record: "ctxs" in record)
PROJECT_JSONL = RecordFormat("jsonl", _parse_project_jsonl, _has_question_and_answers)
