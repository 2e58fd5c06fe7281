"""Self-RAG (Asai et al., 2023): retrieve on demand, write a candidate segment per passage, critique each
candidate, and keep the best ones in a segment-level beam search.

For each segment t and each path y<t in the beam:
1. Decide retrieval. `adaptive`: retrieve when p(Retrieve=yes), normalised over {yes, no}, exceeds
   `delta`; otherwise, when the last segment was written from a passage and "continue" outweighs "no",
   keep using that passage (`retrieve_rule=long-form` decides as the official long-form code does, below).
   `always` and `never` skip the decision.
2. Retrieving: the top k passages for (x, y_{t-1}); for each passage d write a candidate y_t and critique
   it: IsREL(x, d), IsSUP(x, d, y_t), IsUSE(x, y<=t). Not retrieving: one candidate, IsUSE only.
3. Score each candidate f = S + w_rel * rel + w_sup * sup + w_use * use, with the official definitions:
   rel = p(relevant); sup = p(fully) + 0.5 * p(partially); use = sum_i w_i * p(utility i) with
   w = (-1, -0.5, 0, 0.5, 1); each group's probabilities normalised over the group's labels, and a group
   that was not judged counts 0. S is the candidate's probability p(y_t | x, d, y<t) as the paper writes
   it, length-normalised as the official code computes it (run_short_form.py: exp of the mean token
   log-probability, a geometric mean in (0, 1]); the trace keeps the mean log-probability beside it.
   With `hard_constraints`, candidates judged irrelevant or unsupported are dropped; when none is left
   the path continues without evidence.
4. Keep the best `beam_width` unfinished paths, ranked by the mean f of their segments; stop after
   `max_depth` segments or when every path has finished. Return the best finished path; with
   `closed_set`, the answer whose finished paths have the highest total.
`max_depth=1` is the paper's short-form inference (the best of the k candidates).

Candidates and critiques come from one of two back-ends with the same interface (`Critics`, in `critics.py`):
- `prompted`: typed signatures on any chat LM; a label's probability is read from the log-probabilities
  of the label's first token and normalised over the label set (`arag.lm.label_probabilities`).
  `assume_chosen_label` serves LMs without log-probabilities: they are not requested, the chosen label
  gets probability 1 and every generated token probability 1 (S = 1).
- `reflection-tokens`: a Self-RAG-trained model (e.g. selfrag/selfrag_llama2_7b served by vLLM) prompted
  in its own `### Instruction: ... ### Response:` format through /v1/completions; the probability of each
  reflection token is read from the top log-probabilities at the position where the model wrote its group.

Every probability here is exp(log-probability) normalised over its group. The retrieval decision compares
delta with p(yes) / (p(yes) + p(no)) by default; the official short-form code (run_short_form.py) divides
the raw log-probabilities instead, where probabilities are meant, which is not reproduced.
`retrieve_rule=long-form` decides as the official long-form code (run_long_form_static.py) does: before the
first segment, retrieve when p(yes) / (p(yes) + p(no)) exceeds delta; after a segment, by the retrieval token
the model writes next (its group's most probable): [Retrieval] retrieves, [Continue to Use Evidence] keeps
the passage, and [No Retrieval] is overruled to retrieve when (p(yes) + p(continue)) / (p(yes) + p(no))
exceeds delta (it retrieves more often: the continue mass counts for retrieval).

The utility weight w_use is the paper's 0.5; the official run_short_form.py defaults --w_use to 1.0 and its
README's commands keep that default (`w_use=1.0` reproduces it).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Mapping

import dspy

from arag.concurrency import fan_out
from arag.data.metrics import normalize_answer
from arag.errors import ConfigError
from arag.passages import Passage
from arag.programs.frame.base import RAGProgram
from arag.programs.frame.params import Param, passages_per_retrieval
from arag.programs.frame.registry import register
from arag.programs.self_rag.critics import (
    UTILITY_GRADES,
    Critics,
    PromptedCritics,
    ReflectionTokenCritics,
    Segment,
    join_texts,
)
from arag.programs.self_rag.steps import Beam, Chosen, ClosedSet, Dropped, NoEvidence, RetrievalDecision
from arag.programs.self_rag.steps import Candidate as CandidateStep
from arag.trace import steps_of

MODE = Param("mode", "adaptive", "when to retrieve: adaptive (p(retrieve) > delta), always, never",
             choices=("adaptive", "always", "never"), tunable=False)
DELTA = Param("delta", 0.2, "retrieve when p(yes) normalised over {yes, no} exceeds this; larger, fewer retrievals",
              low=0.0, high=1.0, searched=True)
RETRIEVE_RULE = Param("retrieve_rule", "normalised",
                      "normalised: retrieve when p(yes)/(p(yes)+p(no)) > delta, every segment; long-form, the "
                      "official long-form code: that ratio before the first segment, then the model's next "
                      "retrieval token, a [No Retrieval] overruled when (p(yes)+p(continue))/(p(yes)+p(no)) > delta",
                      choices=("normalised", "long-form"), tunable=False)
W_REL = Param("w_rel", 1.0, "weight of the relevance critique (IsREL) in a candidate's score", low=0.0, high=5.0,
              searched=True, search_range=(0.0, 2.0))
W_SUP = Param("w_sup", 1.0, "weight of the support critique (IsSUP) in a candidate's score", low=0.0, high=5.0,
              searched=True, search_range=(0.0, 2.0))
W_USE = Param("w_use", 0.5, "weight of the utility critique (IsUSE) in a candidate's score (the paper's 0.5; the "
              "official short-form code's default is 1.0)", low=0.0, high=5.0, searched=True, search_range=(0.0, 2.0))
BEAM_WIDTH = Param("beam_width", 2, "paths kept after each segment (B)", low=1, high=16, tunable=False)
MAX_DEPTH = Param("max_depth", 1, "most segments per answer (T): 1 is short-form; the official long-form setting is 6",
                  low=1, high=20, tunable=False)
CRITICS = Param("critics", "prompted", "where critiques come from: typed signatures on any chat LM (prompted) or "
                "a Self-RAG-trained model's reflection tokens over /v1/completions",
                choices=("prompted", "reflection-tokens"), tunable=False)
HARD_CONSTRAINTS = Param("hard_constraints", False, "drop candidates judged irrelevant or unsupported")
ASSUME_CHOSEN_LABEL = Param("assume_chosen_label", False, "prompted critics on an LM without log-probabilities: "
                            "the chosen label gets probability 1 (logprobs are not requested)", tunable=False)
CLOSED_SET = Param("closed_set", False, "closed-set tasks (choices, true/false): return the answer whose finished "
                   "paths score highest in total", tunable=False)

SELF_RAG_PARAMS = (MODE, DELTA, RETRIEVE_RULE, W_REL, W_SUP, W_USE, passages_per_retrieval(5), BEAM_WIDTH, MAX_DEPTH,
                   CRITICS, HARD_CONSTRAINTS, ASSUME_CHOSEN_LABEL, CLOSED_SET)

UTILITY_WEIGHTS = dict(zip(UTILITY_GRADES, (-1.0, -0.5, 0.0, 0.5, 1.0)))  # utility 1 to 5


@register
class SelfRAG(RAGProgram):
    """Self-RAG: on-demand retrieval, critiqued candidates per passage, segment-level beam search."""

    name = "self-rag"
    lm_calls_formula = "decisions + candidates x (1 + critiques)"
    follows = ("the paper (Asai et al., 2023), the segment score as the official run_short_form.py computes it; "
               "retrieve_rule=long-form: the official run_long_form_static.py")
    departures = ("w_use=0.5, the paper's; the official run_short_form.py defaults --w_use to 1.0",
                  "retrieval is decided with probabilities; the official run_short_form.py divides the raw "
                  "log-probabilities of [Retrieval] and [No Retrieval], which inverts the comparison with delta")
    params = SELF_RAG_PARAMS

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        self.backend: Critics = (PromptedCritics(self.assume_chosen_label) if self.critics == "prompted"
                                 else ReflectionTokenCritics())

    def check_params(self, config: dict) -> None:
        if config["assume_chosen_label"] and config["critics"] == "reflection-tokens":
            raise ConfigError(f"{self.name}: parameter 'assume_chosen_label' applies to critics=prompted; "
                              "reflection-token critics always read the model's log-probabilities")

    def required_lm_calls(self, trace: list[dict]) -> int:
        """A retrieval decision where one was asked, and per candidate one write and one call per critique."""
        decisions = sum("p_retrieve" in step for step in steps_of(trace, RetrievalDecision))
        return decisions + sum(1 + len(step["critiques"]) for step in steps_of(trace, CandidateStep))

    def run(self, question: str) -> dict:
        beam: list[Path] = [()]
        finished: list[Path] = []
        for depth in range(1, self.max_depth + 1):
            children = [child for path in beam for child in self.expand(question, path, depth)]
            finished += [path for path in children if path[-1].done]
            open_paths = sorted((path for path in children if not path[-1].done), key=path_score, reverse=True)
            beam = open_paths[: self.beam_width]
            self.note(Beam(depth=depth, kept=[path[-1].id for path in beam],
                           finished=[path[-1].id for path in children if path[-1].done]))
            if not beam:
                break
        best = self.choose(finished)
        self.note(Chosen(path=[c.id for c in best], score=round(path_score(best), 6),
                         passages=[c.segment.passage and c.segment.passage.id for c in best]))
        return {"answer": self.answered(dspy.Prediction(answer=answer_text(best)))}

    def expand(self, question: str, path: Path, depth: int) -> list[Path]:
        """The candidate children of one path: one per passage when retrieving, else a single one."""
        last = depth == self.max_depth
        action = self.decide(question, path, depth)
        children: list[Path] = []
        if action == "retrieve":
            passages = self.evidence(question, retrieval_query(question, path), depth)
            # One candidate per passage, written and critiqued at once (they are independent).
            children = fan_out(lambda numbered: self.candidate(question, path, numbered[1], depth, numbered[0], last),
                               list(enumerate(passages, 1)))
            kept = self.admissible(children)
            if kept:
                return kept
            self.note(NoEvidence(depth=depth, parent=parent_id(path),
                                 reason="every candidate was dropped" if children else "no passage was found"))
        elif action == "continue":
            children = [self.candidate(question, path, path[-1].segment.passage, depth, 1, last, continued=True)]
            if self.admissible(children):
                return children
        return [self.candidate(question, path, None, depth, len(children) + 1, last)]

    def decide(self, question: str, path: Path, depth: int) -> str:
        """What precedes the next segment: retrieve, continue (with the last segment's passage) or no.
        normalised: retrieve when p(yes) / (p(yes) + p(no)) > delta, else continue when continue outweighs no.
        long-form, after a segment: the retrieval token the model writes next, [No Retrieval] overruled to
        retrieve when (p(yes) + p(continue)) / (p(yes) + p(no)) > delta."""
        if self.mode != "adaptive":
            action = "retrieve" if self.mode == "always" else "no"
            self.note(RetrievalDecision(depth=depth, parent=parent_id(path), mode=self.mode, decision=action))
            return action
        probabilities = self.backend.retrieval(question, segments_of(path))
        rule = self.retrieve_rule if path else "normalised"  # before the first segment the two rules agree
        p_retrieve = retrieve_probability(probabilities, rule)
        if rule == "long-form":
            written = max(probabilities, key=probabilities.get)
            retrieve = written == "yes" or written == "no" and p_retrieve > self.delta
            keep_passage = written == "continue"
        else:
            retrieve = p_retrieve > self.delta
            keep_passage = probabilities["continue"] > probabilities["no"]
        if retrieve:
            action = "retrieve"
        elif keep_passage and path and path[-1].segment.passage is not None:
            action = "continue"
        else:
            action = "no"
        self.note(RetrievalDecision(depth=depth, parent=parent_id(path), mode=self.mode, rule=rule,
                                    p_retrieve=round(p_retrieve, 6), delta=self.delta,
                                    probabilities=rounded(probabilities), decision=action))
        return action

    def evidence(self, question: str, query: str, depth: int) -> list[Passage]:
        """The passages the candidates of a retrieving step are written from: the top k for the query."""
        return self.retrieve(query, why=f"segment {depth}")

    def candidate(self, question: str, path: Path, passage: Passage | None, depth: int, number: int,
                  last: bool, continued: bool = False) -> Path:
        """Write and critique one candidate segment; the path extended by it."""
        segment = self.backend.write(question, segments_of(path), passage, continued=continued, last=last)
        if continued and "relevance" in path[-1].segment.critiques:
            segment = replace(segment, critiques={**segment.critiques,
                                                  "relevance": path[-1].segment.critiques["relevance"]})
        parts = critique_scores(segment.critiques)
        score = (math.exp(segment.sequence_score) + self.w_rel * parts["relevance"] + self.w_sup * parts["support"]
                 + self.w_use * parts["utility"])
        child = Candidate(f"{path[-1].id}.{number}" if path else str(number), segment, score,
                          done=segment.finished or last)
        extended = (*path, child)
        self.note(CandidateStep(
            id=child.id, depth=depth, passage=passage and passage.id, continued=continued, text=segment.text,
            sequence_score=round(segment.sequence_score, 6), sequence_prob=round(math.exp(segment.sequence_score), 6),
            critiques={group: rounded(probs) for group, probs in segment.critiques.items()},
            **{name: round(value, 6) for name, value in parts.items()},
            score=round(score, 6), path_score=round(path_score(extended), 6), done=child.done))
        return extended

    def admissible(self, children: list[Path]) -> list[Path]:
        """With hard constraints, the children whose candidate is neither irrelevant nor unsupported."""
        if not self.hard_constraints:
            return children
        kept = [path for path in children if not undesirable(path[-1].segment)]
        dropped = [path[-1].id for path in children if undesirable(path[-1].segment)]
        if dropped:
            self.note(Dropped(ids=dropped, reason="judged irrelevant or unsupported (hard constraints)"))
        return kept

    def choose(self, finished: list[Path]) -> Path:
        """The best finished path; for closed-set tasks, the best path of the answer with the highest total."""
        if not self.closed_set:
            return max(finished, key=path_score)
        totals: dict[str, float] = defaultdict(float)
        best_of: dict[str, Path] = {}
        for path in finished:
            key = normalize_answer(answer_text(path))
            totals[key] += path_score(path)
            if key not in best_of or path_score(path) > path_score(best_of[key]):
                best_of[key] = path
        self.note(ClosedSet(totals={key: round(total, 6) for key, total in totals.items()}))
        return best_of[max(totals, key=totals.get)]


# --- candidates, paths and scores --------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """A scored segment in the search tree; `id` spells its place ("2.1": first child of candidate 2)."""

    id: str
    segment: Segment
    score: float
    done: bool


Path = tuple[Candidate, ...]


def relevance_score(probabilities: Mapping[str, float]) -> float:
    """IsREL: p(relevant)."""
    return probabilities["relevant"]


def support_score(probabilities: Mapping[str, float]) -> float:
    """IsSUP: p(fully supported) + 0.5 * p(partially supported)."""
    return probabilities["fully"] + 0.5 * probabilities["partially"]


def utility_score(probabilities: Mapping[str, float]) -> float:
    """IsUSE: the expected utility weight, with weights -1, -0.5, 0, 0.5, 1 for utility 1 to 5."""
    return sum(weight * probabilities[grade] for grade, weight in UTILITY_WEIGHTS.items())


SCORES = {"relevance": relevance_score, "support": support_score, "utility": utility_score}


def critique_scores(critiques: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """rel, sup and use of a candidate; 0 for a group that was not judged."""
    return {group: score(critiques[group]) if group in critiques else 0.0 for group, score in SCORES.items()}


def retrieve_probability(probabilities: Mapping[str, float], rule: str = "normalised") -> float:
    """What is compared with delta. `normalised`: p(yes) / (p(yes) + p(no)), in [0, 1]. `long-form`: the official
    long-form code's (p(yes) + p(continue)) / (p(yes) + p(no)) after a segment, which can exceed 1. 0 when the
    denominator is 0."""
    # Probabilities, not log-probabilities: the official short-form code divides the raw log-probabilities
    # of [Retrieval] and [No Retrieval] here, which inverts the comparison with delta.
    total = probabilities["yes"] + probabilities["no"]
    mass = probabilities["yes"] + (probabilities.get("continue", 0.0) if rule == "long-form" else 0.0)
    return mass / total if total else 0.0


def undesirable(segment: Segment) -> bool:
    """A candidate whose most probable relevance is irrelevant or whose most probable support is none."""
    relevance, support = segment.critiques.get("relevance"), segment.critiques.get("support")
    return bool(relevance and max(relevance, key=relevance.get) == "irrelevant"
                or support and max(support, key=support.get) == "no")


def path_score(path: Path) -> float:
    """The mean score of a path's segments: equal-length paths rank as by the sum, finished paths of
    different lengths compare fairly. (The official long-form code multiplies node scores.)"""
    return sum(candidate.score for candidate in path) / len(path)


def segments_of(path: Path) -> list[Segment]:
    return [candidate.segment for candidate in path]


def answer_text(path: Path) -> str:
    return join_texts([candidate.segment.text for candidate in path])


def parent_id(path: Path) -> str | None:
    return path[-1].id if path else None


def retrieval_query(question: str, path: Path) -> str:
    """Retrieve with the question and, after the first segment, the last segment written (x, y_{t-1})."""
    return join_texts([question, path[-1].segment.text]) if path else question


def rounded(probabilities: Mapping[str, float]) -> dict[str, float]:
    return {label: round(p, 6) for label, p in probabilities.items()}


