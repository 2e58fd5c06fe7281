"""The `arag` command line: list programs, build indexes, evaluate programs on a dataset."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import ujson

from arag.cli_logging import configure_logging
from arag.cli_optimize import compile_command, train_router_command, tune_command
from arag.cli_options import given_params, lm_options, retriever_options, retriever_paths
from arag.errors import AragError, ConfigError
from arag.evaluate import MAX_ERRORS
from arag.setup import LMSetup


class _Group(click.Group):
    """Prints user errors as one line and exits 2; Ctrl-C exits 130 with a hint."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            return super().main(*args, **kwargs)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo("aborted", err=True)
            sys.exit(130)
        except AragError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted: finished rows are kept; rerun the same command to continue", err=True)
            sys.exit(130)


@click.group(cls=_Group)
@click.option("-v", "--verbose", is_flag=True,
              help="Also show other libraries' log messages and progress bars (arag's own progress always shows).")
def main(verbose: bool) -> None:
    """Adaptive retrieval-augmented generation programs on DSPy."""
    configure_logging(verbose)


@main.command("programs")
def programs_command() -> None:
    """List the programs and their parameters (name=default range  meaning)."""
    from arag.programs import PROGRAMS

    for name in sorted(PROGRAMS):
        cls = PROGRAMS[name]
        click.echo(f"{name}  — {(cls.__doc__ or sys.modules[cls.__module__].__doc__ or '').strip().splitlines()[0]}")
        if cls.follows:
            click.echo(f"    follows {cls.follows}")
        for departure in cls.departures:
            click.echo(f"    departs: {departure}")
        for param in cls.params:
            click.echo(f"    {param.describe()}")
        for preset, values in cls.presets.items():
            click.echo(f"    preset {preset}: {', '.join(f'{k}={v}' for k, v in values.items())}")


@main.group("index")
def index_group() -> None:
    """Build retrieval indexes."""


@index_group.command("build")
@click.option("--corpus", required=True, type=click.Path(), help="Corpus file: JSONL (id, title, text) or DPR TSV.")
@click.option("--out", "out_dir", required=True, type=click.Path(),
              help="Folder for the index; for --kind milvus, URI#COLLECTION (./NAME.db or http://HOST:19530).")
@click.option("--kind", default="bm25", show_default=True,
              type=click.Choice(["bm25", "dense", "colbert", "lucene", "milvus"]), help="Index kind.")
@click.option("--checkpoint", type=click.Path(), help="ColBERT checkpoint folder (kind colbert), e.g. colbertv2.0.")
@click.option("--model", type=click.Path(),
              help="Sentence-transformers model folder (kinds dense, milvus); default: the bundled all-MiniLM-L6-v2.")
@click.option("--k1", type=float, help="BM25 k1 (kinds bm25 and lucene; default 1.5).")
@click.option("--b", type=float, help="BM25 b (kinds bm25 and lucene; default 0.75).")
@click.option("--threads", type=click.IntRange(min=1), help="Indexing threads (kind lucene; default: all cores).")
def index_build(corpus: str, out_dir: str, kind: str, checkpoint: str | None, model: str | None, k1: float | None,
                b: float | None, threads: int | None) -> None:
    """Build an index from a corpus file (dense and milvus builds resume when rerun after an interruption)."""
    from arag.data._io import check_apart, check_output_folder
    from arag.retrievers import build_index

    if kind != "milvus":
        check_output_folder(out_dir)
    if "://" not in out_dir:
        check_apart(out_dir.partition("#")[0] if kind == "milvus" else out_dir,
                    {"--corpus": corpus, "--checkpoint": checkpoint, "--model": model})
    given = {"checkpoint": checkpoint, "model": model, "k1": k1, "b": b, "threads": threads}
    options = {name: value for name, value in given.items() if value is not None}
    path = build_index(corpus, out_dir, kind=kind, **options)
    click.echo(f"built {kind} index at {path}")


@main.command("serve")
@click.option("--index", "index", required=True, help="An index folder or retriever spec (bm25:DIR, colbert:DIR, ...).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind; loopback unless told otherwise.")
@click.option("--port", default=8893, show_default=True, type=click.IntRange(0, 65535), help="Port (0: a free one).")
def serve_command(index: str, host: str, port: int) -> None:
    """Serve an index over the ColBERTv2 HTTP protocol at /api/search (GET ?query=&k=, or POST JSON)."""
    from arag.retrievers.colbert_http import serve

    serve(index, host=host, port=port)


@main.command("eval")
@click.option("--program", "program_name", help="Program name (see `arag programs`); optional with --compiled.")
@click.option("--compiled", type=click.Path(),
              help="A program saved by `arag compile` (its prompts, demos, parameters).")
@click.option("--dataset", required=True, type=click.Path(), help="Dataset file (see the README for formats).")
@click.option("--format", "fmt", default="auto", show_default=True, help="Dataset format.")
@retriever_options
@lm_options
@click.option("--param", "param_pairs", multiple=True, help="Program parameter key=value (repeatable).")
@click.option("--params-file", type=click.Path(), help="JSON file of program parameters (e.g. from `arag tune`).")
@click.option("--preset", help="A named parameter set of the program (see `arag programs`), e.g. official-popqa "
                               "for crag; --param and --params-file values win over it.")
@click.option("--fair-k-from", type=click.Path(),
              help="Set k to the mean distinct passages per question of this earlier run (folder or summary.json), "
                   "e.g. single-rag given as many passages as an adaptive-note run (\"fair top-k\").")
@click.option("--metric", "metrics", multiple=True, help="Metric name (repeatable); default: the dataset's own.")
@click.option("--limit", type=click.IntRange(min=1), help="Only the first N examples.")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True, help="Examples run at once.")
@click.option("--max-errors", type=click.IntRange(min=0), default=MAX_ERRORS, show_default=True,
              help="Stop after this many failed questions in a row (0: never stop); failed questions are recorded "
                   "either way and tried again by the next run.")
@click.option("--max-lm-calls", type=click.IntRange(min=0),
              help="Stop a question after this many LM calls, recorded as its failure (default: a generous cap "
                   "derived from the program's parameters; 0: none).")
@click.option("--out", "out_dir", required=True, type=click.Path(), help="Output folder (reused to resume).")
def eval_command(program_name: str | None, compiled: str | None, dataset: str, fmt: str, corpus: str | None,
                 retriever_spec: str | None, lm_setup: LMSetup, param_pairs: tuple[str, ...], params_file: str | None,
                 preset: str | None, fair_k_from: str | None, metrics: tuple[str, ...], limit: int | None,
                 threads: int, max_errors: int, max_lm_calls: int | None, out_dir: str) -> None:
    """Run a program over a dataset; write predictions.jsonl and summary.json to --out."""
    from arag.data import load_examples
    from arag.data._io import check_apart, check_output_folder
    from arag.data.metrics import get_metric
    from arag.evaluate import fair_top_k
    from arag.runs import RUN_FILES, check_run_folder
    from arag.setup import RunSpec

    check_apart(out_dir, {"--dataset": dataset, "--corpus": corpus, "--retriever": retriever_paths(retriever_spec),
                          "--compiled": compiled, "--params-file": params_file, "--fair-k-from": fair_k_from},
                writes=RUN_FILES)
    check_run_folder(check_output_folder(out_dir))
    params = given_params(params_file, param_pairs)
    if fair_k_from:
        params["k"] = fair_top_k(fair_k_from)
    spec = RunSpec(program=program_name, params=params, preset=preset, compiled=compiled, lm=lm_setup,
                   corpus=corpus, retriever=retriever_spec)
    for name in metrics:
        get_metric(name)
    examples = load_examples(dataset, fmt=fmt, limit=limit)
    result = spec.evaluate(examples, dataset=str(Path(dataset).resolve()), out_dir=out_dir, threads=threads,
                           metrics=metrics or None, max_errors=max_errors or None, max_lm_calls=max_lm_calls)
    summary = result.summary
    click.echo(ujson.dumps({k: summary[k] for k in ("program", "n", "n_failed", "metrics", "per_question")}, indent=2))
    click.echo(f"wrote {Path(out_dir) / 'predictions.jsonl'} and {Path(out_dir) / 'summary.json'}")
    if summary["n_failed"]:
        failed = [row for row in result.rows if row.failed]
        if len(failed) == summary["n"]:
            step = f" in {failed[-1].error_step}" if failed[-1].error_step else ""
            raise AragError(f"every question failed; the last error{step}: {failed[-1].error.splitlines()[0]}")
        click.echo(f"{len(failed)} question(s) failed, their errors are in predictions.jsonl; rerun the same "
                   "command to retry them", err=True)


@main.command("export-grounding")
@click.argument("run", type=click.Path())
@click.option("--out", "out_path", required=True, type=click.Path(), help="JSONL file to write.")
@click.option("--only-correct", is_flag=True, help="Only grounding calls of examples answered correctly.")
@click.option("--metric", help="The metric that decides correctness (default: any of the row's metrics at 1.0).")
@click.option("--drop-malformed", is_flag=True,
              help="Leave out calls whose output lacks evidence or revised_answer, whose evidence is not a list of "
                   "strings, or whose revised answer is blank.")
@click.option("--drop-no-evidence", is_flag=True, help="Leave out calls that quoted no evidence.")
@click.option("--drop-unrevised", is_flag=True,
              help="Leave out calls whose revised answer equals the candidate answer (after normalisation).")
@click.option("--drop-revised-wrongly", is_flag=True,
              help="Leave out calls of a question's last hop whose revised answer is the final answer when that "
                   "answer is wrong by --metric (other hops have no gold answer and are kept).")
@click.option("--paper-filters", is_flag=True,
              help="The paper's filtering of grounding traces: --drop-malformed, --drop-no-evidence and "
                   "--drop-revised-wrongly (a grounding that confirmed the candidate answer is kept).")
def export_grounding_command(run: str, out_path: str, only_correct: bool, metric: str | None, drop_malformed: bool,
                             drop_no_evidence: bool, drop_unrevised: bool, drop_revised_wrongly: bool,
                             paper_filters: bool) -> None:
    """Write a GenGround run's grounding calls as a chat fine-tuning set (for distillation).

    Every call is kept unless a filter drops it; each line's metadata lists the call's flaws (malformed,
    no evidence, unrevised, revised wrongly) either way."""
    from arag.data._io import check_output_file
    from arag.optimizers.distillation import export_grounding

    check_output_file(out_path)
    count = export_grounding(run, out_path, only_correct=only_correct, metric=metric, drop_malformed=drop_malformed,
                             drop_no_evidence=drop_no_evidence, drop_unrevised=drop_unrevised,
                             drop_revised_wrongly=drop_revised_wrongly, paper_filters=paper_filters)
    click.echo(f"wrote {count} grounding examples to {out_path}")


@main.command("report")
@click.argument("runs", nargs=-1, type=click.Path())
@click.option("--out", "out_path", required=True, type=click.Path(), help="HTML file to write.")
def report_command(runs: tuple[str, ...], out_path: str) -> None:
    """Write one self-contained HTML page comparing RUNS (folders written by `arag eval --out`): their metrics and
    costs, quality against cost with the Pareto front, and every question's answers and traces side by side."""
    from arag.report import report

    written = report(runs, out_path)
    click.echo(f"wrote {written.path}: {written.runs} run(s), {written.questions} question(s)")
    if written.runs > 1 and written.in_every_run < written.questions:
        held = ", ".join(f"{name} {count}" for name, count in written.questions_per_run.items())
        click.echo(f"the runs hold different questions: {written.in_every_run} are in every run ({held})", err=True)


main.add_command(compile_command)
main.add_command(tune_command)
main.add_command(train_router_command)

@main.command("models")
def models_command() -> None:
    """List the local models (--lm local:NAME): size, where each lives, and whether it is ready."""
    from arag.lm.local_models import DEFAULT_MODEL, MODELS, model_status

    for model in MODELS.values():
        status = model_status(model)
        default = " (--lm local)" if model.name == DEFAULT_MODEL else ""
        click.echo(f"local:{model.name}{default}  — {model.summary}")
        click.echo(f"    {model.size / 2**20:,.0f} MiB, {'ready' if status.ready else 'not ready'}: {status.detail}")
        click.echo(f"    {status.path or 'installed with ' + model.install_hint}")

@main.command("table")
@click.argument("runs", nargs=-1, type=click.Path())
@click.option("--baseline", help="The run each other run is compared with (a folder among RUNS).")
@click.option("--metric", "metrics", multiple=True, help="Metric (repeatable); default: every metric of the runs.")
def table_command(runs: tuple[str, ...], baseline: str | None, metrics: tuple[str, ...]) -> None:
    """Print RUNS (folders written by `arag eval --out`) as a Markdown table: questions, failures, mean metrics,
    each run's difference from --baseline on the same questions with a 95 % paired bootstrap interval, and LM
    calls, tokens, retrievals and seconds per question."""
    from arag.runs import load_runs
    from arag.runs.table import markdown, table_rows

    loaded = load_runs(runs)
    names = {str(Path(run.path).resolve()): run.name for run in loaded}
    base = names.get(str(Path(baseline).resolve())) if baseline else None
    if baseline and base is None:
        raise ConfigError(f"--baseline {baseline} is not one of the runs given")
    chosen = list(metrics) or sorted({m for run in loaded for row in run.rows for m in row.metrics})
    rows = table_rows([(run.name, run.rows) for run in loaded], chosen, base)
    click.echo(markdown(rows, chosen, base))


@main.command("decisions")
@click.argument("runs", nargs=-1, required=True, type=click.Path())
def decisions_command(runs: tuple[str, ...]) -> None:
    """Print what the programs of RUNS (folders written by `arag eval --out`) decided, from their traces: for each
    step that records a choice (CRAG's action, Self-RAG's retrieval decision, FLARE's retrieval before a sentence,
    why a loop stopped, ...), how often each value was taken, per question, and in how many questions."""
    from arag.runs import load_runs
    from arag.runs.decisions import markdown

    click.echo(markdown([(run.name, run.rows) for run in load_runs(runs)]))


if __name__ == "__main__":
    main()
