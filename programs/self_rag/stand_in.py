"""Self-RAG's stand-in answers (`arag.testing.StandInModel`): retrieve (p 0.7), fully supported (p 0.6), utility 4
(p 0.6), and the segments of the stand-in's long answer, with or without a passage."""

from __future__ import annotations

from typing import Any

from arag.signatures.critique import (
    ContinueAnswerFromKnowledge,
    ContinueAnswerFromPassage,
    DecideRetrieval,
    JudgeSupport,
    RateUtility,
)
from arag.testing.engines import ScriptedCall, Tokens
from arag.testing.stand_in import continuation, label, stand_in_for


@stand_in_for(DecideRetrieval)
def retrieval_decision(call: ScriptedCall) -> dict[str, Any]:
    return {"retrieve": label("yes", 0.7, {"no": 0.2, "continue": 0.1})}


@stand_in_for(JudgeSupport)
def support(call: ScriptedCall) -> dict[str, Any]:
    return {"support": Tokens([("fully", 0.6, {"partially": 0.3, "no": 0.1}), (" supported", 1.0)])}


@stand_in_for(RateUtility)
def utility(call: ScriptedCall) -> dict[str, Any]:
    return {"utility": label("4", 0.6, {"5": 0.2, "3": 0.2})}


@stand_in_for(ContinueAnswerFromKnowledge, ContinueAnswerFromPassage)
def segment(call: ScriptedCall) -> dict[str, Any]:
    return {"continuation": continuation(call.inputs.get("question", ""), call.inputs.get("answer_so_far", ""))}
