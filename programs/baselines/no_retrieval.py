"""No retrieval: the LM answers from its own knowledge (the closed-book baseline)."""

from arag.programs.frame.base import RAGProgram
from arag.programs.frame.predictors import REASONING, predictor
from arag.programs.frame.registry import register
from arag.signatures import AnswerFromKnowledge


@register
class NoRetrieval(RAGProgram):
    name = "no-retrieval"
    lm_calls_formula = "1 answer"
    params = (REASONING,)
    needs_retriever = False

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        self.generate_answer = predictor(AnswerFromKnowledge, self.reasoning)

    def required_lm_calls(self, trace: list[dict]) -> int:
        return 1

    def run(self, question: str) -> dict:
        return {"answer": self.answered(self.generate_answer(question=question))}
