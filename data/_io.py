"""File helpers: reading for the corpus and example loaders (every failure a DataError naming file and line),
and the one way arag writes a file that must never be seen half-written."""

from __future__ import annotations

import gzip
import json
import os
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, TextIO

from arag.errors import ConfigError, DataError


@contextmanager
def atomic_writer(path: str | Path, newline: str | None = None, binary: bool = False) -> Iterator[TextIO]:
    """A UTF-8 text file (a binary one with `binary=True`) written beside `path` and moved over it when the block
    ends without an error, so that a reader (or a rerun after a kill) never finds half a file; the folder is made
    if needed. A failed write leaves `path` as it was and no staged file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Each write stages under its own name: two writers of one file never share (or remove) each other's stage.
    staging = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:12]}.tmp")
    handle = open(staging, "xb") if binary else open(staging, "x", encoding="utf-8", newline=newline)
    try:  # only a file this call made is ever removed
        with handle:
            yield handle
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)


def check_output_file(path: str | Path) -> Path:
    """`path` as a Path when a file can be written there (its folder is made if needed), else a ConfigError: for
    commands to check before any work."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"cannot write {path}: it is a folder; give the path of a file")
    _check_writable_folder(path.parent, path)
    return path


def check_output_folder(path: str | Path) -> Path:
    """`path` as a Path when it is, or can be made, a folder to write in, else a ConfigError."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"cannot use {path} as an output folder: it is a file")
    _check_writable_folder(path, path)
    return path


def check_apart(output: str | Path, inputs: Mapping[str, str | Path | Iterable[str | Path] | None], *,
                writes: Iterable[str] | None = None, option: str = "--out") -> None:
    """A ConfigError, before any work, when a command's `output` would write over one of its `inputs` (named by
    their options, each a path, several, or None): when the output is, or is inside, an input, or an input is, or
    is inside, what the command writes (`writes`: the names it writes inside an output folder; None: the output
    as a whole, a file or a folder the command fills). Links are resolved; a hard link to an input counts as it."""
    output = Path(output)
    written = [output] if writes is None else [output / name for name in writes]
    for label, given in inputs.items():
        paths = [given] if isinstance(given, (str, os.PathLike)) else list(given or [])
        for path in map(Path, paths):
            if _is_or_inside(output, path):
                where = "is" if _same(output, path) else "is inside"
                raise ConfigError(f"{option} {output} {where} the input {label} {path}: it would be written over; "
                                  f"choose another {option}")
            if any(_is_or_inside(path, target) for target in written):
                raise ConfigError(f"{option} {output}: the input {label} {path} is among what it would write; "
                                  f"choose another {option}, or move the input elsewhere")


def _is_or_inside(path: Path, folder: Path) -> bool:
    """Whether `path` is `folder` or lies inside it, symbolic links resolved."""
    real, real_folder = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    return _same(path, folder) or real_folder in real.parents


def _same(one: Path, other: Path) -> bool:
    """Whether two paths name one file: the same after resolving links, or one file under two names."""
    if os.path.realpath(one) == os.path.realpath(other):
        return True
    try:
        return os.path.samefile(one, other)
    except OSError:
        return False


def _check_writable_folder(folder: Path, target: Path) -> None:
    """The folder, or the nearest of its parents that exists (the rest would be made), must be a writable folder."""
    existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise ConfigError(f"cannot write {target}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot write {target}: no permission to write in {existing}")


def write_atomic(path: str | Path, text: str) -> None:
    """`text` and a final newline as the whole content of `path`, written atomically."""
    with atomic_writer(path) as handle:
        handle.write(text + "\n")


def existing_file(path: str | Path) -> Path:
    """`path` as a Path, or a DataError when it is missing or not a file."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: file not found")
    if not path.is_file():
        raise DataError(f"{path}: not a file")
    return path


def base_suffix(path: Path) -> str:
    """The lower-case extension, looking through a trailing `.gz`."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes.pop()
    return suffixes[-1] if suffixes else ""


def _open_binary(path: Path):
    return gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")


def iter_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded line without its newline) for every line of a UTF-8 text file (gzip allowed)."""
    path = existing_file(path)
    with _open_binary(path) as handle:
        for line_no, raw in enumerate(handle, 1):
            try:
                text = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{path}, line {line_no}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
            yield line_no, text.rstrip("\r\n")


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line of a JSON Lines file; an empty file is a DataError."""
    path = Path(path)
    found = False
    for line_no, text in iter_lines(path):
        if not text.strip():
            continue
        found = True
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}, line {line_no}: invalid JSON ({exc.msg}, column {exc.colno})") from None
        if not isinstance(record, dict):
            raise DataError(f"{path}, line {line_no}: expected a JSON object, got {type(record).__name__}")
        yield line_no, record
    if not found:
        raise DataError(f"{path}: empty file")


def read_json(path: str | Path) -> Any:
    """The parsed content of a whole JSON document (gzip allowed)."""
    path = existing_file(path)
    with _open_binary(path) as handle:
        raw = handle.read()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line_no = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(f"{path}, line {line_no}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    if not text.strip():
        raise DataError(f"{path}: empty file")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}, line {exc.lineno}: invalid JSON ({exc.msg}, column {exc.colno})") from None


def first_non_blank(path: str | Path) -> str:
    """The first non-blank line of a text file, stripped; an empty file is a DataError."""
    for _, text in iter_lines(path):
        if text.strip():
            return text.strip()
    raise DataError(f"{path}: empty file")
