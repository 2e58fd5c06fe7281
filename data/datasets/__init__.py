"""The QA datasets arag knows, one module each (its name, how paths name it, its metrics, its original file
formats, its precedence: see `declaration.py`). A new dataset is a module here that defines `DATASET`.

DATASETS is in order of precedence: when a text names two datasets, or a record or file fits the formats of
two, the earlier one wins (so 2WikiMultihopQA, in HotpotQA's shape but with `evidences`, comes before HotpotQA)."""

from __future__ import annotations

import importlib
import pkgutil

from arag.data.datasets.declaration import Dataset, RecordFormat

DATASETS: tuple[Dataset, ...] = ()  # every module's DATASET, in order of precedence: filled in below
_BY_NAME: dict[str, Dataset] = {}


def dataset_named(name: object) -> Dataset | None:
    """The dataset whose examples carry `dataset == name`, if arag knows it."""
    return _BY_NAME.get(name) if isinstance(name, str) else None


def dataset_from_text(text: str) -> str | None:
    """The short dataset name a path, source string or label mentions, if any."""
    lowered = text.lower()
    return next((dataset.name for dataset in DATASETS if dataset.pattern.search(lowered)), None)


def dataset_of_meta(meta: dict) -> str | None:
    """The dataset whose own keys an example's `meta` carries, if any."""
    return next((dataset.name for dataset in DATASETS if any(key in meta for key in dataset.meta_keys)), None)


def dataset_formats() -> tuple[RecordFormat, ...]:
    """The original file formats of the datasets, in order of precedence."""
    return tuple(fmt for dataset in DATASETS for fmt in dataset.formats)


def _collect() -> tuple[Dataset, ...]:
    """The DATASET of every module of this package, by precedence (after the functions above: a format module
    imports them)."""
    found = []
    for module in pkgutil.iter_modules(__path__, f"{__name__}."):
        dataset = getattr(importlib.import_module(module.name), "DATASET", None)
        if isinstance(dataset, Dataset):
            found.append(dataset)
    return tuple(sorted(found, key=lambda dataset: (dataset.precedence, dataset.name)))


DATASETS = _collect()
_BY_NAME.update((dataset.name, dataset) for dataset in DATASETS)

__all__ = ["DATASETS", "Dataset", "RecordFormat", "dataset_formats", "dataset_from_text", "dataset_named",
           "dataset_of_meta"]
