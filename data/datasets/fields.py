"""Pieces of a record that several formats share: passages, lists, answers, choices. Every failure is a DataError
that starts with `where` (file and line)."""

from __future__ import annotations

from arag.errors import DataError


def passage(where: str, pid, title, text, is_supporting: bool = False) -> dict:
    """A passage as examples carry it: {id, title, text, is_supporting}."""
    if pid is None or isinstance(pid, bool) or not isinstance(pid, (str, int)):
        raise DataError(f"{where}: passage with invalid id {pid!r}")
    if not isinstance(text, str):
        raise DataError(f"{where}: passage {pid!r} has no text")
    if title is not None and not isinstance(title, str):
        raise DataError(f"{where}: passage {pid!r} has a non-string title")
    return {"id": str(pid), "title": (title or "").strip(), "text": text.strip(), "is_supporting": bool(is_supporting)}


def list_field(record: dict, key: str, where: str) -> list:
    """`record[key]` when it is a list, [] when it is missing or null."""
    value = record.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise DataError(f"{where}: {key!r} must be a list, got {type(value).__name__}")
    return value


def ctx_passages(record: dict, key: str, where: str, record_id, tag: str) -> list[dict] | None:
    """Passages from Self-RAG/ALCE-style `ctxs`/`docs` lists; entries without an id get `<record_id>-<tag>-<i>`
    (`<tag>-<i>` when the record has no id)."""
    id_prefix = tag if record_id is None else f"{record_id}-{tag}"
    entries = list_field(record, key, where)
    if not entries:
        return None
    passages = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise DataError(f"{where}: {key}[{i}] must be an object")
        pid = entry.get("id")
        pid = f"{id_prefix}-{i}" if pid is None or pid == "" else pid
        passages.append(passage(where, pid, entry.get("title"), entry.get("text"), entry.get("is_supporting", False)))
    return passages


def unique(values) -> list:
    """The values without repeats, in order."""
    seen: list = []
    for value in values:
        if value not in seen:
            seen.append(value)
    return seen


def answer_list(answers, where: str) -> list[str]:
    """Answers as distinct non-empty strings, in order."""
    if isinstance(answers, (str, int, float)) and not isinstance(answers, bool):
        answers = [answers]
    if not isinstance(answers, list):
        raise DataError(f"{where}: answers must be a string or a list of strings, got {type(answers).__name__}")
    cleaned: list[str] = []
    for answer in answers:
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or not str(answer).strip():
            raise DataError(f"{where}: invalid answer {answer!r}")
        text = str(answer).strip()
        if text not in cleaned:
            cleaned.append(text)
    return cleaned


def choice_list(choices, where: str) -> list[dict]:
    """Choices as [{label, text}] from either that shape or {"label": [...], "text": [...]}."""
    if isinstance(choices, dict):
        labels, texts = choices.get("label"), choices.get("text")
        if not isinstance(labels, list) or not isinstance(texts, list) or len(labels) != len(texts):
            raise DataError(f"{where}: choices must have equally long 'label' and 'text' lists")
        choices = [{"label": label, "text": text} for label, text in zip(labels, texts)]
    if not isinstance(choices, list) or not choices:
        raise DataError(f"{where}: choices must be a non-empty list")
    cleaned = []
    for choice in choices:
        if not isinstance(choice, dict) or not isinstance(choice.get("text"), str) or choice.get("label") is None:
            raise DataError(f"{where}: each choice needs a label and a text, got {choice!r}")
        cleaned.append({"label": str(choice["label"]).strip(), "text": choice["text"].strip()})
    return cleaned


def checked_label(label, choices: list[dict], where: str) -> str:
    """The answer label as a string, when it is one of the choices' labels."""
    label = str(label).strip()
    if label not in {c["label"] for c in choices}:
        raise DataError(f"{where}: answer label {label!r} is not among the choices {[c['label'] for c in choices]}")
    return label
