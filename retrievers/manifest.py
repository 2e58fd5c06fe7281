"""Index folders on disk: the `arag-index.json` manifest, atomic publication of a finished build, and the
passages of an index (`passages.jsonl` with a file of byte offsets, so any kind can read k passages without
holding the corpus in memory)."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from arag.errors import RetrieverError
from arag.passages import Passage
from arag.scratch import MARKER, process_scratch, remove_abandoned, remove_scratch

MANIFEST_NAME = "arag-index.json"
PASSAGES_FILE = "passages.jsonl"
STAGING_PREFIX = ".{name}.building-"
"""Staging folders are named this, then the building process's id and a random suffix."""


class IndexExistsError(RetrieverError):
    """The folder a build should publish to is already taken (e.g. another process finished first)."""


def write_manifest(index_dir: Path, **fields) -> dict:
    """Writes the manifest (`fields` plus a `created` UTC timestamp) into `index_dir` and returns it."""
    manifest = {**fields, "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    (index_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return manifest


def write_index_files(staging: Path, kind: str, format_version: int, records: Iterable[tuple[str, str, str]] | None,
                      *, corpus_sha256: str | None, settings: dict, n_passages: int | None = None,
                      **versions: str) -> dict:
    """What every index folder holds beside its engine's own files: the passages and the manifest.

    `records=None` when the build wrote `PASSAGES_FILE` itself (streaming, with a `PassageWriter`); then
    `n_passages` gives their number.
    """
    if records is not None:
        n_passages = write_records(staging / PASSAGES_FILE, records)
    return write_manifest(staging, kind=kind, format_version=format_version, n_passages=n_passages,
                          corpus_sha256=corpus_sha256, settings=settings, **versions)


def read_index_manifest(index_dir: Path, kind: str, label: str, format_version: int,
                        settings_keys: set[str]) -> tuple[dict, dict]:
    """The manifest and settings of an index folder that must be of `kind` and `format_version` and whose
    settings must hold `settings_keys`; a RetrieverError naming the folder otherwise."""
    manifest = read_manifest(index_dir)
    if manifest["kind"] != kind:
        raise RetrieverError(f"{index_dir} holds a {manifest['kind']!r} index, not a {label} one")
    if manifest.get("format_version") != format_version:
        raise RetrieverError(
            f"{index_dir}: {label} index format {manifest.get('format_version')!r} is not the one this arag reads "
            f"({format_version}); rebuild the index"
        )
    settings = manifest.get("settings")
    if not isinstance(settings, dict) or not settings_keys <= settings.keys():
        raise RetrieverError(f"{index_dir}: corrupt manifest (settings lack {', '.join(sorted(settings_keys))})")
    return manifest, settings


def read_manifest(index_dir: str | Path) -> dict:
    """The manifest of an index folder, or a RetrieverError naming the folder when it is missing or corrupt."""
    index_dir = Path(index_dir)
    if not index_dir.is_dir():
        raise RetrieverError(f"{index_dir}: no such index folder")
    path = index_dir / MANIFEST_NAME
    if not path.is_file():
        raise RetrieverError(f"{index_dir} holds no arag index ({MANIFEST_NAME} is missing)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise RetrieverError(f"{index_dir}: unreadable {MANIFEST_NAME} ({exc})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("kind"), str):
        raise RetrieverError(f"{index_dir}: corrupt {MANIFEST_NAME} (no index 'kind')")
    return manifest


def is_taken(path: Path) -> bool:
    """True when `path` exists as anything but an empty folder."""
    return path.exists() and not (path.is_dir() and not any(path.iterdir()))


@contextmanager
def staged_directory(out_dir: Path) -> Iterator[Path]:
    """A fresh scratch folder beside `out_dir` to build in (see `arag.scratch`); renamed to `out_dir` only when the
    block completes.

    A build that fails or is killed never leaves a loadable folder at `out_dir`, and what a killed build
    left (its process gone) is removed when the next build of `out_dir` starts. When `out_dir` is
    taken before or at the rename, IndexExistsError is raised and the staged files are discarded.
    """
    if is_taken(out_dir):
        raise IndexExistsError(f"{out_dir} already exists and is not empty; remove it or choose another folder")
    prefix = STAGING_PREFIX.format(name=out_dir.name)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned(out_dir.parent, prefix)
    staging = process_scratch(out_dir.parent, prefix)
    try:
        yield staging
        try:
            os.rename(staging, out_dir)
        except OSError as exc:
            if is_taken(out_dir):
                raise IndexExistsError(f"{out_dir} was created by someone else during this build") from exc
            raise
        (out_dir / MARKER).unlink()  # the published index is the user's, no longer arag's scratch
    finally:
        remove_scratch(staging, missing_ok=True)


def offsets_path(passages_path: Path) -> Path:
    """The offsets file beside a passages file (`passages.jsonl` -> `passages.offsets`)."""
    return passages_path.with_suffix(".offsets")


class PassageWriter:
    """Writes passages one at a time: one `[id, title, text]` JSON list per line, and beside them the byte
    offset of every line plus the file's end as little-endian uint64 (n + 1 numbers), for `PassageStore`.

    Streams: nothing but the current passage is held in memory.
    """

    def __init__(self, path: Path):
        self.path = path
        self.count = 0
        self._lines = open(path, "xb")
        self._offsets = open(offsets_path(path), "xb")
        self._offsets.write(struct.pack("<Q", 0))

    def write(self, record: tuple[str, str, str]) -> None:
        self._lines.write((json.dumps(list(record), ensure_ascii=False) + "\n").encode("utf-8"))
        self._offsets.write(struct.pack("<Q", self._lines.tell()))
        self.count += 1

    def close(self) -> None:
        self._lines.close()
        self._offsets.close()

    def __enter__(self) -> PassageWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def write_records(path: Path, records: Iterable[tuple[str, str, str]]) -> int:
    """Writes the passages of an index with a `PassageWriter`; returns how many."""
    with PassageWriter(path) as writer:
        for record in records:
            writer.write(record)
    return writer.count


def read_records(path: Path) -> list[tuple[str, str, str]]:
    """Every passage written by `write_records`, in order, in memory (see `PassageStore` for reading on demand)."""
    with open(path, encoding="utf-8") as handle:
        return [tuple(json.loads(line)) for line in handle]


class PassageStore:
    """The passages of an index read on demand: the offsets are memory-mapped and passage i is one positioned
    read of its line, so k results read k lines and resident memory does not grow with the corpus.

    Safe to use from many threads (positioned reads share no file cursor).
    """

    def __init__(self, path: Path):
        self.path = path
        try:
            self._offsets = np.memmap(offsets_path(path), dtype="<u8", mode="r")
            size = path.stat().st_size
        except (OSError, ValueError) as exc:
            raise RetrieverError(f"{path.parent}: damaged passage store ({exc})") from None
        if not len(self._offsets) or int(self._offsets[0]) != 0 or int(self._offsets[-1]) != size:
            raise RetrieverError(f"{path.parent}: damaged passage store ({path.name} and its offsets disagree); "
                                 "rebuild the index")
        self._size = size
        self._fd = os.open(path, os.O_RDONLY)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def record(self, index: int) -> tuple[str, str, str]:
        """Passage `index` (0-based, in index order) as `(id, title, text)`."""
        start, end = int(self._offsets[index]), int(self._offsets[index + 1])
        try:
            if not 0 <= start < end <= self._size:
                raise ValueError(f"its offsets say bytes {start} to {end}")
            record = json.loads(os.pread(self._fd, end - start, start))
            if not (isinstance(record, list) and len(record) == 3 and all(isinstance(f, str) for f in record)):
                raise ValueError("its line is not [id, title, text]")
        except (OSError, ValueError) as exc:
            raise RetrieverError(f"{self.path.parent}: damaged passage store ({self.path.name}, passage {index}: "
                                 f"{str(exc).splitlines()[0][:200]}); rebuild the index") from None
        return tuple(record)

    def passage(self, index: int, score: float) -> Passage:
        pid, title, text = self.record(index)
        return Passage(id=pid, title=title, text=text, score=score)

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)
