"""What tuning costs: each trial's LM calls and the cache hits among them, and the study's spending.

A trial's *spent* LM calls are its calls minus its cache hits. Hits are counted at DSPy's cache itself.
Calls are counted here as they start rather than read from the evaluation summary: the summary keeps only
each question's last attempt, and a question that failed in one chunk of the dev set is asked again in the
next, so its failed attempts' calls (which did reach the LM) would go uncounted.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Mapping, Sequence

import optuna
from dspy.utils.callback import BaseCallback
from optuna.trial import FrozenTrial, TrialState

from arag.optimizers.tuning.study import FINISHED, trial_facts
from arag.trace.recorder import CACHE_HIT_LISTENER

logger = logging.getLogger(__name__)


class Ledger:
    """One trial's LM calls, the cache hits among them (with the tokens those first cost), and the
    summary of its rows so far."""

    def __init__(self) -> None:
        self.summary: dict[str, Any] | None = None
        self.calls = 0
        self.cache_hits = 0
        self.cached_prompt_tokens = 0
        self.cached_completion_tokens = 0
        self._lock = threading.Lock()

    @property
    def spent(self) -> int:
        """Calls that reached the LM."""
        return self.calls - self.cache_hits

    def settings(self, callbacks: Sequence[BaseCallback]) -> dict[str, Any]:
        """DSPy settings under which LM calls and cache hits (while `reporting_cache_hits()` is in force) are charged
        to this ledger: `callbacks` and its own."""
        return {"callbacks": [*callbacks, _CallCounter(self)], CACHE_HIT_LISTENER: self._hit}

    def counts(self) -> dict[str, Any]:
        """What the trial recorded about itself, whether it completed, was pruned or failed."""
        counts: dict[str, Any] = {"lm_calls_spent": self.spent, "cache_hits": self.cache_hits}
        if self.summary is not None:
            totals = self.summary["totals"]
            counts.update(
                examples=self.summary["n"],
                failed_examples=self.summary["n_failed"],
                lm_calls=totals["lm_calls"],
                tokens=totals["prompt_tokens"] + totals["completion_tokens"]
                + self.cached_prompt_tokens + self.cached_completion_tokens,
                retrievals_per_question=self.summary["per_question"]["retrieval_calls"],
                metrics=self.summary["metrics"],
            )
        return counts

    def _called(self) -> None:
        with self._lock:
            self.calls += 1

    def _hit(self, usage: Mapping[str, Any]) -> None:
        with self._lock:
            self.cache_hits += 1
            self.cached_prompt_tokens += int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0)
            self.cached_completion_tokens += int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)


class _CallCounter(BaseCallback):
    """Counts every LM call as it starts, whether the cache answers it or not."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self.ledger._called()


def cost_report(study: optuna.Study) -> dict[str, Any]:
    """LM calls spent by the study's trials against as many full passes over the dev set."""
    trials = [t for t in study.get_trials(deepcopy=False) if "lm_calls_spent" in trial_facts(t)]
    finished = [t for t in trials if t.state in FINISHED]
    passes = [trial_facts(t)["lm_calls"] for t in finished if t.state == TrialState.COMPLETE]
    spent = sum(trial_facts(t)["lm_calls_spent"] for t in trials)
    one_pass = sum(passes) / len(passes) if passes else None
    report: dict[str, Any] = {
        "trials": len(finished),
        "lm_calls_spent": spent,
        "one_pass_lm_calls": one_pass,
        "per_trial": [{"trial": t.number, "state": t.state.name.lower(), "examples": trial_facts(t).get("examples", 0),
                       "lm_calls": trial_facts(t).get("lm_calls", 0), "spent": trial_facts(t)["lm_calls_spent"],
                       "cache_hits": trial_facts(t)["cache_hits"]} for t in trials],
    }
    if one_pass:
        report["trials_x_one_pass"] = len(finished) * one_pass
        report["spent_over_trials_x_one_pass"] = spent / (len(finished) * one_pass)
        report["passes_spent"] = spent / one_pass
    return report


def stop_when_spent(max_study_lm_calls: int) -> Callable[[optuna.Study, FrozenTrial], None]:
    """Stop the study once its trials have spent `max_study_lm_calls` LM calls (the trial running then still
    finishes)."""
    def stop(study: optuna.Study, _: FrozenTrial) -> None:
        if cost_report(study)["lm_calls_spent"] >= max_study_lm_calls:
            logger.warning("study %s has spent the %d LM calls it may spend: no further trial", study.study_name,
                           max_study_lm_calls)
            study.stop()

    return stop
