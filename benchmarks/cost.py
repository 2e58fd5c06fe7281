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
program's own trace (`required_calls`): FLARE = look-aheads + rewrites + span questions (+ the empty
look-ahead that ends the answer), Adaptive-Note = 1 + query proposals (retries included) + updates +
reviews + 1, GenGround = deductions + grounding batches (+ a closing call), Self-RAG = retrieval
decisions + per candidate one write and one call per critique, CRAG (scorer=lm) = k judgements +
one per strip + keyword rewrite + answer, Iter-RetGen = one generation per iteration, SuRe = 1 + a summary
and a validity judgement per distinct candidate + both orders of each pair, Adaptive-RAG = its label +
the chosen strategy's. The engine's request count beyond that is flagged as extra (a retry, a parse
fallback, or a bug). Tokens are the scripted engine's word-and-punctuation tokens.
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
from typing import Callable

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
# What each algorithm requires, read from its trace


def steps(trace: list[dict], kind: str) -> list[dict]:
    return [step for step in trace if step["step"] == kind]


def stop_reason(trace: list[dict]) -> str:
    stops = steps(trace, "stop")
    return stops[-1]["reason"] if stops else ""


def correction_calls(trace: list[dict]) -> int:
    """CRAG's corrective step with scorer=lm: one judgement per graded document and per strip, one rewrite."""
    graded = sum(len(step["scores"]) for step in steps(trace, "evaluate"))
    strips = sum(len(step["strip_scores"]) for step in steps(trace, "refine"))
    return graded + strips + len(steps(trace, "rewrite"))


def self_rag_calls(trace: list[dict]) -> int:
    decisions = sum("p_retrieve" in step for step in steps(trace, "retrieval_decision"))
    return decisions + sum(1 + len(step["critiques"]) for step in steps(trace, "candidate"))


def generation_calls(trace: list[dict], piece: str) -> int:
    """One draft per piece, plus the empty draft with which the model ends its answer."""
    return len(steps(trace, piece)) + (stop_reason(trace) == "the model ended its answer")


def flare_calls(trace: list[dict]) -> int:
    sentences = steps(trace, "sentence")
    rewrites = sum(step["retrieved"] for step in sentences)
    questions = sum(len(step.get("spans", ())) for step in sentences if step["retrieved"])
    return generation_calls(trace, "sentence") + rewrites + questions


def self_ask_calls(trace: list[dict]) -> int:
    follow_ups = len(steps(trace, "follow_up"))
    decisions = follow_ups + (stop_reason(trace) != "the follow-up cap is reached")
    return decisions + follow_ups + 1


def adaptive_note_calls(trace: list[dict]) -> int:
    updates = sum(step["iteration"] > 0 for step in steps(trace, "note"))
    return 1 + len(steps(trace, "query")) + updates + len(steps(trace, "review")) + 1


def genground_calls(trace: list[dict]) -> int:
    answer = steps(trace, "answer")
    closing = stop_reason(trace) == "hop budget" or bool(answer and "stated" not in answer[-1]
                                                             and steps(trace, "deduce")[-1]["finished"] is False)
    return len(steps(trace, "deduce")) + len(steps(trace, "ground")) + closing


def adaptive_rag_calls(trace: list[dict]) -> int:
    """Adaptive-RAG: the LM classifier's label (a router file makes none), then what the chosen strategy needs."""
    [route] = steps(trace, "route")
    return (route["classifier"] == "lm") + required_calls(route["strategy"], trace)


def sure_calls(trace: list[dict]) -> int:
    """SuRe: the candidates, then per distinct candidate a summary and a validity judgement, two per pair."""
    return 1 + len(steps(trace, "summary")) + len(steps(trace, "validity")) + len(steps(trace, "compare"))


REQUIRED: dict[str, tuple[str, Callable[[list[dict]], int]]] = {
    "no-retrieval": ("1 answer", lambda trace: 1),
    "single-rag": ("1 answer", lambda trace: 1),
    "flare": ("look-aheads (+1 ending) + rewrites + span questions", flare_calls),
    "flare-instruct": ("one generation per search, +1", lambda trace: len(steps(trace, "write"))),
    "prev-window": ("one draft per window (+1 ending)", lambda trace: generation_calls(trace, "window")),
    "prev-sentence": ("one draft per sentence (+1 ending)", lambda trace: generation_calls(trace, "sentence")),
    "ircot": ("one draft per sentence (+1 ending) + 1 reader",
              lambda trace: generation_calls(trace, "sentence") + len(steps(trace, "read"))),
    "self-ask": ("decisions + intermediate answers + 1", self_ask_calls),
    "react": ("thought-actions + 1 extraction", lambda trace: len(steps(trace, "act")) + 1),
    "crag": ("k judgements + strips + rewrite + 1", lambda trace: correction_calls(trace) + 1),
    "self-rag": ("decisions + candidates x (1 + critiques)", self_rag_calls),
    "self-crag": ("Self-RAG's + CRAG's corrective calls",
                  lambda trace: self_rag_calls(trace) + correction_calls(trace)),
    "adaptive-note": ("1 + 3 x iterations + retries + 1", adaptive_note_calls),
    "genground": ("deductions + grounding batches (+ closing)", genground_calls),
    "iter-retgen": ("one generation per iteration", lambda trace: len(steps(trace, "generate"))),
    "sure": ("1 + K summaries + K validity + K(K-1) pair-wise", sure_calls),
    "adaptive-rag": ("1 label + the chosen strategy's", adaptive_rag_calls),
}


def required_calls(program: str, trace: list[dict]) -> int:
    """The LM calls the program's algorithm needs for the steps its trace records."""
    return REQUIRED[program][1](trace)


# ------------------------------------------------------------------------------------------------
# Measuring


@dataclass
class Cost:
    program: str
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


def measure(program_name: str, retriever, questions: list[dspy.Example]) -> Cost:
    """Run one program over the questions, one at a time, on a fresh stand-in LM."""
    lm = scripted_lm(StandInModel())
    program = build_program(program_name, retriever)
    cost = Cost(program_name)
    started = time.perf_counter()
    with dspy.context(lm=lm):
        for example in questions:
            before = lm.engine.count
            try:
                prediction = program(question=example.question)
            except Exception as exc:  # noqa: BLE001 — a failure is a finding, reported in the table
                cost.failures.append(f"{example.id}: {type(exc).__name__}: {exc}"[:300])
                continue
            cost.requests.append(lm.engine.count - before)
            cost.required.append(required_calls(program_name, prediction.trace))
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
            f"| {mean(cost.passages):.2f} | {REQUIRED[cost.program][0]} |"
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
    unknown = sorted(set(names) - set(REQUIRED))
    if unknown:
        sys.exit(f"no required-call count for {', '.join(unknown)}; known: {', '.join(sorted(REQUIRED))}")
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
