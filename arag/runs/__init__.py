"""Evaluation runs: the folder `arag eval --out` writes, read and written only through `folder`; what its files
hold, declared once in `records` (a run's RunRecord, a question's Row); and tables that compare runs with
bootstrap intervals (`table`, for `arag table`) or count their decisions (`decisions`, for `arag decisions`).
Setting a run up is `arag.setup`'s (RunSpec)."""

from arag.runs.folder import (
    LOCK,
    PREDICTIONS,
    RUN,
    RUN_FILES,
    SUMMARY,
    Run,
    RunFolder,
    check_run_folder,
    last_rows,
    load_run,
    load_runs,
    predictions_path,
    read_record,
    read_rows,
    run_names,
    summarize,
)
from arag.runs.records import COUNTS, Row, RunRecord

__all__ = [
    "COUNTS",
    "LOCK",
    "PREDICTIONS",
    "RUN",
    "RUN_FILES",
    "SUMMARY",
    "Row",
    "Run",
    "RunFolder",
    "RunRecord",
    "check_run_folder",
    "last_rows",
    "load_run",
    "load_runs",
    "predictions_path",
    "read_record",
    "read_rows",
    "run_names",
    "summarize",
]
