"""Uncertainty-gated retrieval: answer closed-book when the model is sure, retrieve when it is not.

    Input: question q, signal, threshold tau
    ask:    U = 1 when the LM, told today's date, judges that q needs retrieval, else 0
    others: draft a closed-book answer y0 = LM(q); U = signal(the first draft_tokens tokens of y0)
    if U >= tau: retrieve ret(q, k) and answer as single-rag does
    else:        answer y0 (ask: the closed-book answer, drafted only now)

LM calls per question: 2 for ask; 1, +1 when retrieving, for the others. Retrievals: 0 or 1.

The signals (`signals.py` computes them, each citing its source):
  mean_entropy   mean token entropy: AdaRAGUE's MeanTokenEntropy (Moskvoretskii et al., arXiv 2501.12835, §3;
                 code s-nlp/AdaRAGUE, lm-polygraph estimators/token_entropy.py); TARG's entropy gate (Wang et
                 al., arXiv 2511.09803, Eq. 1, over a k = 20 token prefix, §4)
  max_entropy    max token entropy: AdaRAGUE's MaxTokenEntropy (UC/utils.py calc_stats over the same entropies)
  min_prob       1 - the least token probability: AdaRAGUE's MaxMaximumTokenProbability, the max of -p(token)
                 (lm-polygraph estimators/max_probability.py), shifted by 1
  margin         mean of exp(-g / 1), g the top-1/top-2 logit gap: TARG's margin gate (Eq. 2, beta = 1)
  entropy_trend  the largest |smoothed second difference| of content words' entropies: ETC (arXiv 2511.09980,
                 §3; pkuserc/ETC generate.py:234-322)
  ask            TA-ARE (Zhang et al., arXiv 2402.16457; hyintell/RetrievalQA utils.py:20-110): one call asking
                 whether q needs external resources, with today's date and four written demonstrations (two
                 settled facts: no; one "as of today" question and one little-known person: yes)

The threshold: retrieve when U >= tau, as AdaRAGUE's threshold classifier does (UC/utils.py:7-64); TARG and
ETC's code compare with > (a tie decides the other way). Every U lies in [0, 10): tau = 0 retrieves for every
question, tau = 10 for none. None of the papers fixes tau: each tunes it on held-out questions (AdaRAGUE: 100
candidates between the train split's lowest and highest score, best accuracy; TARG: a dev quantile for a
retrieval budget, or best dev accuracy; ETC: validation), so `threshold` is searched by `arag tune`; its default
0.5 is TA-ARE's rule for ask (retrieve on yes) and only a starting point for the others. The signal is read from
the draft's answer field, its first `draft_tokens` tokens (TARG's k = 20 prefix, §4); an empty draft retrieves.
Entropies come from the endpoint's top `top_logprobs` candidates (a lower bound of the full-vocabulary entropy;
see `signals.py`). Without log-probabilities only ask runs: the others stop with a ConfigError.
"""

from __future__ import annotations

from datetime import date
from typing import Any

import dspy

from arag.errors import ConfigError, LMError
from arag.lm import TokenLogprob, completion_logprobs, field_logprobs
from arag.programs.baselines.single_rag import SingleRAG
from arag.programs.frame.base import RAGProgram
from arag.programs.frame.params import Param, passages_per_retrieval
from arag.programs.frame.predictors import REASONING, judged
from arag.programs.frame.registry import register
from arag.programs.uncertainty_gate.signals import SIGNALS, Reading
from arag.programs.uncertainty_gate.steps import Draft, Gate
from arag.signatures import AnswerFromKnowledge
from arag.signatures.gating import NeedsRetrieval
from arag.trace import Retrieve, shown_probability, steps_of

ASK = "ask"
SIGNAL = Param("signal", ASK, "the uncertainty estimator: ask (the LM judges, TA-ARE), mean_entropy, max_entropy, "
               "min_prob (AdaRAGUE), margin (TARG), entropy_trend (ETC); all but ask read token log-probabilities",
               choices=(ASK, *SIGNALS))
THRESHOLD = Param("threshold", 0.5, "retrieve when the signal's score is at least threshold (0: for every question; "
                  "10: for none)", low=0.0, high=10.0, searched=True, search_range=(0.0, 3.0))
DRAFT_TOKENS = Param("draft_tokens", 20, "tokens of the closed-book draft the signal reads (TARG's prefix k=20)",
                     low=1, high=256)
TOP_LOGPROBS = Param("top_logprobs", 20, "candidates per token the entropy and margin signals read (at most 20 "
                     "on OpenAI-compatible servers)", low=2, high=20, tunable=False)
TODAY = Param("today", "", "the date the ask signal is told, YYYY-MM-DD (empty: the day the program is built)",
              tunable=False)
K = passages_per_retrieval(5, "TARG's top-5 (§4) and TA-ARE's 5 documents")
NEVER = THRESHOLD.high  # every score lies below it

# TA-ARE's four demonstrations, written anew: two settled facts, one "as of today" question, one little-known person.
ASK_DEMOS = (
    ("What is the boiling point of water at sea level in degrees Celsius?", False),
    ("As of today, which club holds the most recent UEFA Champions League title?", True),
    ("Who painted the Mona Lisa?", False),
    ("What was the occupation of Hildegard Vetterlein?", True),
)


@register
class UncertaintyGate(RAGProgram):
    """Draft closed-book; retrieve and answer as single-rag does when the signal finds the draft uncertain."""

    name = "uncertainty-gate"
    lm_calls_formula = "ask: 1 judgement + 1 answer; others: 1 draft, +1 answer when retrieving"
    follows = ("TA-ARE (ask: date and four demonstrations, retrieve on yes), AdaRAGUE's log-probability estimators "
               "and threshold rule (U >= tau), TARG's margin and k=20 prefix, ETC's entropy trend as its code "
               "computes it; the answer after retrieval is single-rag's")
    departures = (
        "entropies are read from the endpoint's top-20 candidates per token (a lower bound of the full-vocabulary "
        "entropy of lm-polygraph's EntropyCalculator, which AdaRAGUE, TARG and ETC use)",
        "min_prob is 1 - p rather than AdaRAGUE's -p (lm-polygraph max_probability.py): the same order, shifted "
        "so that threshold 0 retrieves always; AdaRAGUE drops the generation's last (end-of-sequence) token, and "
        "the answer field holds none to drop",
        "entropy_trend: content words are the words outside NLTK's English stopwords, as bm25s ships them (ETC's "
        "code keeps spaCy's NOUN/ADJ/VERB/PROPN/NUM words, its paper removes spaCy's stopwords), and the score is "
        "not weighted by DRAGIN's attention as ETC's code does (generate.py:425-433; llama.cpp exposes no "
        "attention); |M| as the paper says, where the code's config compares the signed value (thres_abs false)",
        "the draft is the answer field of a closed-book answer, not AdaRAGUE's verbalized guess-and-probability "
        "template (UC/uncertainty.py:36) nor TARG's raw 20-token continuation; without retrieval it is the answer",
    )
    params = (SIGNAL, THRESHOLD, DRAFT_TOKENS, TOP_LOGPROBS, TODAY, K, REASONING)

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        self.date = self.today or date.today().isoformat()
        self.draft = dspy.Predict(AnswerFromKnowledge)
        self.ask = dspy.Predict(NeedsRetrieval)
        self.ask.demos = [dspy.Example(today=self.date, question=question, needs_retrieval=needed)
                          .with_inputs("today", "question") for question, needed in ASK_DEMOS]
        self.answer_from_passages = SingleRAG(retriever, k=self.k, reasoning=self.reasoning)

    def check_params(self, config: dict[str, Any]) -> None:
        if config["today"]:
            try:
                date.fromisoformat(config["today"])
            except ValueError:
                raise ConfigError(f"uncertainty-gate: parameter 'today' must be a date YYYY-MM-DD, "
                                  f"got {config['today']!r}") from None

    def required_lm_calls(self, trace: list[dict]) -> int:
        """ask: the judgement and one answer; the others: the draft, and the answer after a retrieval."""
        answers_after_retrieval = len(steps_of(trace, Retrieve))
        return 2 if self.signal == ASK else 1 + answers_after_retrieval

    def run(self, question: str) -> dict[str, Any]:
        if self.signal == ASK:
            if self.asked_to_retrieve(question):
                return self.answer_from_passages.run(question)
            return {"answer": self.answered(self.draft(question=question))}
        draft = self.draft(question=question, config={"logprobs": True, "top_logprobs": self.top_logprobs})
        tokens = self.draft_tokens_of(draft)
        self.note(Draft(answer=draft.answer, tokens=[[t.token, shown_probability(t.prob)] for t in tokens]))
        if self.gated(tokens):
            return self.answer_from_passages.run(question)
        return {"answer": self.answered(draft)}

    def asked_to_retrieve(self, question: str) -> bool:
        """TA-ARE: retrieve when the LM says the question needs external resources (an unreadable judgement holds
        no yes, and so does not retrieve, as the code's yes-word match)."""
        prediction = judged(self.ask, "answer without retrieval", today=self.date, question=question)
        needed = None if prediction is None else bool(prediction.needs_retrieval)
        score = 1.0 if needed else 0.0
        retrieve = score >= self.threshold
        self.note(Gate(signal=ASK, score=score, threshold=self.threshold, retrieve=retrieve, needs_retrieval=needed,
                       today=self.date))
        return retrieve

    def draft_tokens_of(self, draft: dspy.Prediction) -> list[TokenLogprob]:
        try:
            completion_logprobs(draft)
        except LMError:
            raise ConfigError(f"uncertainty-gate: signal {self.signal!r} reads token log-probabilities and the LM "
                              "gives none: use signal=ask, or an LM that returns them (a local model, "
                              "or an OpenAI-compatible server with logprobs)") from None
        return field_logprobs(draft, "answer")[: self.draft_tokens]

    def gated(self, tokens: list[TokenLogprob]) -> bool:
        """Whether the signal's score over the draft's tokens reaches the threshold (an empty draft retrieves)."""
        if not tokens:
            self.note(Gate(signal=self.signal, score=None, threshold=self.threshold, retrieve=True,
                           reason="the draft is empty"))
            return True
        reading: Reading = SIGNALS[self.signal](tokens, self.top_logprobs)
        retrieve = reading.score >= self.threshold
        words = {} if reading.words is None else {"words": reading.words}
        self.note(Gate(signal=self.signal, score=round(reading.score, 6), threshold=self.threshold,
                       retrieve=retrieve, values=[round(value, 6) for value in reading.values], **words))
        return retrieve
