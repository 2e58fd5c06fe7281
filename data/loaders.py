"""QA example loaders: dataset files in their original formats turned into `dspy.Example`s of one shape.

Every example has `id`, `question` (the only input), `answers` (gold first, then aliases), `dataset`
and `meta`; depending on the source also `passages` ({id, title, text, is_supporting}),
`supporting_titles`, `choices` + `answer_label` (multiple choice) and `qa_pairs` (ASQA).
A record without answers is an error unless `require_answers=False` (for unlabeled test files
such as HotpotQA's fullwiki test set); such examples get `answers == []`.
"""

from __future__ import annotations

import csv
import json
import re
from itertools import chain, islice
from pathlib import Path
from typing import Any, Callable, Iterator

import dspy

from arag.data._io import base_suffix, first_non_blank, iter_jsonl, iter_lines, read_json
from arag.errors import ConfigError, DataError

FORMATS = ("jsonl", "hotpotqa", "2wiki", "musique", "strategyqa", "popqa", "popqa-selfrag", "arc", "asqa", "pubhealth")

_DATASET_PATTERNS = (
    ("2wiki", re.compile(r"2wiki")),
    ("hotpotqa", re.compile(r"hotpot")),
    ("musique", re.compile(r"musique")),
    ("strategyqa", re.compile(r"strategy_?qa")),
    ("popqa", re.compile(r"popqa")),
    ("arc", re.compile(r"(?<![a-z])arc(?![a-z])")),
    ("triviaqa", re.compile(r"trivia_?qa")),
    ("nq", re.compile(r"nq[_-]open|natural[_ -]questions|(?<![a-z])nq(?![a-z])")),
    ("pubmedqa", re.compile(r"pubmed_?qa")),
    ("pubhealth", re.compile(r"pubhealth|health_claims")),
    ("asqa", re.compile(r"asqa")),
)
_PUBHEALTH_LABELS = {"true", "false", "mixture", "unproven"}
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
    parse = _PARSERS[fmt]
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
    if base_suffix(path) == ".tsv":
        return "popqa"
    keys = set(record)
    question = record.get("question")
    if "paragraphs" in keys:
        return "musique"
    if "context" in keys and ("_id" in keys or "supporting_facts" in keys):
        return "2wiki" if "evidences" in keys or "2wiki" in path.name.lower() else "hotpotqa"
    if "qa_pairs" in keys:
        return "asqa"
    if isinstance(question, dict) or "answerKey" in keys:
        return "arc"
    if "qid" in keys and "answers" not in keys:
        return "strategyqa"
    if "claim" in keys or _looks_like_pubhealth(record):
        return "pubhealth"
    if "ctxs" in keys:
        return "popqa-selfrag"
    if "question" in keys and ("answers" in keys or "answer" in keys):
        return "jsonl"
    raise DataError(
        f"{path}: cannot tell the dataset format from the keys {sorted(keys)}; pass fmt= one of {', '.join(FORMATS)}"
    )


def dataset_from_text(text: str) -> str | None:
    """The short dataset name a path, source string or label mentions, if any."""
    lowered = text.lower()
    for name, pattern in _DATASET_PATTERNS:
        if pattern.search(lowered):
            return name
    return None


def _looks_like_pubhealth(record: dict) -> bool:
    answers = record.get("answers")
    return (
        "ctxs" in record
        and isinstance(answers, list)
        and bool(answers)
        and all(isinstance(a, str) and a.strip().lower() in _PUBHEALTH_LABELS for a in answers)
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
    fields["answers"] = _answer_list(answers, where)
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


def _answer_list(answers, where: str) -> list[str]:
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


def _passage(where: str, pid, title, text, is_supporting: bool = False) -> dict:
    if pid is None or isinstance(pid, bool) or not isinstance(pid, (str, int)):
        raise DataError(f"{where}: passage with invalid id {pid!r}")
    if not isinstance(text, str):
        raise DataError(f"{where}: passage {pid!r} has no text")
    if title is not None and not isinstance(title, str):
        raise DataError(f"{where}: passage {pid!r} has a non-string title")
    return {"id": str(pid), "title": (title or "").strip(), "text": text.strip(), "is_supporting": bool(is_supporting)}


def _list_field(record: dict, key: str, where: str) -> list:
    value = record.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise DataError(f"{where}: {key!r} must be a list, got {type(value).__name__}")
    return value


def _ctx_passages(record: dict, key: str, where: str, id_prefix) -> list[dict] | None:
    """Passages from Self-RAG/ALCE-style `ctxs`/`docs` lists; entries without an id get `<id_prefix>-<i>`."""
    entries = _list_field(record, key, where)
    if not entries:
        return None
    passages = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise DataError(f"{where}: {key}[{i}] must be an object")
        pid = entry.get("id")
        pid = f"{id_prefix}-{i}" if pid is None or pid == "" else pid
        passages.append(_passage(where, pid, entry.get("title"), entry.get("text"), entry.get("is_supporting", False)))
    return passages


def _unique(values) -> list:
    seen: list = []
    for value in values:
        if value not in seen:
            seen.append(value)
    return seen


# ---------------------------------------------------------------- one parser per format


def _parse_jsonl(record: dict, where: str, path: Path) -> dict:
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
        "dataset": _jsonl_dataset(record, meta, path),
        "meta": meta,
    }
    passages = []
    for i, entry in enumerate(_list_field(record, "passages", where)):
        if not isinstance(entry, dict):
            raise DataError(f"{where}: passages[{i}] must be an object")
        passages.append(_passage(where, entry.get("id"), entry.get("title"), entry.get("text"),
                                 entry.get("is_supporting")))
    fields["passages"] = passages or None
    if "supporting_titles" in record:
        fields["supporting_titles"] = list(_list_field(record, "supporting_titles", where))
    choices = meta.get("choices", record.get("choices"))
    if choices is not None:
        fields["choices"] = _choice_list(choices, where)
        label = meta.get("answer_label", record.get("answer_label"))
        fields["answer_label"] = _check_label(label, fields["choices"], where) if label is not None else None
    return fields


def _jsonl_dataset(record: dict, meta: dict, path: Path) -> str:
    declared = record.get("dataset")
    if isinstance(declared, str) and declared.strip():
        return dataset_from_text(declared) or declared.strip().lower()
    if "choices" in meta:
        return "arc"
    if "label_set" in meta:
        return "pubmedqa"
    if "question_decomposition" in meta:
        return "musique"
    if "decomposition" in meta:
        return "strategyqa"
    if "s_pop" in meta or "prop" in meta:
        return "popqa"
    source = record.get("source")
    if isinstance(source, str) and (name := dataset_from_text(source.rsplit(":", 1)[-1])):
        return name
    return dataset_from_text(f"{path.parent.name}/{path.name}") or "jsonl"


def _wiki_multihop(record: dict, where: str, dataset: str) -> dict:
    """HotpotQA and 2WikiMultihopQA share one shape: context = [[title, [sentences]]],
    supporting_facts = [[title, i]]."""
    supporting = _list_field(record, "supporting_facts", where)
    supporting_titles = _unique(fact[0] for fact in supporting if isinstance(fact, list) and fact)
    passages = []
    for i, entry in enumerate(_list_field(record, "context", where)):
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list)):
            raise DataError(f"{where}: context[{i}] must be [title, [sentences]]")
        title, sentences = entry
        text = " ".join(s.strip() for s in sentences if isinstance(s, str) and s.strip())
        passages.append(_passage(where, title, title, text, title in supporting_titles))
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


def _parse_hotpotqa(record: dict, where: str, path: Path) -> dict:
    return _wiki_multihop(record, where, "hotpotqa")


def _parse_2wiki(record: dict, where: str, path: Path) -> dict:
    return _wiki_multihop(record, where, "2wiki")


def _parse_musique(record: dict, where: str, path: Path) -> dict:
    qid = record.get("id")
    prefix = "paragraph" if qid is None else qid
    passages, supporting_titles = [], []
    for i, paragraph in enumerate(_list_field(record, "paragraphs", where)):
        if not isinstance(paragraph, dict):
            raise DataError(f"{where}: paragraphs[{i}] must be an object")
        idx = paragraph.get("idx", i)
        passage = _passage(
            where, f"{prefix}-{idx}", paragraph.get("title"), paragraph.get("paragraph_text"),
            paragraph.get("is_supporting"),
        )
        passages.append(passage)
        if passage["is_supporting"]:
            supporting_titles.append(passage["title"])
    answers = None
    if record.get("answer") is not None:
        answers = [record["answer"], *_list_field(record, "answer_aliases", where)]
    meta = {key: record[key] for key in ("question_decomposition", "answerable") if key in record}
    return {
        "id": qid,
        "question": record.get("question"),
        "answers": answers,
        "dataset": "musique",
        "meta": meta,
        "passages": passages or None,
        "supporting_titles": _unique(supporting_titles) or None,
    }


def _parse_strategyqa(record: dict, where: str, path: Path) -> dict:
    qid = record.get("qid", record.get("id"))
    answer = record.get("answer")
    if isinstance(answer, str) and answer.strip().lower() in {"yes", "no", "true", "false"}:
        answer = answer.strip().lower() in {"yes", "true"}
    if answer is not None and not isinstance(answer, bool):
        raise DataError(f"{where}: StrategyQA answer must be true/false, got {answer!r}")
    facts = _list_field(record, "facts", where)
    prefix = "fact" if qid is None else f"{qid}-f"
    passages = [_passage(where, f"{prefix}{i}", "", fact, is_supporting=True) for i, fact in enumerate(facts)]
    meta = {key: record[key] for key in ("term", "description", "decomposition", "evidence") if key in record}
    return {
        "id": qid,
        "question": record.get("question"),
        "answers": None if answer is None else ["yes" if answer else "no"],
        "dataset": "strategyqa",
        "meta": meta,
        "passages": passages or None,
    }


def _parse_popqa(record: dict, where: str, path: Path) -> dict:
    raw = record.get("possible_answers")
    answers = None
    if raw is not None and raw.strip():
        try:
            answers = json.loads(raw)
        except json.JSONDecodeError:
            raise DataError(f"{where}: possible_answers is not a JSON list: {raw[:80]!r}") from None
        obj = (record.get("obj") or "").strip()
        answers = _unique([obj, *answers] if obj and isinstance(answers, list) else answers)
    meta = {key: record[key] for key in ("subj", "prop", "obj", "s_wiki_title") if record.get(key)}
    for key in ("s_pop", "o_pop"):
        if (record.get(key) or "").strip().isdigit():
            meta[key] = int(record[key])
    return {"id": record.get("id"), "question": record.get("question"), "answers": answers, "dataset": "popqa",
            "meta": meta}


def _parse_popqa_selfrag(record: dict, where: str, path: Path) -> dict:
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
        "passages": _ctx_passages(record, "ctxs", where, "ctx" if qid is None else f"{qid}-ctx"),
    }


def _choice_list(choices, where: str) -> list[dict]:
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


def _check_label(label, choices: list[dict], where: str) -> str:
    label = str(label).strip()
    if label not in {c["label"] for c in choices}:
        raise DataError(f"{where}: answer label {label!r} is not among the choices {[c['label'] for c in choices]}")
    return label


def _parse_arc(record: dict, where: str, path: Path) -> dict:
    question = record.get("question")
    choices = record.get("choices")
    if isinstance(question, dict):
        question, choices = question.get("stem"), question.get("choices")
    if choices is None:
        raise DataError(f"{where}: missing choices")
    choices = _choice_list(choices, where)
    label = record.get("answerKey", record.get("answer_label"))
    answers, meta = None, {}
    if label is not None:
        label = _check_label(label, choices, where)
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
        "passages": _ctx_passages(record, "ctxs", where, "ctx" if qid is None else f"{qid}-ctx"),
    }


def _parse_asqa(record: dict, where: str, path: Path) -> dict:
    qa_pairs = []
    for i, pair in enumerate(_list_field(record, "qa_pairs", where)):
        short_answers = pair.get("short_answers") if isinstance(pair, dict) else None
        if not isinstance(short_answers, list) or not short_answers:
            raise DataError(f"{where}: qa_pairs[{i}] needs a non-empty 'short_answers' list")
        qa_pairs.append({"question": pair.get("question", ""), "short_answers": _answer_list(short_answers, where)})
    qid = record.get("sample_id", record.get("id"))
    meta = {}
    long_answers = [a["long_answer"] for a in _list_field(record, "annotations", where)
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
        "passages": _ctx_passages(record, "docs", where, "doc" if qid is None else f"{qid}-doc"),
    }


def _parse_pubhealth(record: dict, where: str, path: Path) -> dict:
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
        "passages": _ctx_passages(record, "ctxs", where, "ctx" if qid is None else f"{qid}-ctx"),
    }


_PARSERS: dict[str, Callable[[dict, str, Path], dict]] = {
    "jsonl": _parse_jsonl,
    "hotpotqa": _parse_hotpotqa,
    "2wiki": _parse_2wiki,
    "musique": _parse_musique,
    "strategyqa": _parse_strategyqa,
    "popqa": _parse_popqa,
    "popqa-selfrag": _parse_popqa_selfrag,
    "arc": _parse_arc,
    "asqa": _parse_asqa,
    "pubhealth": _parse_pubhealth,
}
