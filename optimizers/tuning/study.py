"""The Optuna study a tuning run writes to: its storage, sampler and pruner, and what each trial records.

Storage is any SQLAlchemy URL. SQLite runs in write-ahead-log mode; every RDB storage keeps heartbeats, so
the trials of a killed worker are failed rather than left running forever.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from arag.errors import ConfigError

logger = logging.getLogger(__name__)

PRUNERS = ("median", "hyperband", "none")
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
FACTS = "arag"  # the trial attribute holding what a trial recorded about itself
_SETUP = "arag"  # the study attribute holding the settings it was made with


def trial_facts(trial: FrozenTrial) -> dict[str, Any]:
    """What a trial recorded about itself: worker, configuration, counts, and a note if it did not run."""
    return trial.user_attrs.get(FACTS, {})


def open_study(storage: str | optuna.storages.BaseStorage, name: str, directions: Sequence[str],
               pruner: optuna.pruners.BasePruner, seed: int | None, trials: int, setup: dict[str, Any], *,
               heartbeat_s: int, grace_period_s: int) -> tuple[optuna.Study, str]:
    """Create or continue the study, and the storage as shown to users (no password); a ConfigError when the
    study was made with other settings. `setup` describes the settings; `trials` sizes TPE's random start."""
    if isinstance(storage, str):
        display = _display_url(storage)
        storage = _rdb_storage(storage, display, heartbeat_s, grace_period_s)
    else:
        display = type(storage).__name__
    sampler = _ReproducibleTPESampler(seed=seed, n_startup_trials=min(10, max(2, trials // 3)), constant_liar=True)
    try:
        study = optuna.create_study(storage=storage, study_name=name, load_if_exists=True, sampler=sampler,
                                    pruner=pruner, directions=list(directions))
    except ValueError as exc:
        raise ConfigError(f"study {name!r} in {display}: {exc}; use another --study") from None
    previous = study.user_attrs.get(_SETUP)
    if previous is None:
        study.set_user_attr(_SETUP, setup)
    else:
        changed = sorted(k for k in set(previous) | set(setup) if previous.get(k) != setup.get(k))
        if changed:
            raise ConfigError(f"study {name!r} in {display} was made with other settings ({', '.join(changed)}); "
                              "use another --study, or the same settings to continue it")
    return study, display


def study_pruner(name: str, n_objectives: int, chunk_ends: Sequence[int]) -> optuna.pruners.BasePruner:
    """The pruner named (one of PRUNERS); none for several objectives, which Optuna cannot prune."""
    if name == "none" or n_objectives > 1:
        if name != "none":
            logger.info("pruning is off: Optuna cannot prune multi-objective studies")
        return optuna.pruners.NopPruner()
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=5)
    return optuna.pruners.HyperbandPruner(min_resource=chunk_ends[0], max_resource=chunk_ends[-1])


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
        finished = len(study.get_trials(deepcopy=False, states=FINISHED))
        draw_seed = (self._seed * 1_000_003 + finished) % 2**32
        # Optuna keeps no public way to set a sampler's random state; both of TPE's generators are reseeded.
        self._rng.rng.seed(draw_seed)
        self._random_sampler._rng.rng.seed(draw_seed)


def _rdb_storage(url: str, display: str, heartbeat_s: int, grace_period_s: int) -> optuna.storages.RDBStorage:
    """An RDB storage with heartbeats, so trials of a killed worker are failed, not counted as running."""
    from sqlalchemy.exc import SQLAlchemyError

    url = rdb_url(url)
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    for attempt in range(3):
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_s,
                                                     grace_period=grace_period_s)
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
