"""FLARE's stand-in answers (`arag.testing.StandInModel`): a question about each unsure span, and FLARE-instruct's
answer that searches once before it answers."""

from __future__ import annotations

from typing import Any

from arag.signatures.generation import ContinueAnswerWithSearch
from arag.signatures.queries import QuestionForSpan
from arag.testing.engines import ScriptedCall
from arag.testing.stand_in import stand_in_for, subjects


@stand_in_for(QuestionForSpan)
def question_for_span(call: ScriptedCall) -> dict[str, Any]:
    return {"question": f"What does {call.inputs.get('span', 'it')} refer to?"}


@stand_in_for(ContinueAnswerWithSearch)
def continuation_with_search(call: ScriptedCall) -> dict[str, Any]:
    names = subjects(call)
    if not call.inputs.get("answer_so_far", "").strip():
        return {"continuation": f"First, what is {names[0]}? [Search({names[0]} history)]"}
    return {"continuation": f"It is described in the passages. So the answer is {names[0]}."}
