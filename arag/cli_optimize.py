"""`arag compile` and `arag tune`: optimise a program's prompts with a DSPy teleprompter, or its
parameters with Optuna, taking the same data, retriever and LM options as `arag eval`."""

from __future__ import annotations

import time
from pathlib import Path

import click
import ujson

from arag.cli_options import (
    given_params,
    lm_options,
    option_assignments,
    retriever_options,
    retriever_paths,
    searched_space,
)
from arag.errors import ConfigError
from arag.setup import LMSetup


@click.command("compile")
@click.option("--program", "program_name", required=True, help="Program name (see `arag programs`).")
@click.option("--trainset", required=True, type=click.Path(), help="Dataset the teleprompter learns from.")
@click.option("--devset", type=click.Path(),
              help="Validation set (bootstrap-rs, mipro and gepa score candidates on it).")
@click.option("--format", "fmt", default="auto", show_default=True, help="Format of both dataset files.")
@click.option("--teleprompter", default="bootstrap", show_default=True,
              type=click.Choice(["bootstrap", "bootstrap-rs", "mipro", "gepa", "copro", "simba"]),
              help="DSPy optimizer: BootstrapFewShot, ...WithRandomSearch, MIPROv2, GEPA, COPRO or SIMBA.")
@click.option("--metric", help="Metric to optimise (default: the trainset's own first metric).")
@click.option("--success-threshold", type=click.FloatRange(0, 1), default=1.0, show_default=True,
              help="Score at which a bootstrapped example counts as a success (a demo worth keeping).")
@click.option("--option", "option_pairs", multiple=True,
              help="Teleprompter option key=value (repeatable; JSON values), "
                   "e.g. max_bootstrapped_demos=2, auto=medium.")
@click.option("--keep-written-demos", is_flag=True,
              help="Keep the program's written worked examples (Self-Ask's chains) before the compiled demos; "
                   "by default the compiled demos replace them.")
@retriever_options
@lm_options
@click.option("--prompt-lm", "prompt_lm_spec", help="provider/model proposing instructions (mipro, copro, simba) "
                                                    "or reflecting (gepa), at temperature 1; default: the task LM.")
@click.option("--prompt-api-base", help="Base URL for --prompt-lm (default: --api-base).")
@click.option("--param", "param_pairs", multiple=True, help="Program parameter key=value (repeatable).")
@click.option("--params-file", type=click.Path(), help="JSON file of program parameters (e.g. from `arag tune`).")
@click.option("--limit", type=click.IntRange(min=1), help="Only the first N examples of each dataset.")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True, help="Examples run at once.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the teleprompters that sample.")
@click.option("--out", "out_path", required=True, type=click.Path(), help="JSON file for the compiled program.")
def compile_command(program_name: str, trainset: str, devset: str | None, fmt: str, teleprompter: str,
                    metric: str | None, success_threshold: float, option_pairs: tuple[str, ...],
                    keep_written_demos: bool, corpus: str | None, retriever_spec: str | None, lm_setup: LMSetup,
                    prompt_lm_spec: str | None,
                    prompt_api_base: str | None, param_pairs: tuple[str, ...], params_file: str | None,
                    limit: int | None, threads: int, seed: int, out_path: str) -> None:
    """Compile a program's prompts against a dataset's metric and save it (see `arag eval --compiled`)."""
    import inspect

    import dspy

    from arag.data import load_examples
    from arag.data._io import check_apart, check_output_file
    from arag.data.metrics import default_metrics, get_metric
    from arag.lm import build_lm
    from arag.optimizers.compile import changes, compile, parse_option_value, tried
    from arag.optimizers.saving import save_program
    from arag.setup import RunSpec
    from arag.trace.recorder import counting_lm_calls

    check_apart(check_output_file(out_path),
                {"--trainset": trainset, "--devset": devset, "--corpus": corpus,
                 "--retriever": retriever_paths(retriever_spec), "--params-file": params_file})
    spec = RunSpec(program=program_name, params=given_params(params_file, param_pairs), lm=lm_setup, corpus=corpus,
                   retriever=retriever_spec)
    if metric:
        get_metric(metric)
    options = {key: parse_option_value(value) for key, value in option_assignments(option_pairs, "--option").items()}
    clash = sorted(set(options) & set(inspect.signature(compile).parameters))
    if clash:
        raise ConfigError(f"--option {', '.join(clash)}: use the command's own option (--metric, --devset, "
                          "--prompt-lm, --success-threshold, --threads, --seed, --keep-written-demos)")
    prompt_lm = build_lm(prompt_lm_spec, api_base=prompt_api_base or lm_setup.api_base,
                         api_key_env=lm_setup.api_key_env, temperature=1.0) if prompt_lm_spec else None
    train = load_examples(trainset, fmt=fmt, limit=limit)
    metric = metric or default_metrics(train[0])[0]
    dev = load_examples(devset, fmt=fmt, limit=limit) if devset else None
    lm, program = spec.build()
    started = time.monotonic()
    with dspy.context(lm=lm), counting_lm_calls() as counts:
        compiled = compile(program, train, dev, teleprompter=teleprompter, metric=metric, prompt_lm=prompt_lm,
                           success_threshold=success_threshold, threads=threads, seed=seed,
                           keep_written_demos=keep_written_demos, **options)
    # Cost: LM calls answered from DSPy's cache count as calls (a fresh compile makes them); the seconds are this
    # process's, so a compile resumed from its cache or log_dir shows what its last part took.
    meta = {"teleprompter": teleprompter, "metric": metric, "options": options,
            "keep_written_demos": keep_written_demos,
            "trainset": str(Path(trainset).resolve()), "devset": str(Path(devset).resolve()) if devset else None,
            "task_lm": lm_setup.spec, "prompt_lm": prompt_lm_spec,
            "cost": {"lm_calls": counts.lm_calls, "seconds": round(time.monotonic() - started, 1)},
            "changed": changes(program, compiled), "tried": tried(program, compiled)}
    path = save_program(compiled, out_path, meta=meta)
    click.echo(ujson.dumps({"program": program_name, "params": compiled.config, "cost": meta["cost"],
                            "changed": meta["changed"]}, indent=2))
    click.echo(f"wrote {path}; evaluate it with `arag eval --compiled {path} ...`")


@click.command("tune")
@click.option("--program", "program_name", help="Program name (see `arag programs`); default: the --compiled one.")
@click.option("--devset", required=True, type=click.Path(), help="Dataset the trials are scored on.")
@click.option("--format", "fmt", default="auto", show_default=True, help="Dataset format.")
@click.option("--trials", required=True, type=click.IntRange(min=1),
              help="Finished (complete or pruned) trials the study should hold in total; a rerun continues up to it.")
@click.option("--objective", "objectives", multiple=True,
              help="Metric to maximise or cost per question to minimise (lm_calls, tokens, retrieval_calls, "
                   "seconds, ...); repeat for a multi-objective study. Default: f1.")
@click.option("--storage", help="SQLAlchemy URL of the study (default: sqlite in --out); PostgreSQL lets "
                                "several workers share one study.")
@click.option("--study", "study_name", help="Study name (default: program and objectives).")
@click.option("--n-jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Trials run at once in this process.")
@click.option("--compiled", type=click.Path(), help="Compiled program file whose prompts every trial keeps.")
@click.option("--param", "param_pairs", multiple=True,
              help="Fixed program parameter key=value, not searched (repeatable).")
@click.option("--params-file", type=click.Path(), help="JSON file of fixed program parameters.")
@click.option("--search", "search_names", multiple=True,
              help="Search this parameter, NAME or NAME=LOW:HIGH (repeatable; default: the method's thresholds and "
                   "decision knobs, marked in `arag programs`); `--search all` searches every tunable parameter.")
@click.option("--range", "range_pairs", multiple=True,
              help="Narrow a numeric search range: name=LOW:HIGH (repeatable).")
@click.option("--chunk-size", type=click.IntRange(min=1),
              help="Examples between pruning checks (default: a quarter of the set).")
@click.option("--pruner", type=click.Choice(["median", "hyperband", "none"]), default="median", show_default=True,
              help="Stops unpromising trials early (single objective only).")
@click.option("--seed", type=int, help="Sampler seed (give each worker of a shared study its own).")
@click.option("--no-plots", is_flag=True, help="Skip the HTML and PNG plots.")
@click.option("--max-lm-calls", type=click.IntRange(min=0),
              help="Stop a question after this many LM calls (default: a generous cap derived from the program's "
                   "parameters; 0: none); a trial whose every question reaches it is pruned.")
@click.option("--budget", "max_study_lm_calls", type=click.IntRange(min=1),
              help="LM calls the whole study may spend (earlier runs' included); no trial starts once spent.")
@click.option("--cost-ceiling", type=click.FloatRange(min=0), default=3.0, show_default=True,
              help="The default configuration runs first; a trial spending more than this many times its LM calls "
                   "per question is pruned (0: no defaults trial, no ceiling).")
@retriever_options
@lm_options
@click.option("--limit", type=click.IntRange(min=1), help="Only the first N examples.")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="Examples run at once per trial.")
@click.option("--out", "out_dir", required=True, type=click.Path(), help="Output folder (reused to continue).")
def tune_command(program_name: str | None, devset: str, fmt: str, trials: int, objectives: tuple[str, ...],
                 storage: str | None, study_name: str | None, n_jobs: int, compiled: str | None,
                 param_pairs: tuple[str, ...], params_file: str | None, search_names: tuple[str, ...],
                 range_pairs: tuple[str, ...], chunk_size: int | None, pruner: str, seed: int | None, no_plots: bool,
                 max_lm_calls: int | None, max_study_lm_calls: int | None, cost_ceiling: float,
                 corpus: str | None, retriever_spec: str | None, lm_setup: LMSetup, limit: int | None, threads: int,
                 out_dir: str) -> None:
    """Tune a program's declared parameters with Optuna; write best_params.json (or the Pareto front),
    trials.csv, study.json and plots to --out."""
    import optuna

    from arag.data import load_examples
    from arag.data._io import check_apart, check_output_folder
    from arag.optimizers.tuning import TuningConfig, defaults_unbeaten, search_space, tune
    from arag.optimizers.tuning.report import WRITTEN
    from arag.setup import RunSpec

    inputs = {"--devset": devset, "--corpus": corpus, "--retriever": retriever_paths(retriever_spec),
              "--compiled": compiled, "--params-file": params_file}
    check_apart(check_output_folder(out_dir), inputs, writes=WRITTEN)
    if storage and storage.startswith("sqlite:///"):
        check_apart(storage.removeprefix("sqlite:///"), inputs, option="--storage")
    fixed = given_params(params_file, param_pairs)
    spec = RunSpec(program=program_name, params=fixed, compiled=compiled, lm=lm_setup, corpus=corpus,
                   retriever=retriever_spec)
    space = searched_space(search_names, range_pairs, fixed)
    if 0 < cost_ceiling <= 1:
        raise ConfigError(f"--cost-ceiling must be above 1 (a multiple of the defaults' LM calls) or 0, "
                          f"got {cost_ceiling}")
    config = TuningConfig(
        trials=trials, out_dir=out_dir, objectives=objectives or ("f1",), space=space, compiled=compiled,
        storage=storage, study_name=study_name, seed=seed, pruner=pruner, chunk_size=chunk_size, n_jobs=n_jobs,
        threads=threads, max_lm_calls=max_lm_calls, max_study_lm_calls=max_study_lm_calls,
        cost_ceiling=cost_ceiling or None, plots=not no_plots)
    search_space(spec.program_name, space)
    examples = load_examples(devset, fmt=fmt, limit=limit)
    retriever, lm = spec.build_retriever(), spec.build_lm()
    spec.check_server()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    result = tune(spec.program_name, examples, retriever, config, lm=lm)
    cost = {k: v for k, v in result.cost.items() if k != "per_trial"}
    shown = {"study": result.study.study_name, "storage": result.storage, "this_worker_ran": len(result.ran),
             "cost": cost}
    shown.update({"best": result.best} if len(result.objectives) == 1 else {"pareto_front": result.pareto})
    click.echo(ujson.dumps(shown, indent=2))
    if defaults := defaults_unbeaten(result):
        click.echo(f"no trial scored better than the defaults (trial {defaults.number}: "
                   f"{result.objectives[0].name} {defaults.values[0]:.4g})")
    for name, reason in result.skipped_plots.items():
        click.echo(f"plot {name} skipped: {reason}", err=True)
    if "best_params" in result.files:
        pick = (f"{Path(out_dir) / 'pareto'}/trial-N.json for the point you pick, or " if result.pareto else "")
        click.echo(f"wrote {out_dir}; evaluate with `arag eval --params-file {pick}{result.files['best_params']}`")
    else:
        click.echo(f"wrote {out_dir}; no trial completed yet")


@click.command("train-router")
@click.argument("runs", nargs=-1, required=True, type=click.Path())
@click.option("--out", "out_path", required=True, type=click.Path(), help="Router file to write (JSON).")
@click.option("--metric", default="em", show_default=True,
              help="The runs' metric that says whether a strategy answered correctly.")
@click.option("--correct-at", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True,
              help="The --metric score at which an answer counts as correct (e.g. 0.5 for f1).")
@click.option("--hops", "hop_pairs", multiple=True,
              help="DATASET=single|multi for a dataset arag does not know (repeatable).")
@click.option("--held-out", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.2,
              show_default=True, help="Share of the questions kept apart to measure the router.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the split and the classifier.")
def train_router_command(runs: tuple[str, ...], out_path: str, metric: str, correct_at: float,
                         hop_pairs: tuple[str, ...], held_out: float, seed: int) -> None:
    """Train adaptive-rag's router from `arag eval` runs of no-retrieval, single-rag and ircot (RUN: their folders)."""
    from arag.data._io import check_apart, check_output_file
    from arag.optimizers.router_training import label_runs, parse_hops, train_router

    if not check_output_file(out_path).parent.is_dir():
        raise ConfigError(f"cannot write {out_path}: its folder does not exist")
    check_apart(out_path, {"RUN": runs})
    labelled = label_runs(runs, metric=metric, hops=parse_hops(hop_pairs), correct_at=correct_at)
    report = train_router(labelled, out_path, held_out=held_out, seed=seed, metric=metric, correct_at=correct_at)
    for line in report.lines():
        click.echo(line)
    click.echo(f"wrote {out_path} (use it with --param classifier={out_path} --program adaptive-rag)")
