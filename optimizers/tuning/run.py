"""Running a study: each trial builds the program with suggested values and runs the dev set through the one
evaluation harness (`arag.evaluate.evaluate`), its rows kept under `out_dir/trials/STUDY/NNNN/`.

A study holds `trials` finished trials: trial numbers are handed out atomically, a trial runs only while fewer
are finished or running, and workers sharing a study (threads, processes, machines) stop at exactly that many.
A trial whose every question fails (an unreachable or broken LM) stops the study with that error. Optuna's
worker threads change DSPy settings only through `dspy.context`.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import socket
import threading
import warnings
from dataclasses import dataclass, field, replace
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
from arag.optimizers.tuning.config import TuningConfig
from arag.optimizers.tuning.cost import Ledger, cost_report, stop_when_spent
from arag.optimizers.tuning.objectives import Objective
from arag.optimizers.tuning.report import write_report
from arag.optimizers.tuning.space import describe, search_space
from arag.optimizers.tuning.study import FACTS, FINISHED, open_study, study_pruner, trial_facts
from arag.programs.frame.base import RAGProgram
from arag.programs.frame.params import Param, resolve_params
from arag.programs.frame.registry import build_program, get_program
from arag.retrievers.base import Retriever
from arag.runs import RunRecord
from arag.scratch import create_scratch, remove_scratch
from arag.trace.recorder import reporting_cache_hits

logger = logging.getLogger(__name__)

HEARTBEAT_S = 10
GRACE_PERIOD_S = 30
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


def tune(program_name: str, devset: Sequence[dspy.Example], retriever: Retriever | None, config: TuningConfig,
         *, lm: dspy.BaseLM | None = None) -> TuneResult:
    """Tune `program_name`'s parameters on `devset` until the study holds `config.trials` finished trials, with
    `lm` (default: `dspy.settings.lm`). Writes best_params.json (or pareto.json), trials.csv, study.json and,
    with `config.plots`, HTML and PNG plots to `config.out_dir`."""
    goals = config.goals
    out_dir = check_output_folder(config.out_dir)
    if not devset:
        raise DataError("the dev set is empty")
    lm = lm or require_lm()
    validated = resolve_params(get_program(program_name).params, dict(config.space.fixed), program_name)
    fixed = {name: validated[name] for name in config.space.fixed}
    space = search_space(program_name, config.space)
    own_metrics = default_metrics(devset[0])
    for goal in goals:
        if goal.name in METRICS and goal.name not in own_metrics:
            logger.warning("objective %s is not among this dataset's metrics (%s)", goal.name, ", ".join(own_metrics))
    build = _program_builder(program_name, retriever, fixed, config.compiled)
    defaults = build({}).config
    out_dir.mkdir(parents=True, exist_ok=True)
    setup = {"program": program_name, "objectives": [g.name for g in goals], "devset": _fingerprint(devset),
             "space": [describe(p) for p in space], "fixed": fixed,
             "compiled": _file_digest(config.compiled) if config.compiled else None}
    chunk_ends = _chunk_ends(len(devset), config.chunk_size)
    study, display = open_study(
        config.storage or f"sqlite:///{(out_dir / 'study.db').resolve()}",
        config.study_name or "-".join([program_name, *setup["objectives"]]),
        [g.direction for g in goals], study_pruner(config.pruner, len(goals), chunk_ends), config.seed,
        config.trials, setup, heartbeat_s=HEARTBEAT_S, grace_period_s=GRACE_PERIOD_S,
    )
    defaults_waiting = config.cost_ceiling is not None and _enqueue_defaults(study, space, defaults)
    objective = _TrialObjective(
        build=build, space=space, goals=goals, devset=list(devset), trials=config.trials, threads=config.threads,
        ends=chunk_ends if len(goals) == 1 or config.cost_ceiling else [len(devset)],
        metrics=list(dict.fromkeys([*(g.name for g in goals if g.name in METRICS), *own_metrics])),
        folder=out_dir / "trials" / re.sub(r"[^\w.-]", "_", study.study_name),
        settings={"lm": lm, "adapter": dspy.settings.adapter,
                  "callbacks": list(dspy.settings.get("callbacks") or [])},
        record=RunRecord(program=program_name, study=study.study_name),
        max_lm_calls=config.max_lm_calls,
        cost_ceiling=config.cost_ceiling,
        defaults=defaults,
    )
    _optimize(study, objective, config, defaults_waiting)
    report = write_report(study, out_dir, goals, program_name, plots=config.plots)
    return TuneResult(study=study, storage=display, objectives=goals, ran=sorted(objective.ran), **report)


def _optimize(study: optuna.Study, objective: _TrialObjective, config: TuningConfig, defaults_waiting: bool) -> None:
    """Run trials until the study holds `config.trials` finished ones or has spent `config.max_study_lm_calls`."""
    trials, limit = config.trials, config.max_study_lm_calls
    finished = len(study.get_trials(deepcopy=False, states=FINISHED))
    if finished >= trials:
        logger.info("study %s already holds %d finished trials (asked for %d)", study.study_name, finished, trials)
        return
    with reporting_cache_hits(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        stops = [_stop_at(trials), *([stop_when_spent(limit)] if limit else [])]
        if limit and cost_report(study)["lm_calls_spent"] >= limit:
            logger.warning("study %s has spent the %d LM calls it may spend", study.study_name, limit)
        else:
            rest = True
            if defaults_waiting and config.n_jobs > 1:
                # Worker threads would race for the queued trial (SQLite has no row locks): it runs alone first.
                study.optimize(objective, n_trials=1, catch=(_StudyFull,), callbacks=stops)
                rest = len(study.get_trials(deepcopy=False, states=_TAKEN)) < trials
            if rest:
                study.optimize(objective, n_jobs=config.n_jobs, catch=(_StudyFull,), callbacks=stops)
    finished = len(study.get_trials(deepcopy=False, states=FINISHED))
    if finished < trials:
        running = len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
        logger.warning("study %s holds %d of %d finished trials; %d are still marked running (by other "
                       "workers, or by a stopped run: those fail after %d s without a heartbeat); "
                       "rerun to continue", study.study_name, finished, trials, running, GRACE_PERIOD_S)


# ---------------------------------------------------------------- trials


@dataclass
class _TrialObjective:
    """One trial: claim a place among the study's trials, build the program with suggested values, run the dev
    set in chunks (reporting the score so far for pruning), and record the trial's counts."""

    build: Callable[[Mapping[str, Any]], RAGProgram]
    space: list[Param]
    goals: list[Objective]
    devset: list[dspy.Example]
    trials: int
    threads: int
    ends: list[int]
    metrics: list[str]
    folder: Path
    settings: dict[str, Any]
    record: RunRecord
    max_lm_calls: int | None = None
    cost_ceiling: float | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    ran: list[int] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, trial: optuna.Trial) -> float | tuple[float, ...]:
        _claim_a_place(trial, self.trials)
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
        remove_scratch(folder, missing_ok=True)  # left by a deleted study of the same name: no trial number reruns
        create_scratch(folder)
        record = replace(self.record, params=program.config, trial=trial.number)
        with dspy.context(**{**self.settings, **ledger.settings(self.settings["callbacks"])}):
            for end in self.ends:
                result = evaluate(program, self.devset[:end], out_dir=folder, threads=self.threads,
                                  metrics=self.metrics, run_info=record, progress=False,
                                  max_lm_calls=self.max_lm_calls, max_errors=None)
                ledger.summary = result.summary
                if result.summary["n_failed"] == result.summary["n"]:
                    if set(result.summary["failures"]) == {LMCallBudgetSpent.__name__}:
                        raise optuna.TrialPruned(f"every question reached its cap on LM calls after {end} examples")
                    error = next(row.error for row in reversed(result.rows) if row.failed)
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


def defaults_trial(study: optuna.Study) -> FrozenTrial | None:
    """The study's completed trial of the default configuration, if it has one (a defaults trial killed
    mid-run stays in the study as failed, beside the one run again)."""
    return next((t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                 if t.user_attrs.get(_ROLE) == "defaults"), None)


def defaults_unbeaten(result: TuneResult) -> FrozenTrial | None:
    """The completed defaults trial of a one-objective study when no trial scored better than it, else None."""
    defaults = defaults_trial(result.study)
    if result.best is None or defaults is None:
        return None
    return defaults if defaults.values == list(result.best["values"].values()) else None


def _defaults_calls_per_question(study: optuna.Study) -> float | None:
    """LM calls per question of the study's completed defaults trial, if it has one."""
    facts = trial_facts(trial) if (trial := defaults_trial(study)) else {}
    return facts["lm_calls"] / facts["examples"] if facts.get("examples") else None


class _StudyFull(Exception):
    """Raised in a trial created after other workers took the study's last places; it never runs."""


def _claim_a_place(trial: optuna.Trial, trials: int) -> None:
    """Trial numbers are given out atomically: a trial runs only if fewer than `trials` trials
    numbered before it are finished or running."""
    ahead = sum(1 for t in trial.study.get_trials(deepcopy=False, states=_TAKEN) if t.number < trial.number)
    if ahead >= trials:
        trial.set_user_attr(FACTS, {"note": "study full: not run"})
        trial.study.stop()
        raise _StudyFull(f"the study already has its {trials} trials; trial {trial.number} was not run")


def _stop_at(trials: int) -> Callable[[optuna.Study, FrozenTrial], None]:
    def stop(study: optuna.Study, _: FrozenTrial) -> None:
        if len(study.get_trials(deepcopy=False, states=_TAKEN)) >= trials:
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

