"""What every program shares: declared parameters, the retrieval step, and the traced result."""

from __future__ import annotations

from typing import Any, ClassVar, Mapping, Sequence

import dspy

from arag.adapters import default_adapter
from arag.errors import ConfigError, QuestionFailed
from arag.lm import field_logprobs
from arag.passages import Passage
from arag.programs.frame.params import Param, resolve_params
from arag.retrievers.base import Retriever, as_retriever
from arag.trace import ABSENT, Answer, Step, current_trace, note, recording, shown_probability

MAX_LM_CALLS_SETTING = "arag_max_lm_calls"  # dspy.context(arag_max_lm_calls=N): the cap on one question's LM calls
BASE_LM_CALLS, LM_CALLS_PER_PASSAGE = 100, 10


class RAGProgram(dspy.Module):
    """Base of every arag program.

    Subclasses set `name` and `params`, build their predictors in `__init__`, and implement
    `run(question) -> dict` (at least `answer`) using `self.retrieve` for every retriever call.
    Parameters become attributes (`self.k`) and are saved with compiled programs.
    """

    name: ClassVar[str]
    params: ClassVar[Sequence[Param]] = ()
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = {}  # named parameter sets, e.g. an official setting
    follows: ClassVar[str] = ""  # what follows the paper and what the official code (details: the module docstring)
    departures: ClassVar[Sequence[str]] = ()  # each choice kept against the paper or the official code, with its source
    needs_retriever: ClassVar[bool] = True
    lm_calls_formula: ClassVar[str] = ""  # the LM calls the algorithm requires, in words (`required_lm_calls`)

    def __init__(self, retriever: Retriever | None = None, *, preset: str | None = None, **params: Any) -> None:
        super().__init__()
        if self.needs_retriever and retriever is None:
            raise ConfigError(f"program {self.name!r} needs a retriever: pass --corpus PATH or --retriever SPEC")
        self.retriever = None if retriever is None else as_retriever(retriever)
        self.config = self.resolve_config(params, preset)
        for key, value in self.config.items():
            setattr(self, key, value)

    @classmethod
    def with_preset(cls, preset: str | None, params: Mapping[str, Any]) -> dict[str, Any]:
        """`params` over the named preset's values (parameters given by name win); a ConfigError for an unknown one."""
        if preset is None:
            return dict(params)
        if preset not in cls.presets:
            known = ", ".join(cls.presets) or "none"
            raise ConfigError(f"{cls.name}: no preset {preset!r} (presets: {known})")
        return {**cls.presets[preset], **params}

    @classmethod
    def resolve_config(cls, params: Mapping[str, Any], preset: str | None = None) -> dict[str, Any]:
        """The parameters a program of this class runs with: `params` over the named preset's values over the
        defaults, each validated, then checked together (`check_params`); a ConfigError names the first bad one.
        Programs and run specifications (`arag.RunSpec`) are validated here, before anything is built."""
        config = resolve_params(cls.params, cls.with_preset(preset, params), cls.name)
        cls.__new__(cls).check_params(config)  # on an instance not built yet: nothing is built before validation
        return config

    def check_params(self, config: dict[str, Any]) -> None:
        """Cross-parameter checks (e.g. lower <= upper); raise ConfigError. Called before the program is built, on
        an instance whose `__init__` has not run: read only `config` and the class's declarations (`self.name`)."""

    def forward(self, question: str) -> dspy.Prediction:
        """Run the program on one question under arag's adapter (unless one is configured).

        A question makes at most `default_max_lm_calls()` LM calls, or the number set with
        `dspy.context(arag_max_lm_calls=N)` (0: no cap; `--max-lm-calls` on the command line).
        A failure that is the question's, not the configuration's (an unreadable output, a failed or timed-out
        LM call, a missing log-probability, the cap on LM calls reached) is raised as QuestionFailed with the step
        that was running and the trace and counts of the work done until then."""
        adapter = dspy.settings.adapter or default_adapter(dspy.settings.lm)
        cap = dspy.settings.get(MAX_LM_CALLS_SETTING)
        failure = None
        with recording(self.default_max_lm_calls() if cap is None else cap or None) as trace, \
                dspy.context(adapter=adapter):
            try:
                result = self.run(question)
            except (ConfigError, QuestionFailed):
                raise
            except Exception as exc:  # noqa: BLE001 — re-raised below with what the question did
                failure = exc
        if failure is not None:
            raise QuestionFailed(failure, step=self.step_name(trace.running), trace=list(trace.steps),
                                 counts=trace.counts()) from failure
        return trace.prediction(**result)

    def default_max_lm_calls(self) -> int:
        """A generous cap on one question's LM calls, from the program's parameters: room for every method's
        worst case at its defaults (a call per passage and per strip, long answers), never a binding one."""
        return BASE_LM_CALLS + LM_CALLS_PER_PASSAGE * int(self.config.get("k", 0))

    def step_name(self, predictor: Any) -> str | None:
        """Where one of this program's predictors sits and its signature, e.g. `evaluator.judge (JudgeRelevance)`
        (a ChainOfThought's inner predictor goes by its module's name: its signature was rebuilt unnamed)."""
        if predictor is None:
            return None
        signature = predictor.signature.__name__
        for name, candidate in self.named_predictors():
            if candidate is predictor:
                name = name.removesuffix(".predict")
                return name if signature == "StringSignature" else f"{name} ({signature})"
        return signature

    def run(self, question: str) -> dict[str, Any]:
        raise NotImplementedError

    def required_lm_calls(self, trace: list[dict]) -> int:
        """The LM calls this program's algorithm requires for the steps its trace records: the cost benchmark
        flags every call beyond them (a retry, a parse fallback, or a bug)."""
        raise NotImplementedError(f"{self.name}: no required_lm_calls for its trace")

    def retrieve(self, query: str, k: int | None = None, *, why: str) -> list[Passage]:
        """Retrieve the top-k passages for `query`, recording the call and the reason for it."""
        k = self.k if k is None else k
        passages = self.retriever.retrieve(query, k)
        trace = current_trace()
        if trace is not None:
            trace.retrieval(query, passages, why=why, k=k)
        return passages

    def answered(self, prediction: dspy.Prediction, field: str = "answer") -> str:
        """Record the final answer as an `answer` step (with its lowest and mean token probability
        when the LM returned log-probabilities) and return its text."""
        text = prediction[field]
        probs = [t.prob for t in field_logprobs(prediction, field)] if prediction.get("logprobs") else []
        lowest, mean = (shown_probability(min(probs)), shown_probability(sum(probs) / len(probs))) if probs \
            else (ABSENT, ABSENT)
        self.note(Answer(answer=text, min_token_prob=lowest, mean_token_prob=mean))
        return text

    def note(self, step: Step) -> None:
        """Record a complete step (a judgement, a decision, a generated sentence) in the active trace."""
        note(step)
