"""LM calls of an N-trial tuning study against N full passes over the dev set, thanks to DSPy's cache.

Runs `arag.optimizers.tuning.tune` on the bundled sample set with scripted LMs (no model is involved: the
scripts stand in for one, so the counts are exact and the quality numbers mean nothing) twice:

- adaptive-note, searching its stopping thresholds t_iu, t_ci, t_rp (k fixed): every trial's LM
  calls are a prefix of the most patient trial's, so the cache answers almost all of them;
- single-rag, searching k: each distinct k puts other passages in the prompt, a new pass each.

"spent" counts calls that reached the LM (cache hits excluded); "one pass" is the mean LM calls a
complete trial makes over the whole set (cached or not); "cold pass" is what the first trial spent,
one pass from an empty cache (less than one pass when a program repeats an identical call).

    python benchmarks/tuning_cost.py [--trials 30]
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import click

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

TARGET_PASSES = 3.0


def _titles(passages_field: str) -> list[str]:
    return [p.split("] ", 1)[1].split(" | ")[0] for p in json.loads(passages_field or "[]")]


def note_taker(examples):
    """A scripted Adaptive-Note LM: notes list passage titles, a new note is better when it names
    more supporting titles, and the answer is right once the note names them all."""
    by_question = {e.question: e for e in examples}

    def covered(question: str, note: str) -> int:
        return sum(title in note for title in by_question[question].supporting_titles)

    def respond(call):
        question = call.inputs.get("question", "")
        inputs, fields = call.inputs, call.output_fields
        if "updated_note" in fields:
            return {"updated_note": f"{inputs['note']}; {'; '.join(_titles(inputs['passages']))}"}
        if "note" in fields:
            return {"note": "Notes on: " + "; ".join(_titles(inputs["passages"]))}
        if "query" in fields:
            asked = len(json.loads(inputs.get("asked_queries") or "[]"))
            return {"query": f"{re.sub(r'[?]', '', question)} detail {asked + 1}"}
        if "better" in fields:
            return {"better": covered(question, inputs["new_note"]) > covered(question, inputs["best_note"])}
        example = by_question[question]
        right = covered(question, inputs.get("note", "")) == len(example.supporting_titles)
        return {f: (example.answers[0] if right else "unknown") if f == "answer" else "." for f in fields}

    return respond


def reader(examples):
    """A scripted single-rag LM: right when every supporting passage is in the prompt."""
    by_question = {e.question: e for e in examples}

    def respond(call):
        example = by_question[call.inputs["question"]]
        right = set(example.supporting_titles) <= set(_titles(call.inputs["passages"]))
        return {f: (example.answers[0] if right else "unknown") if f == "answer" else "." for f in call.output_fields}

    return respond


@click.command()
@click.option("--trials", type=click.IntRange(min=1), default=30, show_default=True, help="Trials per study.")
@click.option("--seed", type=int, default=0, show_default=True, help="Sampler seed.")
def main(trials: int, seed: int) -> None:
    import optuna

    from arag.data import load_corpus, load_examples, sample_paths
    from arag.optimizers.tuning import SearchSpace, TuningConfig, tune
    from arag.retrievers import BM25Retriever
    from arag.testing import isolated_cache, scripted_lm

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    questions, corpus = sample_paths()
    examples = load_examples(questions)
    studies = [
        ("adaptive-note", "t_iu, t_ci, t_rp", note_taker, SearchSpace(names=("t_iu", "t_ci", "t_rp"), fixed={"k": 3})),
        ("single-rag", "k in [1, 20]", reader, SearchSpace(ranges={"k": (1, 20)}, fixed={"reasoning": "direct"})),
    ]
    click.echo(f"{len(examples)} questions, {trials} trials per study, scripted LMs\n")
    click.echo(f"{'program':14} {'searched':18} {'one pass':>9} {'cold pass':>9} {'N x pass':>9} {'spent':>7} "
               f"{'ratio':>7} {'passes spent':>13}  target <= {TARGET_PASSES:g} passes")
    with tempfile.TemporaryDirectory(prefix="arag-tuning-cost-") as folder, isolated_cache():
        retriever = BM25Retriever.build(load_corpus(corpus), Path(folder) / "bm25")
        for program, searched, responder, space in studies:
            lm = scripted_lm(responder(examples))
            config = TuningConfig(trials=trials, out_dir=Path(folder) / program, objectives=("f1",), space=space,
                                  pruner="none", seed=seed, plots=False)
            result = tune(program, examples, retriever, config, lm=lm)
            cost = result.cost
            assert cost["lm_calls_spent"] == lm.engine.count
            verdict = "met" if cost["passes_spent"] <= TARGET_PASSES else \
                f"missed by {cost['passes_spent'] / TARGET_PASSES:.1f}x"
            cold = cost["per_trial"][0]["spent"]
            click.echo(f"{program:14} {searched:18} {cost['one_pass_lm_calls']:9.1f} {cold:9d} "
                       f"{cost['trials_x_one_pass']:9.0f} {cost['lm_calls_spent']:7d} "
                       f"{cost['spent_over_trials_x_one_pass']:7.3f} {cost['passes_spent']:13.2f}  {verdict}")


if __name__ == "__main__":
    main()
