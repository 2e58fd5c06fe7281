"""SuRe's stand-in answers (`arag.testing.StandInModel`): the question's first name and the passages' titles as
candidates, a summary naming its candidate, a summary judged to support a candidate the question names, and the
longer of two summaries as the more informative."""

from __future__ import annotations

from typing import Any

from arag.signatures.summaries import (
    CompareSummaries,
    JudgeSummarySupport,
    ProposeAnswerCandidates,
    SummarizeForCandidate,
    candidate_field,
)
from arag.testing.engines import ScriptedCall
from arag.testing.stand_in import PASSAGE_TITLE, label, stand_in_for, subjects


@stand_in_for(ProposeAnswerCandidates)  # declared without outputs: SuRe appends candidate_1 ... candidate_K
def candidates(call: ScriptedCall) -> dict[str, Any]:
    options = [subjects(call)[0], *PASSAGE_TITLE.findall(call.inputs.get("passages", ""))]
    count = sum(name != "reasoning" for name in call.output_fields)
    return {candidate_field(number): options[(number - 1) % len(options)] for number in range(1, count + 1)}


@stand_in_for(SummarizeForCandidate)
def summary(call: ScriptedCall) -> dict[str, Any]:
    chosen = call.inputs.get("chosen_candidate", subjects(call)[0])
    return {"supporting_summary": f"The passages about {chosen} bear on the question."}


@stand_in_for(JudgeSummarySupport)
def support(call: ScriptedCall) -> dict[str, Any]:
    named = call.inputs.get("candidate", "") in subjects(call)
    return {"supports_candidate": label("True", 0.7, {"False": 0.3}) if named else label("False", 0.6, {"True": 0.4})}


@stand_in_for(CompareSummaries)
def comparison(call: ScriptedCall) -> dict[str, Any]:
    first, second = call.inputs.get("summary_1", ""), call.inputs.get("summary_2", "")
    return {"more_informative": "1" if len(first) >= len(second) else "2"}
