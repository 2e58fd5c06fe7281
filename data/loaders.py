"""QA example loaders: dataset files in their original formats turned into `dspy.Example`s of one shape.

This module reads the files (JSON Lines, a JSON list or TSV; every error names the file and line), chooses the
format and builds the examples; each dataset's name, formats and record parsing are its module in `datasets/`.
Every example has `id`, `question` (the only input), `answers` (gold first, then aliases), `dataset`
and `meta`; depending on the source also `passages` ({id, title, text, is_supporting}),
`supporting_titles`, `choices` + `answer_label` (multiple choice) and `qa_pairs` (ASQA).
A record without answers is an error unless `require_answers=False` (for unlabeled test files
such as HotpotQA's fullwiki test set); such examples get `answers == []`.
"""

from __future__ import annotations

import csv
import json
from itertools import chain, islice
from pathlib import Path
from typing import Any, Iterator

import dspy

from arag.data._io import base_suffix, first_non_blank, iter_jsonl, iter_lines, read_json
from arag.data.datasets import dataset_formats
from arag.data.datasets.fields import answer_list
from arag.data.datasets.shared_formats import PROJECT_JSONL, SELF_RAG_FILES
from arag.errors import ConfigError, DataError

# In the order detection tries them: each dataset's own formats, then the shapes several datasets share.
_FORMATS = {fmt.name: fmt for fmt in (*dataset_formats(), SELF_RAG_FILES, PROJECT_JSONL)}
FORMATS = tuple(_FORMATS)
MAX_QUESTION_CHARS = 10_000


def load_examples(
    path: str | Path, fmt: str = "auto", limit: int | None = None, *, require_answers: bool = True
) -> list[dspy.Example]:
    """The first `limit` (default all) examples of a dataset file; `fmt` is "auto" or one of FORMATS."""
    path = Path(path)
    if fmt != "auto" and fmt not in FORMATS:
        raise DataError(f"{path}: unknown dataset format {fmt!r}; known: auto, {', '.join(FORMATS)}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ConfigError(f"limit must be a non-negative integer or None, got {limit!r}")
    records = _records(path)
    first = next(records, None)
    if first is None:
        raise DataError(f"{path}: no records")
    if fmt == "auto":
        fmt = detect_format(path, first[1])
    parse = _FORMATS[fmt].parse
    examples: list[dspy.Example] = []
    where_of_id: dict[str, str] = {}
    for index, (where, record) in enumerate(islice(chain([first], records), limit)):
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
        fields = parse(record, where, path)
        example = _example(fields, where, index, path, require_answers)
        if example.id in where_of_id:
            raise DataError(f"{where}: duplicate id {example.id!r} (first at {where_of_id[example.id]})")
        where_of_id[example.id] = where
        examples.append(example)
    return examples


def detect_format(path: str | Path, record: dict) -> str:
    """The format of a file from its extension and the keys of its first record."""
    path = Path(path)
    suffix = base_suffix(path)
    by_suffix = (fmt for fmt in _FORMATS.values() if fmt.suffix == suffix)
    by_record = (fmt for fmt in _FORMATS.values() if fmt.detect is not None and fmt.detect(path, record))
    if found := next(chain(by_suffix, by_record), None):
        return found.name
    raise DataError(
        f"{path}: cannot tell the dataset format from the keys {sorted(record)}; pass fmt= one of {', '.join(FORMATS)}"
    )


# ---------------------------------------------------------------- reading records


def _records(path: Path) -> Iterator[tuple[str, Any]]:
    """(location, record) pairs from a TSV, JSON Lines or JSON-array file."""
    if base_suffix(path) == ".tsv":
        return _tsv_records(path)
    head = first_non_blank(path)
    if head.startswith("{") and _is_json_object(head):
        return ((f"{path}, line {n}", record) for n, record in iter_jsonl(path))
    return _json_array_records(path)


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def _json_array_records(path: Path) -> Iterator[tuple[str, Any]]:
    document = read_json(path)
    if not isinstance(document, list):
        raise DataError(f"{path}: expected a JSON list of records or JSON Lines, got a JSON {type(document).__name__}")
    for index, record in enumerate(document):
        yield f"{path}, record {index} (0-based)", record


def _tsv_records(path: Path) -> Iterator[tuple[str, dict]]:
    reader = csv.reader((text for _, text in iter_lines(path)), delimiter="\t")
    header = None
    try:
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue
            if header is None:
                header = [cell.strip() for cell in row]
                continue
            where = f"{path}, line {reader.line_num}"
            if len(row) != len(header):
                raise DataError(f"{where}: expected {len(header)} tab-separated columns, got {len(row)}")
            yield where, dict(zip(header, row))
    except csv.Error as exc:
        raise DataError(f"{path}, line {reader.line_num}: malformed TSV ({exc})") from None
    if header is None:
        raise DataError(f"{path}: empty file")


# ---------------------------------------------------------------- building examples


def _example(fields: dict, where: str, index: int, path: Path, require_answers: bool) -> dspy.Example:
    question = fields.get("question")
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: missing or empty question")
    if len(question) > MAX_QUESTION_CHARS:
        raise DataError(f"{where}: the question is {len(question):,} characters long, over the limit of "
                        f"{MAX_QUESTION_CHARS:,} (is a document in the question field?)")
    answers = fields.get("answers")
    if answers is None or answers == []:
        if require_answers:
            raise DataError(f"{where}: missing answers (pass require_answers=False to load an unlabeled test file)")
        answers = []
    fields["answers"] = answer_list(answers, where)
    fields["question"] = with_choices(question.strip(), fields.get("choices"))
    fields["id"] = _identifier(fields.get("id"), where) or f"{path.stem}-{index}"
    fields["meta"] = fields.get("meta") or {}
    return dspy.Example(**{key: value for key, value in fields.items() if value is not None}).with_inputs("question")


def with_choices(question: str, choices: list[dict] | None) -> str:
    """The question as programs see it: multiple-choice options listed after it (`A) text`, one per line)."""
    if not choices:
        return question
    options = "\n".join(f"{choice['label']}) {choice['text']}" for choice in choices)
    return f"{question}\nChoices:\n{options}"


def _identifier(value, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise DataError(f"{where}: invalid id {value!r}")
    return str(value).strip()
