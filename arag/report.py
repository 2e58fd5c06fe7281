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
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from arag.errors import AragError, ConfigError, DataError
from arag.evaluate import COUNTS, PREDICTIONS, RUN, SUMMARY, summarize
from arag.trace import trace_declarations

COSTS = {  # the scatter's cost axes: a comparison row's key and its label
    "lm_calls": "LM calls per question",
    "tokens": "tokens per question",
    "retrieval_calls": "retrievals per question",
    "seconds": "seconds per question",
}
REQUIRED_ROW_KEYS = ("id", "question", "answers", "metrics", "trace")
QUESTION_KEYS = ("id", "question", "answers")  # kept once per question, not once per run
TEMPLATE = "report.html.j2"


@dataclass
class Run:
    """An evaluation run: its folder, a short name, what was run (run.json), its rows (the last row of each
    question, as a failed question's retry comes after its failure) and its summary, computed from those rows."""

    path: Path
    name: str
    info: dict[str, Any]
    rows: list[dict[str, Any]]
    summary: dict[str, Any]


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
    out = Path(out)
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; give the HTML file to write, e.g. {out / 'report.html'}")
    if not out.parent.is_dir():
        raise ConfigError(f"cannot write {out}: its folder {out.parent} does not exist")
    try:
        import jinja2  # noqa: F401
        import plotly  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"the report needs jinja2 and plotly ({exc}): pip install 'arag[report]'") from None
    loaded = load_runs(runs)
    data = report_data(loaded)
    out.write_text(render_html(data), encoding="utf-8")
    coverage = data["coverage"]
    return ReportFile(out, len(loaded), coverage["questions"], coverage["in_every_run"], coverage["per_run"])


def load_runs(paths: Sequence[str | Path]) -> list[Run]:
    """The runs in these folders, named by the shortest path tails that tell them apart."""
    if not paths:
        raise ConfigError("no runs given: name one or more run folders (written by `arag eval --out`)")
    folders = [Path(path) for path in paths]
    seen: set[Path] = set()
    for folder in folders:
        if folder.resolve() in seen:
            raise ConfigError(f"the run {folder} is given twice")
        seen.add(folder.resolve())
    return [load_run(folder, name) for folder, name in zip(folders, run_names(folders))]


def run_names(folders: Sequence[Path]) -> list[str]:
    """Each folder's name, with as many parent folders as it takes to make the names distinct (the folders are
    distinct)."""
    parts = [folder.resolve().parts for folder in folders]
    depth = 1
    while len(set(names := ["/".join(p[-depth:]) for p in parts])) < len(names):
        depth += 1
    return names


def load_run(path: str | Path, name: str | None = None) -> Run:
    """Read a run folder; a ConfigError when it is not one, a DataError naming the file and line of a bad row."""
    folder = Path(path)
    if not folder.is_dir():
        what = "it is a file" if folder.exists() else "it does not exist"
        raise ConfigError(f"{folder} is not a run folder: {what} (a run is a folder written by `arag eval --out`)")
    missing = [file for file in (RUN, PREDICTIONS) if not (folder / file).is_file()]
    if missing:
        raise ConfigError(f"{folder} is not a run folder: it has no {' and no '.join(missing)} "
                          "(a run is a folder written by `arag eval --out`)")
    info = _json_object(folder / RUN)
    rows = read_rows(folder / PREDICTIONS)
    written = _json_object(folder / SUMMARY) if (folder / SUMMARY).is_file() else {}
    n_total = max(int(written.get("n_total") or 0), len(rows))
    summary = summarize(rows, n_total=n_total, wall_time=float(written.get("wall_time_s") or 0.0), run_info=info)
    return Run(folder, name or folder.name, info, rows, summary)


def _json_object(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise DataError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise DataError(f"{path} should hold a JSON object, not {type(value).__name__}")
    return value


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a predictions.jsonl, the last one of each question; an unfinished last line (a run still
    being written) is left out."""
    lines = path.read_text(encoding="utf-8").split("\n")
    last = lines.pop()  # "" when the file ends with a newline, as evaluate writes it
    if last.strip() and _parses(last):
        lines.append(last)  # a whole row without its newline; a half-written one is left out
    rows: dict[str, dict[str, Any]] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise DataError(f"{path}:{lineno}: not a JSON row") from None
        problem = row_problem(row)
        if problem:
            raise DataError(f"{path}:{lineno}: malformed prediction row: {problem}")
        rows[str(row["id"])] = row
    if not rows:
        raise DataError(f"{path} holds no rows: the run has not finished a question yet")
    return list(rows.values())


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def row_problem(row: Any) -> str | None:
    """What makes `row` unlike a row of `arag.evaluate`, or None."""
    if not isinstance(row, dict):
        return f"a row is a JSON object, not {type(row).__name__}"
    missing = [key for key in REQUIRED_ROW_KEYS if key not in row]
    if missing:
        return f"it has no {', '.join(missing)}"
    if not isinstance(row["question"], str):
        return "question should be text"
    if not isinstance(row["metrics"], dict) or not all(_is_number(v) for v in row["metrics"].values()):
        return "metrics should map metric names to numbers"
    if not isinstance(row["answers"], list):
        return "answers should be a list of gold answers"
    if not isinstance(row["trace"], list) or not all(isinstance(s, dict) and "step" in s for s in row["trace"]):
        return "trace should be a list of steps, each an object with a 'step' name"
    bad = [key for key in (*COUNTS, "seconds") if key in row and not _is_number(row[key])]
    if bad:
        return f"{', '.join(bad)} should be numbers"
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def comparison(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """One row per run: what was run, how many questions and failures, its metrics and its costs per question."""
    rows = []
    for run in runs:
        summary, per_question = run.summary, run.summary["per_question"]
        program = run.info.get("program") or "?"
        params = run.info.get("params") or {}
        rows.append({
            "run": run.name,
            "path": str(run.path),
            "program": program,
            "params": params,
            "changed_params": changed_params(program, params),
            "lm": run.info.get("lm"),
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
    for index, run in enumerate(runs):
        for row in run.rows:
            key = (str(row["id"]), row["question"])
            entry = by_key.setdefault(key, {"id": key[0], "question": row["question"], "answers": row["answers"],
                                            "rows": [None] * len(runs)})
            entry["rows"][index] = {k: v for k, v in row.items() if k not in QUESTION_KEYS}
    for entry in by_key.values():
        present = [row for row in entry["rows"] if row is not None]
        entry["failed"] = any("error" in row for row in present)
        entry["disagree"] = disagree(present)
        entry["in_every_run"] = len(present) == len(runs)
    return list(by_key.values())


def disagree(rows: Sequence[dict[str, Any]]) -> bool:
    """Whether runs' rows of one question differ: in their answers (normalised; a failure is an answer of its
    own) or in a metric they share."""
    from arag.data.metrics import normalize_answer

    if len(rows) < 2:
        return False
    answers = {None if "error" in row else normalize_answer(str(row.get("prediction") or "")) for row in rows}
    shared = set.intersection(*(set(row["metrics"]) for row in rows))
    scores = {tuple(round(float(row["metrics"][name]), 6) for name in sorted(shared)) for row in rows}
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
    )
