"""The uncertainty gate's stand-in answer (`arag.testing.StandInModel`): a question naming several things needs
retrieval, one naming a single thing does not."""

from __future__ import annotations

from typing import Any

from arag.signatures.gating import NeedsRetrieval
from arag.testing.engines import ScriptedCall
from arag.testing.stand_in import stand_in_for, subjects


@stand_in_for(NeedsRetrieval)
def needs_retrieval(call: ScriptedCall) -> dict[str, Any]:
    return {"needs_retrieval": len(subjects(call)) > 1}
