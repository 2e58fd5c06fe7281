"""Tuning a program's declared parameters (thresholds, k, query modes) with Optuna.

    config = TuningConfig(trials=30, out_dir="runs/tune", objectives=("f1", "lm_calls"),
                          space=SearchSpace(names=("k",), ranges={"k": (1, 12)}, fixed={"reasoning": "direct"}))
    result = tune("single-rag", devset, retriever, config)

- Objectives: quality metrics (maximised) and costs per question (minimised): `lm_calls`, `tokens`,
  `prompt_tokens`, `completion_tokens`, `retrieval_calls`, `distinct_passages`, `seconds`. One objective gives
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
  next chunk, so that searching every tunable parameter cannot make a trial run away with the study's LM calls.

Modules: what a run is asked (`config`), the parameters varied (`space`), running the study and its trials
(`run`), the objectives (`objectives`), the cost ledger (`cost`), the study's storage, sampler and pruner
(`study`) and the files written (`report`).
"""

from arag.optimizers.tuning.config import SearchSpace, TuningConfig
from arag.optimizers.tuning.objectives import Objective
from arag.optimizers.tuning.run import TuneResult, defaults_trial, defaults_unbeaten, tune
from arag.optimizers.tuning.space import search_space

__all__ = ["Objective", "SearchSpace", "TuneResult", "TuningConfig", "defaults_trial", "defaults_unbeaten",
           "search_space", "tune"]
