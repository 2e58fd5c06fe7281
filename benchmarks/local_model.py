"""Every program on HotpotQA with a local model: what it does, and what it costs.

    python benchmarks/local_model.py [--model smollm2-135m] [--n 50] [--programs flare,crag,...] [--out DIR]

Each registered program runs with its default parameters over BM25 on the HotpotQA corpus in
../shared/datasets/hotpotqa, one question at a time, on a model of `arag models` (default the 135M test model,
SmolLM2-135M-Instruct; `--model qwen2.5-coder-1.5b` for the one that reads) through llama.cpp in this process,
log-probabilities on, outputs decoded under each signature's JSON schema, with a fresh DSPy cache (every call
reaches the model). Printed per program: questions failed and why, EM/F1, LM calls, tokens in and out, and
seconds per question. These are a small model's figures — the programs' cost and robustness on a real
model — never the papers' numbers.

Runs are written to --out/PROGRAM (predictions.jsonl, summary.json): an interrupted benchmark continues
where it stopped when started again with the same --out.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402

import arag  # noqa: E402
from arag.testing import isolated_cache  # noqa: E402

HOTPOTQA = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "hotpotqa"

# prev-window's drafts are cut at their window's token budget on purpose; DSPy warns about every cut.
logging.getLogger("dspy.clients.lm").setLevel(logging.ERROR)


def hotpotqa_on_the_local_model(dataset: Path, limit: int, threads: int | None = None, model: str = "smollm2-135m"
                                ) -> tuple[list[dspy.Example], arag.retrievers.Retriever, dspy.LM]:
    """The first `limit` questions of a HotpotQA folder, BM25 over its corpus, and the local model `model` asked
    for log-probabilities (on `threads` CPU threads; None: the engine's default); exits naming the folder when it
    holds no dataset."""
    if not (dataset / "public.jsonl").exists():
        raise SystemExit(f"no dataset at {dataset}")
    examples = arag.load_examples(str(dataset / "public.jsonl"), limit=limit)
    retriever = arag.open_retriever(corpus=str(dataset / "corpus.jsonl"))
    return examples, retriever, arag.build_lm(f"local:{model}", logprobs=True, top_logprobs=5, threads=threads)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="a name of `arag models`")
    parser.add_argument("--n", type=int, default=50, help="HotpotQA questions per program")
    parser.add_argument("--programs", default=",".join(sorted(arag.PROGRAMS)), help="comma-separated program names")
    parser.add_argument("--dataset", type=Path, default=HOTPOTQA, help="folder with public.jsonl and corpus.jsonl")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "arag-bench-local")
    args = parser.parse_args()
    names = [name.strip() for name in args.programs.split(",") if name.strip()]
    examples, retriever, lm = hotpotqa_on_the_local_model(args.dataset, args.n, model=args.model)

    header = (f"{'program':<15}{'n':>4}{'failed':>7}  {'why':<34}{'EM':>6}{'F1':>6}{'LM calls':>9}"
              f"{'tok in':>8}{'tok out':>8}{'s/q':>7}")
    print(f"{args.n} HotpotQA questions, {args.model} on {os.cpu_count()} CPU cores\n{header}")
    for name in names:
        spec = arag.RunSpec(program=name, lm=lm, retriever=retriever)
        with isolated_cache():
            result = spec.evaluate(examples, dataset=str(args.dataset / "public.jsonl"), out_dir=args.out / name,
                                   progress=False, max_errors=None)
        summary, per = result.summary, result.summary["per_question"]
        why = ", ".join(f"{kind} {count}" for kind, count in sorted(summary["failures"].items())) or "-"
        metrics = summary["metrics"]
        seconds = summary["seconds_per_question"]
        print(f"{name:<15}{summary['n']:>4}{summary['n_failed']:>7}  {why:<34}{metrics.get('em', 0):>6.3f}"
              f"{metrics.get('f1', 0):>6.3f}{per['lm_calls']:>9.1f}{per['prompt_tokens']:>8.0f}"
              f"{per['completion_tokens']:>8.0f}{seconds:>7.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
