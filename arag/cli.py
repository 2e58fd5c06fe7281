"""The `arag` command line: list programs, build indexes, evaluate programs on a dataset."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click
import ujson

from arag.errors import AragError, ConfigError


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
@click.option("-v", "--verbose", is_flag=True, help="Log what arag does (index builds, LM set-up).")
def main(verbose: bool) -> None:
    """Adaptive retrieval-augmented generation programs on DSPy."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("arag").setLevel(logging.INFO)


@main.command("programs")
def programs_command() -> None:
    """List the programs and their parameters (name=default range  meaning)."""
    from arag.programs import PROGRAMS

    for name in sorted(PROGRAMS):
        cls = PROGRAMS[name]
        click.echo(f"{name}  — {(cls.__doc__ or sys.modules[cls.__module__].__doc__ or '').strip().splitlines()[0]}")
        for param in cls.params:
            click.echo(f"    {param.describe()}")


@main.group("index")
def index_group() -> None:
    """Build retrieval indexes."""


@index_group.command("build")
@click.option("--corpus", required=True, type=click.Path(), help="Corpus file: JSONL (id, title, text) or DPR TSV.")
@click.option("--out", "out_dir", required=True, type=click.Path(), help="Folder for the index.")
@click.option("--kind", default="bm25", show_default=True, help="Index kind.")
def index_build(corpus: str, out_dir: str, kind: str) -> None:
    """Build an index from a corpus file."""
    from arag.retrievers import build_index

    path = build_index(corpus, out_dir, kind=kind)
    click.echo(f"built {kind} index at {path}")


def lm_options(fn):
    fn = click.option("--logprobs", is_flag=True,
                      help="Ask the LM for token log-probabilities on every call (traces then carry answer confidence).")(fn)
    fn = click.option("--api-key-env", default="OPENAI_API_KEY", show_default=True,
                      help="Environment variable holding the API key.")(fn)
    fn = click.option("--api-base", envvar="ARAG_API_BASE", help="Base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1.")(fn)
    fn = click.option("--lm", "lm_spec", envvar="ARAG_LM", help="provider/model, e.g. openai/gpt-4o-mini (or set ARAG_LM).")(fn)
    return fn


def retriever_options(fn):
    fn = click.option("--retriever", "retriever_spec", help="An index folder, bm25:DIR, or another retriever spec.")(fn)
    fn = click.option("--corpus", type=click.Path(), help="Corpus file; its BM25 index is built on first use and reused.")(fn)
    return fn


@main.command("eval")
@click.option("--program", "program_name", required=True, help="Program name (see `arag programs`).")
@click.option("--dataset", required=True, type=click.Path(), help="Dataset file (see the README for formats).")
@click.option("--format", "fmt", default="auto", show_default=True, help="Dataset format.")
@retriever_options
@lm_options
@click.option("--param", "param_pairs", multiple=True, help="Program parameter key=value (repeatable).")
@click.option("--params-file", type=click.Path(), help="JSON file of program parameters (e.g. from `arag tune`).")
@click.option("--fair-k-from", type=click.Path(),
              help="Set k to the mean distinct passages per question of this earlier run (folder or summary.json), "
                   "e.g. single-rag given as many passages as an adaptive-note run (\"fair top-k\").")
@click.option("--metric", "metrics", multiple=True, help="Metric name (repeatable); default: the dataset's own.")
@click.option("--limit", type=click.IntRange(min=1), help="Only the first N examples.")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True, help="Examples run at once.")
@click.option("--out", "out_dir", required=True, type=click.Path(), help="Output folder (reused to resume).")
def eval_command(program_name: str, dataset: str, fmt: str, corpus: str | None, retriever_spec: str | None,
                 lm_spec: str | None, api_base: str | None, api_key_env: str, logprobs: bool, param_pairs: tuple[str, ...],
                 params_file: str | None, fair_k_from: str | None, metrics: tuple[str, ...], limit: int | None, threads: int,
                 out_dir: str) -> None:
    """Run a program over a dataset; write predictions.jsonl and summary.json to --out."""
    import dspy

    from arag.data import load_examples
    from arag.data.metrics import get_metric
    from arag.evaluate import evaluate
    from arag.lm import build_lm
    from arag.programs import build_program, get_program
    from arag.programs.adaptive_note import fair_top_k
    from arag.programs.params import parse_assignments, resolve_params
    from arag.retrievers import open_retriever

    cls = get_program(program_name)
    given = {**_read_params_file(params_file), **parse_assignments(param_pairs)}
    if fair_k_from:
        given["k"] = fair_top_k(fair_k_from)
    params = resolve_params(cls.params, given, program_name)
    for name in metrics:
        get_metric(name)
    if not lm_spec:
        raise ConfigError("no LM configured: pass --lm provider/model (with --api-base URL for a local "
                          "OpenAI-compatible server such as vLLM or Ollama), or set ARAG_LM")
    lm = build_lm(lm_spec, api_base=api_base, api_key_env=api_key_env, logprobs=logprobs,
                  top_logprobs=5 if logprobs else None)
    examples = load_examples(dataset, fmt=fmt, limit=limit)
    retriever = open_retriever(retriever_spec, corpus=corpus) if cls.needs_retriever else None
    program = build_program(program_name, retriever, **params)
    run_info = {
        "program": program_name,
        "params": program.config,
        "dataset": str(Path(dataset).resolve()),
        "retriever": retriever_spec or (str(Path(corpus).resolve()) if corpus else None),
        "lm": lm_spec,
    }
    with dspy.context(lm=lm):
        result = evaluate(program, examples, out_dir=out_dir, threads=threads, metrics=metrics or None,
                          run_info=run_info)
    summary = result.summary
    click.echo(ujson.dumps({k: summary[k] for k in ("program", "n", "n_failed", "metrics", "per_question")}, indent=2))
    click.echo(f"wrote {Path(out_dir) / 'predictions.jsonl'} and {Path(out_dir) / 'summary.json'}")


@main.command("export-grounding")
@click.argument("run", type=click.Path())
@click.option("--out", "out_path", required=True, type=click.Path(), help="JSONL file to write.")
@click.option("--only-correct", is_flag=True, help="Only grounding calls of examples answered correctly.")
@click.option("--metric", help="The metric that decides correctness (default: any of the row's metrics at 1.0).")
def export_grounding_command(run: str, out_path: str, only_correct: bool, metric: str | None) -> None:
    """Write a GenGround run's grounding calls as a chat fine-tuning set (for distillation)."""
    from arag.data.distillation import export_grounding

    count = export_grounding(run, out_path, only_correct=only_correct, metric=metric)
    click.echo(f"wrote {count} grounding examples to {out_path}")


def _read_params_file(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = ujson.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"--params-file {path}: no such file") from None
    except ValueError as exc:
        raise ConfigError(f"--params-file {path}: not valid JSON ({exc})") from None
    data = data.get("params", data) if isinstance(data, dict) else data
    if not isinstance(data, dict):
        raise ConfigError(f"--params-file {path}: expected a JSON object of parameters")
    return data


if __name__ == "__main__":
    main()
