"""CRAG — Corrective Retrieval Augmented Generation (Yan et al., 2024): grade what was retrieved, then correct it.

1. Retrieve k documents for x; the retrieval evaluator (`scorer`) scores each (x, d) in [-1, 1].
2. Action trigger: Correct when some score is >= `upper`, Incorrect when every score is < `lower`,
   Ambiguous otherwise (`evaluator.py`: the scorers and `trigger`).
3. (`correction.py`) Correct: knowledge refinement (`refinement.py`) of the retrieved documents
   (decompose into strips, score each, keep the top `strips_top_k` scoring above `strip_threshold`,
   in reading order).
   Incorrect: knowledge searching: rewrite x into at most three keywords, search `web` for the
   top `web_k` documents, refine them the same way (strips scored against x).
   Ambiguous: both, the retrieved documents' strips first.
4. The generator answers from (x, refined knowledge).

With `web=none`, nothing is searched: Ambiguous keeps the retrieved strips alone, and Incorrect
(or any action that leaves no knowledge) answers from the question alone; the trace says so.
The defaults are the paper's: k = 10, upper 0.5 and lower -0.9 (the paper's PopQA example), top 5
strips above -0.5 in reading order, 5 web results. The official scripts (HuskyInSalt/CRAG,
scripts/CRAG_Inference.py and its run scripts) differ, and each difference is an option:
- thresholds: 0.592 / -0.995 for PopQA, 0.5 / -0.915 for PubHealth, the presets `official-popqa` and
  `official-pubhealth` (`--preset`; the paper's example is `paper-popqa`);
- `refinement=official`: the retrieved documents kept whole, the top 3 by score, and of what a search found
  the top 5 strips (internal_ and external_knowledge_preparation.py), with no threshold, in score order,
  strips under 4 words scored -1 (the paper: strips, top 5 above -0.5, reading order);
- the T5 evaluator's output is compared unclipped, as both do.
Thresholds suit one scorer and data set; fit them with `arag.optimizers.thresholds.fit_thresholds`.

LM calls per question with scorer=lm: k judgements, one per strip scored, one keyword rewrite when
searching, one answer. With scorer=embedding or t5:PATH only the rewrite and the answer use the LM.
"""

from __future__ import annotations

from arag.programs.crag.correction import (
    CORRECTION_PARAMS,
    CRAG_K,
    THRESHOLD_PRESETS,
    KnowledgeCorrector,
    check_thresholds,
    correction_lm_calls,
)
from arag.programs.crag.steps import AnswerFromQuestion
from arag.programs.frame.base import RAGProgram
from arag.programs.frame.predictors import REASONING, predictor
from arag.programs.frame.registry import register
from arag.signatures.answering import AnswerFromKnowledge
from arag.signatures.knowledge import AnswerFromRefinedKnowledge


@register
class CRAG(RAGProgram):
    name = "crag"
    lm_calls_formula = "k judgements + strips + rewrite + 1"
    follows = ("the paper (Yan et al., 2024) by default; --preset official-popqa / official-pubhealth and "
               "refinement=official: the official scripts (HuskyInSalt/CRAG, scripts/CRAG_Inference.py)")
    params = (CRAG_K, *CORRECTION_PARAMS, REASONING)
    presets = THRESHOLD_PRESETS

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        self.corrector = KnowledgeCorrector.from_config(self.config)
        self.generate_answer = predictor(AnswerFromRefinedKnowledge, self.reasoning)
        self.answer_from_question = predictor(AnswerFromKnowledge, self.reasoning)

    def check_params(self, config):
        check_thresholds(self.name, config)

    def required_lm_calls(self, trace: list[dict]) -> int:
        return correction_lm_calls(trace) + 1

    def run(self, question: str) -> dict:
        passages = self.retrieve(question, why="question")
        action, knowledge = self.corrector.correct(question, passages)
        if knowledge:
            prediction = self.generate_answer(question=question, knowledge=knowledge)
        else:
            self.note(AnswerFromQuestion(reason=f"no knowledge after the {action} action"))
            prediction = self.answer_from_question(question=question)
        return {"answer": self.answered(prediction), "action": action, "knowledge": knowledge}
