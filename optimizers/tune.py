"""Tuning a program's declared parameters (thresholds, k, query modes) with Optuna.

Each trial builds the program with suggested values and runs the dev set through the one
evaluation harness (`arag.evaluate.evaluate`), its rows kept under `out_dir/trials/STUDY/NNNN/`.

- Objectives: quality metrics (maximised) and costs per question (minimised): `lm_calls`, `tokens`,
  `prompt_tokens`, `completion_tokens`, `retrieval_calls`, `distinct_passages`. One objective gives
  a best trial; several give the Pareto front, each point written as a parameter file.
- Pruning (single objective only: Optuna cannot prune multi-objective studies): a trial runs the
  dev set in chunks and reports its score so far after each, so a median pruner stops bad trials.
- Cost: LM calls a trial repeats from an earlier trial are answered by DSPy's cache. A trial's
  *spent* LM calls are its calls minus its cache hits (counted at the cache itself); the report
  sets the study's spent calls against trials × one full pass. Cost objectives count every call,
  cached or not (a cached call's tokens are read from the cached response), so they measure the
  program, not the cache.
- Storage: a SQLite file `out_dir/study.db` by default; any SQLAlchemy URL (e.g. PostgreSQL)
  lets several processes or machines share one study. `trials` is the study's total: a rerun
  continues to it, and workers sharing a study stop at exactly that many finished trials.
- A cost ceiling: a new study's first trial is the default configuration (when it lies in the search
  space); a later trial whose LM calls per question pass `cost_ceiling` times the defaults' is pruned at its
  next chunk, so that `--search all` cannot make a trial run away with the budget.
- A trial whose every question fails (an unreachable or broken LM) stops the study with that error.
- Thread safety: Optuna's worker threads change DSPy settings only through `dspy.context`.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import logging
import math
import os
import re
import shutil
import socket
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import dspy
import optuna
import ujson
from dspy.utils.callback import BaseCallback
from optuna.trial import FrozenTrial, TrialState

from arag.data._io import atomic_writer, write_atomic
from arag.data.metrics import METRICS, default_metrics
from arag.errors import AragError, ConfigError, DataError, LMCallBudgetSpent
from arag.evaluate import evaluate
from arag.lm import require_lm
from arag.optimizers.saving import load_program
from arag.programs.frame.base import RAGProgram
from arag.programs.frame.params import Param, resolve_params
from arag.programs.frame.registry import build_program, get_program
from arag.retrievers.base import Retriever

logger = logging.getLogger(__name__)

COSTS = ("lm_calls", "tokens", "prompt_tokens", "completion_tokens", "retrieval_calls", "distinct_passages", "seconds")
_UNITS = {"lm_calls": "LM calls", "tokens": "tokens (in + out)", "prompt_tokens": "tokens in",
          "completion_tokens": "tokens out", "retrieval_calls": "retrievals", "distinct_passages": "distinct passages",
          "seconds": "seconds"}
PRUNERS = ("median", "hyperband", "none")
HEARTBEAT_S = 10
GRACE_PERIOD_S = 30
_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
_TAKEN = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
_LEDGER_SETTING = "arag_tuning_ledger"
_FACTS = "arag"
_ROLE = "arag_role"
DEFAULT_COST_CEILING = 3.0


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

    def value(self, ledger: _Ledger) -> float:
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


@dataclass
class TuneResult:
    """A study after tuning: its best trial (one objective) or Pareto front, cost and files."""

    study: optuna.Study
    storage: str
    objectives: list[Objective]
    best: dict[str, Any] | None
    pareto: list[dict[str, Any]]
    cost: dict[str, Any]
    files: dict[str, str]
    skipped_plots: dict[str, str]
    ran: list[int] = field(default_factory=list)


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


SEARCH_ALL = "all"


def search_space(
    program_name: str,
    *,
    fixed: Mapping[str, Any] | None = None,
    search: Sequence[str] | None = None,
    ranges: Mapping[str, Sequence[float]] | None = None,
) -> list[Param]:
    """The parameters Optuna varies, less the `fixed` ones: by default the program's thresholds and decision
    knobs (its `searched` parameters, over their search ranges); `search=["all"]` every tunable parameter over
    its valid range; else the named ones (`name` or `name=LOW:HIGH`). `ranges` ({name: (low, high)}) narrows
    numeric ranges within the declared bounds."""
    cls = get_program(program_name)
    declared = {p.name: p for p in cls.params}
    fixed = dict(fixed or {})
    ranges = dict(ranges or {})
    named = []
    for entry in search or ():
        name, equals, bounds = entry.partition("=")
        if equals:
            ranges[name] = tuple(bounds.split(":"))
        named.append(name)
    everything = named == [SEARCH_ALL]
    for name in [*(() if everything else named), *ranges]:
        if name not in declared:
            raise ConfigError(f"{program_name} has no parameter {name!r}; known: {', '.join(declared)}")
    if named and not everything:
        chosen = [declared[name] for name in dict.fromkeys(named)]
        both = [p.name for p in chosen if p.name in fixed]
        if both:
            raise ConfigError(f"parameter(s) {', '.join(both)} are both searched and fixed")
    elif everything:
        chosen = [p for p in cls.params if p.tunable and p.name not in fixed]
    else:
        chosen = [p for p in cls.params if p.searched and p.name not in fixed]
        chosen = [dataclasses.replace(p, low=p.search_range[0], high=p.search_range[1]) if p.search_range else p
                  for p in chosen]
    space = []
    for param in chosen:
        if param.name in ranges:
            param = _narrowed(declared[param.name], ranges[param.name], program_name)
        if param.choices is None and param.kind in (int, float) and (param.low is None or param.high is None):
            raise ConfigError(f"{program_name}: parameter {param.name!r} has no declared range; "
                              f"give one (--range {param.name}=LOW:HIGH) or fix it (--param {param.name}=VALUE)")
        space.append(param)
    for name in ranges:
        if name not in {p.name for p in space}:
            raise ConfigError(f"--range {name}: the parameter is not searched (it is fixed, or not searched by "
                              f"default: --search {name} searches it)")
    if not space:
        raise ConfigError(f"{program_name} has no parameter left to tune (searched by default: "
                          f"{', '.join(p.name for p in cls.params if p.searched) or 'none'}; tunable: "
                          f"{', '.join(p.name for p in cls.params if p.tunable) or 'none'}; fixed: "
                          f"{', '.join(fixed) or 'none'}); name some with --search NAME or --search all")
    return space


def tune(
    program_name: str,
    devset: Sequence[dspy.Example],
    retriever: Retriever | None,
    *,
    trials: int,
    out_dir: str | Path,
    objectives: Sequence[str] = ("f1",),
    storage: str | optuna.storages.BaseStorage | None = None,
    study_name: str | None = None,
    n_jobs: int = 1,
    compiled: str | Path | None = None,
    chunk_size: int | None = None,
    pruner: str = "median",
    seed: int | None = None,
    threads: int = 1,
    fixed: Mapping[str, Any] | None = None,
    search: Sequence[str] | None = None,
    ranges: Mapping[str, Sequence[float]] | None = None,
    lm: dspy.BaseLM | None = None,
    plots: bool = True,
    max_lm_calls: int | None = None,
    budget: int | None = None,
    cost_ceiling: float | None = DEFAULT_COST_CEILING,
) -> TuneResult:
    """Tune `program_name`'s parameters on `devset` until the study holds `trials` finished trials.

    `storage`: an SQLAlchemy URL (default `sqlite:///out_dir/study.db`) or an Optuna storage.
    `compiled`: a compiled-program file whose prompts every trial keeps. `fixed`: parameter values
    kept out of the search. `chunk_size`: examples between pruning checks (default: a quarter of
    the dev set). `seed`: the sampler's seed (give each worker of a shared study its own).
    `lm`: default `dspy.settings.lm`. `max_lm_calls`: each question's cap on LM calls (default: the
    program's own; 0: none), so that no trial's parameters can make a question run away. `budget`: LM calls
    the study may spend in all (this run's and earlier runs' trials); when spent, no further trial starts.
    `cost_ceiling`: the default configuration runs first, and a trial spending more than this many times its
    LM calls per question is pruned (None: neither).
    Writes best_params.json (or pareto.json), trials.csv, study.json and, with `plots`, HTML and PNG plots
    to `out_dir`.
    """
    goals = parse_objectives(objectives)
    _check_counts(trials=trials, n_jobs=n_jobs, threads=threads, chunk_size=chunk_size)
    if cost_ceiling is not None and not cost_ceiling > 1:
        raise ConfigError(f"cost_ceiling must be above 1 (a multiple of the defaults' LM calls), got {cost_ceiling!r}")
    if pruner not in PRUNERS:
        raise ConfigError(f"unknown pruner {pruner!r}; known: {', '.join(PRUNERS)}")
    if not devset:
        raise DataError("the dev set is empty")
    lm = lm or require_lm()
    validated = resolve_params(get_program(program_name).params, dict(fixed or {}), program_name)
    fixed = {name: validated[name] for name in fixed or {}}
    space = search_space(program_name, fixed=fixed, search=search, ranges=ranges)
    own_metrics = default_metrics(devset[0])
    for goal in goals:
        if goal.name in METRICS and goal.name not in own_metrics:
            logger.warning("objective %s is not among this dataset's metrics (%s)", goal.name, ", ".join(own_metrics))
    build = _program_builder(program_name, retriever, fixed, compiled)
    defaults = build({}).config
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    setup = {"program": program_name, "objectives": [g.name for g in goals], "devset": _fingerprint(devset),
             "space": [_describe(p) for p in space], "fixed": fixed,
             "compiled": _file_digest(compiled) if compiled else None}
    study, display = _open_study(
        storage or f"sqlite:///{(out_dir / 'study.db').resolve()}",
        study_name or "-".join([program_name, *setup["objectives"]]),
        goals, _pruner(pruner, len(goals), len(devset), chunk_size), seed, trials, setup,
    )
    if cost_ceiling is not None:
        _enqueue_defaults(study, space, defaults)
    objective = _Objective(
        build=build, space=space, goals=goals, devset=list(devset), budget=trials, threads=threads,
        ends=_chunk_ends(len(devset), chunk_size) if len(goals) == 1 or cost_ceiling else [len(devset)],
        metrics=list(dict.fromkeys([*(g.name for g in goals if g.name in METRICS), *own_metrics])),
        folder=out_dir / "trials" / re.sub(r"[^\w.-]", "_", study.study_name),
        settings={"lm": lm, "adapter": dspy.settings.adapter,
                  "callbacks": list(dspy.settings.get("callbacks") or [])},
        run_info={"program": program_name, "study": study.study_name},
        max_lm_calls=max_lm_calls,
        cost_ceiling=cost_ceiling,
        defaults=defaults,
    )
    finished = len(study.get_trials(deepcopy=False, states=_FINISHED))
    if finished >= trials:
        logger.info("study %s already holds %d finished trials (asked for %d)", study.study_name, finished, trials)
    else:
        with _counting_cache_hits(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
            stops = [_stop_at(trials), *([_stop_when_spent(budget)] if budget else [])]
            if budget and _cost_report(study)["lm_calls_spent"] >= budget:
                logger.warning("study %s has spent its budget of %d LM calls", study.study_name, budget)
            else:
                study.optimize(objective, n_jobs=n_jobs, catch=(_OverBudget,), callbacks=stops)
        finished = len(study.get_trials(deepcopy=False, states=_FINISHED))
        if finished < trials:
            running = len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
            logger.warning("study %s holds %d of %d finished trials; %d are still marked running (by other "
                           "workers, or by a stopped run: those fail after %d s without a heartbeat); "
                           "rerun to continue", study.study_name, finished, trials, running, GRACE_PERIOD_S)
    report = write_report(study, out_dir, goals, program_name, plots=plots)
    return TuneResult(study=study, storage=display, objectives=goals, ran=sorted(objective.ran), **report)


def write_report(study: optuna.Study, out_dir: str | Path, goals: Sequence[Objective], program_name: str,
                 *, plots: bool = True) -> dict[str, Any]:
    """trials.csv, study.json, best_params.json (one objective) or pareto.json and pareto/trial-N.json
    (several), and plots, from the study as it stands (whoever ran its trials)."""
    out_dir = Path(out_dir)
    files: dict[str, str] = {}
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    best = None
    pareto: list[dict[str, Any]] = []
    if complete and len(goals) == 1:
        best = _point(study.best_trial, goals, program_name, study.study_name)
        files["best_params"] = _write_json(out_dir / "best_params.json", best)
    elif complete:
        pareto = sorted((_point(t, goals, program_name, study.study_name) for t in study.best_trials),
                        key=lambda p: [(-1 if g.direction == "maximize" else 1) * p["values"][g.name] for g in goals])
        files["pareto"] = _write_json(out_dir / "pareto.json", pareto)
        for point in pareto:
            _write_json(out_dir / "pareto" / f"trial-{point['trial']}.json", point)
        files["best_params"] = _write_json(out_dir / "best_params.json", pareto[0])
    cost = _cost_report(study)
    files["trials"] = _write_trials_csv(out_dir / "trials.csv", study, goals)
    skipped: dict[str, str] = {}
    if plots:
        written, skipped = _write_plots(study, goals, out_dir / "plots")
        files.update(written)
    summary = {
        "study": study.study_name,
        "program": program_name,
        "objectives": {g.name: g.direction for g in goals},
        "trials": {state.name.lower(): len(study.get_trials(deepcopy=False, states=(state,)))
                   for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)},
        "best": best,
        "pareto": pareto,
        "cost": cost,
        "plots_skipped": skipped,
    }
    files["study"] = _write_json(out_dir / "study.json", summary)
    return {"best": best, "pareto": pareto, "cost": cost, "files": files, "skipped_plots": skipped}


# ---------------------------------------------------------------- trials and their cost


@dataclass
class _Objective:
    """One trial: claim a place in the budget, build the program with suggested values, run the dev
    set in chunks (reporting the score so far for pruning), and record the trial's counts."""

    build: Callable[[Mapping[str, Any]], RAGProgram]
    space: list[Param]
    goals: list[Objective]
    devset: list[dspy.Example]
    budget: int
    threads: int
    ends: list[int]
    metrics: list[str]
    folder: Path
    settings: dict[str, Any]
    run_info: dict[str, Any]
    max_lm_calls: int | None = None
    cost_ceiling: float | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    ran: list[int] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, trial: optuna.Trial) -> float | tuple[float, ...]:
        _claim_within_budget(trial, self.budget)
        with self._lock:
            self.ran.append(trial.number)
        params: dict[str, Any] = {}
        for param in self.space:
            params[param.name] = param.suggest(trial, {**self.defaults, **params})
        facts: dict[str, Any] = {"worker": f"{socket.gethostname()}:{os.getpid()}"}
        try:
            program = self.build(params)
        except ConfigError as exc:
            trial.set_user_attr(_FACTS, {**facts, "note": f"infeasible: {exc}"})
            raise optuna.TrialPruned(f"infeasible parameters: {exc}") from None
        facts["config"] = program.config
        trial.set_user_attr(_FACTS, facts)
        ledger = _Ledger()
        try:
            self._run(trial, program, ledger)
        except optuna.TrialPruned as pruned:
            facts["note"] = str(pruned)
            raise
        finally:
            trial.set_user_attr(_FACTS, {**facts, **ledger.counts()})
        values = tuple(goal.value(ledger) for goal in self.goals)
        logger.info("trial %d: %s with %s (%d LM calls, %d spent)", trial.number,
                    ", ".join(f"{g.name}={v:.4g}" for g, v in zip(self.goals, values)), params,
                    ledger.summary["totals"]["lm_calls"], ledger.spent)
        return values[0] if len(values) == 1 else values

    def _run(self, trial: optuna.Trial, program: RAGProgram, ledger: _Ledger) -> None:
        """Run the dev set chunk by chunk, keeping the summary of the rows so far in `ledger`. DSPy
        settings change only through dspy.context, so Optuna's worker threads stay independent."""
        folder = self.folder / f"{trial.number:04d}"
        if folder.exists():  # left by a deleted study of the same name: Optuna never reruns a trial number
            shutil.rmtree(folder)
        run_info = {**self.run_info, "params": program.config, "trial": trial.number}
        callbacks = [*self.settings["callbacks"], _CallCounter(ledger)]
        with dspy.context(**{**self.settings, "callbacks": callbacks, _LEDGER_SETTING: ledger}):
            for end in self.ends:
                result = evaluate(program, self.devset[:end], out_dir=folder, threads=self.threads,
                                  metrics=self.metrics, run_info=run_info, progress=False,
                                  max_lm_calls=self.max_lm_calls, max_errors=None)
                ledger.summary = result.summary
                if result.summary["n_failed"] == result.summary["n"]:
                    if set(result.summary["failures"]) == {LMCallBudgetSpent.__name__}:
                        raise optuna.TrialPruned(f"every question reached its cap on LM calls after {end} examples")
                    error = next(row["error"] for row in reversed(result.rows) if "error" in row)
                    raise AragError(f"trial {trial.number}: every question failed (rows in {folder}); "
                                    f"the last error: {error.splitlines()[0]}")
                self._check_cost(trial, result.summary, end)
                if len(self.goals) == 1 and end < len(self.devset):
                    trial.report(self.goals[0].value(ledger), end)
                    if trial.should_prune():
                        raise optuna.TrialPruned(f"pruned after {end} examples")

    def _check_cost(self, trial: optuna.Trial, summary: Mapping[str, Any], end: int) -> None:
        """Prune the trial when its LM calls per question so far pass the ceiling over the defaults'."""
        if self.cost_ceiling is None or trial.user_attrs.get(_ROLE) == "defaults":
            return
        reference = _defaults_calls_per_question(trial.study)
        calls = summary["per_question"]["lm_calls"]
        if reference and calls > self.cost_ceiling * reference:
            reason = (f"cost: {calls:.1f} LM calls per question after {end} examples, over {self.cost_ceiling:g} x "
                      f"the default configuration's {reference:.1f}")
            raise optuna.TrialPruned(reason)


def _enqueue_defaults(study: optuna.Study, space: Sequence[Param], defaults: Mapping[str, Any]) -> None:
    """Queue the default configuration as the study's next trial, unless it has one (run, running or queued) or
    a default lies outside the searched ranges. A defaults trial killed mid-run is queued again."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    states = (*_TAKEN, TrialState.WAITING)
    if any(t.user_attrs.get(_ROLE) == "defaults" for t in study.get_trials(deepcopy=False, states=states)):
        return
    params = {p.name: defaults[p.name] for p in space}
    outside = [p.name for p in space if not p.admits(params[p.name])]
    if outside:
        logger.info("no cost ceiling: the default %s lies outside the searched range", ", ".join(outside))
        return
    study.enqueue_trial(params, user_attrs={_ROLE: "defaults"})


def _defaults_calls_per_question(study: optuna.Study) -> float | None:
    """LM calls per question of the study's completed defaults trial, if it has one."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        facts = _facts(t)
        if t.user_attrs.get(_ROLE) == "defaults" and facts.get("examples"):
            return facts["lm_calls"] / facts["examples"]
    return None


class _OverBudget(Exception):
    """Raised in a trial created after the study's budget was taken by other workers; it never runs."""


class _Ledger:
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

    def called(self) -> None:
        with self._lock:
            self.calls += 1

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

    def hit(self, usage: Mapping[str, Any]) -> None:
        with self._lock:
            self.cache_hits += 1
            self.cached_prompt_tokens += int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0)
            self.cached_completion_tokens += int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)


class _CallCounter(BaseCallback):
    def __init__(self, ledger: _Ledger) -> None:
        self.ledger = ledger

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self.ledger.called()


class _HitCountingCache:
    """DSPy's cache while tuning: each hit is charged to the ledger of the trial whose call it answered."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def get(self, *args: Any, **kwargs: Any) -> Any:
        record = self.inner.get(*args, **kwargs)
        ledger = dspy.settings.get(_LEDGER_SETTING)
        if record is not None and ledger is not None:
            ledger.hit((record.get("usage") or {}) if isinstance(record, dict) else {})
        return record

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


_hit_counting = {"users": 0, "lock": threading.Lock()}


@contextmanager
def _counting_cache_hits() -> Iterator[None]:
    """Wrap `dspy.cache` while any tuning runs in this process (studies in several threads share it)."""
    with _hit_counting["lock"]:
        if _hit_counting["users"] == 0:
            dspy.cache = _HitCountingCache(dspy.cache)
        _hit_counting["users"] += 1
    try:
        yield
    finally:
        with _hit_counting["lock"]:
            _hit_counting["users"] -= 1
            if _hit_counting["users"] == 0 and isinstance(dspy.cache, _HitCountingCache):
                dspy.cache = dspy.cache.inner


def _facts(trial: FrozenTrial) -> dict[str, Any]:
    """What a trial recorded about itself: worker, configuration, counts, and a note if it did not run."""
    return trial.user_attrs.get(_FACTS, {})


def _claim_within_budget(trial: optuna.Trial, budget: int) -> None:
    """Trial numbers are given out atomically: a trial runs only if fewer than `budget` trials
    numbered before it are finished or running."""
    ahead = sum(1 for t in trial.study.get_trials(deepcopy=False, states=_TAKEN) if t.number < trial.number)
    if ahead >= budget:
        trial.set_user_attr(_FACTS, {"note": "over budget: not run"})
        trial.study.stop()
        raise _OverBudget(f"the study already has its {budget} trials; trial {trial.number} was not run")


def _stop_at(budget: int) -> Callable[[optuna.Study, FrozenTrial], None]:
    def stop(study: optuna.Study, _: FrozenTrial) -> None:
        if len(study.get_trials(deepcopy=False, states=_TAKEN)) >= budget:
            study.stop()

    return stop


def _stop_when_spent(budget: int) -> Callable[[optuna.Study, FrozenTrial], None]:
    """Stop the study once its trials have spent `budget` LM calls (the trial running then still finishes)."""
    def stop(study: optuna.Study, _: FrozenTrial) -> None:
        if _cost_report(study)["lm_calls_spent"] >= budget:
            logger.warning("study %s has spent its budget of %d LM calls: no further trial", study.study_name, budget)
            study.stop()

    return stop


def _cost_report(study: optuna.Study) -> dict[str, Any]:
    """LM calls spent by the study's trials against as many full passes over the dev set."""
    trials = [t for t in study.get_trials(deepcopy=False) if "lm_calls_spent" in _facts(t)]
    finished = [t for t in trials if t.state in _FINISHED]
    passes = [_facts(t)["lm_calls"] for t in finished if t.state == TrialState.COMPLETE]
    spent = sum(_facts(t)["lm_calls_spent"] for t in trials)
    one_pass = sum(passes) / len(passes) if passes else None
    report: dict[str, Any] = {
        "trials": len(finished),
        "lm_calls_spent": spent,
        "one_pass_lm_calls": one_pass,
        "per_trial": [{"trial": t.number, "state": t.state.name.lower(), "examples": _facts(t).get("examples", 0),
                       "lm_calls": _facts(t).get("lm_calls", 0), "spent": _facts(t)["lm_calls_spent"],
                       "cache_hits": _facts(t)["cache_hits"]} for t in trials],
    }
    if one_pass:
        report["trials_x_one_pass"] = len(finished) * one_pass
        report["spent_over_trials_x_one_pass"] = spent / (len(finished) * one_pass)
        report["passes_spent"] = spent / one_pass
    return report


def _point(trial: FrozenTrial, goals: Sequence[Objective], program_name: str, study_name: str) -> dict[str, Any]:
    """A trial as a parameter file `arag eval --params-file` reads: `params` is the whole configuration."""
    return {
        "program": program_name,
        "params": _facts(trial).get("config", trial.params),
        "values": dict(zip((g.name for g in goals), trial.values)),
        "trial": trial.number,
        "study": study_name,
    }


# ---------------------------------------------------------------- the study


def _open_study(storage: str | optuna.storages.BaseStorage, name: str, goals: Sequence[Objective],
                pruner: optuna.pruners.BasePruner, seed: int | None, trials: int,
                setup: dict[str, Any]) -> tuple[optuna.Study, str]:
    """Create or continue the study; a ConfigError when it was made with other settings."""
    if isinstance(storage, str):
        display = _display_url(storage)
        storage = _rdb_storage(storage, display)
    else:
        display = type(storage).__name__
    sampler = _ReproducibleTPESampler(seed=seed, n_startup_trials=min(10, max(2, trials // 3)), constant_liar=True)
    try:
        study = optuna.create_study(storage=storage, study_name=name, load_if_exists=True, sampler=sampler,
                                    pruner=pruner, directions=[g.direction for g in goals])
    except ValueError as exc:
        raise ConfigError(f"study {name!r} in {display}: {exc}; use another --study") from None
    previous = study.user_attrs.get("arag")
    if previous is None:
        study.set_user_attr("arag", setup)
    else:
        changed = sorted(k for k in set(previous) | set(setup) if previous.get(k) != setup.get(k))
        if changed:
            raise ConfigError(f"study {name!r} in {display} was made with other settings ({', '.join(changed)}); "
                              "use another --study, or the same settings to continue it")
    return study, display


class _ReproducibleTPESampler(optuna.samplers.TPESampler):
    """TPE whose random draws for a trial depend only on the seed and the trials finished before it, so that a
    study stopped and continued (a new sampler, a killed trial left failed) proposes what an uninterrupted one
    would have. (Optuna's own seeded sampler restarts its random stream on every run.) One worker only: with
    several, the order in which trials finish differs from run to run anyway."""

    def __init__(self, *, seed: int | None, **options: Any) -> None:
        super().__init__(seed=seed, **options)
        self._seed = seed

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        super().before_trial(study, trial)
        if self._seed is None:
            return
        finished = len(study.get_trials(deepcopy=False, states=_FINISHED))
        draw_seed = (self._seed * 1_000_003 + finished) % 2**32
        # Optuna keeps no public way to set a sampler's random state; both of TPE's generators are reseeded.
        self._rng.rng.seed(draw_seed)
        self._random_sampler._rng.rng.seed(draw_seed)


def _rdb_storage(url: str, display: str) -> optuna.storages.RDBStorage:
    """An RDB storage with heartbeats, so trials of a killed worker are failed, not counted as running."""
    from sqlalchemy.exc import SQLAlchemyError

    url = rdb_url(url)
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    for attempt in range(3):
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=HEARTBEAT_S,
                                                     grace_period=GRACE_PERIOD_S)
            if url.startswith("sqlite"):
                _write_ahead_log(storage.engine)
            return storage
        except SQLAlchemyError as exc:
            if attempt == 2:
                raise ConfigError(f"cannot open the study storage {display}: {exc}") from None
            time.sleep(0.5 + attempt)  # workers starting together may race to create the tables
        except (ValueError, ImportError, ModuleNotFoundError) as exc:
            raise ConfigError(f"cannot open the study storage {display}: {exc}") from None
    raise AssertionError("unreachable")


def _write_ahead_log(engine: Any) -> None:
    """SQLite in write-ahead-log mode without a disk flush per commit: readers and a writer no longer
    block each other (threads and processes sharing the file), and a trial costs far less time.
    A crash can lose the last commits, never corrupt the file."""
    from sqlalchemy import event

    def on_connect(connection: Any, _: Any) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    event.listen(engine, "connect", on_connect)
    engine.dispose()


def rdb_url(url: str) -> str:
    """`url` with a database driver installed here: `postgresql://` means psycopg 3 when psycopg2 is absent."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme in ("postgresql", "postgres"):
        import importlib.util

        if importlib.util.find_spec("psycopg2") is None and importlib.util.find_spec("psycopg") is not None:
            return f"postgresql+psycopg://{rest}"
        return f"postgresql://{rest}"
    return url


def _display_url(url: str) -> str:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        raise ConfigError(f"--storage {url.split('@')[-1]!r} is not a database URL, e.g. "
                          "sqlite:///study.db or postgresql://user@host:5432/db") from None


def _pruner(name: str, n_objectives: int, n_examples: int, chunk_size: int | None) -> optuna.pruners.BasePruner:
    if name == "none" or n_objectives > 1:
        if name != "none":
            logger.info("pruning is off: Optuna cannot prune multi-objective studies")
        return optuna.pruners.NopPruner()
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=5)
    step = _chunk_ends(n_examples, chunk_size)[0]
    return optuna.pruners.HyperbandPruner(min_resource=step, max_resource=n_examples)


def _program_builder(program_name: str, retriever: Retriever | None, fixed: Mapping[str, Any],
                     compiled: str | Path | None) -> Callable[[Mapping[str, Any]], RAGProgram]:
    def build(params: Mapping[str, Any]) -> RAGProgram:
        values = {**fixed, **params}
        if compiled:
            return load_program(compiled, retriever, program=program_name, params=values)
        return build_program(program_name, retriever, **values)

    return build


def _chunk_ends(n: int, chunk_size: int | None) -> list[int]:
    size = chunk_size or max(1, math.ceil(n / 4))
    return [*range(size, n, size), n]


def _check_counts(**counts: int | None) -> None:
    for name, value in counts.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _describe(param: Param) -> dict[str, Any]:
    return {"name": param.name, "low": param.low, "high": param.high,
            "choices": list(param.choices) if param.choices is not None else None, "log": param.log}


def _narrowed(param: Param, bounds: Sequence[float], program_name: str) -> Param:
    if param.choices is not None or param.kind not in (int, float):
        raise ConfigError(f"--range {param.name}: only numeric parameters take a range")
    if len(bounds) != 2:
        raise ConfigError(f"--range {param.name}: give LOW:HIGH, got {bounds!r}")
    low, high = (param.validate(bound, program_name) for bound in bounds)
    if low > high:
        raise ConfigError(f"--range {param.name}: low {low} is above high {high}")
    return dataclasses.replace(param, low=low, high=high)


def _fingerprint(devset: Sequence[dspy.Example]) -> str:
    digest = hashlib.sha256()
    for example in devset:
        digest.update(f"{example.id}\x1f{example.question}\x1e".encode())
    return f"{len(devset)}:{digest.hexdigest()[:16]}"


def _file_digest(path: str | Path) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such compiled program file") from None


# ---------------------------------------------------------------- files


def _write_json(path: Path, data: Any) -> str:
    write_atomic(path, ujson.dumps(data, indent=2, ensure_ascii=False))
    return str(path)


def _write_trials_csv(path: Path, study: optuna.Study, goals: Sequence[Objective]) -> str:
    trials = study.get_trials(deepcopy=False)
    params = sorted({name for t in trials for name in t.params})
    metrics = sorted({name for t in trials for name in _facts(t).get("metrics", {})})
    counts = {"examples": "examples", "failed_examples": "failed_examples", "lm_calls": "total_lm_calls",
              "lm_calls_spent": "lm_calls_spent", "cache_hits": "cache_hits", "tokens": "total_tokens",
              "retrievals_per_question": "retrievals_per_question"}
    header = ["trial", "state", *(g.name for g in goals), *params, *(f"mean_{m}" for m in metrics),
              *counts.values(), "duration_s", "worker", "note"]
    with atomic_writer(path, newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for t in trials:
            values = list(t.values) if t.values else [None] * len(goals)
            facts = _facts(t)
            duration = t.duration.total_seconds() if t.duration else None
            writer.writerow([t.number, t.state.name.lower(), *values, *(t.params.get(p) for p in params),
                             *(facts.get("metrics", {}).get(m) for m in metrics), *(facts.get(c) for c in counts),
                             duration, facts.get("worker"), facts.get("note", "")])
    return str(path)


def _write_plots(study: optuna.Study, goals: Sequence[Objective],
                 folder: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Optimisation history, parameter importances, each objective against each parameter (slice),
    quality against retrievals per question (FLARE's Figure 5) and, with several objectives, the
    Pareto front; each as HTML (plotly) and PNG (matplotlib). A plot that cannot be drawn is
    skipped with its reason."""
    try:
        import matplotlib
        import plotly  # noqa: F401
    except ImportError as exc:
        return {}, {"all": f"plots need plotly and matplotlib ({exc.name} is missing): pip install plotly matplotlib"}
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna import visualization as html
    from optuna.visualization import matplotlib as png

    folder.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}
    skipped: dict[str, str] = {}
    multi = len(goals) > 1
    charts: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = []
    for index, goal in enumerate(goals):
        target = (lambda t, i=index: t.values[i]) if multi else None
        named = {"target": target, "target_name": goal.label}
        suffix = f"-{goal.name}" if multi else ""
        charts += [
            (f"history{suffix}", lambda n=named: html.plot_optimization_history(study, **n),
             lambda n=named: png.plot_optimization_history(study, **n)),
            (f"importances{suffix}", lambda n=named: html.plot_param_importances(study, **n),
             lambda n=named: png.plot_param_importances(study, **n)),
            (f"slice{suffix}", lambda n=named: html.plot_slice(study, **n),
             lambda n=named: png.plot_slice(study, **n)),
        ]
        if goal.name in METRICS:
            charts.append((f"retrieval-rate{suffix}", lambda i=index, g=goal: _retrieval_rate_html(study, i, g),
                           lambda i=index, g=goal: _retrieval_rate_png(study, i, g)))
    if multi:
        names = [g.label for g in goals]
        charts.append(("pareto", lambda: html.plot_pareto_front(study, target_names=names),
                       lambda: png.plot_pareto_front(study, target_names=names)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, draw_html, draw_png in charts:
            try:
                draw_html().write_html(folder / f"{name}.html", include_plotlyjs="cdn")
                drawn = draw_png()
                figure = _figure_of(drawn)
                figure.savefig(folder / f"{name}.png", dpi=110, bbox_inches="tight")
                plt.close(figure)
            except Exception as exc:  # noqa: BLE001 — a plot that cannot be drawn is reported, the study stands
                skipped[name] = f"{type(exc).__name__}: {exc}"
                plt.close("all")
                continue
            written[f"plot:{name}"] = str(folder / f"{name}.html")
    for name, reason in skipped.items():
        logger.info("plot %s skipped: %s", name, reason)
    return written, skipped


def _figure_of(drawn: Any) -> Any:
    first = drawn.flat[0] if hasattr(drawn, "flat") else drawn
    return first.figure


def _retrieval_points(study: optuna.Study, index: int) -> list[tuple[float, float, int, dict[str, Any]]]:
    points = [(_facts(t)["retrievals_per_question"], t.values[index], t.number, t.params)
              for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if "retrievals_per_question" in _facts(t)]
    if not points:
        raise ValueError("no complete trial to plot")
    return points


def _retrieval_rate_html(study: optuna.Study, index: int, goal: Objective) -> Any:
    import plotly.graph_objects as go

    points = _retrieval_points(study, index)
    figure = go.Figure(go.Scatter(
        x=[p[0] for p in points], y=[p[1] for p in points], mode="markers",
        marker={"color": [p[2] for p in points], "colorscale": "Blues", "showscale": True,
                "colorbar": {"title": "trial"}},
        text=[f"trial {p[2]}: {p[3]}" for p in points], hoverinfo="text+x+y"))
    figure.update_layout(title=f"{goal.name} against retrieval rate", xaxis_title="retrievals per question",
                         yaxis_title=goal.label)
    return figure


def _retrieval_rate_png(study: optuna.Study, index: int, goal: Objective) -> Any:
    import matplotlib.pyplot as plt

    points = _retrieval_points(study, index)
    figure, axes = plt.subplots(figsize=(6, 4))
    dots = axes.scatter([p[0] for p in points], [p[1] for p in points], c=[p[2] for p in points], cmap="Blues",
                        edgecolors="grey")
    figure.colorbar(dots, ax=axes, label="trial")
    axes.set(title=f"{goal.name} against retrieval rate", xlabel="retrievals per question", ylabel=goal.label)
    return axes
