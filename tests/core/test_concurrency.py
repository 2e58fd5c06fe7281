"""Independent LM calls inside one question run at once, under the process's limit, with the same trace."""

from __future__ import annotations

import threading
import time

import dspy
import pytest

from arag.concurrency import DEFAULT_LM_CONCURRENCY, fan_out, lm_concurrency, set_lm_concurrency
from arag.errors import ConfigError
from arag.programs import build_program
from arag.programs.self_rag.steps import Beam
from arag.testing import NUMBERED, TemplateRetriever, Tokens, isolated_cache, scripted_lm
from arag.trace import note, recording

LATENCY = 0.2


def answers(call):
    """Every judgement yes (sure), every critique its best label, every answer Budapest."""
    out = {}
    for field in call.output_fields:
        if field in ("relevant", "retrieve"):
            out[field] = Tokens([("yes", 0.9, {"no": 0.1})])
        elif field == "support":
            out[field] = Tokens([("fully supported", 0.9, {"no support": 0.1})])
        elif field == "utility":
            out[field] = Tokens([("5", 0.9, {"1": 0.1})])
        elif field in ("answer", "continuation"):
            out[field] = "Budapest."
        else:
            out[field] = "Because."
    return out


class InFlight:
    """Wraps a responder to record the most calls in flight at once."""

    def __init__(self, responder):
        self.responder, self.now, self.most = responder, 0, 0
        self.lock = threading.Lock()

    def __call__(self, call):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(LATENCY)
        with self.lock:
            self.now -= 1
        return self.responder(call)


@pytest.fixture(autouse=True)
def default_limit():
    with isolated_cache(enabled=False):
        yield
    set_lm_concurrency(DEFAULT_LM_CONCURRENCY)


def timed(name, limit, **params):
    """One question at the given limit on LM calls in flight: seconds, prediction, in-flight record, LM."""
    set_lm_concurrency(limit)
    flight = InFlight(answers)
    lm = scripted_lm(flight, logprobs=True, top_logprobs=5)
    program = build_program(name, TemplateRetriever(NUMBERED), **params)
    started = time.perf_counter()
    with dspy.context(lm=lm):
        prediction = program(question="Which river flows through Budapest?")
    return time.perf_counter() - started, prediction, flight, lm


@pytest.mark.parametrize("name, params, at_once", [
    ("crag", {"k": 5, "reasoning": "direct"}, 5),   # the 5 passages judged together
    ("self-rag", {"k": 4}, 4),                       # a candidate per passage, written together
])
def test_independent_calls_overlap_and_change_nothing_else(name, params, at_once):
    """(How much faster a question gets is benchmarks/latency.py's business; here, that calls overlap.)"""
    _, one_at_a_time, flight_1, lm_1 = timed(name, 1, **params)
    _, together, flight_n, lm_n = timed(name, 8, **params)
    assert flight_1.most == 1 and flight_n.most >= at_once
    assert lm_1.engine.count == lm_n.engine.count == one_at_a_time.lm_calls == together.lm_calls
    # the same steps, in the same order, with the same values
    assert together.trace == one_at_a_time.trace and together.answer == one_at_a_time.answer


def test_the_limit_bounds_the_calls_in_flight_across_questions():
    set_lm_concurrency(3)
    flight = InFlight(answers)
    lm = scripted_lm(flight, logprobs=True, top_logprobs=5)
    program = build_program("crag", TemplateRetriever(NUMBERED), k=5, reasoning="direct")

    def ask(question):
        with dspy.context(lm=lm):
            return program(question=question)

    threads = [threading.Thread(target=ask, args=(f"Question {i}?",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert flight.most == 3 and lm_concurrency() == 3


def test_fan_out_keeps_item_order_in_results_and_trace_and_raises_the_first_failure():
    def work(item):
        time.sleep(0.05 * (3 - item))  # the last item finishes first
        note(Beam(depth=item, kept=[], finished=[]))
        if item in (1, 2):
            raise ValueError(f"item {item}")
        return item * 10

    with recording() as trace:
        assert fan_out(lambda item: work(item) if item == 0 else item * 10, [0, 3, 4]) == [0, 30, 40]
        with pytest.raises(ValueError, match="item 1"):
            fan_out(work, [0, 1, 2])
    assert [step["depth"] for step in trace.steps] == [0, 0, 1, 2]


def test_a_bad_limit_is_refused():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigError, match="lm_concurrency"):
            set_lm_concurrency(bad)
