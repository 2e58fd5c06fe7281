"""Cost per question of every program on HotpotQA with a scripted LM, next to what its algorithm requires.

    python benchmarks/cost.py [--limit N] [--programs flare,crag,...] [--dataset DIR] [--quick]

Every registered program runs with its default parameters over BM25 on the HotpotQA corpus in
../shared/datasets/hotpotqa, one question at a time, against `StandInModel`: a scripted LM that
answers every arag signature in a fixed way shaped by the question and the passages it is shown
(a three-sentence answer whose second sentence has an unsure year, two sub-questions, notes that
grow with new passages, relevance judged by word overlap, and so on). Its answers are not a model's:
the figures are the programs' costs, never their quality. DSPy's cache is off, so every call reaches
the engine.

For each question the number of LM calls the method's algorithm requires is derived from the
program's own trace by the program itself (`required_lm_calls`; `lm_calls_formula` in words): FLARE =
look-aheads + rewrites + span questions (+ the empty look-ahead that ends the answer), Adaptive-Note =
1 + query proposals (retries included) + updates + reviews + 1, GenGround = deductions + grounding
batches (+ a closing call), Self-RAG = retrieval decisions + per candidate one write and one call per
critique, CRAG (scorer=lm) = k judgements + one per strip + keyword rewrite + answer, Iter-RetGen = one
generation per iteration, SuRe = 1 + a summary and a validity judgement per distinct candidate + both
orders of each pair, Adaptive-RAG = its label + the chosen strategy's. The engine's request count beyond
that is flagged as extra (a retry, a parse fallback, or a bug). Tokens are the scripted engine's
word-and-punctuation tokens.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402

from arag.data import load_corpus, load_examples  # noqa: E402
from arag.programs import PROGRAMS, build_program  # noqa: E402
from arag.retrievers import BM25Retriever  # noqa: E402
from arag.testing import StandInModel, isolated_cache, scripted_lm  # noqa: E402

HOTPOTQA = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "hotpotqa"
QUICK_QUESTIONS = 3

# prev-window drafts are cut at their window's token budget on purpose; DSPy warns about every cut.
logging.getLogger("dspy.clients.lm").setLevel(logging.ERROR)

# ------------------------------------------------------------------------------------------------
# Measuring


@dataclass
class Cost:
    program: str
    formula: str
    lm_calls: list[int] = field(default_factory=list)
    requests: list[int] = field(default_factory=list)
    required: list[int] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    completion_tokens: list[int] = field(default_factory=list)
    retrievals: list[int] = field(default_factory=list)
    passages: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def extra(self) -> int:
        return sum(r - q for r, q in zip(self.requests, self.required))

    @property
    def questions_with_extra(self) -> int:
        return sum(r != q for r, q in zip(self.requests, self.required))


def hotpotqa_retriever(dataset: Path, work: Path) -> BM25Retriever:
    return BM25Retriever.build(load_corpus(dataset / "corpus.jsonl"), work / "bm25")


def requests(lm: dspy.LM) -> int:
    """The requests the stand-in answered: the scripted engine's, and its attention model's generations (DRAGIN)."""
    return lm.engine.count + lm.engine.responder.attention_generations


def measure(program_name: str, retriever, questions: list[dspy.Example]) -> Cost:
    """Run one program over the questions, one at a time, on a fresh stand-in LM."""
    lm = scripted_lm(StandInModel())
    program = build_program(program_name, retriever)
    cost = Cost(program_name, program.lm_calls_formula)
    started = time.perf_counter()
    with dspy.context(lm=lm):
        for example in questions:
            before = requests(lm)
            try:
                prediction = program(question=example.question)
            except Exception as exc:  # noqa: BLE001 — a failure is a finding, reported in the table
                cost.failures.append(f"{example.id}: {type(exc).__name__}: {exc}"[:300])
                continue
            cost.requests.append(requests(lm) - before)
            cost.required.append(program.required_lm_calls(prediction.trace))
            cost.lm_calls.append(prediction.lm_calls)
            cost.prompt_tokens.append(prediction.prompt_tokens)
            cost.completion_tokens.append(prediction.completion_tokens)
            cost.retrievals.append(prediction.retrieval_calls)
            cost.passages.append(prediction.distinct_passages)
    cost.seconds = time.perf_counter() - started
    return cost


def mean(values: list[int]) -> float:
    return statistics.fmean(values) if values else 0.0


def spread(values: list[int]) -> str:
    return f"{mean(values):.2f} ({min(values)}–{max(values)})" if values else "—"


def table(costs: list[Cost]) -> str:
    lines = [
        "| program | questions | LM calls / q (min–max) | required / q | extra calls | tokens in / q | "
        "tokens out / q | retrievals / q | distinct passages / q | required = |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cost in costs:
        lines.append(
            f"| {cost.program} | {len(cost.requests)}{f' ({len(cost.failures)} failed)' if cost.failures else ''} "
            f"| {spread(cost.requests)} | {mean(cost.required):.2f} | {cost.extra} "
            f"| {mean(cost.prompt_tokens):,.0f} | {mean(cost.completion_tokens):,.0f} | {mean(cost.retrievals):.2f} "
            f"| {mean(cost.passages):.2f} | {cost.formula} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=HOTPOTQA, help="folder with public.jsonl and corpus.jsonl")
    parser.add_argument("--limit", type=int, help="only the first N questions (default: all)")
    parser.add_argument("--programs", help="comma-separated program names (default: every registered program)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_QUESTIONS} questions: a smoke run")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = args.programs.split(",") if args.programs else sorted(PROGRAMS)
    unknown = sorted(set(names) - set(PROGRAMS))
    if unknown:
        sys.exit(f"unknown programs {', '.join(unknown)}; known: {', '.join(sorted(PROGRAMS))}")
    limit = QUICK_QUESTIONS if args.quick else args.limit
    questions = load_examples(args.dataset / "public.jsonl", limit=limit)
    costs = []
    with tempfile.TemporaryDirectory(prefix="arag-cost-") as work, isolated_cache(enabled=False):
        retriever = hotpotqa_retriever(args.dataset, Path(work))
        for name in names:
            costs.append(measure(name, retriever, questions))
            print(f"{name}: {len(questions)} questions in {costs[-1].seconds:.1f} s", file=sys.stderr, flush=True)
    print(f"HotpotQA ({args.dataset}): {len(questions)} questions, BM25 over its corpus, stand-in scripted LM, "
          "default parameters, DSPy cache off\n")
    print(table(costs))
    print()
    for cost in costs:
        ratio = sum(cost.requests) / sum(cost.required) if sum(cost.required) else float("nan")
        verdict = "ok" if cost.extra == 0 and not cost.failures else "CHECK"
        print(f"ratio {cost.program}: LM calls / required = {ratio:.3f} "
              f"({cost.extra} extra over {cost.questions_with_extra} questions, {len(cost.failures)} failed) {verdict}")
        for failure in cost.failures[:3]:
            print(f"    failed {failure}")
    return 0 if all(c.extra == 0 and not c.failures for c in costs) else 1


if __name__ == "__main__":
    sys.exit(main())
