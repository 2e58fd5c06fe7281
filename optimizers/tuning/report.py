"""What a tuning run writes: trials.csv, study.json, best_params.json or the Pareto front, and plots.

Everything is read from the study as it stands, whoever ran its trials.
"""

from __future__ import annotations

import csv
import logging
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import optuna
import ujson
from optuna.trial import FrozenTrial, TrialState

from arag.data._io import atomic_writer, write_atomic
from arag.data.metrics import METRICS
from arag.optimizers.tuning.cost import cost_report
from arag.optimizers.tuning.objectives import Objective
from arag.optimizers.tuning.study import trial_facts

logger = logging.getLogger(__name__)
# What a tuning run writes in its folder (`run` adds the default storage, study.db, and trials/, the trials' runs).
WRITTEN = ("best_params.json", "pareto.json", "pareto", "trials.csv", "study.json", "plots", "study.db", "trials")


def write_report(study: optuna.Study, out_dir: str | Path, goals: Sequence[Objective], program_name: str,
                 *, plots: bool = True) -> dict[str, Any]:
    """trials.csv, study.json, best_params.json (one objective) or pareto.json and pareto/trial-N.json for each
    distinct point of the front (several), and plots, from the study as it stands (whoever ran its trials)."""
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
                        key=lambda p: [*((-1 if g.direction == "maximize" else 1) * p["values"][g.name]
                                         for g in goals), p["trial"]])
        files["pareto"] = _write_front(out_dir, pareto)
        files["best_params"] = _write_json(out_dir / "best_params.json", pareto[0])
    cost = cost_report(study)
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


def _write_front(out_dir: Path, pareto: list[dict[str, Any]]) -> str:
    """pareto.json, and pareto/trial-N.json for each distinct point of the front: of members that tie on every
    objective only the first trial gets a file, the others name it in `same_point_as`. Files this study wrote for
    trials that have left the front (a resumed study) are removed; any other file is left alone."""
    first_of: dict[tuple, int] = {}
    for point in pareto:
        first = first_of.setdefault(tuple(point["values"].values()), point["trial"])
        if first != point["trial"]:
            point["same_point_as"] = first
    folder = out_dir / "pareto"
    kept = {f"trial-{trial}" for trial in first_of.values()}
    study = pareto[0]["study"]
    for stale in folder.glob("trial-*.json"):
        if stale.stem not in kept and _front_member_of(stale, study):
            stale.unlink()
    for point in pareto:
        if "same_point_as" not in point:
            _write_json(folder / f"trial-{point['trial']}.json", point)
    return _write_json(out_dir / "pareto.json", pareto)


def _front_member_of(path: Path, study: str) -> bool:
    """Whether `path` is a plain file that a front of `study` wrote (never a link, nor a file of anything else)."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        data = ujson.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("study") == study and "trial" in data


def _point(trial: FrozenTrial, goals: Sequence[Objective], program_name: str, study_name: str) -> dict[str, Any]:
    """A trial as a parameter file `arag eval --params-file` reads: `params` is the whole configuration."""
    return {
        "program": program_name,
        "params": trial_facts(trial).get("config", trial.params),
        "values": dict(zip((g.name for g in goals), trial.values)),
        "trial": trial.number,
        "study": study_name,
    }


def _write_json(path: Path, data: Any) -> str:
    write_atomic(path, ujson.dumps(data, indent=2, ensure_ascii=False))
    return str(path)


def _write_trials_csv(path: Path, study: optuna.Study, goals: Sequence[Objective]) -> str:
    trials = study.get_trials(deepcopy=False)
    params = sorted({name for t in trials for name in t.params})
    metrics = sorted({name for t in trials for name in trial_facts(t).get("metrics", {})})
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
            facts = trial_facts(t)
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
    points = [(trial_facts(t)["retrievals_per_question"], t.values[index], t.number, t.params)
              for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if "retrievals_per_question" in trial_facts(t)]
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
