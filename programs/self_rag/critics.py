"""Self-RAG's two critic back-ends, one interface (`Critics`): each writes the next candidate segment and
critiques it, giving every label group's probabilities normalised over the group.

- `PromptedCritics`: typed signatures on any chat LM; a label's probability is read from the log-probabilities
  of the label's first token (`arag.lm.label_probabilities`).
- `ReflectionTokenCritics`: a Self-RAG-trained model in its own prompt format, through raw completions; each
  reflection token's probability is read from the top log-probabilities where the model wrote its group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

import dspy

from arag.concurrency import fan_out
from arag.errors import LMError
from arag.lm import (
    TokenLogprob,
    complete_raw,
    field_logprobs,
    label_probabilities,
    raw_prompt_lm,
    require_lm,
    token_label_probabilities,
)
from arag.passages import Passage
from arag.programs.frame.predictors import judged
from arag.programs.frame.sentences import split_sentences
from arag.signatures.critique import (
    ContinueAnswerFromKnowledge,
    ContinueAnswerFromPassage,
    DecideRetrieval,
    JudgeSupport,
    RateUtility,
)
from arag.signatures.relevance import JudgeRelevance

UTILITY_GRADES = ("1", "2", "3", "4", "5")
CRITIC_TOP_LOGPROBS = 5
REFLECTION_TOP_LOGPROBS = 20

RETRIEVE_TOKENS = {"[Retrieval]": "yes", "[No Retrieval]": "no", "[Continue to Use Evidence]": "continue"}
RELEVANCE_TOKENS = {"[Relevant]": "relevant", "[Irrelevant]": "irrelevant"}
SUPPORT_TOKENS = {"[Fully supported]": "fully", "[Partially supported]": "partially",
                  "[No support / Contradictory]": "no"}
UTILITY_TOKENS = {f"[Utility:{grade}]": grade for grade in UTILITY_GRADES}
MARKUP_TOKENS = {"<paragraph>", "</paragraph>", "</s>", *RELEVANCE_TOKENS, *SUPPORT_TOKENS, *UTILITY_TOKENS}


@dataclass(frozen=True)
class Segment:
    """A candidate continuation as a critic back-end wrote and judged it.

    `critiques` maps a group (relevance, support, utility) to its labels' probabilities, normalised over
    the group; `transcript` is the segment in the generator's own format (reflection tokens included);
    `next_retrieval` holds the retrieval probabilities the generator wrote after an unfinished segment.
    """

    text: str
    transcript: str
    sequence_score: float
    critiques: Mapping[str, Mapping[str, float]]
    passage: Passage | None = None
    finished: bool = True
    next_retrieval: Mapping[str, float] | None = None


def mean_logprob(tokens: Sequence[TokenLogprob]) -> float:
    """The mean token log-probability; 0 for an empty segment."""
    return sum(token.logprob for token in tokens) / len(tokens) if tokens else 0.0


def join_texts(texts: Sequence[str]) -> str:
    return " ".join(text.strip() for text in texts if text.strip())


class Critics(Protocol):
    """Where candidates and critiques come from. Probabilities are normalised over each group: retrieve
    {yes, no, continue}, relevance {relevant, irrelevant}, support {fully, partially, no}, utility {1..5}."""

    def retrieval(self, question: str, written: Sequence[Segment]) -> dict[str, float]:
        """The retrieval probabilities before the next segment."""

    def write(self, question: str, written: Sequence[Segment], passage: Passage | None, *,
              continued: bool, last: bool) -> Segment:
        """The next segment, written from `passage` (or none) and critiqued; relevance is judged only for
        a passage not `continued` from the last segment; a `last` segment ends the answer."""


class PromptedCritics(dspy.Module):
    """Critiques as typed predictions on any chat LM; label probabilities from the label tokens'
    log-probabilities. A segment is the first sentence of the continuation, or all of it when it is the
    last one allowed or a single sentence (then the answer is finished)."""

    RETRIEVE_LABELS = {"yes": "yes", "no": "no", "continue": "continue"}
    RELEVANCE_LABELS = {"yes": "relevant", "no": "irrelevant"}
    SUPPORT_LABELS = {"fully supported": "fully", "partially supported": "partially", "no support": "no"}
    UTILITY_LABELS = {grade: grade for grade in UTILITY_GRADES}

    def __init__(self, assume_chosen_label: bool = False):
        super().__init__()
        self.assume_chosen_label = assume_chosen_label
        config = {} if assume_chosen_label else {"logprobs": True, "top_logprobs": CRITIC_TOP_LOGPROBS}
        self.decide_retrieval = dspy.Predict(DecideRetrieval, **config)
        self.continue_answer = dspy.Predict(ContinueAnswerFromKnowledge, **config)
        self.continue_from_passage = dspy.Predict(ContinueAnswerFromPassage, **config)
        self.judge_relevance = dspy.Predict(JudgeRelevance, **config)
        self.judge_support = dspy.Predict(JudgeSupport, **config)
        self.rate_utility = dspy.Predict(RateUtility, **config)

    def retrieval(self, question: str, written: Sequence[Segment]) -> dict[str, float]:
        evidence = written[-1].passage if written else None
        prediction = judged(self.decide_retrieval, "retrieve", question=question,
                            answer_so_far=join_texts([s.text for s in written]),
                            evidence=evidence.long_text if evidence else "")
        if prediction is None:
            return {"yes": 1.0, "no": 0.0, "continue": 0.0}
        return self.probabilities(prediction, "retrieve", self.RETRIEVE_LABELS)

    def write(self, question: str, written: Sequence[Segment], passage: Passage | None, *,
              continued: bool, last: bool) -> Segment:
        so_far = join_texts([s.text for s in written])

        def generate() -> dspy.Prediction:
            if passage is None:
                return self.continue_answer(question=question, answer_so_far=so_far)
            return self.continue_from_passage(question=question, passage=passage.long_text, answer_so_far=so_far)

        def relevance() -> dict[str, float] | None:
            if passage is None or continued:
                return None
            judged = self.judge_relevance(question=question, passage=passage.long_text)
            return self.probabilities(judged, "relevant", self.RELEVANCE_LABELS)

        # IsREL needs no segment: it is judged while the segment is written; IsSUP and IsUSE then at once.
        prediction, relevant = fan_out(lambda step: step(), [generate, relevance])
        continuation = prediction.continuation.strip()
        sentences = split_sentences(continuation)
        text = continuation if last or len(sentences) <= 1 else sentences[0].strip()

        def support() -> dict[str, float] | None:
            if passage is None:
                return None
            judged = self.judge_support(question=question, passage=passage.long_text, statement=text)
            return self.probabilities(judged, "support", self.SUPPORT_LABELS)

        def utility() -> dict[str, float]:
            rated = self.rate_utility(question=question, response=join_texts([so_far, text]))
            return self.probabilities(rated, "utility", self.UTILITY_LABELS)

        supported, useful = fan_out(lambda step: step(), [support, utility])
        judged_groups = (("relevance", relevant), ("support", supported), ("utility", useful))
        critiques = {group: probabilities for group, probabilities in judged_groups if probabilities is not None}
        return Segment(text=text, transcript=text, sequence_score=self.sequence_score(prediction, text),
                       critiques=critiques, passage=passage, finished=text == continuation)

    def probabilities(self, prediction: dspy.Prediction, field_name: str,
                      labels: Mapping[str, str]) -> dict[str, float]:
        """Each label's probability (under the back-end's group label), normalised over the labels."""
        if self.assume_chosen_label:
            chosen = prediction[field_name]
            return {label: float(name == chosen) for name, label in labels.items()}
        found = label_probabilities(prediction, field_name, list(labels))
        return {labels[name]: p for name, p in found.items()}

    def sequence_score(self, prediction: dspy.Prediction, text: str) -> float:
        """The mean log-probability of the continuation tokens that spell the kept segment."""
        if self.assume_chosen_label:
            return 0.0
        return mean_logprob(leading_tokens(field_logprobs(prediction, "continuation"), text))


def leading_tokens(tokens: Sequence[TokenLogprob], text: str) -> list[TokenLogprob]:
    """The first tokens of a field, up to the one that completes `text` (the field's beginning)."""
    kept, spelled = [], ""
    for token in tokens:
        if len(spelled.lstrip()) >= len(text):
            break
        kept.append(token)
        spelled += token.token
    return kept


class ReflectionTokenCritics(dspy.Module):
    """Critiques as a Self-RAG-trained model's own reflection tokens, read from raw completions.

    The prompt is the model's format, `### Instruction:\\n{question}\\n\\n### Response:\\n`, followed by the
    segments written so far and, before each new segment, `[Retrieval]<paragraph>{title}\\n{text}</paragraph>`,
    `[No Retrieval]` or `[Continue to Use Evidence]`. A segment runs until the model writes its next retrieval
    token, whose top log-probabilities decide the next retrieval; without one the answer is finished.
    The prompts go to the active LM's raw-prompt twin (`arag.lm.raw_prompt_lm`): an OpenAI-compatible
    server's /v1/completions with special tokens kept (vLLM drops them unless asked; the API key is read
    from OPENAI_API_KEY there), or a local GGUF model without its chat template.
    """

    def retrieval(self, question: str, written: Sequence[Segment]) -> dict[str, float]:
        if written:
            return dict(written[-1].next_retrieval)
        _, tokens = complete_raw(raw_prompt_lm(require_lm(), keep_special_tokens=True), instruction_prompt(question),
                                 top_logprobs=REFLECTION_TOP_LOGPROBS, max_tokens=1)
        probabilities = group_probabilities(tokens[0], RETRIEVE_TOKENS) if tokens else {}
        if not any(probabilities.values()):
            raise _no_reflection_tokens("a retrieval token ([Retrieval] / [No Retrieval]) to start the response")
        return probabilities

    def write(self, question: str, written: Sequence[Segment], passage: Passage | None, *,
              continued: bool, last: bool) -> Segment:
        if continued:
            lead = "[Continue to Use Evidence]"
        elif passage is None:
            lead = "[No Retrieval]"
        else:
            lead = f"[Retrieval]<paragraph>{passage_block(passage)}</paragraph>"
        prompt = instruction_prompt(question) + "".join(s.transcript for s in written) + lead
        _, tokens = complete_raw(raw_prompt_lm(require_lm(), keep_special_tokens=True), prompt,
                                 top_logprobs=REFLECTION_TOP_LOGPROBS)
        return read_segment(tokens, lead, passage, judge_relevance=passage is not None and not continued)


def instruction_prompt(question: str) -> str:
    """The Self-RAG model's prompt format, before anything it writes."""
    return f"### Instruction:\n{question}\n\n### Response:\n"


def passage_block(passage: Passage) -> str:
    return f"{passage.title}\n{passage.text}" if passage.title else passage.text


def read_segment(tokens: Sequence[TokenLogprob], lead: str, passage: Passage | None,
                 judge_relevance: bool) -> Segment:
    """A segment from the tokens a Self-RAG model wrote after `lead`: the tokens before its next retrieval
    token, the support and utility groups where it first wrote them, and relevance at its first token."""
    body: list[TokenLogprob] = []
    critiques: dict[str, dict[str, float]] = {}
    next_retrieval = None
    for token in tokens:
        name = token.token.strip()
        if name in RETRIEVE_TOKENS:
            next_retrieval = group_probabilities(token, RETRIEVE_TOKENS)
            break
        body.append(token)
        for group, names in (("support", SUPPORT_TOKENS), ("utility", UTILITY_TOKENS)):
            if name in names and group not in critiques:
                critiques[group] = group_probabilities(token, names)
    if judge_relevance:
        relevance = group_probabilities(tokens[0], RELEVANCE_TOKENS) if tokens else {}
        if not any(relevance.values()):
            raise _no_reflection_tokens("a relevance token ([Relevant] / [Irrelevant]) after the paragraph")
        critiques["relevance"] = relevance
    text = "".join(token.token for token in body if token.token.strip() not in MARKUP_TOKENS).strip()
    return Segment(text=text, transcript=lead + "".join(token.token for token in body),
                   sequence_score=mean_logprob(body), critiques=critiques, passage=passage,
                   finished=next_retrieval is None, next_retrieval=next_retrieval)


def group_probabilities(token: TokenLogprob, names: Mapping[str, str]) -> dict[str, float]:
    """A reflection-token group's probabilities at one position, from the token and its top candidates,
    normalised over the group (all 0 when none of its tokens is among them)."""
    return token_label_probabilities(token, lambda candidate: names.get(candidate.strip()),
                                     list(dict.fromkeys(names.values())))


def _no_reflection_tokens(what: str) -> LMError:
    return LMError(
        f"critics='reflection-tokens' found no {what} among the top {REFLECTION_TOP_LOGPROBS} log-probabilities: "
        "it needs a Self-RAG-trained model (e.g. selfrag/selfrag_llama2_7b) on an OpenAI-compatible server "
        "(--api-base) with /v1/completions and log-probabilities; use critics=prompted for other LMs"
    )
