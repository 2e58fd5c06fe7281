"""Test isolation: DSPy's disk cache, hubs and cost-map downloads are kept out of every test."""

import os
import tempfile
from pathlib import Path

import pytest

# Before dspy is imported anywhere: a private disk cache (DSPy's cache key ignores the engine
# object, so scripted LMs of the same name would answer each other across runs), no hub access.
os.environ["DSPY_CACHEDIR"] = tempfile.mkdtemp(prefix="arag-test-dspy-cache-")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

SHARED_DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


@pytest.fixture
def shared_dataset():
    """Path of a set in ../shared/datasets, or a skip when that folder is absent."""

    def _get(name: str) -> Path:
        path = SHARED_DATASETS / name
        if not path.exists():
            pytest.skip(f"{path} is not present")
        return path

    return _get
