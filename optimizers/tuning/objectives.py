"""What tuning optimises: quality metrics (maximised) and costs per question (minimised)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from arag.data.metrics import METRICS
from arag.errors import ConfigError
from arag.optimizers.tuning.cost import Ledger

COSTS = ("lm_calls", "tokens", "prompt_tokens", "completion_tokens", "retrieval_calls", "distinct_passages", "seconds")
_UNITS = {"lm_calls": "LM calls", "tokens": "tokens (in + out)", "prompt_tokens": "tokens in",
          "completion_tokens": "tokens out", "retrieval_calls": "retrievals", "distinct_passages": "distinct passages",
          "seconds": "seconds"}


@dataclass(frozen=True)
class Objective:
    """A quality metric (maximised) or a cost per question (minimised)."""

    name: str

    @property
    def direction(self) -> str:
        return "maximize" if self.name in METRICS else "minimize"

    @property
    def label(self) -> str:
        """An axis title with the unit: 'f1 (mean over questions)', 'LM calls per question'."""
        return f"{self.name} (mean over questions)" if self.name in METRICS else f"{_UNITS[self.name]} per question"

    def value(self, ledger: Ledger) -> float:
        """This objective over a trial's rows so far; costs count cached calls too."""
        summary = ledger.summary
        if self.name in METRICS:
            return float(summary["metrics"].get(self.name, 0.0))
        if self.name == "seconds":
            return float(summary["seconds_per_question"])
        totals, n = summary["totals"], max(summary["n"], 1)
        cached = {"prompt_tokens": ledger.cached_prompt_tokens, "completion_tokens": ledger.cached_completion_tokens}
        if self.name == "tokens":
            total = totals["prompt_tokens"] + totals["completion_tokens"] + sum(cached.values())
        else:
            total = totals[self.name] + cached.get(self.name, 0)
        return total / n


def parse_objectives(names: Sequence[str]) -> list[Objective]:
    """Objectives by name; a ConfigError for unknown or repeated names."""
    if not names:
        raise ConfigError("give at least one objective, e.g. f1")
    known = [*METRICS, *COSTS]
    for name in names:
        if name not in known:
            raise ConfigError(f"unknown objective {name!r}; known: {', '.join(known)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"objectives must differ, got {list(names)}")
    return [Objective(name) for name in names]
