"""The recorder: the steps a program call took, and what it cost.

A program runs inside `recording()`; its steps (records of the declared kinds: `arag.trace.steps` and each
method's `steps.py`) append to the active `Trace` as JSON objects, and DSPy's callbacks and usage tracker count the
LM calls and tokens made meanwhile.
"""

from __future__ import annotations

import contextvars
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import dspy
from dspy.utils.callback import BaseCallback

from arag.errors import LMCallBudgetSpent
from arag.passages import Passage
from arag.trace.record import ABSENT, Step
from arag.trace.steps import Retrieve

_active: contextvars.ContextVar["Trace | None"] = contextvars.ContextVar("arag_trace", default=None)


class Trace:
    """The steps of one program call and its counts: LM calls, tokens, retrievals, distinct passages."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.lm_calls = 0
        self.prompt_tokens = 0
        self.reused_prompt_tokens = 0  # of those, the ones the engine took from its cache of an earlier prompt
        self.completion_tokens = 0
        self.retrieval_calls = 0
        self.passage_ids: set[str] = set()
        self.running: Any = None  # the predictor called last: where a failure happened
        self.max_lm_calls: int | None = None
        self.calls_begun = 0
        self._lock = threading.Lock()

    def add(self, step: Step) -> None:
        """Append one complete step."""
        entry = step.as_json()
        with self._lock:
            self.steps.append(entry)

    def retrieval(self, query: str, passages: Sequence[Passage], *, why: str, k: int,
                  cut_ids: list[str] = ABSENT, documents: list[dict[str, Any]] = ABSENT) -> None:
        """Record one retriever call: the query, why it was made, and which passages were new (`cut_ids` and
        `documents` as `Retrieve` declares them)."""
        counts = self.counted_in()
        with counts._lock:
            counts.retrieval_calls += 1
            new = [p.id for p in passages if p.id not in counts.passage_ids]
            counts.passage_ids.update(new)
        shown = [{"id": p.id, "title": p.title, "score": round(float(p.score), 4)} for p in passages]
        self.add(Retrieve(why=why, query=query, k=k, passages=shown, new_ids=new, cut_ids=cut_ids,
                          documents=documents))

    def counted_in(self) -> Trace:
        """The trace whose counts this one's calls add to: itself."""
        return self

    def begin_lm_call(self) -> None:
        """Count an LM call about to be made; LMCallBudgetSpent when it would pass `max_lm_calls`."""
        counts = self.counted_in()
        with counts._lock:
            if counts.max_lm_calls is not None and counts.calls_begun >= counts.max_lm_calls:
                raise LMCallBudgetSpent(f"the question spent its {counts.max_lm_calls} LM calls (max_lm_calls; "
                                        "raise it with --max-lm-calls N)")
            counts.calls_begun += 1

    def counts(self) -> dict[str, int]:
        return {
            "lm_calls": self.lm_calls,
            "prompt_tokens": self.prompt_tokens,
            "reused_prompt_tokens": self.reused_prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "retrieval_calls": self.retrieval_calls,
            "distinct_passages": len(self.passage_ids),
        }

    def prediction(self, **fields: Any) -> dspy.Prediction:
        """The program's result: its output fields, the steps, and the counts."""
        return dspy.Prediction(**fields, trace=list(self.steps), **self.counts())


class Branch(Trace):
    """The steps of one of several things done at once within a question (`arag.concurrency.fan_out`): they
    are kept apart while it runs and added to the trace after the ones before it; its counts go to the trace."""

    def __init__(self, trunk: Trace) -> None:
        super().__init__()
        self.trunk = trunk

    def counted_in(self) -> Trace:
        return self.trunk.counted_in()

    def run(self, fn: Any, *args: Any) -> Any:
        """`fn(*args)` with this branch as the active trace (in the calling thread's context)."""
        token = _active.set(self)
        try:
            return fn(*args)
        finally:
            _active.reset(token)

    def merge(self) -> None:
        """Append this branch's steps to its trunk."""
        with self.trunk._lock:
            self.trunk.steps.extend(self.steps)


def branch_of(trace: Trace | None) -> Branch | None:
    return Branch(trace) if trace is not None else None


class _LMCallCounter(BaseCallback):
    def __init__(self, trace: Trace) -> None:
        self.trace = trace

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        with self.trace._lock:
            self.trace.lm_calls += 1

    def on_module_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        if isinstance(instance, dspy.Predict):
            self.trace.running = instance


def shown_probability(p: float) -> float:
    """A probability as traces record it: four significant digits, so that a tiny one stays above 0."""
    return float(f"{p:.4g}")


def count_lm_work(*, lm_calls: int = 0, prompt_tokens: int = 0, completion_tokens: int = 0,
                  reused_prompt_tokens: int = 0) -> None:
    """Count LM work done outside DSPy in the active trace (a model this process runs for what DSPy cannot ask of
    it, such as the attention model's generations and forward passes), as DSPy's callbacks and usage tracker count
    the calls made through it. A call's cap is checked before it is made (`arag.concurrency.lm_slot`)."""
    trace = _active.get()
    if trace is None:
        return
    counts = trace.counted_in()
    with counts._lock:
        counts.lm_calls += lm_calls
        counts.prompt_tokens += prompt_tokens
        counts.completion_tokens += completion_tokens
        counts.reused_prompt_tokens += reused_prompt_tokens


CACHE_HIT_LISTENER = "arag_cache_hit_listener"
"""A DSPy setting: the function told of each hit of DSPy's cache, with the usage the answer cost when it was made,
while `reporting_cache_hits()` is in force (e.g. `charge_to_trace`, or a tuning trial's ledger)."""


class _HitReportingCache:
    """DSPy's cache, telling the `CACHE_HIT_LISTENER` of the settings in force of each hit."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def get(self, *args: Any, **kwargs: Any) -> Any:
        record = self.inner.get(*args, **kwargs)
        listener = dspy.settings.get(CACHE_HIT_LISTENER)
        if record is not None and listener is not None:
            listener((record.get("usage") or {}) if isinstance(record, dict) else {})
        return record

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


_reporting = {"users": 0, "lock": threading.Lock()}


@contextmanager
def reporting_cache_hits() -> Iterator[None]:
    """Wrap `dspy.cache` (the one in place when entered) while any caller needs its hits reported; several
    callers, in threads, share one wrapper."""
    with _reporting["lock"]:
        if _reporting["users"] == 0:
            dspy.cache = _HitReportingCache(dspy.cache)
        _reporting["users"] += 1
    try:
        yield
    finally:
        with _reporting["lock"]:
            _reporting["users"] -= 1
            if _reporting["users"] == 0 and isinstance(dspy.cache, _HitReportingCache):
                dspy.cache = dspy.cache.inner


def charge_to_trace(usage: dict[str, Any]) -> None:
    """A `CACHE_HIT_LISTENER` counting a cached answer's tokens in the active trace as if the call had been made
    (its LM call is counted already), so that a run answered partly from the cache reports its whole cost."""
    count_lm_work(prompt_tokens=int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0),
                  completion_tokens=int(usage.get("completion_tokens") or usage.get("output_tokens") or 0),
                  reused_prompt_tokens=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0))


def current_trace() -> Trace | None:
    """The trace of the program call running in this context, if any."""
    return _active.get()


def note(step: Step) -> None:
    """Record a complete step in the active trace (nothing when no program call is recording)."""
    trace = _active.get()
    if trace is not None:
        trace.add(step)


@contextmanager
def counting_lm_calls() -> Iterator[Trace]:
    """Count the LM calls made meanwhile, those of the program calls inside included, into the `lm_calls` of the
    yielded counts (which record no steps): what a compile or a study costs."""
    counts = Trace()
    with dspy.context(callbacks=[*(dspy.settings.get("callbacks") or []), _LMCallCounter(counts)]):
        yield counts


@contextmanager
def recording(max_lm_calls: int | None = None) -> Iterator[Trace]:
    """Record a program call, with at most `max_lm_calls` LM calls (None: no cap). Nested calls (a program
    inside another) share the outer trace and its cap."""
    outer = _active.get()
    if outer is not None:
        yield outer
        return
    trace = Trace()
    trace.max_lm_calls = max_lm_calls
    token = _active.set(trace)
    callbacks = [*(dspy.settings.get("callbacks") or []), _LMCallCounter(trace)]
    try:
        with dspy.context(callbacks=callbacks), dspy.track_usage() as usage:
            try:
                yield trace
            finally:
                _add_usage(trace, usage.get_total_tokens())
    finally:
        _active.reset(token)


def _add_usage(trace: Trace, totals_by_lm: dict[str, dict[str, Any]]) -> None:
    for totals in totals_by_lm.values():
        trace.prompt_tokens += int(totals.get("prompt_tokens") or totals.get("input_tokens") or 0)
        trace.completion_tokens += int(totals.get("completion_tokens") or totals.get("output_tokens") or 0)
        trace.reused_prompt_tokens += int((totals.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
