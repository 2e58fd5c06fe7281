"""Seconds per question at one thread, one LM call at a time against independent calls at once.

    python benchmarks/latency.py [--latency 0.2] [--questions 5] [--programs crag,self-rag,...] [--quick]

Each program answers the first HotpotQA questions one at a time over BM25, against the stand-in scripted
LM of `arag.testing.stand_in` whose every call sleeps `--latency` seconds, twice in one run: with
`lm_concurrency=1` (every LM call waits for the one before, as arag ran before its calls inside a question
were made at once) and with the default limit (independent calls inside a question at once). DSPy's cache
is off, so every call reaches the LM. Beside them, the algorithm's critical path: its rounds of LM calls
that depend on each other, times the latency, counted from each question's trace:

    crag       judge the k passages; score each source's strips (one round per source); the keyword
               rewrite when searching; answer
    self-rag   per segment: the retrieval decision; write each candidate while its relevance is judged;
               its support and utility
    self-crag  Self-RAG's rounds, plus CRAG's refinement (and rewrite) rounds for its knowledge
The target: at most 1.3 x the critical path for these three. Programs whose calls all depend on the one
before (the others) have a critical path of one round per call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402

from arag.concurrency import DEFAULT_LM_CONCURRENCY, set_lm_concurrency  # noqa: E402
from arag.data import load_corpus, load_examples  # noqa: E402
from arag.programs import PROGRAMS, build_program  # noqa: E402
from arag.programs.crag.steps import Evaluate, Refine, Rewrite  # noqa: E402
from arag.programs.self_rag.steps import Candidate, RetrievalDecision  # noqa: E402
from arag.retrievers import BM25Retriever  # noqa: E402
from arag.testing import (  # noqa: E402
    StandInModel,  # noqa: E402
    isolated_cache,
    scripted_lm,
)
from arag.trace import steps_of  # noqa: E402

HOTPOTQA = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "hotpotqa"
TARGET = 1.3
FAN_OUT_PROGRAMS = ("crag", "self-crag", "self-rag")


def critical_rounds(name: str, prediction: dspy.Prediction) -> int:
    """Rounds of dependent LM calls the algorithm needs for this question (see the module docstring)."""
    correction = len(steps_of(prediction, Evaluate, Refine, Rewrite))
    if name == "crag":
        return correction + 1
    if name in ("self-rag", "self-crag"):
        decisions = sum("p_retrieve" in step for step in steps_of(prediction, RetrievalDecision))
        depths = {step["depth"] for step in steps_of(prediction, Candidate)}
        return decisions + 2 * len(depths) + (correction if name == "self-crag" else 0)
    return prediction.lm_calls


def seconds_per_question(name: str, retriever, questions: list, latency: float, limit: int):
    set_lm_concurrency(limit)
    lm = scripted_lm(StandInModel(), latency=latency)
    program = build_program(name, retriever)
    seconds, predictions = [], []
    with dspy.context(lm=lm):
        for example in questions:
            started = time.perf_counter()
            predictions.append(program(question=example.question))
            seconds.append(time.perf_counter() - started)
    return statistics.mean(seconds), predictions, lm.engine.count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=HOTPOTQA, help="folder with public.jsonl and corpus.jsonl")
    parser.add_argument("--programs", help="comma-separated program names (default: every registered program)")
    parser.add_argument("--latency", type=float, default=0.2, help="seconds every LM call waits")
    parser.add_argument("--questions", type=int, default=5, help="questions per program")
    parser.add_argument("--quick", action="store_true", help="crag and self-rag, 2 questions, 20 ms: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.programs, args.questions, args.latency = "crag,self-rag", 2, 0.02
    names = args.programs.split(",") if args.programs else sorted(PROGRAMS)
    questions = load_examples(args.dataset / "public.jsonl", limit=args.questions)
    print(f"HotpotQA, BM25, stand-in LM sleeping {args.latency * 1000:.0f} ms per call, one question at a time, "
          f"DSPy cache off; mean of {len(questions)} questions\n")
    print("| program | LM calls / q | one call at a time (s/q) | independent calls at once (s/q) | critical path (s/q) "
          "| at once / critical path |")
    print("|---|---|---|---|---|---|")
    ratios = []
    with tempfile.TemporaryDirectory(prefix="arag-latency-") as work, isolated_cache(enabled=False):
        retriever = BM25Retriever.build(load_corpus(args.dataset / "corpus.jsonl"), Path(work) / "bm25")
        for name in names:
            before, _, calls = seconds_per_question(name, retriever, questions, args.latency, 1)
            after, predictions, _ = seconds_per_question(name, retriever, questions, args.latency,
                                                         DEFAULT_LM_CONCURRENCY)
            path = statistics.mean(critical_rounds(name, p) for p in predictions) * args.latency
            ratio = after / path
            ratios.append((name, before / path, ratio))
            print(f"| {name} | {calls / len(questions):.1f} | {before:.2f} | {after:.2f} | {path:.2f} | {ratio:.2f} |",
                  flush=True)
    set_lm_concurrency(DEFAULT_LM_CONCURRENCY)
    print()
    for name, before, after in ratios:
        line = f"ratio {name}: latency / critical path {before:.2f} one call at a time, {after:.2f} at once"
        if name in FAN_OUT_PROGRAMS:
            line += " (target met)" if after <= TARGET else f" (target {TARGET} MISSED)"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
