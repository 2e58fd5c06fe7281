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

Collection never passes T_RP: the new passages the last update reads are cut to the T_RP - RP still
allowed, and those cut are dropped, as if never retrieved (its retrieval step lists them as `cut_ids`; the
run's distinct passages leave them out). This is the official code's trim; the paper checks the rule before
each iteration only, so RP could end up to k-1 above T_RP.

`query_style=paper` (default) follows the paper: one query q_t per iteration, P_t = ret(q_t, k), and the
update reads only the passages not retrieved before (passages are told apart by id). `query_style=official`
follows the official code (thunlp/Adaptive-Note, src/main.py, `retrieve_note`): the LM proposes at most two
new questions at once, and one retrieval per iteration searches them and the question, joined by newlines
and cut to their first 500 characters; the update reads all k passages retrieved, those seen before too,
unless that could pass T_RP, when it reads only the unseen ones, cut to the T_RP - RP still allowed. In both
styles RP counts distinct passages, and a proposal that repeats an asked query is refused (the paper's
q_t not in Q_ask; the official code does not check). When the LM returns log-probabilities (an LM built
with `logprobs=True, top_logprobs=k`), the trace records the reviewer's probability that the new note is
better (`p_better`, normalised over True/False); without them the verdict is recorded alone.
"""

from __future__ import annotations

import re

import dspy

from arag.lm import has_top_logprobs, label_probabilities
from arag.passages import Passage, dedup, format_passages
from arag.programs.adaptive_note.steps import Note, Query, Review
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
from arag.trace import ABSENT, Stop, StopReason, current_trace, shown_probability, steps_of

T_IU = Param("t_iu", 1, "stop after this many updates that did not beat the best note", low=1, high=10,
             searched=True, search_range=(1, 3))
T_CI = Param("t_ci", 3, "stop after this many collection iterations", low=1, high=10, searched=True,
             search_range=(1, 5))
T_RP = Param("t_rp", 15, "stop once this many distinct passages were retrieved", low=1, high=100,
             searched=True, search_range=(5, 30))
QUERY_WITH_QUESTION = Param("query_with_question", False,
                            "retrieve with the new query followed by the question instead of the query alone "
                            "(query_style=official always does)")
QUERY_STYLE = Param("query_style", "paper", "paper: one query per iteration, retrieved alone, the update reading "
                    "only unseen passages; official: at most two queries, retrieved once together with the "
                    "question, the update reading all k passages", choices=("paper", "official"), tunable=False)
ANSWER_STYLE = Param("answer_style", "short", "a few words (multi-hop QA) or a guided long form (long-form QA)",
                     choices=("short", "long"), tunable=False)

OFFICIAL_QUERIES = 2  # new questions per iteration in the official code
OFFICIAL_QUERY_CHARS = 500  # the official search text is cut to this many characters


@register
class AdaptiveNote(RAGProgram):
    name = "adaptive-note"
    lm_calls_formula = "1 + 3 x iterations + retries + 1"
    follows = ("the paper (Wang et al., 2024) by default, collection cut at T_RP as the official code does; "
               "query_style=official: the official code's iteration (thunlp/Adaptive-Note, src/main.py)")
    params = (T_IU, T_CI, T_RP, passages_per_retrieval(5), QUERY_WITH_QUESTION, QUERY_STYLE, ANSWER_STYLE)

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        self.write_note = dspy.Predict(WriteNote)
        self.propose_query = dspy.Predict(ProposeNextQuery if self.query_style == "paper" else ProposeNextQueries)
        self.update_note = dspy.Predict(UpdateNote)
        self.compare_notes = dspy.Predict(CompareNotes)
        self.generate_answer = dspy.Predict(AnswerFromNote if self.answer_style == "short" else WriteLongAnswerFromNote)

    def required_lm_calls(self, trace: list[dict]) -> int:
        """The first note, every query proposal (retries included), the updates and their reviews, the answer."""
        updates = sum(step["iteration"] > 0 for step in steps_of(trace, Note))
        return 1 + len(steps_of(trace, Query)) + updates + len(steps_of(trace, Review)) + 1

    def run(self, question: str) -> dict:
        # Note initialisation: P_0 = ret(q, k); N_0 -> M_opt.
        passages = self.retrieve(question, why="question")
        seen = {p.id for p in passages}
        best_note = self.write_note(question=question, passages=format_passages(passages)).note
        self.note(Note(iteration=0, new_ids=[p.id for p in passages], seen_ids=[], note=best_note))

        asked: list[str] = []
        invalid_updates = iterations = 0
        while not (stop := self.stop_reason(invalid_updates, iterations, len(seen))):
            # Iterative information collection: q_t not in Q_ask, P_t = ret(q_t, k), N_t.
            queries = self.next_queries(question, best_note, asked, iterations + 1)
            if not queries:
                stop = StopReason.REPEATED_QUERY
                break
            asked.extend(queries)
            iterations += 1
            retrieved, read = self.collect(question, queries, seen)
            new_ids = [p.id for p in read if p.id not in seen]
            seen_ids = list(dict.fromkeys(p.id for p in retrieved if p.id in seen))
            seen.update(new_ids)
            note = self.update_note(question=question, note=best_note, passages=format_passages(read)).updated_note
            self.note(Note(iteration=iterations, query=" | ".join(queries), new_ids=new_ids, seen_ids=seen_ids,
                           note=note))

            # Adaptive memory review: N_t -> M_opt when better, else an invalid update.
            if self.review(question, best_note, note, iterations):
                best_note = note
            else:
                invalid_updates += 1

        self.note(Stop(reason=stop, invalid_updates=invalid_updates, iterations=iterations,
                       distinct_passages=len(seen)))
        # Task-oriented generator: a = LM(q, M_opt).
        answer = self.answered(self.generate_answer(question=question, note=best_note))
        return {"answer": answer, "note": best_note, "stop_reason": stop.value}

    def stop_reason(self, invalid_updates: int, iterations: int, distinct_passages: int) -> StopReason | None:
        """The first stop rule met (`t_iu`, `t_ci`, `t_rp`), or None to go on collecting."""
        if invalid_updates >= self.t_iu:
            return StopReason.T_IU
        if iterations >= self.t_ci:
            return StopReason.T_CI
        if distinct_passages >= self.t_rp:
            return StopReason.T_RP
        return None

    def collect(self, question: str, queries: list[str], seen: set[str]) -> tuple[list[Passage], list[Passage]]:
        """P_t: the passages taken from the retrieval for the new queries, and those the update reads, never more
        new ones than the T_RP - RP still allowed (the retrieval step lists the ones cut as `cut_ids`).
        paper: ret(q_t, k), the unseen passages read; official: one retrieval for the queries and the question,
        all k read unless that could pass T_RP, then the unseen ones."""
        if self.query_style == "paper":
            query, why = self.search_text(queries[0], question), "next query"
        else:
            query, why = "\n".join([*queries, question])[:OFFICIAL_QUERY_CHARS], "next queries"
        found = self.retriever.retrieve(query, self.k)
        unseen = dedup(found, set(seen))
        reads_all = self.query_style == "official" and len(seen) + self.k <= self.t_rp
        read = found if reads_all else unseen[: self.t_rp - len(seen)]
        cut = {p.id for p in unseen} - {p.id for p in read}
        taken = [p for p in found if p.id not in cut]
        trace = current_trace()
        if trace is not None:
            trace.retrieval(query, taken, why=why, k=self.k, cut_ids=[p.id for p in unseen if p.id in cut] or ABSENT)
        return taken, read

    def next_queries(self, question: str, best_note: str, asked: list[str], iteration: int) -> list[str]:
        """New queries (one, or at most two in the official style); one retry when every proposal repeats an
        asked query, then none."""
        asked_keys = {query_key(q) for q in asked}
        rejected: list[str] = []
        for _ in range(2):
            if self.query_style == "paper":
                proposed = [self.propose_query(question=question, note=best_note, asked_queries=asked,
                                               rejected_query=rejected[0] if rejected else "").query]
            else:
                proposed = self.propose_query(question=question, note=best_note, asked_queries=asked,
                                              rejected_queries=rejected).queries[:OFFICIAL_QUERIES]
            fresh = []
            for query in (q.strip() for q in proposed):
                repeated = query_key(query) in asked_keys or query_key(query) in {query_key(f) for f in fresh}
                self.note(Query(iteration=iteration, query=query, repeated=repeated))
                if not repeated:
                    fresh.append(query)
            if fresh:
                return fresh
            rejected = [q.strip() for q in proposed]
        return []

    def search_text(self, query: str, question: str) -> str:
        return f"{query}\n{question}" if self.query_with_question else query

    def review(self, question: str, best_note: str, new_note: str, iteration: int) -> bool:
        """f_c(N_t, M_opt): is the new note better? Recorded with its probability when log-probabilities exist;
        an unreadable judgement keeps the best note."""
        prediction = judged(self.compare_notes, "not better: the best note is kept", question=question,
                            best_note=best_note, new_note=new_note)
        if prediction is None:
            self.note(Review(iteration=iteration, better=False))
            return False
        better = bool(prediction.better)
        p_better = shown_probability(label_probabilities(prediction, "better", ["True", "False"])["True"]) \
            if has_top_logprobs(prediction, "better") else ABSENT
        self.note(Review(iteration=iteration, better=better, p_better=p_better))
        return better


def query_key(query: str) -> str:
    """A query reduced to its lower-cased words, for spotting repeats."""
    return " ".join(re.findall(r"\w+", query.lower()))
