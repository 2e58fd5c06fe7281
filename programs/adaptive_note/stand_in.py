"""Adaptive-Note's stand-in answers (`arag.testing.StandInModel`): notes that list the passages' titles and grow
with new ones, a longer note judged better, and new queries about the question's names (the second proposal
repeats the first query once, so that the documented retry runs)."""

from __future__ import annotations

from typing import Any

from arag.signatures.notes import CompareNotes, ProposeNextQueries, ProposeNextQuery, UpdateNote, WriteNote
from arag.testing.engines import ScriptedCall
from arag.testing.stand_in import PASSAGE_TITLE, json_list, label, stand_in_for, subjects


@stand_in_for(WriteNote)
def note(call: ScriptedCall) -> dict[str, Any]:
    titles = PASSAGE_TITLE.findall(call.inputs.get("passages", ""))
    return {"note": "Note: " + "; ".join(titles[:3]) + "."}


@stand_in_for(UpdateNote)
def updated_note(call: ScriptedCall) -> dict[str, Any]:
    titles = PASSAGE_TITLE.findall(call.inputs.get("passages", ""))
    note = call.inputs.get("note", "")
    return {"updated_note": f"{note}\nAlso: {'; '.join(titles[:2])}." if titles else note}


@stand_in_for(CompareNotes)
def better(call: ScriptedCall) -> dict[str, Any]:
    better = len(call.inputs.get("new_note", "")) > len(call.inputs.get("best_note", ""))
    return {"better": label("True" if better else "False", 0.8, {"False" if better else "True": 0.2})}


@stand_in_for(ProposeNextQuery)
def query(call: ScriptedCall) -> dict[str, Any]:
    asked = json_list(call.inputs.get("asked_queries", ""))
    if len(asked) == 1 and not call.inputs.get("rejected_query"):
        return {"query": asked[0]}  # a repeat, refused and asked again: Adaptive-Note's documented retry
    return {"query": new_query(subjects(call), len(asked))}


@stand_in_for(ProposeNextQueries)
def queries(call: ScriptedCall) -> dict[str, Any]:
    asked = len(json_list(call.inputs.get("asked_queries", "")))
    return {"queries": [new_query(subjects(call), asked), new_query(subjects(call), asked + 1)]}


def new_query(names: list[str], asked: int) -> str:
    return f"{names[asked % len(names)]} background {asked + 1}"
