"""The evaluation harness: run a program over a dev set, one JSON row per example, resumably.

Rows are appended to `predictions.jsonl` as examples finish, so a kill loses only the examples
in flight; rerunning with the same output folder skips every example already answered. One process
at a time holds a run folder (an exclusive lock on its `run.lock`); a folder with rows but no
`run.json` was not written by arag and is refused.
"""

from __future__ import annotations

import contextvars
import errno
import fcntl
import json
import math
import os
import socket
import time
import warnings
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import dspy
import ujson
from tqdm import tqdm

from arag.data._io import write_atomic
from arag.data.metrics import default_metrics, score_all
from arag.errors import AragError, ConfigError, DataError, QuestionFailed
from arag.lm import require_lm
from arag.programs.frame.base import MAX_LM_CALLS_SETTING

PREDICTIONS = "predictions.jsonl"
SUMMARY = "summary.json"
RUN = "run.json"
LOCK = "run.lock"
MAX_ERRORS = 10  # failed examples in a row that stop a run: the setup, not the questions, is likely at fault
COUNTS = ("lm_calls", "prompt_tokens", "completion_tokens", "retrieval_calls", "distinct_passages")


@dataclass
class EvalResult:
    rows: list[dict[str, Any]]
    summary: dict[str, Any]


def evaluate(
    program: dspy.Module,
    devset: Sequence[dspy.Example],
    *,
    out_dir: str | Path | None = None,
    threads: int = 1,
    metrics: Sequence[str] | None = None,
    run_info: dict[str, Any] | None = None,
    progress: bool = True,
    max_errors: int | None = MAX_ERRORS,
    max_lm_calls: int | None = None,
) -> EvalResult:
    """Run `program` on every example and score it.

    `metrics` defaults to the ones that suit each example's dataset. With `out_dir`, rows go to
    `out_dir/predictions.jsonl` as they finish and `out_dir/summary.json` at the end; examples
    already answered there are skipped; failed ones are run again, with a fresh LM rollout so that
    DSPy's cache does not replay the failure. `run_info` (program name, parameters, ...) is stored in
    `out_dir/run.json` and must match on resume.

    An example that fails (QuestionFailed: an unreadable output, a failed LM call, ...) is recorded with
    its error's kind, message and step, its partial trace and what it spent; the run goes on. A user
    error (AragError) stops the run, and so do `max_errors` failed examples in a row (None: never).
    `max_lm_calls` caps each example's LM calls (default: the program's own generous cap; 0: none); an example
    that reaches it fails with LMCallBudgetSpent.
    """
    if max_errors is not None and max_errors < 1:
        raise ConfigError(f"max_errors must be at least 1 (or None for no limit), got {max_errors}")
    if threads < 1:
        raise ConfigError(f"threads must be at least 1, got {threads}")
    _check_unique_ids(devset)
    require_lm()
    store = _RowStore(Path(out_dir), run_info or {}) if out_dir is not None else None
    with store or nullcontext():
        finished = store.finished() if store else {}
        attempts = store.attempts() if store else {}
        todo = [ex for ex in devset if str(ex.id) not in finished]
        rows = {key: row for key, row in finished.items()}
        started = time.perf_counter()
        failures_in_row = 0
        interrupted = False

        cap = {} if max_lm_calls is None else {MAX_LM_CALLS_SETTING: max_lm_calls}

        def run_one(example: dspy.Example) -> dict[str, Any]:
            with dspy.context(**cap):
                return _run_example(program, example, metrics, attempt=attempts.get(str(example.id), 0))

        bar = tqdm(total=len(devset), initial=len(devset) - len(todo), disable=not progress, unit="q")
        pool = ThreadPoolExecutor(max_workers=threads)
        try:
            pending = {pool.submit(contextvars.copy_context().run, run_one, ex) for ex in todo}
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    row = future.result()
                    rows[row["id"]] = row
                    if store:
                        store.append(row)
                    bar.update()
                    failures_in_row = failures_in_row + 1 if "error" in row else 0
                    if max_errors is not None and failures_in_row >= max_errors:
                        step = f" in {row['error_step']}" if row.get("error_step") else ""
                        raise AragError(
                            f"stopped after {failures_in_row} failed examples in a row (--max-errors {max_errors}); "
                            f"last error{step}: {row['error']}"
                            + (f" (finished rows are kept in {store.dir})" if store else "")
                        )
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            pool.shutdown(wait=not interrupted, cancel_futures=True)
            bar.close()
            if store:
                store.close_rows()
                rows = store.last_rows()  # the file is the record: one row per id, whatever wrote it
            ordered = [rows[str(ex.id)] for ex in devset if str(ex.id) in rows]
            summary = summarize(ordered, n_total=len(devset), wall_time=time.perf_counter() - started,
                                run_info=run_info)
            if store:
                store.write_summary(summary)
    return EvalResult(rows=ordered, summary=summary)


def _run_example(program: dspy.Module, example: dspy.Example, metrics: Sequence[str] | None,
                 attempt: int = 0) -> dict[str, Any]:
    names = list(metrics) if metrics else default_metrics(example)
    row: dict[str, Any] = {"id": str(example.id), "question": example.question, "answers": list(example.answers)}
    started = time.perf_counter()
    try:
        with _rollout(attempt):
            pred = program(question=example.question)
    except AragError:
        raise
    except Exception as exc:  # noqa: BLE001 — one failed example is recorded, the run goes on
        row["seconds"] = round(time.perf_counter() - started, 3)
        failed = exc if isinstance(exc, QuestionFailed) else None
        row.update(prediction=None, metrics={name: 0.0 for name in names})
        row.update({c: int(failed.counts.get(c, 0)) if failed else 0 for c in COUNTS})
        cause = failed.cause if failed else exc
        row["error"] = f"{type(cause).__name__}: {cause}"
        row["error_kind"] = type(cause).__name__
        row["error_step"] = failed.step if failed else None
        row["attempt"] = attempt
        row["trace"] = _jsonable(failed.trace) if failed else []
        return row
    row["seconds"] = round(time.perf_counter() - started, 3)
    row["prediction"] = pred.answer
    row["metrics"] = score_all(example, pred.answer, names)
    row.update({c: int(pred.get(c, 0) or 0) for c in COUNTS})
    extra = {k: v for k, v in pred.items() if k not in {"answer", "trace", *COUNTS}}
    if extra:
        row["outputs"] = _jsonable(extra)
    if attempt:
        row["attempt"] = attempt
    row["trace"] = _jsonable(pred.get("trace", []))
    return row


@contextmanager
def _rollout(attempt: int) -> Iterator[None]:
    """A retry's LM calls under a new rollout id: DSPy's cache would otherwise replay the failed outputs."""
    lm = dspy.settings.lm
    if not attempt or lm is None or not hasattr(lm, "copy"):
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="rollout_id has no effect")  # it keys the cache, as meant
        retry = lm.copy(rollout_id=[lm.kwargs.get("rollout_id"), attempt])  # the endpoint's id kept in the key
    with dspy.context(lm=retry):
        yield


def summarize(rows: Sequence[dict[str, Any]], *, n_total: int, wall_time: float,
              run_info: dict[str, Any] | None = None) -> dict[str, Any]:
    """Mean metrics (failed examples score 0), total and mean counts, and the run's description."""
    n = len(rows)
    metric_names = sorted({name for row in rows for name in row["metrics"]})
    means = {name: sum(row["metrics"].get(name, 0.0) for row in rows) / n if n else 0.0 for name in metric_names}
    totals = {c: sum(int(row.get(c, 0)) for row in rows) for c in COUNTS}
    return {
        **(run_info or {}),
        "n": n,
        "n_total": n_total,
        "complete": n == n_total,
        "n_failed": sum("error" in row for row in rows),
        "failures": dict(Counter(row["error_kind"] for row in rows if "error" in row and row.get("error_kind"))),
        "metrics": means,
        "totals": totals,
        "per_question": {c: totals[c] / n if n else 0.0 for c in COUNTS},
        "seconds_per_question": round(sum(row.get("seconds", 0.0) for row in rows) / n, 3) if n else 0.0,
        "wall_time_s": round(wall_time, 3),
    }


def _check_unique_ids(devset: Iterable[dspy.Example]) -> None:
    seen: set[str] = set()
    for ex in devset:
        key = str(ex.id)
        if key in seen:
            raise DataError(f"example id {key!r} appears twice in the dataset; ids must be unique")
        seen.add(key)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if hasattr(value, "model_dump"):
        return _jsonable(value.model_dump())
    return str(value)


class _RowStore:
    """predictions.jsonl (append-only, one flushed line per example), run.json and summary.json, in a folder this
    process holds locked from construction to `release()`."""

    def __init__(self, directory: Path, run_info: dict[str, Any]) -> None:
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
            self._check_run(run_info)
            self._drop_partial_last_line()
        except BaseException:
            self.release()
            raise

    def _check_run(self, run_info: dict[str, Any]) -> None:
        previous = _previous_run(self.dir)
        if previous is not None:
            changed = {k for k in set(previous) | set(run_info) if previous.get(k) != run_info.get(k)}
            if changed:
                raise ConfigError(
                    f"{self.dir} holds a run with different settings ({', '.join(sorted(changed))}); "
                    "use another --out, or the same settings to resume it"
                )
        else:
            write_atomic(self.dir / RUN, ujson.dumps(run_info, indent=2))

    def _drop_partial_last_line(self) -> None:
        """A kill mid-write can leave half a line; cut it so appends stay line-aligned."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with open(self.path, "r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)

    def finished(self) -> dict[str, dict[str, Any]]:
        """Rows already answered (failed ones are run again), by example id."""
        return {key: row for key, row in self.last_rows().items() if "error" not in row}

    def attempts(self) -> dict[str, int]:
        """How many times each example has failed so far: the attempt number of its next try."""
        counts: Counter[str] = Counter()
        for row in self._all_rows():
            if "error" in row:
                counts[row["id"]] += 1
        return dict(counts)

    def last_rows(self) -> dict[str, dict[str, Any]]:
        """The last row of each example id in predictions.jsonl."""
        return {row["id"]: row for row in self._all_rows()}

    def _all_rows(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        if not self.path.exists():
            return rows
        with open(self.path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                try:
                    row = ujson.loads(line)
                except ValueError:
                    raise DataError(f"{self.path}:{lineno}: not a JSON row; move the file away to start over") from None
                if not isinstance(row, dict) or not isinstance(row.get("id"), str) \
                        or not isinstance(row.get("metrics"), dict):
                    raise DataError(f"{self.path}:{lineno}: not a row of arag's (an object with a string 'id' and "
                                    "'metrics'); move the file away to start over")
                rows.append(row)
        return rows

    def append(self, row: dict[str, Any]) -> None:
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")
        self._file.write(ujson.dumps(row, ensure_ascii=False) + "\n")
        self._file.flush()

    def close_rows(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_atomic(self.dir / SUMMARY, ujson.dumps(summary, indent=2))

    def __enter__(self) -> _RowStore:
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


def _previous_run(directory: Path) -> dict[str, Any] | None:
    """The run.json of an earlier run in the folder, or None for a folder without rows; links in place of
    arag's files, and rows or a summary without a run.json (not written by arag) are refused."""
    for name in (RUN, PREDICTIONS, SUMMARY):
        if (directory / name).is_symlink():
            raise ConfigError(f"{directory / name} is a symbolic link; arag writes only files of its own: "
                              "use another --out")
    run_path = directory / RUN
    if not run_path.exists():
        foreign = [name for name in (PREDICTIONS, SUMMARY) if (directory / name).exists()]
        if foreign:
            raise ConfigError(f"{directory} holds {' and '.join(foreign)} but no {RUN}: not a run of arag's; "
                              "use another --out, or move those files away")
        return None
    try:
        previous = ujson.loads(run_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"{run_path}: not valid JSON ({exc}); use another --out") from None
    if not isinstance(previous, dict):
        raise DataError(f"{run_path}: not a run description (a JSON object); use another --out")
    return previous


def _lock_folder(directory: Path) -> int:
    """An exclusive lock on the folder's run.lock (a descriptor, held until closed), which then names this process;
    a ConfigError naming the holder when another process has it."""
    path = directory / LOCK
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{path} is a symbolic link; arag writes only files of its own: use another --out") \
                from None
        raise ConfigError(f"cannot use {directory} as the output folder: {exc.strerror or exc}") from None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(descriptor, 200, 0).decode("utf-8", errors="replace").strip() or "unknown process"
        os.close(descriptor)
        raise ConfigError(f"{directory} is in use by another arag run ({holder}); wait for it to end, "
                          "or use another --out") from None
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
              .encode(), 0)
    return descriptor


def fair_top_k(summary_path: str | Path) -> int:
    """The mean distinct passages per answered question of a run (Adaptive-Note's), rounded half up:
    the `k` that gives single-time RAG as many passages ("fair top-k").

    `summary_path` is a run's `summary.json` or the folder holding it (`arag eval --out`). Failed
    examples, which retrieved nothing, are left out of the mean.
    """
    path = Path(summary_path)
    if path.is_dir():
        path = path / SUMMARY
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"fair top-k: no run summary at {path}") from None
    except ValueError as exc:
        raise ConfigError(f"fair top-k: {path} is not valid JSON ({exc})") from None
    total = (summary.get("totals") or {}).get("distinct_passages") if isinstance(summary, dict) else None
    answered = summary.get("n", 0) - summary.get("n_failed", 0) if isinstance(summary, dict) else 0
    if not isinstance(total, int) or answered < 1:
        raise ConfigError(f"fair top-k: {path} is not the summary of a run with answered questions "
                          "(it needs n, n_failed and totals.distinct_passages)")
    k = math.floor(total / answered + 0.5)
    if k < 1:
        raise ConfigError(f"fair top-k: the run in {path} retrieved {total / answered:g} distinct passages "
                          "per question; k must be at least 1")
    return k
