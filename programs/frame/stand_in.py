"""Stand-in answers (`arag.testing.StandInModel`) to the signatures the programs share: the next sentence of the
stand-in's long answer (its year unsure), and relevance judged by word overlap with the question."""

from __future__ import annotations

from typing import Any

from arag.signatures.generation import ContinueAnswer
from arag.signatures.relevance import JudgeRelevance
from arag.testing.engines import ScriptedCall
from arag.testing.stand_in import content_words, continuation, label, stand_in_for


@stand_in_for(ContinueAnswer)
def next_sentence(call: ScriptedCall) -> dict[str, Any]:
    return {"continuation": continuation(call.inputs.get("question", ""), call.inputs.get("answer_so_far", ""))}


@stand_in_for(JudgeRelevance)
def relevance(call: ScriptedCall) -> dict[str, Any]:
    """Relevant (p 0.9) when the passage shares two content words with the question, else not (p 0.85)."""
    overlap = len(content_words(call.inputs.get("question", "")) & content_words(call.inputs.get("passage", "")))
    p_yes = 0.9 if overlap >= 2 else 0.15
    if p_yes > 0.5:
        return {"relevant": label("yes", p_yes, {"no": 1 - p_yes})}
    return {"relevant": label("no", 1 - p_yes, {"yes": p_yes})}
