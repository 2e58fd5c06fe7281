"""Programs: one `dspy.Module` per method and baseline, reachable by name through the registry.

The methods: `flare.py`, `crag/`, `self_rag/`, `self_crag.py`, `adaptive_note.py`, `genground.py`, `ircot.py`,
`iter_retgen.py`, `sure.py`, `adaptive_rag/`; the baselines their papers compare against: `baselines/`. The
frame they share (base class, declared parameters, registry, predictors, sentences, FLARE's active-generation
loop) is in `frame/`.
"""

from arag.programs import adaptive_note, flare, genground, ircot, iter_retgen, self_crag, sure  # noqa: F401  (registers)
from arag.programs.adaptive_rag import adaptive_rag  # noqa: F401
from arag.programs.baselines import multi_time, no_retrieval, react, self_ask, single_rag  # noqa: F401
from arag.programs.crag import crag  # noqa: F401
from arag.programs.frame.base import RAGProgram
from arag.programs.frame.params import Param
from arag.programs.frame.registry import PROGRAMS, build_program, get_program
from arag.programs.self_rag import self_rag  # noqa: F401

__all__ = ["PROGRAMS", "Param", "RAGProgram", "build_program", "get_program"]
