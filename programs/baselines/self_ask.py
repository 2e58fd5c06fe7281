"""Self-Ask with retrieval (Press et al., 2022), FLARE's question-decomposition baseline: the LM asks
follow-up sub-questions one at a time, each is retrieved and answered from its passages, and the
final answer comes from the chain of follow-ups and intermediate answers.

The paper's method is a few-shot prompt: each exemplar answers "Are follow up questions needed here:
Yes.", then alternates "Follow up:" and "Intermediate answer:", and closes with "So the final answer is:".
Here the steps are DSPy signatures: `NextFollowUp` decides whether a follow-up is needed and writes it
(the decomposition is spelled out in its instructions), `AnswerFromPassages` gives the intermediate
answer from the follow-up's passages, and `AnswerFromFollowUps` the final answer from the chain.

By default, as in the paper, the model is shown worked examples: three decomposed questions of our own
(`WRITTEN_CHAINS`, two bridge questions and a comparison, not the paper's exemplars), attached as the
demos of the follow-up decision (one demo per decision of each chain, the last one "no follow-up") and
of the final answer. `demos=false` runs zero-shot, from the instructions alone; `arag compile`
replaces the written demos with bootstrapped ones, or adds these after them (`--keep-written-demos`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import dspy

from arag.passages import format_passages
from arag.programs.baselines.steps import FollowUp
from arag.programs.frame.base import RAGProgram
from arag.programs.frame.params import FLARE_SETTING_K, Param
from arag.programs.frame.registry import register
from arag.signatures.answering import AnswerFromPassages
from arag.signatures.generation import AnswerFromFollowUps
from arag.signatures.queries import NextFollowUp
from arag.trace import Stop, StopReason, steps_of, stop_reason

MAX_FOLLOW_UPS = Param("max_follow_ups", 5, "cap on the follow-up questions per answer", low=1, high=20,
                       searched=True, search_range=(1, 5))
DEMOS = Param("demos", True, "show the written worked examples (three decomposed questions); false: zero-shot",
              tunable=False)


FOLLOW_UP_LABEL, INTERMEDIATE_LABEL = "Follow up:", "Intermediate answer:"


def chain_entry(follow_up: str, intermediate_answer: str) -> str:
    """One follow-up and its intermediate answer, as the chain holds them."""
    return f"{FOLLOW_UP_LABEL} {follow_up} {INTERMEDIATE_LABEL} {intermediate_answer}"


def follow_up_question(text: str) -> str:
    """The follow-up question in what the model wrote: the text before any "Intermediate answer:", which the
    paper's prompt stops generation at (the search engine gives that answer, not the model), without a leading
    "Follow up:". A model copying the chain's format writes both."""
    question = re.split(re.escape(INTERMEDIATE_LABEL), text, maxsplit=1, flags=re.IGNORECASE)[0].strip()
    if question.lower().startswith(FOLLOW_UP_LABEL.lower()):
        question = question[len(FOLLOW_UP_LABEL):].strip()
    return question


@dataclass(frozen=True)
class WrittenChain:
    """A worked example: a question, its follow-ups with their intermediate answers, and the final answer."""

    question: str
    hops: tuple[tuple[str, str], ...]
    answer: str

    def decisions(self) -> list[dspy.Example]:
        """One follow-up decision per step of the chain: each follow-up in turn, then none."""
        demos = []
        for asked in range(len(self.hops) + 1):
            more = asked < len(self.hops)
            demos.append(dspy.Example(question=self.question, follow_ups=self.entries()[:asked],
                                      needs_follow_up=more, follow_up=self.hops[asked][0] if more else "")
                         .with_inputs("question", "follow_ups"))
        return demos

    def final_answer(self) -> dspy.Example:
        return dspy.Example(question=self.question, follow_ups=self.entries(),
                            answer=self.answer).with_inputs("question", "follow_ups")

    def entries(self) -> list[str]:
        return [chain_entry(follow_up, intermediate) for follow_up, intermediate in self.hops]


WRITTEN_CHAINS = (
    WrittenChain("Which river flows through the city where Wolfgang Amadeus Mozart was born?",
                 (("In which city was Wolfgang Amadeus Mozart born?", "Salzburg"),
                  ("Which river flows through Salzburg?", "The Salzach")),
                 "The Salzach"),
    WrittenChain("Who was born first, Marie Curie or Albert Einstein?",
                 (("When was Marie Curie born?", "7 November 1867"),
                  ("When was Albert Einstein born?", "14 March 1879")),
                 "Marie Curie"),
    WrittenChain("What is the nationality of the director of the film Spirited Away?",
                 (("Who directed the film Spirited Away?", "Hayao Miyazaki"),
                  ("What is the nationality of Hayao Miyazaki?", "Japanese")),
                 "Japanese"),
)


@register
class SelfAsk(RAGProgram):
    """Self-Ask: follow-up sub-questions, each retrieved and answered, then the final answer."""

    name = "self-ask"
    lm_calls_formula = "decisions + intermediate answers + 1"
    follows = ("the paper (Press et al., 2022) with retrieval, as FLARE's baseline; the paper's few-shot prompt as "
               "DSPy signatures shown three written worked examples (demos=false: zero-shot)")
    params = (FLARE_SETTING_K, MAX_FOLLOW_UPS, DEMOS)

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        self.next_follow_up = dspy.Predict(NextFollowUp)
        self.answer_follow_up = dspy.Predict(AnswerFromPassages)
        self.answer_question = dspy.Predict(AnswerFromFollowUps)
        if self.demos:
            self.next_follow_up.demos = [demo for chain in WRITTEN_CHAINS for demo in chain.decisions()]
            self.answer_question.demos = [chain.final_answer() for chain in WRITTEN_CHAINS]

    def required_lm_calls(self, trace: list[dict]) -> int:
        follow_ups = len(steps_of(trace, FollowUp))
        decisions = follow_ups + (stop_reason(trace) != StopReason.FOLLOW_UP_CAP)
        return decisions + follow_ups + 1

    def run(self, question: str) -> dict:
        chain: list[str] = []
        asked: set[str] = set()
        stop = StopReason.FOLLOW_UP_CAP
        for _ in range(self.max_follow_ups):
            decision = self.next_follow_up(question=question, follow_ups=chain)
            follow_up = follow_up_question(decision.follow_up)
            if not decision.needs_follow_up or not follow_up:
                stop = StopReason.NO_FOLLOW_UP
                break
            if follow_up.lower() in asked:
                stop = StopReason.FOLLOW_UP_REPEATED
                break
            asked.add(follow_up.lower())
            passages = self.retrieve(follow_up, why="follow-up question")
            intermediate = self.answer_follow_up(passages=format_passages(passages), question=follow_up).answer
            self.note(FollowUp(question=follow_up, intermediate_answer=intermediate,
                               passage_ids=[p.id for p in passages]))
            chain.append(chain_entry(follow_up, intermediate))
        self.note(Stop(reason=stop, follow_ups=len(chain)))
        return {"answer": self.answered(self.answer_question(question=question, follow_ups=chain))}
