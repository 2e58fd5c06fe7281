"""Programs: one `dspy.Module` per method and baseline, reachable by name through the registry."""

from arag.programs import adaptive_note, genground, no_retrieval, single_rag  # noqa: F401  (registers the programs)
from arag.programs.base import RAGProgram
from arag.programs.params import Param
from arag.programs.registry import PROGRAMS, build_program, get_program

__all__ = ["PROGRAMS", "Param", "RAGProgram", "build_program", "get_program"]
