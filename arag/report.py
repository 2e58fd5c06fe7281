"""One self-contained HTML page that compares evaluation runs and shows every question's traces side by side.

    arag.report(["runs/flare", "runs/crag"], "report.html")

A run is a folder written by `arag eval --out` (run.json, predictions.jsonl, summary.json). The page holds a
table of the runs (quality, failures, cost), a quality-against-cost scatter with the Pareto front, and the
questions: each run's answer, metrics and trace, drawn by the page only when a question is opened. The rows go
into the page once, as gzip-compressed JSON (base64), and plotly's JavaScript is inlined: the file needs no
network and stays small (traces repeat themselves a lot: queries, passage titles, drafts).
"""

from __future__ import annotations

import base64
import gzip
import importlib.resources
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from arag.data._io import check_apart
from arag.errors import AragError, ConfigError
from arag.programs import PROGRAMS
from arag.runs import COUNTS, Row, Run, load_runs
from arag.trace import trace_declarations

COSTS = {  # the scatter's cost axes: a comparison row's key and its label
    "lm_calls": "LM calls per question",
    "tokens": "tokens per question",
    "retrieval_calls": "retrievals per question",
    "seconds": "seconds per question",
}
QUESTION_KEYS = ("id", "question", "answers")  # kept once per question, not once per run
TEMPLATE = "report.html.j2"
METHOD_VIEWS = "report.js"  # beside a program's module: its method's views of its own step kinds


@dataclass
class ReportFile:
    """What `report` wrote: the page, and which questions the runs hold."""

    path: Path
    runs: int
    questions: int
    in_every_run: int
    questions_per_run: dict[str, int]


def report(runs: Sequence[str | Path], out: str | Path) -> ReportFile:
    """Write the HTML report of `runs` (run folders) to `out`; a ConfigError or DataError names bad input."""
    check_out(out)
    check_apart(out, {"RUN": runs})
    return write_report(load_runs(runs), out)


def check_out(out: str | Path) -> None:
    """A ConfigError unless `out` names a file the report can be written to, with the libraries it needs."""
    out = Path(out)
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; give the HTML file to write, e.g. {out / 'report.html'}")
    if not out.parent.is_dir():
        raise ConfigError(f"cannot write {out}: its folder {out.parent} does not exist")
    try:
        import jinja2  # noqa: F401
        import plotly  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"the report needs jinja2 and plotly ({exc}): pip install 'dspy-arag[report]'") from None


def write_report(runs: Sequence[Run], out: str | Path) -> ReportFile:
    """Write the HTML report of runs already loaded (`check_out` first) to `out`."""
    out = Path(out)
    data = report_data(runs)
    out.write_text(render_html(data), encoding="utf-8")
    coverage = data["coverage"]
    return ReportFile(out, len(runs), coverage["questions"], coverage["in_every_run"], coverage["per_run"])


def comparison(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """One row per run: what was run, how many questions and failures, its metrics and its costs per question."""
    rows = []
    for run in runs:
        summary, per_question = run.summary, run.summary["per_question"]
        program = run.record.program or "?"  # a run.json that does not record its program
        params = run.record.params or {}
        rows.append({
            "run": run.name,
            "path": str(run.path),
            "program": program,
            "params": params,
            "changed_params": changed_params(program, params),
            "lm": run.record.lm or None,
            "n": summary["n"],
            "n_total": summary["n_total"],
            "n_failed": summary["n_failed"],
            "failures": summary["failures"],
            "metrics": summary["metrics"],
            **{count: per_question[count] for count in COUNTS},
            "tokens": per_question["prompt_tokens"] + per_question["completion_tokens"],
            "seconds": summary["seconds_per_question"],
        })
    return rows


def changed_params(program: str, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters that differ from the program's defaults (all of them for a program unknown here)."""
    from arag.programs import get_program

    try:
        defaults = {param.name: param.default for param in get_program(program).params}
    except AragError:
        return dict(params)
    return {key: value for key, value in params.items() if key not in defaults or defaults[key] != value}


def pareto_front(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For (quality, cost) points, higher quality and lower cost better: whether each point is on the Pareto
    front, that is, no other point is at least as good on both axes and better on one."""
    def beaten(q: float, c: float) -> bool:
        return any(q2 >= q and c2 <= c and (q2 > q or c2 < c) for q2, c2 in points)

    return [not beaten(q, c) for q, c in points]


def pareto_fronts(rows: Sequence[dict[str, Any]], metrics: Sequence[str]) -> dict[str, dict[str, list[str]]]:
    """The runs on the front for every metric and cost axis: {metric: {cost: [run names]}}; a run without the
    metric (another dataset's) has no place on that metric's axis."""
    fronts: dict[str, dict[str, list[str]]] = {}
    for metric in metrics:
        scored = [row for row in rows if metric in row["metrics"]]
        fronts[metric] = {}
        for cost in COSTS:
            on_front = pareto_front([(row["metrics"][metric], row[cost]) for row in scored])
            fronts[metric][cost] = [row["run"] for row, front in zip(scored, on_front) if front]
    return fronts


def scatter_figure(rows: Sequence[dict[str, Any]], metric: str, cost: str, front: Sequence[str]) -> dict[str, Any]:
    """The plotly figure (as JSON) of `metric` against `cost`, the front's runs joined by a staircase."""
    import plotly.graph_objects as go
    import plotly.io

    scored = [row for row in rows if metric in row["metrics"]]
    best = sorted((row for row in scored if row["run"] in front), key=lambda row: (row[cost], row["metrics"][metric]))
    hover = "<b>%{text}</b><br>" + f"{metric} %{{y:.3f}}<br>{COSTS[cost]} %{{x:.4g}}<extra></extra>"
    figure = go.Figure()
    figure.add_scatter(x=[row[cost] for row in best], y=[row["metrics"][metric] for row in best],
                       mode="lines", line={"shape": "hv", "color": "#2a9d8f", "dash": "dot"},
                       name="Pareto front", hoverinfo="skip")
    figure.add_scatter(x=[row[cost] for row in scored], y=[row["metrics"][metric] for row in scored],
                       text=[row["run"] for row in scored], mode="markers+text", textposition="top center",
                       marker={"size": 12, "color": ["#2a9d8f" if row["run"] in front else "#8d99ae" for row in scored],
                               "symbol": ["star" if row["run"] in front else "circle" for row in scored],
                               "line": {"width": 1, "color": "#333"}},
                       name="runs (★ on the front)", hovertemplate=hover)
    figure.update_layout(template="plotly_white", height=440, margin={"l": 60, "r": 20, "t": 30, "b": 60},
                         xaxis_title=COSTS[cost], yaxis_title=metric, legend={"orientation": "h", "y": -0.18})
    return json.loads(plotly.io.to_json(figure))


def question_table(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Every question of any run, in first-seen order: its id, text and gold answers; each run's row (None where
    the run lacks the question); whether it failed in a run, and whether the runs that hold it disagree."""
    by_key: dict[tuple[str, str], dict[str, Any]] = {}
    held: dict[tuple[str, str], list[Row]] = {}
    for index, run in enumerate(runs):
        for row in run.rows:
            key = (row.id, row.question)
            entry = by_key.setdefault(key, {"id": row.id, "question": row.question, "answers": row.answers,
                                            "rows": [None] * len(runs)})
            entry["rows"][index] = {k: v for k, v in row.to_json().items() if k not in QUESTION_KEYS}
            held.setdefault(key, []).append(row)
    for key, entry in by_key.items():
        present = held[key]
        entry["failed"] = any(row.failed for row in present)
        entry["disagree"] = disagree(present)
        entry["in_every_run"] = len(present) == len(runs)
    return list(by_key.values())


def disagree(rows: Sequence[Row]) -> bool:
    """Whether runs' rows of one question differ: in their answers (normalised; a failure is an answer of its
    own) or in a metric they share."""
    from arag.data.metrics import normalize_answer

    if len(rows) < 2:
        return False
    answers = {None if row.failed else normalize_answer(str(row.prediction or "")) for row in rows}
    shared = set.intersection(*(set(row.metrics) for row in rows))
    scores = {tuple(round(float(row.metrics[name]), 6) for name in sorted(shared)) for row in rows}
    return len(answers) > 1 or len(scores) > 1


def report_data(runs: Sequence[Run]) -> dict[str, Any]:
    """Everything the page shows: the comparison, the scatters, the questions and which runs hold them."""
    rows = comparison(runs)
    metrics = sorted({name for row in rows for name in row["metrics"]})
    fronts = pareto_fronts(rows, metrics)
    questions = question_table(runs)
    return {
        "runs": rows,
        "metrics": metrics,
        "costs": COSTS,
        "fronts": fronts,
        "figures": {m: {c: scatter_figure(rows, m, c, fronts[m][c]) for c in COSTS} for m in metrics},
        "questions": questions,
        "declarations": trace_declarations(),
        "coverage": {
            "questions": len(questions),
            "in_every_run": sum(q["in_every_run"] for q in questions),
            "per_run": {run.name: len(run.rows) for run in runs},
        },
    }


def render_html(data: dict[str, Any]) -> str:
    """The page: the comparison table rendered here, the rest drawn in the browser from the embedded data."""
    import jinja2
    import plotly.offline

    env = jinja2.Environment(loader=jinja2.PackageLoader("arag", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    packed = gzip.compress(json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8"), mtime=0)
    return env.get_template(TEMPLATE).render(
        runs=data["runs"],
        metrics=data["metrics"],
        costs=data["costs"],
        coverage=data["coverage"],
        data=base64.b64encode(packed).decode("ascii"),
        plotly_js=plotly.offline.get_plotlyjs(),
        method_views=method_views(),
    )


def method_views() -> str:
    """The page's script for the methods' own step kinds: the `report.js` beside each registered program's module,
    by package, each in a block of its own (its helpers stay its own)."""
    parts = []
    for package in sorted({program.__module__.rpartition(".")[0] for program in PROGRAMS.values()}):
        fragment = importlib.resources.files(package) / METHOD_VIEWS
        if fragment.is_file():
            parts.append(f"// {package}: {METHOD_VIEWS}\n{{\n{fragment.read_text(encoding='utf-8')}}}\n")
    return "".join(parts)
