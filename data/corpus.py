"""Passage corpora: JSON Lines (`{"id", "title", "text"}`) or DPR-style TSV (`id<TAB>text<TAB>title`)."""

from __future__ import annotations

import csv
import logging
from dataclasses import replace
from pathlib import Path
from typing import Iterator

from arag.data._io import base_suffix, existing_file, first_non_blank, iter_jsonl, iter_lines
from arag.errors import DataError
from arag.passages import Passage

logger = logging.getLogger(__name__)

CORPUS_FORMATS = ("jsonl", "tsv")
DPR_COLUMNS = ("id", "text", "title")
_JSONL_SUFFIXES = {".jsonl", ".json", ".ndjson"}
# A passage's title and text are each cut to this many characters (about 5,000 tokens) when the corpus is read:
# a passage is retrieved whole into prompts, and one runaway record must not swallow the LM's context.
MAX_PASSAGE_CHARS = 20_000


def load_corpus(path: str | Path, fmt: str = "auto") -> list[Passage]:
    """Every passage of a corpus file, in file order (score 0.0)."""
    return list(iter_corpus(path, fmt))


def iter_corpus(path: str | Path, fmt: str = "auto") -> Iterator[Passage]:
    """The passages of a corpus file one at a time; `fmt` is "jsonl", "tsv" or "auto" (extension, then content).

    A missing file or unknown format fails here; a bad line fails when the iteration reaches it. Titles and
    texts longer than MAX_PASSAGE_CHARS are cut to that length, with a warning.
    """
    path = existing_file(path)
    fmt = corpus_format(path) if fmt == "auto" else fmt
    if fmt not in CORPUS_FORMATS:
        raise DataError(f"{path}: unknown corpus format {fmt!r}; known: auto, {', '.join(CORPUS_FORMATS)}")
    return _unique_passages(path, _jsonl_rows(path) if fmt == "jsonl" else _tsv_rows(path))


def _unique_passages(path: Path, rows: Iterator[tuple[int, Passage]]) -> Iterator[Passage]:
    first_line_of: dict[str, int] = {}
    cut_lines: list[int] = []
    for line_no, passage in rows:
        if passage.id in first_line_of:
            raise DataError(
                f"{path}, line {line_no}: duplicate passage id {passage.id!r} "
                f"(first at line {first_line_of[passage.id]})"
            )
        first_line_of[passage.id] = line_no
        if max(len(passage.title), len(passage.text)) > MAX_PASSAGE_CHARS:
            cut_lines.append(line_no)
            passage = replace(passage, title=passage.title[:MAX_PASSAGE_CHARS], text=passage.text[:MAX_PASSAGE_CHARS])
        yield passage
    if not first_line_of:
        raise DataError(f"{path}: no passages")
    if cut_lines:
        logger.warning("%s: %d passage(s) longer than %d characters cut to that length (line %s%s)", path,
                       len(cut_lines), MAX_PASSAGE_CHARS, cut_lines[0], " and others" if len(cut_lines) > 1 else "")


def corpus_format(path: str | Path) -> str:
    """The corpus format name ("jsonl" or "tsv") from the extension, else from whether the file starts with "{"."""
    path = Path(path)
    suffix = base_suffix(path)
    if suffix in _JSONL_SUFFIXES:
        return "jsonl"
    if suffix == ".tsv":
        return "tsv"
    return "jsonl" if first_non_blank(path).startswith("{") else "tsv"


def _passage(path: Path, line_no: int, pid, title, text) -> Passage:
    where = f"{path}, line {line_no}"
    if pid is None or isinstance(pid, bool) or not isinstance(pid, (str, int)) or not str(pid).strip():
        raise DataError(f"{where}: missing or invalid passage id {pid!r}")
    if not isinstance(text, str):
        raise DataError(f"{where}: missing 'text'" if text is None else f"{where}: 'text' must be a string")
    if title is None:
        title = ""
    if not isinstance(title, str):
        raise DataError(f"{where}: 'title' must be a string, got {type(title).__name__}")
    if not title.strip() and not text.strip():
        raise DataError(f"{where}: passage {pid!r} has neither title nor text")
    return Passage(id=str(pid).strip(), title=title.strip(), text=text.strip())


def _jsonl_rows(path: Path) -> Iterator[tuple[int, Passage]]:
    for line_no, record in iter_jsonl(path):
        yield line_no, _passage(path, line_no, record.get("id"), record.get("title"), record.get("text"))


def _tsv_rows(path: Path) -> Iterator[tuple[int, Passage]]:
    lines = (text for _, text in iter_lines(path))
    reader = csv.reader(lines, delimiter="\t")
    columns: dict[str, int] | None = None
    width = len(DPR_COLUMNS)
    try:
        for row in reader:
            line_no = reader.line_num
            if not any(cell.strip() for cell in row):
                continue
            if columns is None:
                header = [cell.strip().lower() for cell in row]
                if "id" in header and "text" in header:
                    columns = {name: header.index(name) for name in DPR_COLUMNS if name in header}
                    width = len(header)
                    continue
                columns = {name: i for i, name in enumerate(DPR_COLUMNS)}
            if len(row) != width:
                raise DataError(f"{path}, line {line_no}: expected {width} tab-separated columns, got {len(row)}")
            title = row[columns["title"]] if "title" in columns else ""
            yield line_no, _passage(path, line_no, row[columns["id"]], title, row[columns["text"]])
    except csv.Error as exc:
        raise DataError(f"{path}, line {reader.line_num}: malformed TSV ({exc})") from None
