"""Self-CRAG (Yan et al., 2024): CRAG's corrected knowledge in front of the Self-RAG generator.

Self-RAG runs as in `self_rag` (retrieval decision, critiqued candidates, segment-level beam search);
where it would read the top k passages, it reads the knowledge CRAG makes of them. CRAG's knowledge has
three forms: internal (the k retrieved documents refined: decomposed into strips, the best kept), external
(x rewritten into keywords, `web` searched, the results refined the same way), and the two combined,
the internal first. `contexts` says which forms Self-RAG reads:

- `released` (default) follows CRAG's released code (HuskyInSalt/CRAG). Its knowledge scripts
  (scripts/internal_knowledge_preparation.py, external_knowledge_preparation.py,
  combined_knowledge_preparation.py) build all three forms for every question, and scripts/data_process.py
  (--postprocess, run by run_selfcrag_preparation.sh) puts them, internal, external, combined, in place of
  Self-RAG's retrieved passages. So Self-RAG writes one candidate from each and its critiques choose; the
  retrieved documents are not graded and no action is taken (`scorer` scores only the strips refined).
  Departures: a form left empty (no strip kept, or nothing searched with `web=none`) is not given, nor
  the combination unless both parts hold knowledge, where the released files keep empty contexts; the
  contexts carry no title, where the released files give all three the top retrieved document's title;
  the combination is the strips one per line, not "Knowledge1: ... [sep] Knowledge2: ...". The
  three-context layout the run script asks for is followed, not data_process.py's default one, which
  repeats the external context once per search snippet (identical candidates only).
- `action` follows the paper's description, Self-RAG reading the knowledge of CRAG's action:
  1. the retrieval evaluator (`scorer`) grades each retrieved document against x;
  2. Correct when some score is >= `upper`, Incorrect when every score is < `lower`, Ambiguous otherwise;
  3. Correct: the internal form; Incorrect: the external; Ambiguous: the combined (as scripts/CRAG_Inference.py
     picks a form by action for CRAG);
  4. that knowledge, as one passage, is what the single candidate is written from and critiqued against.
When no knowledge is left (e.g. `action`, Incorrect with `web=none`), Self-RAG writes without evidence and the
trace says so. CRAG's parameters keep CRAG's defaults (k = 10, upper 0.5, lower -0.9, top 5 strips above -0.5).
"""

from __future__ import annotations

from arag.passages import Passage
from arag.programs.crag.correction import (
    CORRECTION_PARAMS,
    CRAG_K,
    THRESHOLD_PRESETS,
    KnowledgeCorrector,
    check_thresholds,
    correction_lm_calls,
)
from arag.programs.crag.steps import Contexts
from arag.programs.frame.params import Param
from arag.programs.frame.registry import register
from arag.programs.self_rag.self_rag import SELF_RAG_PARAMS, SelfRAG

CONTEXTS = Param("contexts", "released", "what Self-RAG reads: released, the internal, external and combined knowledge "
                 "as CRAG's released code gives each question; action, the knowledge of CRAG's action (the paper)",
                 choices=("released", "action"), tunable=False)
SELF_CRAG_PARAMS = (*(CRAG_K if param.name == "k" else param for param in SELF_RAG_PARAMS), *CORRECTION_PARAMS,
                    CONTEXTS)


@register
class SelfCRAG(SelfRAG):
    """Self-CRAG: Self-RAG reading CRAG's corrected knowledge instead of the raw top-k passages."""

    name = "self-crag"
    lm_calls_formula = "Self-RAG's + CRAG's corrective calls"
    follows = ("the released pipeline (HuskyInSalt/CRAG, scripts/data_process.py) by default; contexts=action: "
               "the paper's description")
    params = SELF_CRAG_PARAMS
    presets = THRESHOLD_PRESETS

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        self.corrector = KnowledgeCorrector.from_config(self.config)

    def check_params(self, config: dict) -> None:
        super().check_params(config)
        check_thresholds(self.name, config)

    def evidence(self, question: str, query: str, depth: int) -> list[Passage]:
        """The knowledge Self-RAG writes candidates from: the three forms (`released`), or the knowledge of
        CRAG's action as one passage (`action`); none when nothing is left."""
        passages = self.retrieve(query, why=f"segment {depth}")
        if self.contexts == "action":
            action, knowledge = self.corrector.correct(question, passages)
            return [Passage(f"knowledge:{action}:{depth}", "", "\n".join(knowledge))] if knowledge else []
        internal = self.corrector.refine_knowledge(question, passages, source="retrieved")
        external = self.corrector.search_knowledge(question)
        forms = {"internal": internal, "external": external,
                 "combined": internal + external if internal and external else []}
        self.note(Contexts(depth=depth, given=[name for name, knowledge in forms.items() if knowledge],
                           empty=[name for name, knowledge in forms.items() if not knowledge]))
        return [Passage(f"knowledge:{name}:{depth}", "", "\n".join(knowledge))
                for name, knowledge in forms.items() if knowledge]

    def required_lm_calls(self, trace: list[dict]) -> int:
        return super().required_lm_calls(trace) + correction_lm_calls(trace)

