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

This module runs the trials; beside it are the objectives (`tuning_objectives`), the cost ledger
(`tuning_cost`), the study's storage, sampler and pruner (`tuning_study`) and the files (`tuning_report`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import re
import shutil
import socket
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import dspy
import optuna
from optuna.trial import FrozenTrial, TrialState

from arag.data._io import check_output_folder
from arag.data.metrics import METRICS, default_metrics
from arag.errors import AragError, ConfigError, DataError, LMCallBudgetSpent
from arag.evaluate import evaluate
from arag.lm import require_lm
from arag.optimizers.saving import load_program
from arag.optimizers.tuning_cost import Ledger, cost_report, counting_cache_hits, stop_when_spent
from arag.optimizers.tuning_objectives import Objective, parse_objectives
from arag.optimizers.tuning_report import write_report
from arag.optimizers.tuning_study import FACTS, FINISHED, PRUNERS, open_study, rdb_url, study_pruner, trial_facts
from arag.programs.frame.base import RAGProgram
from arag.programs.frame.params import Param, resolve_params
from arag.programs.frame.registry import build_program, get_program
from arag.retrievers.base import Retriever

__all__ = ["Objective", "TuneResult", "parse_objectives", "rdb_url", "search_space", "tune", "write_report"]

logger = logging.getLogger(__name__)

HEARTBEAT_S = 10
GRACE_PERIOD_S = 30
DEFAULT_COST_CEILING = 3.0
SEARCH_ALL = "all"
_TAKEN = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
_ROLE = "arag_role"


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
    out_dir = check_output_folder(out_dir)
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
    out_dir.mkdir(parents=True, exist_ok=True)
    setup = {"program": program_name, "objectives": [g.name for g in goals], "devset": _fingerprint(devset),
             "space": [_describe(p) for p in space], "fixed": fixed,
             "compiled": _file_digest(compiled) if compiled else None}
    chunk_ends = _chunk_ends(len(devset), chunk_size)
    study, display = open_study(
        storage or f"sqlite:///{(out_dir / 'study.db').resolve()}",
        study_name or "-".join([program_name, *setup["objectives"]]),
        [g.direction for g in goals], study_pruner(pruner, len(goals), chunk_ends), seed, trials, setup,
        heartbeat_s=HEARTBEAT_S, grace_period_s=GRACE_PERIOD_S,
    )
    defaults_waiting = cost_ceiling is not None and _enqueue_defaults(study, space, defaults)
    objective = _TrialObjective(
        build=build, space=space, goals=goals, devset=list(devset), budget=trials, threads=threads,
        ends=chunk_ends if len(goals) == 1 or cost_ceiling else [len(devset)],
        metrics=list(dict.fromkeys([*(g.name for g in goals if g.name in METRICS), *own_metrics])),
        folder=out_dir / "trials" / re.sub(r"[^\w.-]", "_", study.study_name),
        settings={"lm": lm, "adapter": dspy.settings.adapter,
                  "callbacks": list(dspy.settings.get("callbacks") or [])},
        run_info={"program": program_name, "study": study.study_name},
        max_lm_calls=max_lm_calls,
        cost_ceiling=cost_ceiling,
        defaults=defaults,
    )
    finished = len(study.get_trials(deepcopy=False, states=FINISHED))
    if finished >= trials:
        logger.info("study %s already holds %d finished trials (asked for %d)", study.study_name, finished, trials)
    else:
        with counting_cache_hits(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
            stops = [_stop_at(trials), *([stop_when_spent(budget)] if budget else [])]
            if budget and cost_report(study)["lm_calls_spent"] >= budget:
                logger.warning("study %s has spent its budget of %d LM calls", study.study_name, budget)
            else:
                rest = True
                if defaults_waiting and n_jobs > 1:
                    # Worker threads would race for the queued trial (SQLite has no row locks): it runs alone first.
                    study.optimize(objective, n_trials=1, catch=(_OverBudget,), callbacks=stops)
                    rest = len(study.get_trials(deepcopy=False, states=_TAKEN)) < trials
                if rest:
                    study.optimize(objective, n_jobs=n_jobs, catch=(_OverBudget,), callbacks=stops)
        finished = len(study.get_trials(deepcopy=False, states=FINISHED))
        if finished < trials:
            running = len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
            logger.warning("study %s holds %d of %d finished trials; %d are still marked running (by other "
                           "workers, or by a stopped run: those fail after %d s without a heartbeat); "
                           "rerun to continue", study.study_name, finished, trials, running, GRACE_PERIOD_S)
    report = write_report(study, out_dir, goals, program_name, plots=plots)
    return TuneResult(study=study, storage=display, objectives=goals, ran=sorted(objective.ran), **report)


# ---------------------------------------------------------------- trials


@dataclass
class _TrialObjective:
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
            trial.set_user_attr(FACTS, {**facts, "note": f"infeasible: {exc}"})
            raise optuna.TrialPruned(f"infeasible parameters: {exc}") from None
        facts["config"] = program.config
        trial.set_user_attr(FACTS, facts)
        ledger = Ledger()
        try:
            self._run(trial, program, ledger)
        except optuna.TrialPruned as pruned:
            facts["note"] = str(pruned)
            raise
        finally:
            trial.set_user_attr(FACTS, {**facts, **ledger.counts()})
        values = tuple(goal.value(ledger) for goal in self.goals)
        logger.info("trial %d: %s with %s (%d LM calls, %d spent)", trial.number,
                    ", ".join(f"{g.name}={v:.4g}" for g, v in zip(self.goals, values)), params,
                    ledger.summary["totals"]["lm_calls"], ledger.spent)
        return values[0] if len(values) == 1 else values

    def _run(self, trial: optuna.Trial, program: RAGProgram, ledger: Ledger) -> None:
        """Run the dev set chunk by chunk, keeping the summary of the rows so far in `ledger`. DSPy
        settings change only through dspy.context, so Optuna's worker threads stay independent."""
        folder = self.folder / f"{trial.number:04d}"
        if folder.exists():  # left by a deleted study of the same name: Optuna never reruns a trial number
            shutil.rmtree(folder)
        run_info = {**self.run_info, "params": program.config, "trial": trial.number}
        with dspy.context(**{**self.settings, **ledger.settings(self.settings["callbacks"])}):
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


def _enqueue_defaults(study: optuna.Study, space: Sequence[Param], defaults: Mapping[str, Any]) -> bool:
    """Queue the default configuration as the study's next trial, unless it has one (run, running or queued) or
    a default lies outside the searched ranges. A defaults trial killed mid-run is queued again. Whether a
    defaults trial is now waiting to run."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    kept = (*_TAKEN, TrialState.WAITING)
    states = {t.state for t in study.get_trials(deepcopy=False, states=kept) if t.user_attrs.get(_ROLE) == "defaults"}
    if states:
        return TrialState.WAITING in states
    params = {p.name: defaults[p.name] for p in space}
    outside = [p.name for p in space if not p.admits(params[p.name])]
    if outside:
        logger.info("no cost ceiling: the default %s lies outside the searched range", ", ".join(outside))
        return False
    study.enqueue_trial(params, user_attrs={_ROLE: "defaults"})
    return True


def _defaults_calls_per_question(study: optuna.Study) -> float | None:
    """LM calls per question of the study's completed defaults trial, if it has one."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        facts = trial_facts(t)
        if t.user_attrs.get(_ROLE) == "defaults" and facts.get("examples"):
            return facts["lm_calls"] / facts["examples"]
    return None


class _OverBudget(Exception):
    """Raised in a trial created after the study's budget was taken by other workers; it never runs."""


def _claim_within_budget(trial: optuna.Trial, budget: int) -> None:
    """Trial numbers are given out atomically: a trial runs only if fewer than `budget` trials
    numbered before it are finished or running."""
    ahead = sum(1 for t in trial.study.get_trials(deepcopy=False, states=_TAKEN) if t.number < trial.number)
    if ahead >= budget:
        trial.set_user_attr(FACTS, {"note": "over budget: not run"})
        trial.study.stop()
        raise _OverBudget(f"the study already has its {budget} trials; trial {trial.number} was not run")


def _stop_at(budget: int) -> Callable[[optuna.Study, FrozenTrial], None]:
    def stop(study: optuna.Study, _: FrozenTrial) -> None:
        if len(study.get_trials(deepcopy=False, states=_TAKEN)) >= budget:
            study.stop()

    return stop


# ---------------------------------------------------------------- setting up


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

