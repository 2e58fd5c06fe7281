"""GenGround (Shi et al., ACL 2024): deduce each simple sub-question's answer from the model's own
knowledge, then ground that answer in the retrieved passages, a batch at a time.

A deduction that is not finished but names no sub-question ends the loop with its answer (there is
nothing to retrieve for); the paper's loop has no hop limit, here `max_hops` deductions and one
closing call bound it."""

from __future__ import annotations

import re
from typing import Any, Sequence

import dspy

from arag.passages import Passage, format_passages
from arag.programs.frame.base import RAGProgram
from arag.programs.frame.params import Param, passages_per_retrieval
from arag.programs.frame.predictors import REASONING, predictor
from arag.programs.frame.registry import register
from arag.programs.genground.steps import Deduce, Ground, Hop
from arag.signatures.grounding import (
    ConcludeFromHistory,
    ConcludeYesNo,
    DeduceNextHop,
    DeduceNextHopYesNo,
    GroundAnswer,
    GroundedHop,
)
from arag.trace import Answer, Stop, StopReason, steps_of, stop_reason

K = passages_per_retrieval(10, "one retrieval per sub-question")
BATCH_SIZE = Param("batch_size", 3, "passages per grounding call (b), fed in rank order", low=1, high=20,
                   searched=True, search_range=(1, 5))
MAX_HOPS = Param("max_hops", 7, "deduction steps before the loop stops without a final answer", low=1, high=20)
ANSWER_TYPE = Param("answer_type", "short", "short answers, or yes/no for StrategyQA-style questions",
                    choices=("short", "yes_no"), tunable=False)

_YES_NO_WORDS = {"yes": "yes", "true": "yes", "no": "no", "false": "no"}
_FIRST_WORD = re.compile(r"\W*(\w+)")
_NO_EVIDENCE_MARKERS = {"", "empty", "none", "no evidence"}


@register
class GenGround(RAGProgram):
    """GenGround: answer deduction from the model's knowledge, then instructed grounding in batches."""

    name = "genground"
    lm_calls_formula = "deductions + grounding batches (+ closing)"
    follows = "the paper (Shi et al., 2024), with a hop budget (max_hops) the paper does not have"
    params = (K, BATCH_SIZE, MAX_HOPS, ANSWER_TYPE, REASONING)

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        yes_no = self.answer_type == "yes_no"
        self.deduce = predictor(DeduceNextHopYesNo if yes_no else DeduceNextHop, self.reasoning)
        self.ground = predictor(GroundAnswer, self.reasoning)
        self.conclude = predictor(ConcludeYesNo if yes_no else ConcludeFromHistory, self.reasoning)

    def required_lm_calls(self, trace: list[dict]) -> int:
        """Every deduction and grounding batch, and the closing call when the hops ran out or named no yes/no."""
        deductions, answers = steps_of(trace, Deduce), steps_of(trace, Answer)
        closing = stop_reason(trace) == StopReason.HOP_BUDGET or bool(
            answers and "stated" not in answers[-1] and deductions[-1]["finished"] is False)
        return len(deductions) + len(steps_of(trace, Ground)) + closing

    def run(self, question: str) -> dict[str, Any]:
        history: list[GroundedHop] = []
        for hop in range(1, self.max_hops + 1):
            # Answer deduction: the next single-hop sub-question and the model's own answer, or the final answer.
            deduced = self.deduce(question=question, history=history)
            self.note(Deduce(hop=hop, finished=deduced.finished, sub_question=deduced.sub_question,
                             answer=deduced.answer, **_reasoning(deduced)))
            if deduced.finished or not deduced.sub_question.strip():
                # A deduction without a sub-question has nothing to ground: its answer is the final one.
                reason = StopReason.DEDUCED if deduced.finished else StopReason.NO_SUB_QUESTION
                self.note(Stop(reason=reason, hops=len(history)))
                return {"answer": self.finish(question, history, deduced), "hops": _dumped(history)}
            # Instructed knowledge grounding of that answer, b passages at a time.
            passages = self.retrieve(deduced.sub_question, why=f"hop {hop} sub-question")
            history.append(self.ground_in_batches(question, deduced.sub_question, deduced.answer, passages, hop))
        self.note(Stop(reason=StopReason.HOP_BUDGET, hops=len(history)))
        return {"answer": self.answered(self.conclude(question=question, history=history)), "hops": _dumped(history)}

    def ground_in_batches(self, question: str, sub_question: str, deduced_answer: str,
                          passages: Sequence[Passage], hop: int) -> GroundedHop:
        """Ground the deduced answer against the passages in rank order, `batch_size` at a time, stopping at
        the first batch that yields evidence; when none does, the deduced answer stands."""
        batches_tried: list[list[str]] = []
        evidence: list[str] = []
        answer = deduced_answer
        for start in range(0, len(passages), self.batch_size):
            batch = passages[start:start + self.batch_size]
            batches_tried.append([p.id for p in batch])
            inputs = {"question": question, "sub_question": sub_question, "candidate_answer": deduced_answer,
                      "passages": format_passages(batch)}
            grounded = self.ground(**inputs)
            evidence = cited_evidence(grounded.evidence or [])
            self.note(Ground(hop=hop, batch=len(batches_tried), passage_ids=batches_tried[-1], inputs=inputs,
                             outputs=_outputs(grounded), evidence_found=bool(evidence)))
            if evidence:
                answer = grounded.revised_answer.strip() or deduced_answer
                break
        self.note(Hop(hop=hop, sub_question=sub_question, deduced_answer=deduced_answer, batches=batches_tried,
                      evidence=evidence, answer=answer, revised=answer != deduced_answer))
        return GroundedHop(sub_question=sub_question, answer=answer, evidence=evidence)

    def finish(self, question: str, history: list[GroundedHop], deduced: dspy.Prediction) -> str:
        """The deduction's final answer; for yes/no questions normalised to yes or no, and decided from the
        grounded history by one closing call when it names neither."""
        if self.answer_type == "short":
            return self.answered(deduced)
        label = yes_no_label(deduced.answer)
        if label is None:
            return self.answered(self.conclude(question=question, history=history))
        self.note(Answer(answer=label, stated=deduced.answer))
        return label


def yes_no_label(text: str) -> str | None:
    """"yes" or "no" when the text starts with yes/no/true/false ("Yes.", "no, because ..."), else None."""
    first = _FIRST_WORD.match(text.lower())
    return _YES_NO_WORDS.get(first.group(1)) if first else None


def cited_evidence(evidence: Sequence[str]) -> list[str]:
    """The quoted evidence, without blank items and without the paper's "Empty" marker for none."""
    return [item.strip() for item in evidence if item.strip().strip(".").lower() not in _NO_EVIDENCE_MARKERS]


def _outputs(prediction: dspy.Prediction) -> dict[str, Any]:
    return {name: value for name, value in prediction.items() if name != "logprobs"}


def _reasoning(prediction: dspy.Prediction) -> dict[str, str]:
    return {"reasoning": prediction.reasoning} if "reasoning" in prediction else {}


def _dumped(history: list[GroundedHop]) -> list[dict[str, Any]]:
    return [hop.model_dump() for hop in history]
