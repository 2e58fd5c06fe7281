"""The small multi-hop sample set shipped with the package (questions and the corpus that answers them)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def sample_paths() -> tuple[Path, Path]:
    """(questions.jsonl, corpus.jsonl) of the bundled sample set."""
    folder = files("arag.data").joinpath("sample")
    return Path(str(folder.joinpath("questions.jsonl"))), Path(str(folder.joinpath("corpus.jsonl")))
