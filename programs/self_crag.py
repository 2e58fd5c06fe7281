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


from arag.programs.crag import CORRECTION_PARAMS, CRAG_K, KnowledgeCorrector, check_thresholds
from arag.programs.registry import register
from arag.programs.self_rag import SELF_RAG_PARAMS, SelfRAG
from arag.retrievers.base import Passage

SELF_CRAG_PARAMS = (*(CRAG_K if param.name == "k" else param for param in SELF_RAG_PARAMS), *CORRECTION_PARAMS)


@register
class SelfCRAG(SelfRAG):
    """Self-CRAG: Self-RAG reading CRAG's corrected knowledge instead of the raw top-k passages."""

    name = "self-crag"
    params = SELF_CRAG_PARAMS

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        self.corrector = KnowledgeCorrector.from_config(self.config)

    def check_params(self, config: dict) -> None:
        super().check_params(config)
        check_thresholds(self.name, config)

    def evidence(self, question: str, query: str, depth: int) -> list[Passage]:
        """CRAG's corrected knowledge for the query, as one passage (none when nothing is left)."""
        passages = self.retrieve(query, why=f"segment {depth}")
        action, knowledge = self.corrector.correct(question, passages)
        return [Passage(f"knowledge:{action}:{depth}", "", "\n".join(knowledge))] if knowledge else []
