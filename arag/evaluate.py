"""The evaluation harness: run a program over a dev set, one JSON row per example, resumably.

Rows are appended to `predictions.jsonl` as examples finish, so a kill loses only the examples
in flight; rerunning with the same output folder skips every example already answered. One process
at a time holds a run folder (an exclusive lock on its `run.lock`); a folder with rows but no
`run.json` was not written by arag and is refused. `arag.runs.folder` reads and writes the folder's files.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import math
import time
import warnings
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import dspy
from tqdm import tqdm

from arag.data.metrics import default_metrics, score_all
from arag.errors import AragError, ConfigError, DataError, QuestionFailed
from arag.lm import require_lm
from arag.programs.frame.base import MAX_LM_CALLS_SETTING
from arag.runs import COUNTS, SUMMARY, Row, RunFolder, RunRecord, summarize
from arag.trace import read_step
from arag.trace.recorder import CACHE_HIT_LISTENER, charge_to_trace, reporting_cache_hits

MAX_ERRORS = 10  # failed examples in a row that stop a run: the setup, not the questions, is likely at fault


@dataclass
class EvalResult:
    rows: list[Row]
    summary: dict[str, Any]


def evaluate(
    program: dspy.Module,
    devset: Sequence[dspy.Example],
    *,
    out_dir: str | Path | None = None,
    threads: int = 1,
    metrics: Sequence[str] | None = None,
    run_info: RunRecord | Mapping[str, Any] | None = None,
    progress: bool = True,
    max_errors: int | None = MAX_ERRORS,
    max_lm_calls: int | None = None,
) -> EvalResult:
    """Run `program` on every example and score it.

    `metrics` defaults to the ones that suit each example's dataset. With `out_dir`, rows go to
    `out_dir/predictions.jsonl` as they finish and `out_dir/summary.json` at the end; examples
    already answered there are skipped; failed ones are run again, with a fresh LM rollout so that
    DSPy's cache does not replay the failure. `run_info`, the run's record (a RunRecord or its JSON: program name,
    parameters, ...; default: `describe_run`'s account of the program, the configured LM and the examples; a
    `RunSpec` makes it for the runs it sets up), is stored in `out_dir/run.json` and in the summary; a folder holding
    a run of other settings is refused, never resumed.

    An LM call answered from DSPy's disk cache counts with the tokens it cost when it was made, so that a run's
    costs do not depend on what earlier runs left in the cache (unless the caller already listens to cache hits,
    as a tuning trial's ledger does); its seconds are this run's.

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
    if run_info is None:
        record = describe_run(program, devset)
    else:
        record = run_info if isinstance(run_info, RunRecord) else RunRecord.from_json(run_info, "run_info")
    store = RunFolder(Path(out_dir), record) if out_dir is not None else None
    with store or nullcontext(), reporting_cache_hits():
        finished = store.finished() if store else {}
        attempts = store.attempts() if store else {}
        todo = [ex for ex in devset if str(ex.id) not in finished]
        rows = {key: row for key, row in finished.items()}
        started = time.perf_counter()
        failures_in_row = 0
        interrupted = False

        settings = {} if max_lm_calls is None else {MAX_LM_CALLS_SETTING: max_lm_calls}
        if dspy.settings.get(CACHE_HIT_LISTENER) is None:
            settings[CACHE_HIT_LISTENER] = charge_to_trace

        def run_one(example: dspy.Example) -> Row:
            with dspy.context(**settings):
                return _run_example(program, example, metrics, attempt=attempts.get(str(example.id), 0))

        bar = tqdm(total=len(devset), initial=len(devset) - len(todo), disable=not progress, unit="q")
        pool = ThreadPoolExecutor(max_workers=threads)
        try:
            submitted = {pool.submit(contextvars.copy_context().run, run_one, ex): i for i, ex in enumerate(todo)}
            pending = set(submitted)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=submitted.get):  # several at once: in the devset's order
                    row = future.result()
                    rows[row.id] = row
                    if store:
                        store.append(row)
                    bar.update()
                    failures_in_row = failures_in_row + 1 if row.failed else 0
                    if max_errors is not None and failures_in_row >= max_errors:
                        step = f" in {row.error_step}" if row.error_step else ""
                        raise AragError(
                            f"stopped after {failures_in_row} failed examples in a row (--max-errors {max_errors}); "
                            f"last error{step}: {row.error}"
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
                                record=record)
            if store:
                store.write_summary(summary)
    return EvalResult(rows=ordered, summary=summary)


def describe_run(program: dspy.Module, devset: Sequence[dspy.Example]) -> RunRecord:
    """What a run is, for run.json when the caller says nothing: the program's name and parameters, a digest of its
    prompts and demos (a compiled program is another run than the program it came from), the configured LM's model
    and the examples' dataset names."""
    state = json.dumps(program.dump_state(), sort_keys=True, ensure_ascii=False, default=str)
    lm = dspy.settings.lm
    return RunRecord(
        program=getattr(program, "name", None) or type(program).__name__,
        params=json.loads(json.dumps(dict(getattr(program, "config", None) or {}), default=str)),
        prompts="sha256:" + hashlib.sha256(state.encode("utf-8")).hexdigest()[:16],
        lm=str(getattr(lm, "model", None) or type(lm).__name__),
        dataset=dataset_names(devset),
    )


def dataset_names(devset: Sequence[dspy.Example]) -> str | None:
    """The examples' dataset names (`dataset` of each), as a run's record names its dataset when told nothing."""
    return ", ".join(sorted({str(ex.get("dataset")) for ex in devset if ex.get("dataset")})) or None


def _run_example(program: dspy.Module, example: dspy.Example, metrics: Sequence[str] | None,
                 attempt: int = 0) -> Row:
    names = list(metrics) if metrics else default_metrics(example)
    question = {"id": str(example.id), "question": example.question, "answers": list(example.answers)}
    started = time.perf_counter()
    try:
        with _rollout(attempt):
            pred = program(question=example.question)
    except AragError:
        raise
    except Exception as exc:  # noqa: BLE001 — one failed example is recorded, the run goes on
        failed = exc if isinstance(exc, QuestionFailed) else None
        cause = failed.cause if failed else exc
        return Row(**question, seconds=round(time.perf_counter() - started, 3), prediction=None,
                   metrics={name: 0.0 for name in names},
                   **{c: int(failed.counts.get(c, 0)) if failed else 0 for c in COUNTS},
                   error=f"{type(cause).__name__}: {cause}", error_kind=type(cause).__name__,
                   error_step=failed.step if failed else None, attempt=attempt,
                   trace=_read_trace(failed.trace if failed else []))
    extra = {k: v for k, v in pred.items() if k not in {"answer", "trace", *COUNTS}}
    return Row(**question, seconds=round(time.perf_counter() - started, 3), prediction=pred.answer,
               metrics=score_all(example, pred.answer, names), **{c: int(pred.get(c, 0) or 0) for c in COUNTS},
               outputs=_jsonable(extra) if extra else None, attempt=attempt or None,
               trace=_read_trace(pred.get("trace", [])))


def _read_trace(steps: Sequence[Any]) -> list[Any]:
    """A program's recorded steps as a row holds them: each read back into its declared kind."""
    return [read_step(step) for step in _jsonable(list(steps))]


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
