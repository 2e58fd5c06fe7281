"""Programs: one `dspy.Module` per method and baseline, reachable by name through the registry.

The methods: `flare.py`, `crag/`, `self_rag/`, `self_crag.py`, `adaptive_note.py`, `genground.py`, `ircot.py`,
`iter_retgen.py`, `sure.py`, `adaptive_rag/`; the baselines their papers compare against: `baselines/`. The
frame they share (base class, declared parameters, registry, predictors, sentences, FLARE's active-generation
loop) is in `frame/`. A new program is a module here whose class carries `@register`.
"""

import importlib
import pkgutil

from arag.programs.frame.base import RAGProgram
from arag.programs.frame.params import Param
from arag.programs.frame.registry import PROGRAMS, build_program, get_program

# Every module below this package is imported once, so that each program's `@register` line is all it takes.
for _module in pkgutil.walk_packages(__path__, f"{__name__}."):
    importlib.import_module(_module.name)

__all__ = ["PROGRAMS", "Param", "RAGProgram", "build_program", "get_program"]
