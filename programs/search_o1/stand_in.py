"""Search-o1's stand-in answers (`arag.testing.StandInModel`): one search between the markers, then a \\boxed{}
answer; the documents condensed into a sentence naming their titles."""

from __future__ import annotations

from typing import Any

from arag.signatures.reasoning import BEGIN_QUERY, BEGIN_RESULT, END_QUERY, ReasonInDocuments, ReasonWithSearch
from arag.testing.engines import ScriptedCall
from arag.testing.stand_in import PASSAGE_TITLE, stand_in_for, subjects


@stand_in_for(ReasonWithSearch)
def next_reasoning(call: ScriptedCall) -> dict[str, Any]:
    name = subjects(call)[0]
    if BEGIN_RESULT not in call.inputs.get("reasoning_so_far", ""):
        return {"next_reasoning": f"I need facts about {name}.\n{BEGIN_QUERY}{name}{END_QUERY}"}
    return {"next_reasoning": f"The result names {name}.\nSo the answer is \\boxed{{{name}}}."}


@stand_in_for(ReasonInDocuments)
def final_information(call: ScriptedCall) -> dict[str, Any]:
    titles = PASSAGE_TITLE.findall(call.inputs.get("documents", ""))
    return {"final_information": f"The documents are about {'; '.join(titles[:3])}." if titles else ""}
