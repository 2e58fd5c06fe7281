"""Questions per second against threads, with a simulated LM of fixed latency: the speed-up over 1 thread.

    python benchmarks/throughput.py [--latency 0.2] [--threads 1,4,16,32] [--rounds 4]
                                    [--programs single-rag,flare,...] [--quick]

Each program runs through the evaluation harness (`arag.evaluate.evaluate`, the code behind
`arag eval --threads T`) over HotpotQA questions with BM25 on its corpus, against the stand-in
scripted LM of `arag.testing.stand_in` whose every call sleeps `--latency` seconds (a remote LM's
wait, no CPU), with DSPy's cache on in a fresh folder as in a real first run (`--cache off` to
compare). At T threads it answers `rounds` x T questions (4 at 1 thread), so that every worker has
several questions and the tail is short. An LM-bound program ideally runs T times
faster at T threads; the target is a speed-up of at least 0.8 x T at 16 and 32 threads.

Columns: questions/s; speed-up = (questions/s at T) / (questions/s at 1 thread); the same ratio
in LM calls/s (insensitive to the mix of questions, whose costs differ a little); CPU seconds the
process spent per LM call (all threads), which bounds throughput when Python's GIL saturates.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402

from arag.data import load_corpus, load_examples  # noqa: E402
from arag.evaluate import evaluate  # noqa: E402
from arag.programs import PROGRAMS, build_program  # noqa: E402
from arag.retrievers import BM25Retriever  # noqa: E402
from arag.testing import StandInModel, isolated_cache, scripted_lm  # noqa: E402

HOTPOTQA = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "hotpotqa"
TARGET_EFFICIENCY = 0.8
TARGET_THREADS = (16, 32)


@dataclass
class Run:
    threads: int
    questions: int
    calls: int
    failed: int
    seconds: float
    cpu_seconds: float

    @property
    def qps(self) -> float:
        return self.questions / self.seconds

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.seconds


def run_once(program_name: str, retriever, questions: list, threads: int, latency: float) -> Run:
    """One evaluation on a fresh stand-in LM (unique name: nothing is served from another run's cache)."""
    lm = scripted_lm(StandInModel(), latency=latency)
    program = build_program(program_name, retriever)
    cpu, wall = time.process_time(), time.perf_counter()
    with dspy.context(lm=lm):
        result = evaluate(program, questions, threads=threads, progress=False)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return Run(threads, len(questions), lm.engine.count, result.summary["n_failed"], wall, cpu)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=HOTPOTQA, help="folder with public.jsonl and corpus.jsonl")
    parser.add_argument("--programs", help="comma-separated program names (default: every registered program)")
    parser.add_argument("--threads", default="1,4,16,32", help="comma-separated thread counts; the first is the base")
    parser.add_argument("--latency", type=float, default=0.2, help="seconds every LM call waits")
    parser.add_argument("--rounds", type=int, default=4, help="questions per thread at each thread count")
    parser.add_argument("--cache", choices=("on", "off"), default="on",
                        help="DSPy's memory and disk cache (on, in a fresh folder, as in real runs; every call misses)")
    parser.add_argument("--quick", action="store_true",
                        help="single-rag and flare, 1 and 4 threads, 20 ms: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.programs, args.threads, args.latency, args.rounds = "single-rag,flare", "1,4", 0.02, 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = args.programs.split(",") if args.programs else sorted(PROGRAMS)
    thread_counts = [int(t) for t in args.threads.split(",")]
    examples = load_examples(args.dataset / "public.jsonl", limit=args.rounds * max(thread_counts))
    print(f"HotpotQA, BM25, stand-in LM sleeping {args.latency * 1000:.0f} ms per call, DSPy cache {args.cache}; "
          f"{args.rounds} questions per thread\n")
    print("| program | threads | questions | LM calls / q | questions/s | speed-up (ideal = threads) | "
          "speed-up in LM calls/s | CPU ms / LM call |")
    print("|---|---|---|---|---|---|---|---|")
    speedups = []
    with tempfile.TemporaryDirectory(prefix="arag-throughput-") as work, isolated_cache(enabled=args.cache == "on"):
        retriever = BM25Retriever.build(load_corpus(args.dataset / "corpus.jsonl"), Path(work) / "bm25")
        for name in names:
            base = None
            for threads in thread_counts:
                run = run_once(name, retriever, examples[: args.rounds * threads], threads, args.latency)
                base = base or run
                speedup, call_speedup = run.qps / base.qps, run.calls_per_s / base.calls_per_s
                failed = f" ({run.failed} failed)" if run.failed else ""
                print(f"| {name} | {threads} | {run.questions}{failed} | {run.calls / run.questions:.1f} "
                      f"| {run.qps:.2f} | {speedup:.2f} ({speedup / threads:.2f} x threads) "
                      f"| {call_speedup:.2f} | {1000 * run.cpu_seconds / max(run.calls, 1):.2f} |", flush=True)
                if run is not base:
                    speedups.append((name, threads, speedup))
    print()
    for name, threads, speedup in speedups:
        line = f"ratio {name} at {threads} threads: speed-up {speedup:.2f} = {speedup / threads:.2f} x threads"
        if threads in TARGET_THREADS:
            goal = TARGET_EFFICIENCY * threads
            line += " (target met)" if speedup >= goal else f" (target {goal:.1f} MISSED by {goal - speedup:.2f})"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
