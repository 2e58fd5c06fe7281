"""ReAct (Yao et al., 2023) over the corpus: `dspy.ReAct` reasons, calls a search tool backed by the
retriever, and answers once it has what it needs."""

from __future__ import annotations

import dspy

from arag.programs.active_generation import K_FLARE
from arag.programs.base import RAGProgram
from arag.programs.params import Param
from arag.programs.registry import register
from arag.retrievers.base import format_passages
from arag.signatures.generation import AnswerBySearching

MAX_ITERS = Param("max_iters", 7, "cap on the reason-and-act steps before the answer is extracted", low=1, high=30)


@register
class ReActSearch(RAGProgram):
    """ReAct: thought, search, observation, until finish; then the answer from the trajectory."""

    name = "react"
    params = (K_FLARE, MAX_ITERS)

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        self.agent = dspy.ReAct(AnswerBySearching, tools=[dspy.Tool(self.search)], max_iters=self.max_iters)

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
