"""Single-time RAG: retrieve once with the question, answer from the top k passages."""

from dataclasses import replace

from arag.programs.base import K, RAGProgram
from arag.programs.registry import register
from arag.programs.steps import REASONING, predictor
from arag.retrievers import format_passages
from arag.signatures import AnswerFromPassages


@register
class SingleRAG(RAGProgram):
    name = "single-rag"
    params = (replace(K, searched=True, search_range=(1, 20)), REASONING)

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        self.generate_answer = predictor(AnswerFromPassages, self.reasoning)

    def run(self, question: str) -> dict:
        passages = self.retrieve(question, why="question")
        prediction = self.generate_answer(passages=format_passages(passages), question=question)
        return {"answer": self.answered(prediction)}
