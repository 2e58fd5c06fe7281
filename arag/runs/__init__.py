"""Evaluation runs: the folder `arag eval --out` writes, read and written only through `folder`, and tables that
compare runs with bootstrap intervals (`table`, for `arag table`) or count their decisions (`decisions`, for
`arag decisions`)."""

from arag.runs.folder import (
    COUNTS,
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
    read_rows,
    read_run_info,
    row_problem,
    run_names,
    summarize,
)

__all__ = [
    "COUNTS",
    "LOCK",
    "PREDICTIONS",
    "RUN",
    "RUN_FILES",
    "SUMMARY",
    "Run",
    "RunFolder",
    "check_run_folder",
    "last_rows",
    "load_run",
    "load_runs",
    "predictions_path",
    "read_rows",
    "read_run_info",
    "row_problem",
    "run_names",
    "summarize",
]
