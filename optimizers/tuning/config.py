"""What a tuning run is asked to do: the parameters it varies (`SearchSpace`) and how its study runs
(`TuningConfig`), each checked when made.

Words: `trials` counts a study's trials; `max_lm_calls` caps one question's LM calls (as in `evaluate`);
`max_study_lm_calls` caps the LM calls the whole study spends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import optuna

from arag.errors import ConfigError
from arag.optimizers.tuning.objectives import Objective, parse_objectives
from arag.optimizers.tuning.study import PRUNERS

DEFAULT_COST_CEILING = 3.0


@dataclass(frozen=True)
class SearchSpace:
    """The declared parameters a study varies, and those it holds.

    `names`: the parameters searched; none named, the program's thresholds and decision knobs (its `searched`
    parameters, over their search ranges), or with `every_tunable` every tunable parameter over its valid range.
    `ranges` ({name: (low, high)}) narrows numeric ranges within the declared bounds. `fixed` ({name: value})
    holds parameters out of the search."""

    names: tuple[str, ...] = ()
    every_tunable: bool = False
    ranges: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)
    fixed: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", tuple(self.names))
        if self.names and self.every_tunable:
            raise ConfigError("search the named parameters or every tunable one, not both")


@dataclass(frozen=True)
class TuningConfig:
    """A tuning run: `trials` finished (complete or pruned) trials in the study, a rerun continuing to it, and
    their files under `out_dir`.

    - `objectives`: quality metrics (maximised) and costs per question (minimised), by name; `space`: what varies;
      `compiled`: a compiled-program file whose prompts every trial keeps.
    - `storage`: an SQLAlchemy URL (default `sqlite:///out_dir/study.db`) or an Optuna storage; `study_name`
      (default: the program and objectives); `seed`: the sampler's (give each worker of a shared study its own);
      `pruner`: one of PRUNERS; `chunk_size`: examples between pruning checks (default: a quarter of the dev set).
    - `n_jobs`: trials at once in this process; `threads`: examples at once in a trial.
    - `max_lm_calls`: each question's cap (default: the program's own; 0: none), so that no trial's parameters make
      a question run away; `max_study_lm_calls`: LM calls the study may spend in all (earlier runs' included),
      no trial starting once spent; `cost_ceiling`: the default configuration runs first, and a trial spending
      more than this many times its LM calls per question is pruned (None: neither).
    - `plots`: HTML and PNG plots beside the files.
    """

    trials: int
    out_dir: str | Path
    objectives: tuple[str, ...] = ("f1",)
    space: SearchSpace = field(default_factory=SearchSpace)
    compiled: str | Path | None = None
    storage: str | optuna.storages.BaseStorage | None = None
    study_name: str | None = None
    seed: int | None = None
    pruner: str = "median"
    chunk_size: int | None = None
    n_jobs: int = 1
    threads: int = 1
    max_lm_calls: int | None = None
    max_study_lm_calls: int | None = None
    cost_ceiling: float | None = DEFAULT_COST_CEILING
    plots: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "objectives", tuple(self.objectives))
        parse_objectives(self.objectives)
        _check_counts(trials=self.trials, n_jobs=self.n_jobs, threads=self.threads, chunk_size=self.chunk_size)
        if self.cost_ceiling is not None and not self.cost_ceiling > 1:
            raise ConfigError(f"cost_ceiling must be above 1 (a multiple of the defaults' LM calls), "
                              f"got {self.cost_ceiling!r}")
        if self.pruner not in PRUNERS:
            raise ConfigError(f"unknown pruner {self.pruner!r}; known: {', '.join(PRUNERS)}")

    @property
    def goals(self) -> list[Objective]:
        """The objectives, parsed."""
        return parse_objectives(self.objectives)


def _check_counts(**counts: int | None) -> None:
    for name, value in counts.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
