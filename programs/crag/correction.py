"""CRAG's corrective step, shared by `crag` and `self-crag`: grade the retrieved documents with the
retrieval evaluator, take the action the grades trigger, and refine the retrieved documents (Correct),
search for knowledge (Incorrect), or both (Ambiguous). Its parameters are declared here, once for both."""

from __future__ import annotations

import math

import dspy

from arag.errors import ConfigError
from arag.passages import Passage
from arag.programs.crag.evaluator import (
    AMBIGUOUS,
    CORRECT,
    INCORRECT,
    open_scorer,
    trigger,
)
from arag.programs.crag.refinement import STRIP_MODES, refine
from arag.programs.crag.steps import Action, Evaluate, Refine, Rewrite, Search
from arag.programs.frame.params import Param, passages_per_retrieval
from arag.retrievers.web import Document, open_knowledge_search
from arag.signatures.queries import RewriteAsKeywords
from arag.trace import current_trace, note, steps_of

SCORER = Param("scorer", "lm", "retrieval evaluator: lm, embedding, or t5:PATH", tunable=False)
UPPER = Param("upper", 0.5, "Correct when some passage scores at or above this", low=-1.0, high=1.0,
              searched=True)
LOWER = Param("lower", -0.9, "Incorrect when every passage scores below this (lower <= upper)", low=-1.0,
              high=1.0, searched=True, at_most="upper")
CRAG_K = passages_per_retrieval(10, "the paper's k")
STRIP_MODE = Param("strip_mode", "sentences",
                   "knowledge strips: groups of 3 sentences, 50-word windows, or whole passages", choices=STRIP_MODES)
STRIPS_TOP_K = Param("strips_top_k", 5, "knowledge strips kept per source", low=1, high=50)
STRIP_THRESHOLD = Param("strip_threshold", -0.5, "strips must score above this to be kept", low=-1.0, high=1.0)
WEB = Param("web", "none", "knowledge search: serper, tavily, brave, searxng[:URL], local:DIR, or none",
            tunable=False)
WEB_K = Param("web_k", 5, "documents taken from each knowledge search", low=1, high=20)
REFINEMENT = Param("refinement", "paper", "paper: strips, the top strips_top_k above strip_threshold, in reading "
                   "order; official: retrieved documents whole, the top 3 by score, and the top 5 web strips, no "
                   "threshold, in score order", choices=("paper", "official"), tunable=False)
THRESHOLD_PRESETS = {
    "paper-popqa": {"upper": 0.5, "lower": -0.9},
    "official-popqa": {"upper": 0.592, "lower": -0.995},
    "official-pubhealth": {"upper": 0.5, "lower": -0.915},
}
OFFICIAL_TOP_K = 3  # retrieved documents kept whole (internal_knowledge_preparation.py, top_n)
OFFICIAL_WEB_TOP_K = 5  # web strips kept (external_knowledge_preparation.py, top_n)
OFFICIAL_MIN_WORDS = 4
LABEL_FALLBACK = Param("label_fallback", False,
                       "scorer=lm on an LM without log-probabilities: score yes as +1 and no as -1 instead of failing",
                       tunable=False)
MAX_KEYWORDS = 3

KEYWORD_DEMOS = (
    dspy.Example(question="Which architect designed the concert hall where the Vienna Philharmonic plays?",
                 keywords=["Vienna Philharmonic", "concert hall", "architect"]),
    dspy.Example(question="In what year did the author of Dracula die?", keywords=["author of Dracula", "death year"]),
    dspy.Example(question="What language is spoken in the birthplace of Ada Lovelace?",
                 keywords=["Ada Lovelace", "birthplace", "language"]),
)


CORRECTION_PARAMS = (SCORER, UPPER, LOWER, STRIP_MODE, STRIPS_TOP_K, STRIP_THRESHOLD, REFINEMENT, WEB, WEB_K,
                     LABEL_FALLBACK)


def check_thresholds(program: str, config: dict) -> None:
    """lower <= upper, or a ConfigError naming both."""
    if config["lower"] > config["upper"]:
        raise ConfigError(
            f"{program}: parameter 'lower' ({config['lower']}) must not exceed parameter 'upper' ({config['upper']})"
        )


def correction_lm_calls(trace: list[dict]) -> int:
    """The LM calls of the corrective step with scorer=lm: a judgement per graded document and per strip, and
    the keyword rewrite."""
    graded = sum(len(step["scores"]) for step in steps_of(trace, Evaluate))
    strips = sum(len(step["strip_scores"]) for step in steps_of(trace, Refine))
    return graded + strips + len(steps_of(trace, Rewrite))


class KnowledgeCorrector(dspy.Module):
    """CRAG's corrective step, shared by `crag` and `self-crag`: grade the retrieved documents, pick the
    action, then refine them (Correct), search for knowledge (Incorrect), or both (Ambiguous)."""

    def __init__(self, *, scorer: str, upper: float, lower: float, strip_mode: str, strips_top_k: int,
                 strip_threshold: float, refinement: str, web: str, web_k: int, label_fallback: bool) -> None:
        super().__init__()
        self.upper, self.lower = upper, lower
        self.strip_mode, self.strips_top_k, self.strip_threshold = strip_mode, strips_top_k, strip_threshold
        self.refinement = refinement
        self.web_k = web_k
        self.evaluator = open_scorer(scorer, label_fallback=label_fallback)
        self.knowledge_search = open_knowledge_search(web)
        self.rewrite_query = dspy.Predict(RewriteAsKeywords)
        self.rewrite_query.demos = [demo.with_inputs("question") for demo in KEYWORD_DEMOS]

    @classmethod
    def from_config(cls, config: dict) -> "KnowledgeCorrector":
        return cls(**{param.name: config[param.name] for param in CORRECTION_PARAMS})

    def correct(self, question: str, passages: list[Passage]) -> tuple[str, list[str]]:
        """The action taken and the corrected knowledge (strips), recorded in the trace."""
        scores = self.evaluator.score(question, [p.long_text for p in passages])
        note(Evaluate(scorer=str(self.evaluator),
                      scores=[{"id": p.id, "title": p.title, "score": round(s, 4)} for p, s in zip(passages, scores)]))
        action = trigger(scores, self.upper, self.lower)
        note(Action(action=action, max_score=round(max(scores), 4) if scores else None,
                    upper=self.upper, lower=self.lower))
        knowledge: list[str] = []
        if action in (CORRECT, AMBIGUOUS):
            knowledge += self.refine_knowledge(question, passages, source="retrieved")
        if action in (INCORRECT, AMBIGUOUS):
            knowledge += self.search_knowledge(question)
        return action, knowledge

    def refine_knowledge(self, question: str, passages: list[Passage], *, source: str) -> list[str]:
        """Decompose-then-recompose: the kept strips of `passages` (the official refinement: retrieved
        documents whole, the best 3, or the best 5 strips of what a search found, in score order)."""
        if self.refinement == "official":
            retrieved = source == "retrieved"
            mode = "passage" if retrieved else self.strip_mode
            refinement = refine(question, passages, self.evaluator, mode=mode,
                                top_k=OFFICIAL_TOP_K if retrieved else OFFICIAL_WEB_TOP_K, threshold=-math.inf,
                                in_score_order=True, min_words=OFFICIAL_MIN_WORDS)
        else:
            mode = self.strip_mode
            refinement = refine(question, passages, self.evaluator, mode=mode, top_k=self.strips_top_k,
                                threshold=self.strip_threshold)
        note(Refine(source=source, mode=mode, refinement=self.refinement,
                    strip_scores=[round(strip.score, 4) for strip in refinement.strips],
                    kept=[{"source": s.source, "text": s.text, "score": round(s.score, 4)} for s in refinement.kept]))
        return refinement.knowledge

    def search_knowledge(self, question: str) -> list[str]:
        """Knowledge searching: keyword rewrite, search, refinement of what was found."""
        if self.knowledge_search is None:
            note(Search(skipped=True, reason="web=none: no knowledge search configured"))
            return []
        query = self.keyword_query(question)
        documents = self.knowledge_search.search(query, self.web_k)
        self.record_search(query, documents)
        found = [passage for document in documents for passage in document.passages]
        return self.refine_knowledge(question, found, source=str(self.knowledge_search))

    def keyword_query(self, question: str) -> str:
        """At most three keywords joined by commas; the question itself when the rewrite is empty."""
        keywords = [k.strip() for k in self.rewrite_query(question=question).keywords if k.strip()][:MAX_KEYWORDS]
        if not keywords:
            note(Rewrite(query=question, reason="the rewrite was empty: searching with the question"))
            return question
        query = ", ".join(keywords)
        note(Rewrite(query=query))
        return query

    def record_search(self, query: str, documents: list[Document]) -> None:
        """A knowledge search counts as a retrieval: its documents are passages the program saw."""
        trace = current_trace()
        if trace is None:
            return
        found = [Passage(document.url, document.title, document.snippet) for document in documents]
        trace.retrieval(query, found, why=f"knowledge search ({self.knowledge_search})", k=self.web_k,
                        documents=[document.summary() for document in documents])
