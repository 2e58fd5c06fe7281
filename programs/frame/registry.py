"""CLI names to program classes."""

from __future__ import annotations

from typing import Any

from arag.errors import ConfigError
from arag.programs.frame.base import RAGProgram
from arag.retrievers.base import Retriever

PROGRAMS: dict[str, type[RAGProgram]] = {}


def register(cls: type[RAGProgram]) -> type[RAGProgram]:
    """Class decorator: make a program reachable by its `name`."""
    if cls.name in PROGRAMS:
        raise ValueError(f"program name {cls.name!r} registered twice")
    PROGRAMS[cls.name] = cls
    return cls


def get_program(name: str) -> type[RAGProgram]:
    try:
        return PROGRAMS[name]
    except KeyError:
        raise ConfigError(f"unknown program {name!r}; known: {', '.join(sorted(PROGRAMS))}") from None


def build_program(name: str, retriever: Retriever | None = None, **params: Any) -> RAGProgram:
    """An instance of the named program; `retriever` is dropped for programs that never retrieve."""
    cls = get_program(name)
    return cls(retriever if cls.needs_retriever else None, **params)
