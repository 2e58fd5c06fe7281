"""Thresholds tuned on the local model: do tuned parameters beat the defaults on questions they never saw?

    python benchmarks/tuning_local.py [--model smollm2-135m] [--skip 0] [--n-tune 50] [--n-eval 50] [--trials 8]
                                      [--programs flare,crag] [--threads N]

For each program, `arag.optimizers.tuning.tune` searches its default space (FLARE's theta and beta, CRAG's upper and
lower) for F1 on --n-tune HotpotQA questions (after the first --skip: `--skip 20` leaves the quality table's
questions out), with a local model (SmolLM2-135M-Instruct by default) run by llama.cpp in this process
(log-probabilities on) over BM25 on the HotpotQA corpus. The study's first trial is the default configuration.
Then the defaults and the best trial's parameters are evaluated on the next --n-eval questions (none with
--n-eval 0). The best parameters are in OUT/PROGRAM/study/best_params.json, which `benchmarks/quality.py
--tuned` runs as a row of the quality table. Printed per program: the study's cost (trials, LM calls spent,
seconds) and, for both configurations, F1 on the tuning questions and EM, F1 and LM calls per question on the
held-out ones.

One DSPy cache (fresh, in --out) serves a program's study and its two evaluations, as it would a user: trials
repeat the calls whose inputs their thresholds do not change (CRAG's relevance grades, FLARE's first look-ahead),
and "LM calls spent" counts the calls that reached the model. These are a small model's figures, never the
papers' numbers. Rerun with the same --out to continue an interrupted run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402
import optuna  # noqa: E402

import arag  # noqa: E402
from arag.optimizers.tuning import TuningConfig, defaults_trial, search_space, tune  # noqa: E402
from arag.testing import isolated_cache  # noqa: E402

HOTPOTQA = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "hotpotqa"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip", type=int, default=0, help="the first questions, left out (the quality table's)")
    parser.add_argument("--n-tune", type=int, default=50, help="HotpotQA questions the study scores trials on")
    parser.add_argument("--n-eval", type=int, default=50,
                        help="the next questions, for the held-out comparison (0: none)")
    parser.add_argument("--trials", type=int, default=8, help="trials per study, the defaults trial included")
    parser.add_argument("--programs", default="flare,crag", help="comma-separated program names")
    parser.add_argument("--dataset", type=Path, default=HOTPOTQA, help="folder with public.jsonl and corpus.jsonl")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "arag-bench-tuning-local")
    parser.add_argument("--threads", type=int, help="llama.cpp CPU threads (default: the engine's)")
    parser.add_argument("--model", default="smollm2-135m", help="a name of `arag models`")
    args = parser.parse_args()
    if not (args.dataset / "public.jsonl").exists():
        raise SystemExit(f"no dataset at {args.dataset}")
    if min(args.skip, args.n_tune - 1, args.n_eval) < 0:
        raise SystemExit("--skip and --n-eval take 0 or more questions, --n-tune 1 or more")
    if args.trials < 1:
        raise SystemExit(f"--trials {args.trials}: a study needs at least 1 trial (the defaults)")
    programs = [name.strip() for name in args.programs.split(",") if name.strip()]
    unknown = [name for name in programs if name not in arag.PROGRAMS]
    if unknown or not programs:
        raise SystemExit(f"--programs: unknown {', '.join(unknown)}" if unknown else "--programs names no program")
    examples = arag.load_examples(str(args.dataset / "public.jsonl"),
                                  limit=args.skip + args.n_tune + args.n_eval)[args.skip:]
    retriever = arag.open_retriever(corpus=str(args.dataset / "corpus.jsonl"))
    lm = arag.build_lm(f"local:{args.model}", logprobs=True, top_logprobs=5, threads=args.threads)
    tuning, held_out = examples[:args.n_tune], examples[args.n_tune:]
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    print(f"{len(tuning)} tuning and {len(held_out)} held-out HotpotQA questions (after the first {args.skip}), "
          f"{args.trials} trials, {args.model} on {os.cpu_count()} CPU cores\n")
    print("| program | study: trials, LM calls spent, minutes | configuration | parameters | F1 tuning "
          "| EM held-out | F1 held-out | LM calls / q held-out |")
    print("|---|---|---|---|---|---|---|---|")
    for name in programs:
        out = args.out / name
        with isolated_cache(folder=out / "dspy-cache"), dspy.context(lm=lm):
            config = TuningConfig(trials=args.trials, out_dir=out / "study", objectives=("f1",), seed=0, plots=False)
            study = tune(name, tuning, retriever, config)
            minutes = sum((t.datetime_complete - t.datetime_start).total_seconds() for t in study.study.trials
                          if t.datetime_complete and t.datetime_start) / 60  # all invocations' trials, resumed ones too
            defaults = defaults_trial(study.study)
            rows = {"defaults": (defaults.params, defaults.value)} if defaults else {}
            rows["tuned"] = (study.best["params"], study.best["values"]["f1"])
            searched = [param.name for param in search_space(name)]
            cost = f"{study.cost['trials']}, {study.cost['lm_calls_spent']}, {minutes:.0f}"
            if not held_out:
                for label, (params, tuning_f1) in rows.items():
                    shown = ", ".join(f"{key}={_short(params[key])}" for key in searched)
                    print(f"| {name} | {cost} | {label} | {shown} | {tuning_f1:.3f} | — | — | — |", flush=True)
                continue
            for label, (params, tuning_f1) in rows.items():
                spec = arag.RunSpec(program=name, params=params, lm=lm, retriever=retriever)
                result = spec.evaluate(held_out, out_dir=out / f"held-out-{label}", progress=False, max_errors=None)
                summary = result.summary
                shown = ", ".join(f"{key}={_short(spec.config[key])}" for key in searched)
                print(f"| {name} | {cost} | {label} | {shown} | {tuning_f1:.3f} | {summary['metrics']['em']:.3f} "
                      f"| {summary['metrics']['f1']:.3f} | {summary['per_question']['lm_calls']:.1f} |", flush=True)
    return 0


def _short(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    sys.exit(main())
