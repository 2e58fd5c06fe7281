"""Programs: one `dspy.Module` per method and baseline, reachable by name through the registry.

The methods: `flare.py`, `crag/` (with Self-CRAG), `self_rag/`, `adaptive_note/`, `genground/`, `ircot.py`,
`iter_retgen.py`, `sure/`, `adaptive_rag/`, `uncertainty_gate/`, `search_o1/`; the baselines their papers compare
against: `baselines/`. The frame they share (base class, declared parameters, registry, predictors, sentences,
FLARE's active-generation loop) is in `frame/`. A new program is a module here whose class carries `@register`;
a method in its own folder declares its step kinds there too (`steps.py`), and its stand-in answers for tests
(`stand_in.py`, imported by `arag.testing` only). Importing this package imports every other module below it, so
that each registration, and each step kind, is all it takes.
"""

import importlib
import pkgutil

from arag.programs.frame.base import RAGProgram
from arag.programs.frame.params import Param
from arag.programs.frame.registry import PROGRAMS, build_program, get_program

for _module in pkgutil.walk_packages(__path__, f"{__name__}."):
    if _module.name.rpartition(".")[2] != "stand_in":  # a method's answers for the test fakes: arag.testing's
        importlib.import_module(_module.name)

__all__ = ["PROGRAMS", "Param", "RAGProgram", "build_program", "get_program"]
