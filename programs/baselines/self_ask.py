"""Self-Ask with retrieval (Press et al., 2022), FLARE's question-decomposition baseline: the LM asks
follow-up sub-questions one at a time, each is retrieved and answered from its passages, and the
final answer comes from the chain of follow-ups and intermediate answers."""

from __future__ import annotations

import dspy

from arag.passages import format_passages
from arag.programs.frame.base import RAGProgram
from arag.programs.frame.params import FLARE_SETTING_K, Param
from arag.programs.frame.registry import register
from arag.signatures.answering import AnswerFromPassages
from arag.signatures.generation import AnswerFromFollowUps
from arag.signatures.queries import NextFollowUp

MAX_FOLLOW_UPS = Param("max_follow_ups", 5, "cap on the follow-up questions per answer", low=1, high=20,
                       searched=True, search_range=(1, 5))


@register
class SelfAsk(RAGProgram):
    """Self-Ask: follow-up sub-questions, each retrieved and answered, then the final answer."""

    name = "self-ask"
    params = (FLARE_SETTING_K, MAX_FOLLOW_UPS)

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        self.next_follow_up = dspy.Predict(NextFollowUp)
        self.answer_follow_up = dspy.Predict(AnswerFromPassages)
        self.answer_question = dspy.Predict(AnswerFromFollowUps)

    def run(self, question: str) -> dict:
        chain: list[str] = []
        asked: set[str] = set()
        stop = "the follow-up cap is reached"
        for _ in range(self.max_follow_ups):
            decision = self.next_follow_up(question=question, follow_ups=chain)
            follow_up = decision.follow_up.strip()
            if not decision.needs_follow_up or not follow_up:
                stop = "no follow-up is needed"
                break
            if follow_up.lower() in asked:
                stop = "a follow-up was asked again"
                break
            asked.add(follow_up.lower())
            passages = self.retrieve(follow_up, why="follow-up question")
            intermediate = self.answer_follow_up(passages=format_passages(passages), question=follow_up).answer
            self.note("follow_up", question=follow_up, intermediate_answer=intermediate,
                      passage_ids=[p.id for p in passages])
            chain.append(f"Follow up: {follow_up} Intermediate answer: {intermediate}")
        self.note("stop", reason=stop, follow_ups=len(chain))
        return {"answer": self.answered(self.answer_question(question=question, follow_ups=chain))}
