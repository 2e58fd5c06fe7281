"""The quality table: programs × datasets on one model and retriever, resumable, with intervals and costs.

    python benchmarks/quality.py [--model qwen2.5-coder-1.5b] [--n N] [--programs single-rag,flare,...]
                                 [--datasets hotpotqa,popqa,2wiki,musique] [--table | --report FOLDER]

Every program runs with its defaults over the table's questions of each dataset (a fixed order, so every program
sees the same questions; quality_plan.py says which, and which are kept apart for training): HotpotQA
(../shared/datasets/hotpotqa, BM25 over its distractor corpus), PopQA's long tail, the questions that carry
passages (popqa_longtail), 2WikiMultihopQA's dev questions (2wikimultihopqa, BM25 over their paragraphs) and
MuSiQue's (musique). Without --n, the plan sets each cell's number of questions: the core programs' counts, the
others grown in blocks of 10 while their interval against single-rag decides nothing. The model is loaded once
for the whole matrix; each cell (program, dataset) gets a fresh DSPy cache, so every cost is the program's own
(--cache DIR shares one between the cells run, counting its answers as the calls and tokens they first cost).
Scored by EM, F1 and match (a gold alias appears in the answer: the accuracy the Self-RAG and CRAG papers report).

Each cell is an `arag eval` run folder under --runs (traces included, for `arag report`), and its compact rows
(id, answer, scores, costs, step counts and the commit: no question or passage text) are kept under --results,
which lives in the repository: stopped at any moment (SIGKILL included), the matrix continues where it stopped,
on this machine or another that has the results, without answering a question twice. Several processes can share
one matrix (the same command started N times, e.g. one per core with --threads 1): a cell another process is
running is skipped, and each process takes the next free one. --table prints one table of
every dataset: each program's scores with a 95 % paired bootstrap interval of its difference from single-rag on
the same questions (and on those single-rag answered on the same kind of CPU; a compiled, tuned or rerun row's
also from its own program), its costs per question, and the rule that set its number of questions; --report
FOLDER draws the same results as `arag report`'s page.
--compiled FILE adds a row for a program compiled with a DSPy teleprompter (`arag compile` on other questions
than the table's: PROGRAM-compiled for BootstrapFewShot, PROGRAM-gepa for GEPA, PROGRAM-mipro for MIPROv2),
--tuned FILE one for a program's parameters tuned on other questions
(`benchmarks/tuning_local.py --skip 20`), --rerun one for each of --programs answered again (PROGRAM-rerun: on
another kind of CPU, what the machine alone moves; --rerun MACHINE: PROGRAM-rerun-MACHINE); --table and --report
show the compiled, tuned and rerun rows the results hold, after the others.

adaptive-rag's row needs a router trained on this model's runs over other questions than the table's:
`--router-labels` runs what its labels need on questions apart from the table's (`--skip 20 --n 30 --runs
runs/router/MODEL --results benchmarks/results/router/MODEL`): no-retrieval and single-rag on each, ircot on those
whose label their answers leave open; then `--train-router router.json` with the same --skip, --n and --results
(or `arag train-router` on their run folders), and `--param adaptive-rag.classifier=router.json` here. The table's
questions that router learned from (PopQA has no others to learn from) are left out of the cell, or routed by a
second router trained on the table's results apart from them (`--train-router second.json --apart-from
router.json`, then `--second-router second.json` beside the --param): each question is routed by a router that
never saw it.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402
from quality_cells import Cell, compiled_cell, held_variants, is_rerun, own_program, rerun_cell, tuned_cell  # noqa: E402
from quality_plan import (  # noqa: E402
    DATASETS,
    FIRST_N,
    split_of,
    table_questions,
    target_n,
    training_questions,
)
from quality_results import KeptRow, answered_rows, cell_rows, read_results, results_run, same_cpu_difference, sync  # noqa: E402

import arag  # noqa: E402
from arag.optimizers.router_training import MULTI_STEP, label_runs, questions_needing_multi_step, train_router  # noqa: E402
from arag.programs.adaptive_rag.adaptive_rag import STRATEGIES  # noqa: E402
from arag.programs.adaptive_rag.router import learned_questions  # noqa: E402
from arag.report import check_out, write_report  # noqa: E402
from arag.runs import Run, RunRecord, check_run_folder  # noqa: E402
from arag.runs.table import paired_difference, question_scores, table_rows  # noqa: E402
from arag.testing import isolated_cache  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "datasets"
METRICS = ("em", "f1", "match")
BASELINE = "single-rag"
# Cheap and informative programs first, so that a short session still fills whole rows of the table.
ORDER = ("no-retrieval", "single-rag", "uncertainty-gate", "flare", "ircot", "iter-retgen", "search-o1",
         "flare-instruct", "prev-window", "prev-sentence", "self-ask", "genground", "adaptive-note", "sure", "self-rag",
         "crag", "self-crag", "react", "adaptive-rag", "dragin")
# The uncertainty gate's ask signal is told the date: the table fixes it, so that a cell resumed on another day asks
# the same questions (and a shared DSPy cache answers them).
TABLE_PARAMS = {"uncertainty-gate": {"today": "2026-11-28"}}
ANSWERED_AT = "answered-at"  # in a run folder: the commit of the process answering its questions
SECOND_ROUTER = "-second-router"  # the run folder of adaptive-rag's questions that its --second-router routes

logging.getLogger("dspy.clients.lm").setLevel(logging.ERROR)


def positive_int(text: str) -> int:
    """--n's value: a whole number of questions, at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of questions (a whole number, at least 1)")
    return int(text)


def non_negative_int(text: str) -> int:
    """--skip's value: a whole number of questions, 0 or more."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of questions (a whole number, 0 or more)")
    return int(text)


def answering_commit(run_dir: Path) -> str:
    """The commit of the process that answers (or last answered) the run folder's questions, which --sync gives
    the rows it copies: a process syncing from another checkout runs other code than the rows'."""
    try:
        return (run_dir / ANSWERED_AT).read_text().strip() or current_commit()
    except FileNotFoundError:
        return current_commit()


def current_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_cell(cell: Cell, dataset: str, examples: list[dspy.Example], corpus: Path, lm: dspy.LM,
             runs: Path, results: Path, cache: Path | None = None, run_name: str | None = None) -> dict[str, KeptRow]:
    """One cell on one dataset: the questions its results lack (or failed) answered, its results returned;
    FolderInUse when another process is running it. `cache`: the folder of a DSPy cache the cells share (one a
    dataset), whose answers count as LM calls with the tokens they first cost; by default a fresh one.
    `run_name`: the run folder, when not the cell's name (a share of its questions run with other parameters)."""
    run_dir, cell_results = runs / dataset / (run_name or cell.name), results / dataset / f"{cell.name}.jsonl"
    check_run_folder(run_dir)  # FolderInUse while another process runs this cell
    commit = current_commit()
    kept = sync(run_dir, cell_results, commit)
    todo = [e for e in examples if e.id not in kept or kept[e.id].failed]
    if todo:
        print(f"{cell.name:<24}{dataset:<10}{len(examples) - len(todo):>4} answered, {len(todo)} to run", flush=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / ANSWERED_AT).write_text(commit + "\n")
        with isolated_cache(folder=cache / dataset if cache else None):
            cell.spec(lm, corpus).evaluate(todo, dataset=dataset, out_dir=run_dir, metrics=list(METRICS),
                                           progress=sys.stderr.isatty(), max_errors=None)
        kept = sync(run_dir, cell_results, commit)
    return kept


def run_planned_cell(cell: Cell, dataset: str, questions: list[dspy.Example], corpus: Path, lm: dspy.LM,
                     runs: Path, results: Path,
                     cache: Path | None = None) -> tuple[list[dspy.Example], dict[str, KeptRow]]:
    """A cell run to the number of questions the plan gives it (`target_n`), block after block while it grows;
    the questions it now covers and its results."""
    while True:
        rows = cell_rows(results, dataset, cell.name, questions)
        n, rule = target_n(cell.name, dataset, rows, cell_rows(results, dataset, BASELINE, questions))
        examples = questions[:n]
        kept = read_results(results / dataset / f"{cell.name}.jsonl")
        if all(e.id in kept and not kept[e.id].failed for e in examples) and rule != "growing":
            return examples, kept
        kept = run_cell(cell, dataset, examples, corpus, lm, runs, results, cache)
        if rule != "growing":
            return examples, kept


def report_cell(cell: str, dataset: str, examples: list[dspy.Example], kept: dict[str, KeptRow]) -> None:
    done = [kept[e.id] for e in examples if e.id in kept]
    f1 = sum(r.metrics.get("f1", 0.0) for r in done) / max(len(done), 1)
    failed = sum(r.failed for r in done)
    print(f"{cell:<24}{dataset:<10}{len(done):>4} questions, {failed} failed, F1 {f1:.3f}", flush=True)


def print_table(results: Path, programs: list[str], selected: dict[str, list[dspy.Example]], which: str,
                label: str, n_fixed: bool) -> None:
    """One Markdown table of every dataset's cells over those of its `selected` questions each has answered:
    scores, each one's difference from single-rag on the same questions with its 95 % interval (also over the
    questions single-rag answered on the row's kind of CPU, and a compiled, tuned or rerun row's from its own
    program), costs per question (prompt tokens with, in brackets, those llama.cpp
    reused from the call before), and the rule that set the cell's number of questions; then the model, the
    commits the rows were answered at and the CPU kinds they were answered on."""
    print(f"The {which} of each dataset (the split of its source they come from beside its name)\n")
    print("| dataset | program | n | n rule | failed | EM | F1 | F1 − single-rag [95 %] "
          "| F1 − single-rag on the same CPU [95 %] (n) | F1 − own program [95 %] "
          "| match | match − single-rag [95 %] | LM calls/q | prompt tok/q (reused) | compl. tok/q | retrievals/q "
          "| s/q |")
    print("|---" * 17 + "|")
    commits: Counter = Counter()
    cpus: Counter = Counter()
    for dataset, examples in selected.items():
        kept = {name: read_results(results / dataset / f"{name}.jsonl") for name in programs}
        runs = [(program, rows) for program in programs if (rows := answered_rows(kept[program], examples))]
        for program, rows in runs:
            commits.update(kept[program][row.id].commit for row in rows)
            cpus.update(kept[program][row.id].cpu or "not recorded" for row in rows)
        by_name = dict(runs)
        baseline = BASELINE if BASELINE in by_name else None
        answered = {row.id for rows in by_name.values() for row in rows}
        split = split_of([e for e in examples if e.id in answered], DATASETS[dataset].split)
        for row in table_rows(runs, METRICS, baseline):
            name = row["run"]
            differences = [row.get(f"{metric} vs {baseline}") for metric in ("f1", "match")]
            f1_change, match_change = (str(d).replace("-", "−") if d else "—" for d in differences)
            same_cpu = (None if baseline is None or name == BASELINE
                        or (is_rerun(name) and own_program(name) == BASELINE)
                        else same_cpu_difference(kept[name], results / dataset, BASELINE, examples))
            same_cpu_change = f"{same_cpu} ({same_cpu.questions})".replace("-", "−") if same_cpu else "—"
            own = own_program(name)
            own_change = (paired_difference(question_scores(by_name[name], "f1"), question_scores(by_name[own], "f1"))
                          if own in by_name else None)
            rule = "--n" if n_fixed else target_n(name, dataset, by_name[name],
                                                   cell_rows(results, dataset, BASELINE, examples))[1]
            reused = f" ({row['reused_prompt_tokens']:,.0f})" if row["reused_prompt_tokens"] is not None else ""
            calls, prompt, completion, retrievals, seconds = (
                per_question(row[name], spec) for name, spec in (("lm_calls", ".1f"), ("prompt_tokens", ",.0f"),
                ("completion_tokens", ",.0f"), ("retrieval_calls", ".1f"), ("seconds", ",.0f")))
            print(f"| {DATASETS[dataset].label} ({split}) | {name} | {row['n']} | {rule} | {row['failed']} "
                  f"| {row['em']:.3f} | {row['f1']:.3f} | {f1_change} | {same_cpu_change} "
                  f"| {str(own_change or '—').replace('-', '−')} "
                  f"| {row['match']:.3f} | {match_change} | {calls} | {prompt}{reused} | {completion} | {retrievals} "
                  f"| {seconds} |")
    answered_at = ", ".join(f"{commit} ({count})" for commit, count in commits.most_common())
    answered_on = ", ".join(f"{cpu} ({count})" for cpu, count in cpus.most_common())
    print(f"\nModel: {label}. Commits the questions were answered at (questions): {answered_at or 'none yet'}. "
          f"CPUs they were answered on (questions): {answered_on or 'none yet'}.")


def per_question(value: float | None, spec: str) -> str:
    """A cost per question as the table prints it; — where some row lacks the count."""
    return "—" if value is None else format(value, spec)


def result_runs(results: Path, cells: list[Cell], dataset: str, examples: list[dspy.Example],
                label: str) -> list[Run]:
    """Each cell's compact results as a run for `arag report`: the question and gold answers read back from the
    dataset, no trace (the traces stay in the run folders, for `arag report runs/quality/MODEL/DATASET/*`)."""
    runs = []
    for cell in cells:
        rows = cell_rows(results, dataset, cell.name, examples)
        if rows:
            record = RunRecord(program=cell.program, params=cell.params, dataset=dataset, lm=label,
                               compiled=str(cell.compiled) if cell.compiled else None)
            runs.append(results_run(results / dataset / f"{cell.name}.jsonl", cell.name, rows, len(examples), record))
    return runs


def label_needs(results: Path, dataset: str, examples: list[dspy.Example], label: str) -> list[dspy.Example]:
    """Those of `examples` whose router label waits on the multi-step strategy, read from the results of the
    simpler two (a question they have not both answered yet is left for a later run)."""
    simpler = [Cell(STRATEGIES[strategy], STRATEGIES[strategy]) for strategy in sorted(STRATEGIES)
               if strategy != MULTI_STEP]
    runs = result_runs(results, simpler, dataset, examples, label)
    needed = questions_needing_multi_step(runs) if len(runs) == len(simpler) else set()
    return [e for e in examples if e.id in needed]


def check_trained_apart(second: Path, first: Path) -> None:
    """Refuse a second router that learned from any question the first one did: it routes those questions."""
    shared = {dataset: ids & learned_questions(second, "--second-router").get(dataset, set())
              for dataset, ids in learned_questions(first).items()}
    if overlap := sum(len(ids) for ids in shared.values()):
        raise SystemExit(f"--second-router {second} learned from {overlap} of the questions {first} learned from, "
                         f"which it is to route: train it apart from them (--train-router FILE --apart-from {first})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="a name of `arag models`")
    parser.add_argument("--lm", help="any LM spec instead of the local model (e.g. openai/MODEL with --api-base)")
    parser.add_argument("--api-base", help="an OpenAI-compatible server's URL, for --lm")
    parser.add_argument("--threads", type=int, help="llama.cpp CPU threads (default: the engine's; 1 on a busy "
                        "machine, where threads that wait for each other lose far more than one thread gains)")
    parser.add_argument("--n", type=positive_int,
                        help="the table's first N questions of each dataset for every cell (default: the plan of "
                             "quality_plan.py: the core programs' counts, the others grown in blocks while their "
                             "interval against single-rag decides nothing)")
    parser.add_argument("--skip", type=non_negative_int, default=0, metavar="M",
                        help="take the N questions after the first M of the file (default N 20): other questions "
                             "than the table's, e.g. --skip 20 for the runs that train adaptive-rag's router (with "
                             "--runs and --results of their own)")
    parser.add_argument("--programs", help="comma-separated, run in this order (default: every program)")
    parser.add_argument("--router-labels", action="store_true",
                        help="run what adaptive-rag's router learns from, with --skip and --runs and --results of "
                             "their own: no-retrieval and single-rag on every question, ircot on those whose label "
                             "their answers leave open (a single-hop question both missed)")
    parser.add_argument("--datasets", default=",".join(DATASETS),
                        help=f"comma-separated, of: {', '.join(DATASETS)}")
    parser.add_argument("--param", action="append", default=[], metavar="PROGRAM.NAME=VALUE",
                        help="a program's parameter (repeatable), e.g. adaptive-rag.classifier=router.json")
    parser.add_argument("--compiled", action="append", default=[], type=Path, metavar="FILE",
                        help="a compiled program (`arag compile --out FILE`), run as a row of its own named "
                             "PROGRAM-compiled for BootstrapFewShot, PROGRAM-gepa, PROGRAM-mipro ... for the other "
                             "teleprompters (-kept where it kept its written demos), after the others (repeatable)")
    parser.add_argument("--tuned", action="append", default=[], type=Path, metavar="FILE",
                        help="a tuning run's parameter file (best_params.json of `arag tune` or "
                             "benchmarks/tuning_local.py), run as a row of its own named PROGRAM-tuned (a Pareto "
                             "front's member pareto/trial-N.json: PROGRAM-tuned-N) after the others (repeatable)")
    parser.add_argument("--shared", type=Path, default=SHARED, help="the shared datasets folder")
    parser.add_argument("--runs", type=Path, help="run folders (default runs/quality/MODEL)")
    parser.add_argument("--cache", type=Path, metavar="DIR",
                        help="one DSPy cache a dataset in DIR, shared by the cells run (e.g. the members of a tuned "
                             "front, where one that stops earlier replays another's calls): its answers count as LM "
                             "calls with the tokens they first cost; by default each cell gets a fresh cache")
    parser.add_argument("--results", type=Path, help="compact results (default benchmarks/results/quality/MODEL)")
    parser.add_argument("--table", action="store_true", help="only print the table of what the results hold")
    parser.add_argument("--report", type=Path, metavar="FOLDER",
                        help="only write FOLDER/DATASET.html from the results (FOLDER is created if missing): "
                             "`arag report`'s page of quality against cost, one per dataset")
    parser.add_argument("--train-router", type=Path, metavar="FILE",
                        help="only train adaptive-rag's router on the results of no-retrieval, single-rag and ircot "
                             "(the router's own: with --skip and their --results) and write it to FILE")
    parser.add_argument("--apart-from", type=Path, metavar="ROUTER",
                        help="with --train-router on the table's questions: leave out those the router file ROUTER "
                             "learned from, for a second router that routes them (--second-router)")
    parser.add_argument("--second-router", type=Path, metavar="FILE",
                        help="adaptive-rag: route the table's questions that --param adaptive-rag.classifier's "
                             "router learned from with this router, trained apart from them (--train-router FILE "
                             "--apart-from ROUTER); without it those questions are left out of the cell")
    parser.add_argument("--rerun", nargs="?", const="", metavar="MACHINE",
                        help="answer --programs again, into rows PROGRAM-rerun (run it on another machine than the "
                             "programs' rows: greedy answers can differ between CPU kinds, and the row's difference "
                             "from its own program is what the machine alone moves; --rerun M: PROGRAM-rerun-M)")
    parser.add_argument("--sync", action="store_true",
                        help="only copy what the run folders finished into the results (before a commit, while a "
                             "matrix is stopped in the middle of a cell)")
    args = parser.parse_args()
    label = args.lm.replace("/", "-") if args.lm else args.model
    runs = args.runs or ROOT / "runs" / "quality" / label
    results = args.results or ROOT / "benchmarks" / "results" / "quality" / label
    if args.router_labels and args.programs is not None:
        raise SystemExit("--router-labels runs the router's own strategies: give it without --programs")
    chosen = ",".join(STRATEGIES.values()) if args.router_labels else args.programs
    programs = [name.strip() for name in (ORDER if chosen is None else chosen.split(",")) if name.strip()]
    names = [name.strip() for name in args.datasets.split(",") if name.strip()]
    unknown = sorted(set(programs) - set(arag.PROGRAMS)) + sorted(set(names) - set(DATASETS))
    if unknown:
        raise SystemExit(f"unknown program or dataset: {', '.join(unknown)}")
    params = {program: dict(values) for program, values in TABLE_PARAMS.items()}
    for assignment in args.param:
        target, equals, value = assignment.partition("=")
        program, dot, name = target.partition(".")
        if not (equals and dot and program and name):
            raise SystemExit(f"--param {assignment!r}: expected PROGRAM.NAME=VALUE, e.g. flare.theta=0.6")
        if program not in programs:
            raise SystemExit(f"--param {assignment!r}: {program!r} is not one of --programs")
        params.setdefault(program, {})[name] = value
    if args.rerun is not None and (args.compiled or args.tuned or args.router_labels):
        raise SystemExit("--rerun answers --programs again: give it without --compiled, --tuned and --router-labels")
    cells = [Cell(name, name, params.get(name, {})) if args.rerun is None
             else rerun_cell(name, params.get(name, {}), args.rerun) for name in programs]
    cells += [compiled_cell(path) for path in args.compiled]
    cells += [tuned_cell(path) for path in args.tuned]
    if args.cache and args.cache.exists() and not args.cache.is_dir():
        raise SystemExit(f"--cache {args.cache} is a file; give a folder for the shared DSPy cache")
    if args.report and args.report.exists() and not args.report.is_dir():
        raise SystemExit(f"--report {args.report} is a file; give the folder to write DATASET.html into")
    for cell in cells:  # a bad value stops here, before the model loads
        cell.spec()
    if args.apart_from and not args.train_router:
        raise SystemExit("--apart-from leaves questions out of a router's training: give it with --train-router")
    routers = [cell.params["classifier"] for cell in cells if cell.program == "adaptive-rag" and not cell.compiled
               and cell.params.get("classifier", "lm") != "lm"]
    if args.second_router:
        if not routers:
            raise SystemExit("--second-router routes what adaptive-rag's router learned from: give it with "
                             "--programs adaptive-rag --param adaptive-rag.classifier=ROUTER.json")
        check_trained_apart(args.second_router, Path(routers[0]))
    shown = cells + held_variants(results, programs, names, {cell.name for cell in cells})
    cell_names = [cell.name for cell in shown]
    if args.sync:
        for dataset in names:
            for cell in (cell.name for cell in cells):
                for run_dir in (runs / dataset / cell, runs / dataset / f"{cell}{SECOND_ROUTER}"):
                    sync(run_dir, results / dataset / f"{cell}.jsonl", answering_commit(run_dir))
    if args.skip:
        n = args.n or FIRST_N
        selected = {name: training_questions(DATASETS[name], args.shared, n, args.skip) for name in names}
        which = f"questions {args.skip + 1} to {args.skip + n} (of the file)"
    else:
        selected = {name: table_questions(DATASETS[name], args.shared, args.n or len(DATASETS[name].questions(
            args.shared))) for name in names}
        which = f"table's first {args.n} questions" if args.n else "table's questions"
    for name, examples in selected.items():
        if args.n and len(examples) < args.n:
            print(f"{name} has {len(examples)} questions to take, fewer than --n {args.n}: all of them are taken",
                  file=sys.stderr)
    if args.report:
        args.report.mkdir(parents=True, exist_ok=True)
        for dataset in names:
            check_out(args.report / f"{dataset}.html")
        for dataset, examples in selected.items():
            out = args.report / f"{dataset}.html"
            written = write_report(result_runs(results, shown, dataset, examples, label), out)
            print(f"{written.path}: {written.runs} programs, {written.questions} questions", flush=True)
    if args.train_router:
        strategies = [Cell(name, name) for name in STRATEGIES.values()]
        apart = learned_questions(args.apart_from, "--apart-from") if args.apart_from else {}
        for dataset, examples in selected.items():
            if left_out := sum(e.id in apart.get(dataset, ()) for e in examples):
                print(f"{dataset}: left out the {left_out} questions {args.apart_from} learned from")
        strategy_runs = [run for dataset, examples in selected.items()
                         for run in result_runs(results, strategies, dataset,
                                                [e for e in examples if e.id not in apart.get(dataset, ())], label)]
        for line in train_router(label_runs(strategy_runs), args.train_router).lines():
            print(line)
        print(f"wrote {args.train_router}")
    if args.table or args.sync:
        print_table(results, cell_names, selected, which, label, n_fixed=bool(args.n or args.skip))
    if args.table or args.sync or args.report or args.train_router:
        return 0
    lm = (arag.build_lm(args.lm, api_base=args.api_base, logprobs=True, top_logprobs=5) if args.lm
          else arag.build_lm(f"local:{args.model}", logprobs=True, top_logprobs=5, threads=args.threads))
    for cell in cells:
        if cell.program == "adaptive-rag" and not cell.compiled and "classifier" not in cell.params:
            print("adaptive-rag: skipped (give --param adaptive-rag.classifier=ROUTER.json, a router trained on "
                  "this model's runs over other questions)", flush=True)
            continue
        for dataset, examples in selected.items():
            if args.router_labels and cell.program == STRATEGIES[MULTI_STEP]:
                examples = label_needs(results, dataset, examples, label)
                if not examples:
                    print(f"{cell.name:<24}{dataset:<10}   0 questions: no label waits on it", flush=True)
                    continue
            routed_apart: list[dspy.Example] = []
            if cell.program == "adaptive-rag" and cell.params.get("classifier") in routers and not args.skip:
                learned = learned_questions(cell.params["classifier"]).get(dataset, set())
                routed_apart = [e for e in examples if e.id in learned] if args.second_router else []
                examples = [e for e in examples if e.id not in learned]
            corpus = DATASETS[dataset].corpus(args.shared)
            try:
                if args.n or args.skip:
                    kept = run_cell(cell, dataset, examples, corpus, lm, runs, results, args.cache)
                else:
                    examples, kept = run_planned_cell(cell, dataset, examples, corpus, lm, runs, results, args.cache)
                if routed_apart:
                    second = Cell(cell.name, cell.program, {**cell.params, "classifier": str(args.second_router)})
                    kept = run_cell(second, dataset, routed_apart, corpus, lm, runs, results, args.cache,
                                    run_name=f"{cell.name}{SECOND_ROUTER}")
                    examples += routed_apart
            except arag.FolderInUse as exc:
                print(f"{cell.name:<24}{dataset:<10}skipped: {exc}", flush=True)
                continue
            report_cell(cell.name, dataset, examples, kept)
    print_table(results, cell_names, selected, which, label, n_fixed=bool(args.n or args.skip))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except arag.AragError as exc:  # bad input: one line naming it, no traceback
        sys.exit(str(exc))
