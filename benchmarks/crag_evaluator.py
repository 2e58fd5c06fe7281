"""CRAG's retrieval evaluator on labelled pairs: each scorer's ROC-AUC and fitted thresholds.

By default the pairs are HotpotQA's distractor setting in ../shared/datasets/hotpotqa/public.jsonl
(per question 2 supporting paragraphs, relevant, and 8 distractors, irrelevant). The embedding
scorer always runs; `--scorer t5:PATH` adds a T5 evaluator; the lm scorer runs only when `--lm`
names a real LM (it needs log-probabilities, unless `--label-fallback`).

    python benchmarks/crag_evaluator.py [--limit 100] [--lm openai/MODEL --api-base URL] [--alpha 0.5 ...]
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import click

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

HOTPOTQA = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "hotpotqa" / "public.jsonl"


@click.command()
@click.option("--pairs", "pairs_path", type=click.Path(), default=str(HOTPOTQA), show_default=True,
              help="Labelled pairs: a dataset with is_supporting passages, or JSONL {question, passage, relevant}.")
@click.option("--limit", type=click.IntRange(min=1), help="Only the first N questions.")
@click.option("--scorer", "scorers", multiple=True, help="Scorer spec (repeatable): embedding, t5:PATH, lm.")
@click.option("--lm", "lm_spec", help="provider/model for the lm scorer, e.g. openai/gpt-4o-mini.")
@click.option("--api-base", help="Base URL of an OpenAI-compatible server for --lm.")
@click.option("--label-fallback", is_flag=True, help="lm scorer without log-probabilities: yes=+1, no=-1.")
@click.option("--alpha", "alphas", multiple=True, type=float, help="False-positive penalty (repeatable).")
def main(pairs_path, limit, scorers, lm_spec, api_base, label_fallback, alphas):
    import dspy

    from arag.lm import build_lm
    from arag.optimizers.thresholds import DEFAULT_ALPHA, fit_thresholds, load_pairs, roc_auc, score_pairs
    from arag.programs.crag.evaluator import open_scorer

    pairs = load_pairs(pairs_path, limit=limit)
    n_relevant = sum(pair.relevant for pair in pairs)
    questions = len({pair.question for pair in pairs})
    click.echo(f"{pairs_path}: {questions} questions, {len(pairs)} pairs ({n_relevant} relevant, "
               f"{len(pairs) - n_relevant} irrelevant)")
    specs = list(scorers) or ["embedding"] + (["lm"] if lm_spec else [])
    if "lm" in specs and not lm_spec:
        raise click.UsageError("the lm scorer needs --lm provider/model (a real LM returning log-probabilities)")
    lm = build_lm(lm_spec, api_base=api_base) if lm_spec else None
    for spec in specs:
        scorer = open_scorer(spec, label_fallback=label_fallback)
        started = time.perf_counter()
        with dspy.context(lm=lm):
            scores = score_pairs(scorer, pairs)
        elapsed = time.perf_counter() - started
        labels = [pair.relevant for pair in pairs]
        click.echo(f"\nscorer {spec}: ROC-AUC {roc_auc(scores, labels):.4f}  "
                   f"({elapsed:.1f} s, {1000 * elapsed / len(pairs):.1f} ms per pair)")
        click.echo("  alpha   upper    lower   S_upper  S_lower  correct  ambiguous  incorrect (share of questions)")
        for alpha in alphas or (0.0, 0.5, DEFAULT_ALPHA, 2.0):
            fit = fit_thresholds(scores, labels, alpha, questions=[pair.question for pair in pairs])
            click.echo(f"  {alpha:5.2f}  {fit.upper:+.4f}  {fit.lower:+.4f}  {fit.s_upper:7.4f}  {fit.s_lower:7.4f}"
                       f"  {fit.correct_share:7.3f}  {fit.ambiguous_share:9.3f}  {fit.incorrect_share:9.3f}")


if __name__ == "__main__":
    main()
