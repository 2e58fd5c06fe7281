"""Adaptive-Note (Wang et al., 2024): a growing note, the best one kept as memory, adaptive stop rules.

Iterative Information Collector: P_0 = ret(q, k); N_0 = LM(q, P_0); M_opt <- N_0. Each iteration
proposes q_t not in Q_ask from (q, M_opt, Q_ask), retrieves P_t = ret(q_t, k), and writes
N_t = LM(q, P_t, M_opt). Adaptive Memory Reviewer: N_t replaces M_opt when the LM judges it better,
else it counts as an invalid update. Stop when IU >= T_IU, CI >= T_CI or RP >= T_RP (checked before
each iteration). The task-oriented generator answers from M_opt.

LM calls per question: 1 (first note) + 3 per iteration (query, update, compare) + 1 (answer).
The one retry: a proposed query that repeats an asked one (compared case-, punctuation- and
space-insensitively) is refused and asked for once more, telling the LM which query was refused
(one more call); a second repeat stops the loop with reason `repeated_query` (that iteration
made its two query calls and nothing else).

Passages are deduplicated by id across steps: each update sees only the passages not retrieved
before, and RP counts distinct passages.

`query_style=paper` (default) follows the paper: one query per iteration, P_t = ret(q_t, k), and RP may
end above T_RP by up to k-1 (the rule is checked before each iteration). `query_style=official` follows
the official code (thunlp/Adaptive-Note, src/main.py): two queries per iteration, each retrieved with
"query\nquestion", and the last retrieval trimmed so that RP never exceeds T_RP. When the LM returns
log-probabilities (an LM built with `logprobs=True, top_logprobs=k`), the trace records the reviewer's
probability that the new note is better (`p_better`, normalised over True/False); without them the verdict
is recorded alone.
"""

from __future__ import annotations

import re

import dspy

from arag.lm import has_top_logprobs, label_probabilities
from arag.passages import dedup, format_passages
from arag.programs.frame.base import RAGProgram
from arag.programs.frame.params import Param, passages_per_retrieval
from arag.programs.frame.predictors import judged
from arag.programs.frame.registry import register
from arag.signatures.notes import (
    AnswerFromNote,
    CompareNotes,
    ProposeNextQueries,
    ProposeNextQuery,
    UpdateNote,
    WriteLongAnswerFromNote,
    WriteNote,
)
from arag.trace import shown_probability

T_IU = Param("t_iu", 1, "stop after this many updates that did not beat the best note", low=1, high=10,
             searched=True, search_range=(1, 3))
T_CI = Param("t_ci", 3, "stop after this many collection iterations", low=1, high=10, searched=True,
             search_range=(1, 5))
T_RP = Param("t_rp", 15, "stop once this many distinct passages were retrieved", low=1, high=100,
             searched=True, search_range=(5, 30))
QUERY_WITH_QUESTION = Param("query_with_question", False,
                            "retrieve with the new query followed by the question instead of the query alone "
                            "(query_style=official always does)")
QUERY_STYLE = Param("query_style", "paper", "paper: one query per iteration, retrieved alone; official: two, "
                    "each retrieved with the question, the last retrieval trimmed to T_RP",
                    choices=("paper", "official"), tunable=False)
ANSWER_STYLE = Param("answer_style", "short", "a few words (multi-hop QA) or a guided long form (long-form QA)",
                     choices=("short", "long"), tunable=False)

REPEATED_QUERY = "repeated_query"


@register
class AdaptiveNote(RAGProgram):
    name = "adaptive-note"
    follows = ("the paper (Wang et al., 2024) by default; query_style=official: the official code "
               "(thunlp/Adaptive-Note, src/main.py)")
    params = (T_IU, T_CI, T_RP, passages_per_retrieval(5), QUERY_WITH_QUESTION, QUERY_STYLE, ANSWER_STYLE)

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        self.write_note = dspy.Predict(WriteNote)
        self.propose_query = dspy.Predict(ProposeNextQuery if self.query_style == "paper" else ProposeNextQueries)
        self.update_note = dspy.Predict(UpdateNote)
        self.compare_notes = dspy.Predict(CompareNotes)
        self.generate_answer = dspy.Predict(AnswerFromNote if self.answer_style == "short" else WriteLongAnswerFromNote)

    def run(self, question: str) -> dict:
        # Note initialisation: P_0 = ret(q, k); N_0 -> M_opt.
        passages = self.retrieve(question, why="question")
        seen = {p.id for p in passages}
        best_note = self.write_note(question=question, passages=format_passages(passages)).note
        self.note("note", iteration=0, new_ids=[p.id for p in passages], seen_ids=[], note=best_note)

        asked: list[str] = []
        invalid_updates = iterations = 0
        while not (stop := self.stop_reason(invalid_updates, iterations, len(seen))):
            # Iterative information collection: q_t not in Q_ask, P_t = ret(q_t, k), N_t.
            queries = self.next_queries(question, best_note, asked, iterations + 1)
            if not queries:
                stop = REPEATED_QUERY
                break
            asked.extend(queries)
            iterations += 1
            retrieved = [p for q in queries for p in self.retrieve(self.search_text(q, question), why="next query")]
            new = dedup(retrieved, set(seen))
            if self.query_style == "official":
                new = new[: max(self.t_rp - len(seen), 0)]
            seen.update(p.id for p in new)
            note = self.update_note(question=question, note=best_note, passages=format_passages(new)).updated_note
            new_ids = [p.id for p in new]
            self.note("note", iteration=iterations, query=" | ".join(queries), new_ids=new_ids,
                      seen_ids=list(dict.fromkeys(p.id for p in retrieved if p.id not in new_ids)), note=note)

            # Adaptive memory review: N_t -> M_opt when better, else an invalid update.
            if self.review(question, best_note, note, iterations):
                best_note = note
            else:
                invalid_updates += 1

        self.note("stop", reason=stop, invalid_updates=invalid_updates, iterations=iterations,
                  distinct_passages=len(seen))
        # Task-oriented generator: a = LM(q, M_opt).
        answer = self.answered(self.generate_answer(question=question, note=best_note))
        return {"answer": answer, "note": best_note, "stop_reason": stop}

    def stop_reason(self, invalid_updates: int, iterations: int, distinct_passages: int) -> str | None:
        """The first stop rule met (`t_iu`, `t_ci`, `t_rp`), or None to go on collecting."""
        if invalid_updates >= self.t_iu:
            return "t_iu"
        if iterations >= self.t_ci:
            return "t_ci"
        if distinct_passages >= self.t_rp:
            return "t_rp"
        return None

    def next_queries(self, question: str, best_note: str, asked: list[str], iteration: int) -> list[str]:
        """New queries (one, or two in the official style); one retry when every proposal repeats an asked
        query, then none."""
        asked_keys = {query_key(q) for q in asked}
        rejected: list[str] = []
        for _ in range(2):
            if self.query_style == "paper":
                proposed = [self.propose_query(question=question, note=best_note, asked_queries=asked,
                                               rejected_query=rejected[0] if rejected else "").query]
            else:
                proposed = self.propose_query(question=question, note=best_note, asked_queries=asked,
                                              rejected_queries=rejected).queries
            fresh = []
            for query in (q.strip() for q in proposed):
                repeated = query_key(query) in asked_keys or query_key(query) in {query_key(f) for f in fresh}
                self.note("query", iteration=iteration, query=query, repeated=repeated)
                if not repeated:
                    fresh.append(query)
            if fresh:
                return fresh
            rejected = [q.strip() for q in proposed]
        return []

    def search_text(self, query: str, question: str) -> str:
        with_question = self.query_with_question or self.query_style == "official"
        return f"{query}\n{question}" if with_question else query

    def review(self, question: str, best_note: str, new_note: str, iteration: int) -> bool:
        """f_c(N_t, M_opt): is the new note better? Recorded with its probability when log-probabilities exist;
        an unreadable judgement keeps the best note."""
        prediction = judged(self.compare_notes, "not better: the best note is kept", question=question,
                            best_note=best_note, new_note=new_note)
        if prediction is None:
            self.note("review", iteration=iteration, better=False)
            return False
        better = bool(prediction.better)
        step = self.note("review", iteration=iteration, better=better)
        if has_top_logprobs(prediction, "better"):
            step["p_better"] = shown_probability(label_probabilities(prediction, "better", ["True", "False"])["True"])
        return better


def query_key(query: str) -> str:
    """A query reduced to its lower-cased words, for spotting repeats."""
    return " ".join(re.findall(r"\w+", query.lower()))
