"""Single-time RAG: retrieve once with the question, answer from the top k passages."""


from arag.passages import format_passages
from arag.programs.frame.base import RAGProgram
from arag.programs.frame.params import passages_per_retrieval
from arag.programs.frame.predictors import REASONING, predictor
from arag.programs.frame.registry import register
from arag.signatures import AnswerFromPassages


@register
class SingleRAG(RAGProgram):
    name = "single-rag"
    lm_calls_formula = "1 answer"
    params = (passages_per_retrieval(5, searched=True, search_range=(1, 20)), REASONING)

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        self.generate_answer = predictor(AnswerFromPassages, self.reasoning)

    def required_lm_calls(self, trace: list[dict]) -> int:
        return 1

    def run(self, question: str) -> dict:
        passages = self.retrieve(question, why="question")
        prediction = self.generate_answer(passages=format_passages(passages), question=question)
        return {"answer": self.answered(prediction)}
