"""Independent LM calls inside one question, made at once, under one process-wide limit on concurrent LM calls.

`fan_out(fn, items)` runs `fn` on every item in its own thread and returns the results in item order. Each
thread runs in a copy of the caller's context, so DSPy's settings (LM, adapter, callbacks, usage tracker)
and the question's trace come along; the steps each item records are put into the trace in item order once
all are done, so a trace reads as if the items had run one after the other. (DSPy's own `Parallel` carries
its settings but not other context, and submits a slow item a second time near the end of a batch, which
would count its LM calls twice.)

Every LM call arag makes — through its adapters and `complete_raw` — holds one of `lm_concurrency` slots
while it runs, shared by the questions run at once (`--threads`) and the fan-out inside them: a rate-limited
API is never sent more than that many requests at a time. With a limit of 1 everything runs one call at a
time, as a single-slot server (one llama.cpp context) would serve it anyway.
"""

from __future__ import annotations

import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence, TypeVar

from arag.errors import ConfigError
from arag.trace import branch_of, current_trace

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_LM_CONCURRENCY = 32

_limit_lock = threading.Lock()
_limit = DEFAULT_LM_CONCURRENCY
_slots = threading.BoundedSemaphore(DEFAULT_LM_CONCURRENCY)
_in_flight = 0  # LM calls holding a slot now


def set_lm_concurrency(limit: int) -> None:
    """At most `limit` LM calls at a time in this process, from now on."""
    global _limit, _slots
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigError(f"lm_concurrency must be a whole number of at least 1, got {limit!r}")
    with _limit_lock:
        _limit, _slots = limit, threading.BoundedSemaphore(limit)


def lm_concurrency() -> int:
    return _limit


_holding: contextvars.ContextVar[bool] = contextvars.ContextVar("arag_lm_slot", default=False)


@contextmanager
def lm_slot() -> Iterator[None]:
    """Hold one of the process's LM-call slots for the duration of one call (a call made while holding one,
    such as an adapter's fallback, uses the same slot), counted against the question's cap on LM calls."""
    if _holding.get():
        yield
        return
    trace = current_trace()
    if trace is not None:
        trace.begin_lm_call()
    global _in_flight
    slots = _slots
    with slots:
        token = _holding.set(True)
        with _limit_lock:
            _in_flight += 1
        try:
            yield
        finally:
            with _limit_lock:
                _in_flight -= 1
            _holding.reset(token)


def fan_out(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """`fn(item)` for every item, at once (at most `lm_concurrency` threads), in item order; the first item's
    exception, if any, is raised once every item has finished. When the process's LM-call slots are all but
    taken (many questions at once), the items run one after the other: more threads would only wait."""
    items = list(items)
    if len(items) <= 1 or _in_flight >= _limit - 1:
        return [fn(item) for item in items]
    trace = current_trace()
    branches = [branch_of(trace) for _ in items]

    def run(branch, item):
        return branch.run(fn, item) if branch is not None else fn(item)

    with ThreadPoolExecutor(max_workers=min(len(items), _limit), thread_name_prefix="arag-fan-out") as pool:
        futures = [pool.submit(contextvars.copy_context().run, run, branch, item)
                   for branch, item in zip(branches, items)]
    for branch in branches:
        if branch is not None:
            branch.merge()
    return [future.result() for future in futures]


_models: dict[tuple[str, str], tuple[Any, threading.Lock]] = {}
_models_lock = threading.Lock()


def shared_model(kind: str, path: str, load: Callable[[], Any]) -> tuple[Any, threading.Lock]:
    """The model loaded once per process for (kind, path) (a scorer's, a router's encoder), with the lock its users
    call it under."""
    key = (kind, path)
    with _models_lock:
        if key not in _models:
            _models[key] = (load(), threading.Lock())
        return _models[key]
