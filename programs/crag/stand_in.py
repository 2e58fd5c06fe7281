"""CRAG's stand-in answers (`arag.testing.StandInModel`): the question's first three names as its keywords (the
evaluator's relevance judgements are the shared ones, `programs/frame/stand_in.py`)."""

from __future__ import annotations

from typing import Any

from arag.signatures.queries import RewriteAsKeywords
from arag.testing.engines import ScriptedCall
from arag.testing.stand_in import stand_in_for, subjects


@stand_in_for(RewriteAsKeywords)
def keywords(call: ScriptedCall) -> dict[str, Any]:
    return {"keywords": subjects(call)[:3]}
