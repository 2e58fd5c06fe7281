"""The baselines' stand-in answers (`arag.testing.StandInModel`): Self-Ask asks two follow-ups, one per name of
the question; ReAct searches twice, then finishes."""

from __future__ import annotations

import re
from typing import Any

import dspy

from arag.signatures.generation import AnswerBySearching
from arag.signatures.queries import NextFollowUp
from arag.testing.engines import ScriptedCall
from arag.testing.stand_in import json_list, stand_in_for, subjects

FOLLOW_UPS = 2
REACT_SEARCHES = 2
OBSERVATION = re.compile(r"\[\[ ## observation_\d+ ## \]\]")
# the step dspy.ReAct makes of ReAct's signature: its inputs and the trajectory, to the next thought and tool call
REACT_STEP = dspy.Signature(f"{', '.join(AnswerBySearching.input_fields)}, trajectory -> next_thought, "
                            "next_tool_name, next_tool_args")


@stand_in_for(NextFollowUp)
def follow_up(call: ScriptedCall) -> dict[str, Any]:
    names, asked = subjects(call), len(json_list(call.inputs.get("follow_ups", "")))
    return {"needs_follow_up": asked < FOLLOW_UPS,
            "follow_up": f"What is {names[asked % len(names)]}?" if asked < FOLLOW_UPS else ""}


@stand_in_for(REACT_STEP)
def react_step(call: ScriptedCall) -> dict[str, Any]:
    names, searches = subjects(call), len(OBSERVATION.findall(call.prompt))
    if searches < REACT_SEARCHES:
        return {"next_thought": "I should search.", "next_tool_name": "search",
                "next_tool_args": {"query": names[searches % len(names)]}}
    return {"next_thought": "I know enough.", "next_tool_name": "finish", "next_tool_args": {}}
