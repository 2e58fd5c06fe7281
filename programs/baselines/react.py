"""ReAct (Yao et al., 2023) over the corpus: `dspy.ReAct` reasons, calls a search tool backed by the
retriever, and answers once it has what it needs."""

from __future__ import annotations

import dspy
from dspy.utils.exceptions import AdapterParseError

from arag.passages import format_passages
from arag.programs.frame.base import RAGProgram
from arag.programs.frame.params import FLARE_SETTING_K, Param
from arag.programs.frame.registry import register
from arag.signatures.generation import AnswerBySearching
from arag.trace import note

MAX_ITERS = Param("max_iters", 7, "cap on the reason-and-act steps before the answer is extracted", low=1, high=30,
                  searched=True, search_range=(1, 10))


class _ReAct(dspy.ReAct):
    """`dspy.ReAct` that ends the trajectory on an unreadable step, as it does on an invalid tool choice
    (DSPy 3.4.1 ends it on ValueError only, and AdapterParseError is not one). The answer is then extracted
    from the trajectory so far; an unreadable extraction still fails the question."""

    def _call_with_potential_trajectory_truncation(self, module, trajectory, **input_args):
        try:
            return super()._call_with_potential_trajectory_truncation(module, trajectory, **input_args)
        except AdapterParseError as exc:
            if module is self.extract:
                raise
            note("unreadable", signature=module.signature.__name__, fallback="end the trajectory",
                 error=str(exc).splitlines()[0][:300])
            raise ValueError(str(exc)) from exc


@register
class ReActSearch(RAGProgram):
    """ReAct: thought, search, observation, until finish; then the answer from the trajectory."""

    name = "react"
    params = (FLARE_SETTING_K, MAX_ITERS)

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        self.agent = _ReAct(AnswerBySearching, tools=[dspy.Tool(self.search)], max_iters=self.max_iters)

    def run(self, question: str) -> dict:
        prediction = self.agent(question=question)
        trajectory = prediction.trajectory
        for index in range(sum(key.startswith("thought_") for key in trajectory)):
            self.note("act", index=index, thought=trajectory[f"thought_{index}"],
                      tool=trajectory[f"tool_name_{index}"], args=trajectory[f"tool_args_{index}"])
        return {"answer": self.answered(prediction)}

    def search(self, query: str) -> list[str]:
        """Search the corpus: the passages that best match the query, as `[rank] Title | text`."""
        return format_passages(self.retrieve(query, why="react search"))
