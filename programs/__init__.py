"""Programs: one `dspy.Module` per method and baseline, reachable by name through the registry."""

from arag.programs import (  # noqa: F401  (importing a program's module registers it)
    adaptive_note,
    crag,
    flare,
    genground,
    multi_time,
    no_retrieval,
    react,
    self_ask,
    self_crag,
    self_rag,
    single_rag,
)
from arag.programs.base import RAGProgram
from arag.programs.params import Param
from arag.programs.registry import PROGRAMS, build_program, get_program

__all__ = ["PROGRAMS", "Param", "RAGProgram", "build_program", "get_program"]
