"""The dataset registry: every dataset module registered once, named by its own pattern, scored by known metrics."""

import importlib
import pkgutil

import arag.data.datasets as datasets_package
from arag.data import FORMATS, METRICS, dataset_from_text
from arag.data.datasets import DATASETS, dataset_named


def test_every_dataset_module_is_registered():
    modules = [importlib.import_module(f"{datasets_package.__name__}.{info.name}")
               for info in pkgutil.iter_modules(datasets_package.__path__)]
    declared = [module.DATASET for module in modules if hasattr(module, "DATASET")]
    assert sorted(d.name for d in declared) == sorted(d.name for d in DATASETS)


def test_names_and_formats_are_unique():
    names = [d.name for d in DATASETS]
    assert len(set(names)) == len(names)
    format_names = [fmt.name for d in DATASETS for fmt in d.formats]
    assert len(set(format_names)) == len(format_names)
    assert set(format_names) < set(FORMATS)


def test_each_dataset_is_named_by_its_pattern_and_scored_by_known_metrics():
    for dataset in DATASETS:
        assert dataset_from_text(f"data/{dataset.name}/dev.jsonl") == dataset.name
        assert dataset_named(dataset.name) is dataset
        assert dataset.metrics and set(dataset.metrics) <= set(METRICS)
    assert dataset_named("jsonl") is None


def test_every_format_can_be_detected():
    for dataset in DATASETS:
        assert all(fmt.detect is not None or fmt.suffix for fmt in dataset.formats)
