"""Search-o1 (Li et al., arXiv 2501.05366): the model reasons step by step and searches whenever it lacks a fact,
writing the query between markers; each search's documents are condensed (Reason-in-Documents) into the result
inserted back into the reasoning, and the reasoning goes on.

    Input: question q; reasoning R = ""
    for turn = 1 .. max_turns:
        R += LM(q, R), stopped at the end-query marker (kept) or the end of the answer
        the turn does not end with "<|begin_search_query|> s <|end_search_query|>": stop
        searches made < max_searches and s not searched before:
            D = ret(s, k); r = ReasonInDocuments(previous steps of R, s, D)
            R += "<|begin_search_result|> r <|end_search_result|>"
        else: R += a notice between the result markers (the limit is reached, or s was searched already)
    answer = the last \\boxed{...} in R; none: back off to reasoning without retrieval (no-retrieval's answer)

LM calls per question: one per turn, one Reason-in-Documents per search, +1 for the back-off. Retrievals: one per
search.

Follows the official code (sunnynexus/Search-o1@6ced48f, scripts/run_search_o1.py): the markers (40-43); a turn
searches only when it ends with the end-query marker, with its last query (412-417, 529-533), an empty query ending
the reasoning; the limit and repeat notices (596-608); the previous steps Reason-in-Documents reads (565-583,
`markers.previous_reasoning`), which are not given the question (286-299); the result inserted into the
same reasoning (666-671); the defaults max_searches=10 (74-78), max_turns=15 (80-85), k=10 (87-92) and 8,192 tokens
per generation call for a model other than QwQ (388-394); the \\boxed{} answer (evaluate.py:31-42) and the back-off
to direct reasoning (§4.3). The reasoning runs in one of two forms (`prompt_style`): `signature`, a typed
DSPy signature re-sent each turn with the reasoning so far as an input (any chat LM, compilable), or `raw`, one
plain prompt that the reasoning is appended to, as the official code appends it to the chat-templated prompt
(a completions endpoint, or the local model without its chat template). Reason-in-Documents is a typed signature
in both (analysis, then the final information: §3.4, Eq. 4-5); with prompt_style=raw on a completions-only model,
give that predictor a chat LM (`program.reason_in_documents.set_lm(chat_lm)`).
"""

from __future__ import annotations

from typing import Any

import dspy

from arag.lm import complete_raw, raw_prompt_lm, require_lm
from arag.passages import format_passages
from arag.programs.baselines.no_retrieval import NoRetrieval
from arag.programs.frame.active_generation import PROMPT_STYLE
from arag.programs.frame.base import RAGProgram
from arag.programs.frame.params import Param, passages_per_retrieval
from arag.programs.frame.registry import register
from arag.programs.search_o1.markers import (
    LIMIT_NOTICE,
    REPEAT_NOTICE,
    boxed_answer,
    closed_turn,
    notice_block,
    previous_reasoning,
    result_block,
    turn_query,
)
from arag.programs.search_o1.steps import BackOff, Condense, Turn
from arag.signatures.reasoning import END_QUERY, NOTHING_FOUND, ReasonInDocuments, ReasonWithSearch
from arag.trace import Answer, Stop, StopReason, steps_of

MAX_SEARCHES = Param("max_searches", 10, "the search limit: past it a query gets a notice instead of results "
                     "(the official default; its QA runs use 5 on NQ/TriviaQA, 10 on multi-hop sets)",
                     low=0, high=50, searched=True, search_range=(1, 10))
MAX_TURNS = Param("max_turns", 15, "generation turns per question (the official max_turn)", low=1, high=50)
CALL_TOKENS = Param("max_tokens", 8192, "tokens per generation call (the official 8,192 for models other than QwQ)",
                    low=16, high=32768)
BACK_OFF = Param("back_off", True, "no \\boxed{} answer: answer by reasoning without retrieval (the paper's "
                 "back-off); false: the answer stays empty")
K = passages_per_retrieval(10, "the official top_k=10 web pages per search")

SEARCH, LIMIT, REPEAT, FINISHED = "search", "limit_notice", "repeat_notice", "finished"


@register
class SearchO1(RAGProgram):
    """Search-o1: reasoning that searches inline, with Reason-in-Documents condensing what each search found."""

    name = "search-o1"
    lm_calls_formula = "one generation per turn + one Reason-in-Documents per search (+1 back-off)"
    follows = ("the official code (sunnynexus/Search-o1, scripts/run_search_o1.py): markers, last query of a turn "
               "that ends on the end marker, limit and repeat notices, previous steps shown to Reason-in-Documents, "
               "max_searches=10, max_turns=15, top_k=10, 8,192 tokens per call; the paper's back-off (§4.3)")
    departures = (
        "decoding is the LM's own (greedy by default), where the official code samples at temperature 0.7, top_p "
        "0.8, top_k 20 (run_search_o1.py:124-143, 304-312)",
        "documents are the retriever's passages, `[rank] Title | text`, where the official code fetches Bing's "
        "top-10 pages and cuts each to the 3,000 characters around its snippet (bing_search.py:49-92)",
        "\\boxed{} is read to its matching brace; the official regex runs to the last } of the line "
        "(evaluate.py:31-42), so braced text after the answer on that line joined it",
        "the condensed result keeps its line breaks as spaces; the official parser deletes them (evaluate.py:20-29)",
        "the prompts are written anew; with prompt_style=signature the reasoning so far is an input re-sent each "
        "turn rather than the model's own turn continued",
    )
    params = (MAX_SEARCHES, MAX_TURNS, K, CALL_TOKENS, PROMPT_STYLE, BACK_OFF)

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        self.reason = dspy.Predict(ReasonWithSearch)
        self.reason_in_documents = dspy.ChainOfThought(ReasonInDocuments)
        self.direct_reasoning = NoRetrieval(reasoning="cot")

    def required_lm_calls(self, trace: list[dict]) -> int:
        return len(steps_of(trace, Turn)) + len(steps_of(trace, Condense)) + len(steps_of(trace, BackOff))

    def run(self, question: str) -> dict[str, Any]:
        reasoning, searched = "", []
        stop = StopReason.STEP_LIMIT
        for turn in range(1, self.max_turns + 1):
            text = closed_turn(self.generate(question, reasoning))
            reasoning += text
            query = turn_query(text)
            if query is None:
                self.note(Turn(turn=turn, text=text, query=None, action=FINISHED))
                stop = StopReason.FINAL_ANSWER if boxed_answer(reasoning) is not None else StopReason.MODEL_ENDED
                break
            if len(searched) < self.max_searches and query not in searched:
                self.note(Turn(turn=turn, text=text, query=query, action=SEARCH))
                reasoning += result_block(self.search(turn, query, reasoning))
                searched.append(query)
            else:
                at_limit = len(searched) >= self.max_searches
                self.note(Turn(turn=turn, text=text, query=query, action=LIMIT if at_limit else REPEAT))
                reasoning += notice_block(LIMIT_NOTICE if at_limit else REPEAT_NOTICE)
        self.note(Stop(reason=stop, searches=len(searched), iterations=turn))
        return {"answer": self.final_answer(question, reasoning), "reasoning": reasoning}

    def generate(self, question: str, reasoning: str) -> str:
        """The next turn of the reasoning, stopped at the end-query marker (which the endpoint leaves out)."""
        if self.prompt_style == "raw":
            text, _ = complete_raw(raw_prompt_lm(require_lm()), raw_prompt(question, reasoning, self.max_searches),
                                   max_tokens=self.max_tokens, stop=[END_QUERY])
            return text
        prediction = self.reason(question=question, search_limit=self.max_searches, reasoning_so_far=reasoning,
                                 config={"max_tokens": self.max_tokens, "stop": [END_QUERY]})
        return prediction.next_reasoning or ""

    def search(self, turn: int, query: str, reasoning: str) -> str:
        """Retrieve for the query and condense the documents into the result inserted into the reasoning."""
        passages = self.retrieve(query, why="search query")
        steps = previous_reasoning(reasoning)
        prediction = self.reason_in_documents(previous_reasoning=steps, search_query=query,
                                              documents=format_passages(passages))
        result = " ".join((prediction.final_information or "").split()) or NOTHING_FOUND
        self.note(Condense(turn=turn, query=query, passage_ids=[p.id for p in passages], previous_reasoning=steps,
                           analysis=prediction.get("reasoning") or "", result=result,
                           found_nothing=result == NOTHING_FOUND))
        return result

    def final_answer(self, question: str, reasoning: str) -> str:
        """The last \\boxed{} answer; without one, the back-off's answer (or none)."""
        answer = boxed_answer(reasoning)
        if answer is not None:
            self.note(Answer(answer=answer))
            return answer
        if not self.back_off:
            self.note(Answer(answer=""))
            return ""
        self.note(BackOff(reason="the reasoning gave no \\boxed{} answer"))
        return self.direct_reasoning.run(question)["answer"]


def raw_prompt(question: str, reasoning: str, max_searches: int) -> str:
    """The plain prompt of prompt_style=raw: the instructions, the question, and the reasoning so far, which the
    model continues."""
    instructions = " ".join(ReasonWithSearch.instructions.split())
    return (f"{instructions}\nYou may search at most {max_searches} times.\n\n"
            f"Question: {question}\n\nReasoning:\n{reasoning}")
