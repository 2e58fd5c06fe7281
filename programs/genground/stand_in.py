"""GenGround's stand-in answers (`arag.testing.StandInModel`): two hops deduced, each about one of the question's
names, then the final answer; evidence quoted from the first passage naming the sub-question's subject, else the
paper's "Empty"."""

from __future__ import annotations

import re
from typing import Any

from arag.signatures.grounding import DeduceNextHop, DeduceNextHopYesNo, GroundAnswer
from arag.testing.engines import ScriptedCall
from arag.testing.stand_in import content_words, json_list, stand_in_for, subjects

HOPS = 2
HISTORY_HOP = re.compile(r'"sub_question"')


@stand_in_for(DeduceNextHop, DeduceNextHopYesNo)
def deduction(call: ScriptedCall) -> dict[str, Any]:
    names = subjects(call)
    hops = len(HISTORY_HOP.findall(call.inputs.get("history", "")))
    if hops >= HOPS:
        return {"finished": True, "sub_question": "", "answer": names[0]}
    name = names[hops % len(names)]
    return {"finished": False, "sub_question": f"What is {name} known for?", "answer": name}


@stand_in_for(GroundAnswer)
def grounding(call: ScriptedCall) -> dict[str, Any]:
    return {"evidence": evidence(call.inputs),
            "revised_answer": call.inputs.get("candidate_answer", subjects(call)[0])}


def evidence(inputs: dict[str, str]) -> list[str]:
    subject = content_words(inputs.get("sub_question", ""))
    for passage in json_list(inputs.get("passages", "")):
        if isinstance(passage, str) and subject & content_words(passage):
            return [" ".join(passage.split("|", 1)[-1].split()[:12])]
    return ["Empty"]
