"""Adaptive-RAG's stand-in answer (`arag.testing.StandInModel`): a question naming one thing needs one retrieval
(B), one naming several needs several (C)."""

from __future__ import annotations

from typing import Any

from arag.signatures.routing import ClassifyComplexity
from arag.testing.engines import ScriptedCall
from arag.testing.stand_in import label, stand_in_for, subjects


@stand_in_for(ClassifyComplexity)
def complexity(call: ScriptedCall) -> dict[str, Any]:
    if len(subjects(call)) > 1:
        return {"complexity": label("C", 0.6, {"B": 0.3, "A": 0.1})}
    return {"complexity": label("B", 0.6, {"C": 0.3, "A": 0.1})}
