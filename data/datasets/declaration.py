"""What a dataset module declares: its name, how paths and labels name it, the metrics that suit it, and the file
formats of its original release."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class RecordFormat:
    """A file format, the `fmt=` of `load_examples`. `parse(record, where, path)` turns one record into example
    fields (`id`, `question`, `answers`, `dataset`, `meta`, and as the source has them `passages`,
    `supporting_titles`, `choices`, `answer_label`, `qa_pairs`), raising a DataError that starts with `where` (file
    and line) on a bad record. Detection: a file whose extension (through `.gz`) is `suffix` is in this format;
    else `detect(path, first_record)` says whether it is."""

    name: str
    parse: Callable[[dict, str, Path], dict]
    detect: Callable[[Path, dict], bool] | None = None
    suffix: str | None = None


@dataclass(frozen=True)
class Dataset:
    """A QA dataset. `name` is its examples' `dataset` field; `pattern` finds it in a lower-case path, source or
    label; `metrics` name the metrics of `arag.data.metrics.METRICS` that score it by default; `meta_keys` are keys
    of `meta` that only its examples carry in the project's JSON Lines shape; `formats` are the file formats of its
    original release. `precedence` orders the datasets: when a text names two, or a record or file fits the
    formats of two, the lower one wins (2WikiMultihopQA, in HotpotQA's shape but with `evidences`, before HotpotQA)."""

    name: str
    precedence: int
    pattern: re.Pattern[str]
    metrics: tuple[str, ...]
    meta_keys: tuple[str, ...] = ()
    formats: tuple[RecordFormat, ...] = ()
