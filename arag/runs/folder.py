"""The run folder that `arag eval --out` writes, and the one place that reads and writes its files.

    run.json           what was run (a RunRecord: program, parameters, LM, ...), written when the run starts
    predictions.jsonl  one Row per finished question, appended as questions finish; a question run again
                       (a failure retried) has a later row, and its last row is the one that counts
    summary.json       the means and totals of those last rows, written when the run stops
    run.lock           held by the one process that writes the folder, and naming it

A row is a line of predictions.jsonl. A last line without its newline is a row being written, or cut by a kill:
every reader keeps it when it is whole JSON and leaves it out otherwise, and the writer, before it appends, ends a
whole one with its newline and cuts a broken one. What run.json and a row hold is declared in `records`.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import socket
import stat
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import ujson

from arag.data._io import existing_file, write_atomic
from arag.errors import ConfigError, DataError, FolderInUse
from arag.runs.records import COUNTS, Row, RunRecord

PREDICTIONS = "predictions.jsonl"
SUMMARY = "summary.json"
RUN = "run.json"
LOCK = "run.lock"
RUN_FILES = (RUN, PREDICTIONS, SUMMARY, LOCK)  # what a run writes in its folder
# What run.lock holds: nothing (made, not yet written) or its holder's line, `pid N on HOST[, since TIME]`.
LOCK_LINE = re.compile(r"(pid \d+ on [^\n]{1,300}\n?)?")
MAX_LOCK_BYTES = 400


# ------------------------------------------------------------------------------------------------
# Reading


@dataclass
class Run:
    """An evaluation run: its folder, a short name, what was run (run.json), its rows (the last row of each
    question, as a failed question's retry comes after its failure) and its summary, computed from those rows."""

    path: Path
    name: str
    record: RunRecord
    rows: list[Row]
    summary: dict[str, Any]


def predictions_path(path: str | Path) -> Path:
    """The predictions.jsonl of a run folder, or `path` itself when it names a file."""
    path = Path(path)
    return path / PREDICTIONS if path.is_dir() else path


def read_rows(path: str | Path) -> list[Row]:
    """Every row of a run folder's predictions.jsonl (or of that file), in the order written; a DataError names the
    file and line of a row that is not one of arag's."""
    path = existing_file(predictions_path(path))
    *lines, last = path.read_bytes().split(b"\n")
    if last.strip() and _whole_json(last):
        lines.append(last)  # a whole row without its newline; a half-written one is left out
    rows = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError:
            raise DataError(f"{path}:{lineno}: not a JSON row") from None
        rows.append(Row.from_json(data, f"{path}:{lineno}"))
    return rows


def last_rows(path: str | Path) -> list[Row]:
    """The last row of each question in a run folder's predictions.jsonl (or that file), in first-seen order."""
    rows = {row.id: row for row in read_rows(path)}
    return list(rows.values())


def _whole_json(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def read_record(folder: str | Path) -> RunRecord | None:
    """What the run in `folder` ran (its run.json), or None when the folder has none."""
    path = Path(folder) / RUN
    return RunRecord.from_json(_json_value(path), str(path)) if path.exists() else None


def _json_value(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from None


def _json_object(path: Path, what: str) -> dict[str, Any]:
    value = _json_value(path)
    if not isinstance(value, dict):
        raise DataError(f"{path}: not {what} (a JSON object)")
    return value


def summarize(rows: Sequence[Row], *, n_total: int, wall_time: float,
              record: RunRecord | None = None) -> dict[str, Any]:
    """Mean metrics (failed examples score 0), total and mean counts, and the run's record."""
    n = len(rows)
    metric_names = sorted({name for row in rows for name in row.metrics})
    means = {name: sum(row.metrics.get(name, 0.0) for row in rows) / n if n else 0.0 for name in metric_names}
    totals = {c: sum(row.count(c) or 0 for row in rows) for c in COUNTS}
    return {
        **(record.to_json() if record is not None else {}),
        "n": n,
        "n_total": n_total,
        "complete": n == n_total,
        "n_failed": sum(row.failed for row in rows),
        "failures": dict(Counter(row.error_kind for row in rows if row.failed and row.error_kind)),
        "metrics": means,
        "totals": totals,
        "per_question": {c: totals[c] / n if n else 0.0 for c in COUNTS},
        "seconds_per_question": round(sum(row.seconds or 0.0 for row in rows) / n, 3) if n else 0.0,
        "wall_time_s": round(wall_time, 3),
    }


def load_run(path: str | Path, name: str | None = None) -> Run:
    """Read a run folder; a ConfigError when it is not one, a DataError naming the file and line of a bad row."""
    folder = Path(path)
    if not folder.is_dir():
        what = "it is a file" if folder.exists() else "it does not exist"
        raise ConfigError(f"{folder} is not a run folder: {what} (a run is a folder written by `arag eval --out`)")
    missing = [file for file in (RUN, PREDICTIONS) if not (folder / file).is_file()]
    if RUN in missing:
        raise ConfigError(f"{folder} is not a run folder: it has no {' and no '.join(missing)} "
                          "(a run is a folder written by `arag eval --out`)")
    record = read_record(folder) or RunRecord()
    rows = [] if missing else last_rows(folder)
    if not rows:
        raise DataError(f"{folder / PREDICTIONS} holds no rows: the run has not finished a question yet")
    written = _json_object(folder / SUMMARY, "a run summary") if (folder / SUMMARY).is_file() else {}
    n_total = max(int(written.get("n_total") or 0), len(rows))
    summary = summarize(rows, n_total=n_total, wall_time=float(written.get("wall_time_s") or 0.0), record=record)
    return Run(folder, name or folder.name, record, rows, summary)


def load_runs(paths: Sequence[str | Path]) -> list[Run]:
    """The runs in these folders, named by the shortest path tails that tell them apart."""
    if not paths:
        raise ConfigError("no runs given: name one or more run folders (written by `arag eval --out`)")
    folders = [Path(path) for path in paths]
    seen: set[Path] = set()
    for folder in folders:
        if folder.resolve() in seen:
            raise ConfigError(f"the run {folder} is given twice")
        seen.add(folder.resolve())
    return [load_run(folder, name) for folder, name in zip(folders, run_names(folders))]


def run_names(folders: Sequence[Path]) -> list[str]:
    """Each folder's name, with as many parent folders as it takes to make the names distinct (the folders are
    distinct)."""
    parts = [folder.resolve().parts for folder in folders]
    depth = 1
    while len(set(names := ["/".join(p[-depth:]) for p in parts])) < len(names):
        depth += 1
    return names


# ------------------------------------------------------------------------------------------------
# Writing


class RunFolder:
    """A run folder held for writing: predictions.jsonl (append-only, one flushed line per example), run.json and
    summary.json, in a folder this process holds locked from construction to `release()`."""

    def __init__(self, directory: Path, record: RunRecord) -> None:
        self.dir = directory
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot use {directory} as the output folder: {exc.strerror or exc}") from None
        self.path = directory / PREDICTIONS
        self._file = None
        _previous_run(directory)  # a folder that is not a run of arag's gets no lock file either
        self._lock = _lock_folder(directory)
        try:
            self._check_run(record)
            self._end_last_line()
        except BaseException:
            self.release()
            raise

    def _check_run(self, record: RunRecord) -> None:
        previous = _previous_run(self.dir)
        if previous is not None:
            changed = record.differences(previous)
            if changed:
                raise ConfigError(
                    f"{self.dir} holds a run with different settings ({', '.join(changed)}); "
                    "use another --out, or the same settings to resume it"
                )
        else:
            write_atomic(self.dir / RUN, ujson.dumps(record.to_json(), indent=2))

    def _end_last_line(self) -> None:
        """Keeps appends line-aligned after a kill mid-write: a whole last row gets its newline, half a one is cut."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if not data or data.endswith(b"\n"):
            return
        start = data.rfind(b"\n") + 1
        with open(self.path, "r+b") as f:
            if _whole_json(data[start:]):
                f.seek(0, os.SEEK_END)
                f.write(b"\n")
            else:
                f.truncate(start)

    def finished(self) -> dict[str, Row]:
        """Rows already answered (failed ones are run again), by example id."""
        return {key: row for key, row in self.last_rows().items() if not row.failed}

    def attempts(self) -> dict[str, int]:
        """How many times each example has failed so far: the attempt number of its next try."""
        return dict(Counter(row.id for row in self._rows() if row.failed))

    def last_rows(self) -> dict[str, Row]:
        """The last row of each example id in predictions.jsonl."""
        return {row.id: row for row in self._rows()}

    def _rows(self) -> list[Row]:
        if not self.path.exists():
            return []
        try:
            return read_rows(self.path)
        except DataError as exc:
            raise DataError(f"{exc}; move the file away to start over") from None

    def append(self, row: Row) -> None:
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")
        self._file.write(ujson.dumps(row.to_json(), ensure_ascii=False) + "\n")
        self._file.flush()

    def close_rows(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_atomic(self.dir / SUMMARY, ujson.dumps(summary, indent=2))

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def release(self) -> None:
        """Closes the rows file and unlocks the folder."""
        self.close_rows()
        if self._lock is not None:
            os.close(self._lock)  # closing the descriptor releases its lock
            self._lock = None


def check_run_folder(directory: str | Path) -> None:
    """Fails as `evaluate` would, before a command's set-up work, when the folder is held by another run, is
    not a run of arag's, or holds a broken run.json (the same checks run again when the run starts)."""
    directory = Path(directory)
    if directory.is_dir():
        _previous_run(directory)
        os.close(_lock_folder(directory))


def _previous_run(directory: Path) -> RunRecord | None:
    """The run.json of an earlier run in the folder, or None for a folder without rows; links in place of
    arag's files (symbolic ones, or a hard-linked predictions.jsonl), and rows or a summary without a run.json (not
    written by arag) are refused."""
    for name in (RUN, PREDICTIONS, SUMMARY):
        if (directory / name).is_symlink():
            raise ConfigError(f"{directory / name} is a symbolic link; arag writes only files of its own: "
                              "use another --out")
    rows = directory / PREDICTIONS
    if rows.exists() and rows.stat().st_nlink != 1:  # appended to in place: a hard link would be written through
        raise ConfigError(f"{rows} is a hard link ({rows.stat().st_nlink} names for one file); arag writes only "
                          "files of its own: use another --out")
    if not (directory / RUN).exists():
        foreign = [name for name in (PREDICTIONS, SUMMARY) if (directory / name).exists()]
        if foreign:
            raise ConfigError(f"{directory} holds {' and '.join(foreign)} but no {RUN}: not a run of arag's; "
                              "use another --out, or move those files away")
    try:
        return read_record(directory)
    except DataError as exc:
        raise DataError(f"{exc}; use another --out") from None


def _lock_folder(directory: Path) -> int:
    """An exclusive lock on the folder's run.lock (a descriptor, held until closed), which then names this process;
    FolderInUse naming the holder when another process has it. A run.lock that is not arag's own (a link, not a
    plain file, or content other than a holder's line) is refused and left as it was."""
    path = directory / LOCK
    try:
        descriptor = _open_lock(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{path} is a symbolic link; arag writes only files of its own: use another --out") \
                from None
        raise ConfigError(f"cannot use {directory} as the output folder: {exc.strerror or exc}") from None
    try:
        _check_lock_file(path, descriptor)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_text(descriptor).strip() or "unknown process"
            raise FolderInUse(f"{directory} is in use by another arag run ({holder}); wait for it to end, "
                              "or use another --out") from None
        if not LOCK_LINE.fullmatch(_lock_text(descriptor)):  # read again: its holder may have written it since
            raise ConfigError(f"{path} is not a run lock of arag's (it holds other text); arag writes only files "
                              "of its own: use another --out, or move it away")
    except BaseException:
        os.close(descriptor)
        raise
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
              .encode(), 0)
    return descriptor


def _open_lock(path: Path) -> int:
    """A descriptor of run.lock, made here when there is none; never through a symbolic link."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return os.open(path, flags | os.O_NONBLOCK)  # a FIFO in its place must not block the open


def _check_lock_file(path: Path, descriptor: int) -> None:
    """A ConfigError unless the open run.lock is a plain file with no other name (a hard link would be written
    through) whose text is empty or a holder's line."""
    status = os.fstat(descriptor)
    if not stat.S_ISREG(status.st_mode):
        raise ConfigError(f"{path} is not a plain file; arag writes only files of its own: use another --out")
    if status.st_nlink != 1:
        raise ConfigError(f"{path} is a hard link ({status.st_nlink} names for one file); arag writes only files of "
                          "its own: use another --out, or move it away")
    if status.st_size > MAX_LOCK_BYTES or not LOCK_LINE.fullmatch(_lock_text(descriptor)):
        raise ConfigError(f"{path} is not a run lock of arag's (it holds other text); arag writes only files of its "
                          "own: use another --out, or move it away")


def _lock_text(descriptor: int) -> str:
    return os.pread(descriptor, MAX_LOCK_BYTES + 1, 0).decode("utf-8", errors="replace")
