"""Self-CRAG (Yan et al., 2024): CRAG's corrected knowledge in front of the Self-RAG generator.

Self-RAG runs as in `self_rag` (retrieval decision, critiqued candidates, segment-level beam search);
where it would read the top k passages, CRAG corrects them first:
1. Retrieve k documents for the query; the retrieval evaluator (`scorer`) grades each against x.
2. Action trigger: Correct when some score is >= `upper`, Incorrect when every score is < `lower`,
   Ambiguous otherwise.
3. Correct: refine the retrieved documents (decompose into strips, keep the best, in reading order);
   Incorrect: rewrite x into keywords, search `web`, refine what was found; Ambiguous: both.
4. The corrected knowledge, recomposed into one passage as CRAG's released code hands it to its Self-RAG
   generator, is what the candidate is written from and critiqued against. When a step leaves no
   knowledge (Incorrect with `web=none`), Self-RAG writes without evidence and the trace says so.
CRAG's parameters keep CRAG's defaults (k = 10, upper 0.5, lower -0.9, top 5 strips above -0.5).
"""

from __future__ import annotations

import dspy

from arag.errors import ConfigError
from arag.programs.crag import (
    CRAG,
    CRAG_K,
    KEYWORD_DEMOS,
    LABEL_FALLBACK,
    LOWER,
    SCORER,
    STRIP_MODE,
    STRIP_THRESHOLD,
    STRIPS_TOP_K,
    UPPER,
    WEB,
    WEB_K,
)
from arag.programs.registry import register
from arag.programs.relevance import AMBIGUOUS, CORRECT, INCORRECT, open_scorer, trigger
from arag.programs.self_rag import SELF_RAG_PARAMS, SelfRAG
from arag.retrievers.base import Passage
from arag.retrievers.web import open_knowledge_search
from arag.signatures.queries import RewriteAsKeywords

SELF_CRAG_PARAMS = (
    *(CRAG_K if param.name == "k" else param for param in SELF_RAG_PARAMS),
    SCORER, UPPER, LOWER, STRIP_MODE, STRIPS_TOP_K, STRIP_THRESHOLD, WEB, WEB_K, LABEL_FALLBACK,
)


@register
class SelfCRAG(SelfRAG):
    """Self-CRAG: Self-RAG reading CRAG's corrected knowledge instead of the raw top-k passages."""

    name = "self-crag"
    params = SELF_CRAG_PARAMS

    # CRAG's corrective steps, shared as they are: refinement, knowledge search, keyword rewrite, search record.
    refine_knowledge = CRAG.refine_knowledge
    search_knowledge = CRAG.search_knowledge
    keyword_query = CRAG.keyword_query
    record_search = CRAG.record_search

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        self.evaluator = open_scorer(self.scorer, label_fallback=self.label_fallback)
        self.knowledge_search = open_knowledge_search(self.web)
        self.rewrite_query = dspy.Predict(RewriteAsKeywords)
        self.rewrite_query.demos = [demo.with_inputs("question") for demo in KEYWORD_DEMOS]

    def check_params(self, config: dict) -> None:
        super().check_params(config)
        if config["lower"] > config["upper"]:
            raise ConfigError(f"{self.name}: parameter 'lower' ({config['lower']}) must not exceed "
                              f"parameter 'upper' ({config['upper']})")

    def evidence(self, question: str, query: str, depth: int) -> list[Passage]:
        """CRAG's corrected knowledge for the query, as one passage (none when nothing is left)."""
        passages = self.retrieve(query, why=f"segment {depth}")
        scores = self.evaluator.score(question, [p.long_text for p in passages])
        self.note("evaluate", scorer=str(self.evaluator),
                  scores=[{"id": p.id, "title": p.title, "score": round(s, 4)} for p, s in zip(passages, scores)])
        action = trigger(scores, self.upper, self.lower)
        self.note("action", action=action, max_score=round(max(scores), 4) if scores else None,
                  upper=self.upper, lower=self.lower)
        knowledge: list[str] = []
        if action in (CORRECT, AMBIGUOUS):
            knowledge += self.refine_knowledge(question, passages, source="retrieved")
        if action in (INCORRECT, AMBIGUOUS):
            knowledge += self.search_knowledge(question)
        return [Passage(f"knowledge:{action}:{depth}", "", "\n".join(knowledge))] if knowledge else []
