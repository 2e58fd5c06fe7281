"""Adaptive-RAG (Jeong et al., NAACL 2024): a classifier labels the question's complexity, and the strategy
for that complexity answers it.

    label ← classifier(q) ∈ {A, B, C}
    A:  answer ← LM(q)                        no-retrieval: the model's own knowledge
    B:  answer ← LM(q, R(q, k))               single-rag: one retrieval
    C:  answer ← IRCoT(q)                     ircot: retrieval interleaved with chain-of-thought

The three strategies are arag's own `no-retrieval`, `single-rag` (with this program's `k`) and `ircot` (with
its `ircot_k`, its other parameters at their defaults), held as this program's sub-modules (so that compiling and
saving reach their predictors) and run inside this program's trace after a `route` step that records the label
and, when known, the probability of each label.

Passages per retrieval follow the official code's FLAN-T5 setting (starsuzi/Adaptive-RAG, run.py,
`instantiation_schemes`): k = 15 for the single-step strategy and K = 6 for IRCoT, the values run.py sets
(its GPT setting, in comments there, is 6 and 3: `--preset official-gpt`). The paper takes these settings
from IRCoT's implementation (Trivedi et al., 2023) and runs both FLAN-T5 and GPT-3.5.

Classifiers (`classifier`, details in `router.py`): `lm` asks the configured LM for the label, one call (the paper
does not; it is the classifier for an endpoint with nothing trained); a router file from `arag train-router` is
the paper's trained classifier: the paper fine-tunes T5-large on silver labels (the simplest strategy that
answered a training question correctly; the dataset's single- or multi-hop nature when none did), here a
logistic regression over MiniLM embeddings of the question is trained on the same labels from arag's own runs.
"""

from __future__ import annotations

from arag.programs.adaptive_rag.router import open_classifier
from arag.programs.adaptive_rag.steps import Route
from arag.programs.baselines.no_retrieval import NoRetrieval
from arag.programs.baselines.single_rag import SingleRAG
from arag.programs.frame.base import RAGProgram
from arag.programs.frame.params import Param, passages_per_retrieval
from arag.programs.frame.registry import register
from arag.programs.ircot import IRCoT
from arag.trace import ABSENT, shown_probability, steps_of

STRATEGIES = {"A": NoRetrieval.name, "B": SingleRAG.name, "C": IRCoT.name}  # each label's program

CLASSIFIER = Param("classifier", "lm", "lm: the configured LM labels each question; or the path of a router file "
                                       "written by `arag train-router`", tunable=False)
SINGLE_STEP_K = passages_per_retrieval(15, "the single-step strategy's; the official run.py's FLAN-T5 value, 6 for GPT",
                                       searched=True, search_range=(1, 20))
IRCOT_K = Param("ircot_k", 6, "IRCoT's K, the multi-step strategy's passages per retrieval; the official run.py's "
                "FLAN-T5 value, 3 for GPT", low=1, high=15)
PRESETS = {"official-flan-t5": {"k": 15, "ircot_k": 6}, "official-gpt": {"k": 6, "ircot_k": 3}}


@register
class AdaptiveRAG(RAGProgram):
    """Adaptive-RAG: route each question to no retrieval, one retrieval, or IRCoT by its predicted complexity."""

    name = "adaptive-rag"
    lm_calls_formula = "1 label + the chosen strategy's"
    params = (CLASSIFIER, SINGLE_STEP_K, IRCOT_K)
    presets = PRESETS
    follows = ("the paper (Jeong et al., 2024); passages per retrieval as the official run.py's FLAN-T5 setting "
               "(B k=15, C K=6; --preset official-gpt: 6 and 3); its trained classifier is a logistic regression "
               "over MiniLM embeddings here (the paper's: T5-large), and classifier=lm asks the LM instead")

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        self.router = open_classifier(self.classifier)
        self.no_retrieval = NoRetrieval()
        self.single_step = SingleRAG(self.retriever, k=self.k)
        self.multi_step = IRCoT(self.retriever, k=self.ircot_k)
        self.strategies = {"A": self.no_retrieval, "B": self.single_step, "C": self.multi_step}

    def default_max_lm_calls(self) -> int:
        return 1 + max(strategy.default_max_lm_calls() for strategy in self.strategies.values())

    def required_lm_calls(self, trace: list[dict]) -> int:
        """The LM classifier's label (a router file makes none), then what the chosen strategy needs."""
        [route] = steps_of(trace, Route)
        return (route["classifier"] == "lm") + self.strategies[route["label"]].required_lm_calls(trace)

    def run(self, question: str) -> dict:
        routing = self.router.classify(question)
        strategy = self.strategies[routing.label]
        probabilities = {label: shown_probability(p) for label, p in routing.probabilities.items()} \
            if routing.probabilities else ABSENT
        self.note(Route(label=routing.label, strategy=strategy.name, classifier=str(self.router),
                        probabilities=probabilities))
        return strategy.run(question)
