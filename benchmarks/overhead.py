"""Framework overhead: CPU time per LM call with a zero-latency scripted LM, and where it goes.

    python benchmarks/overhead.py [--limit 30] [--programs flare,crag,...] [--cache on|off] [--quick]

Each program answers HotpotQA questions one at a time (BM25 over its corpus) against the stand-in
scripted LM of `arag.testing.stand_in` with no latency. `time.process_time` is read around the run,
around every engine call and around every retrieval; framework CPU per LM call is

    (run CPU - engine CPU - retrieval CPU) / engine requests

that is, everything DSPy and arag do for a call: prompt building, output parsing, log-probability
alignment, tracing and counting, callbacks, DSPy's cache (on by default, as in real runs, in a
fresh folder). The scripted engine's own CPU (rendering its answer, counting tokens) stands for the
network client of a real LM and is left out. Target: at most 5 ms per call.

A second, profiled pass (cProfile, which slows everything down, so its figures are shares rather
than absolute costs) splits the time by area and lists the functions that cost most.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402

from arag.data import load_corpus, load_examples  # noqa: E402
from arag.programs import PROGRAMS, build_program  # noqa: E402
from arag.retrievers import BM25Retriever  # noqa: E402
from arag.testing import StandInModel, isolated_cache, scripted_lm  # noqa: E402

HOTPOTQA = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "hotpotqa"
TARGET_MS = 5.0
QUICK_QUESTIONS = 2
QUICK_PROGRAMS = ("single-rag", "flare", "crag")

# Areas of the profile: (label, file suffix, function name), measured by cumulative time.
AREAS = (
    ("prompt building (adapter format)", "dspy/adapters/base.py", "format"),
    ("output parsing (adapter parse)", "dspy/adapters/chat_adapter.py", "parse"),
    ("output parsing (adapter parse)", "dspy/adapters/json_adapter.py", "parse"),
    ("log-probability alignment (arag.lm)", "arag/lm/logprobs.py", "_field_tokens"),
    ("tracing: steps and retrieval records", "arag/trace.py", "add"),
    ("tracing: steps and retrieval records", "arag/trace.py", "retrieval"),
    ("tracing: LM call counter callback", "arag/trace.py", "on_lm_start"),
    ("DSPy callbacks wrapper", "dspy/utils/callback.py", "_execute_start_callbacks"),
    ("DSPy callbacks wrapper", "dspy/utils/callback.py", "_execute_end_callbacks"),
    ("DSPy usage tracking", "dspy/utils/usage_tracker.py", "add_usage"),
    ("DSPy cache (get + put)", "dspy/clients/cache.py", "get"),
    ("DSPy cache (get + put)", "dspy/clients/cache.py", "put"),
    ("DSPy LM history", "dspy/clients/base_lm.py", "update_history"),
    ("sentence splitting (pysbd)", "programs/frame/sentences.py", "split_sentences"),
)
EXCLUDED_AREAS = (
    ("scripted engine (not framework)", "arag/testing/engines.py", "complete"),
    ("retrieval (not framework)", "programs/frame/base.py", "retrieve"),
)


@dataclass
class Overhead:
    program: str
    questions: int
    requests: int
    total_s: float
    engine_s: float
    retrieval_s: float

    @property
    def framework_ms(self) -> float:
        return 1000 * (self.total_s - self.engine_s - self.retrieval_s) / max(self.requests, 1)


class CPUMeter:
    """Accumulates the process CPU time spent inside wrapped callables (single-threaded use)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, function):
        def timed(*args, **kwargs):
            started = time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += time.process_time() - started

        return timed


@contextmanager
def metered(obj, attribute: str, meter: CPUMeter):
    original = getattr(obj, attribute)
    setattr(obj, attribute, meter.wrap(original))
    try:
        yield
    finally:
        setattr(obj, attribute, original)


def measure(program_name: str, retriever, questions: list) -> Overhead:
    lm = scripted_lm(StandInModel())
    program = build_program(program_name, retriever)
    engine, retrieval = CPUMeter(), CPUMeter()
    with dspy.context(lm=lm), metered(lm.engine, "complete", engine), metered(retriever, "retrieve", retrieval):
        started = time.process_time()
        for example in questions:
            program(question=example.question)
        total = time.process_time() - started
    return Overhead(program_name, len(questions), lm.engine.count, total, engine.seconds, retrieval.seconds)


def profile(names: list[str], retriever, questions: list) -> tuple[pstats.Stats, int]:
    """Every program over the questions under cProfile; the stats and the engine requests made."""
    requests = 0
    profiler = cProfile.Profile()
    for name in names:
        lm = scripted_lm(StandInModel())
        program = build_program(name, retriever)
        with dspy.context(lm=lm):
            profiler.enable()
            for example in questions:
                program(question=example.question)
            profiler.disable()
        requests += lm.engine.count
    return pstats.Stats(profiler), requests


def cumulative(stats: pstats.Stats, suffix: str, function: str) -> float:
    return sum(entry[3] for (path, _, name), entry in stats.stats.items()
               if name == function and path.endswith(suffix))


def excluded_path(path: str) -> bool:
    return any(part in path for part in ("arag/testing/", "retrievers/", "bm25s/", "Stemmer"))


def own_time(entry: tuple) -> float:
    """A function's own time, less what it spent when called directly by the engine or the retriever."""
    callers = entry[4]
    if not callers:
        return entry[2]
    return sum(timing[2] for caller, timing in callers.items() if not excluded_path(caller[0]))


def profile_report(stats: pstats.Stats, requests: int) -> list[str]:
    total = stats.total_tt
    excluded = {label: sum(cumulative(stats, suffix, fn) for area, suffix, fn in EXCLUDED_AREAS if area == label)
                for label, _, _ in EXCLUDED_AREAS}
    framework = total - sum(excluded.values())
    areas: dict[str, float] = {}
    for label, suffix, function in AREAS:
        areas[label] = areas.get(label, 0.0) + cumulative(stats, suffix, function)
    lines = [f"Profiled: {requests} LM calls, {total:.2f} s under cProfile "
             f"({1000 * framework / requests:.2f} ms framework per call under the profiler)\n",
             "| area (cumulative time; areas can nest) | share of framework time | ms per LM call (profiled) |",
             "|---|---|---|"]
    for label, seconds in sorted(areas.items(), key=lambda item: -item[1]):
        lines.append(f"| {label} | {seconds / framework:.1%} | {1000 * seconds / requests:.3f} |")
    for label, seconds in excluded.items():
        lines.append(f"| {label} | — | {1000 * seconds / requests:.3f} |")
    lines += ["", "Top functions by own time (scripted engine and retrieval excluded):", "",
              "| function | own time share | calls per LM call |", "|---|---|---|"]
    ranked = sorted(((own_time(entry), key, entry[1]) for key, entry in stats.stats.items()
                     if not excluded_path(key[0])), reverse=True)
    for own, (path, line, name), calls in ranked[:15]:
        where = "/".join(Path(path).parts[-2:]) if path != "~" else "builtin"
        lines.append(f"| {where}:{line} {name} | {own / framework:.1%} | {calls / requests:.1f} |")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=HOTPOTQA, help="folder with public.jsonl and corpus.jsonl")
    parser.add_argument("--programs", help="comma-separated program names (default: every registered program)")
    parser.add_argument("--limit", type=int, default=30, help="questions per program")
    parser.add_argument("--cache", choices=("on", "off"), default="on", help="DSPy's memory and disk cache")
    parser.add_argument("--quick", action="store_true",
                        help=f"{', '.join(QUICK_PROGRAMS)} on {QUICK_QUESTIONS} questions: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.programs, args.limit = ",".join(QUICK_PROGRAMS), QUICK_QUESTIONS
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = args.programs.split(",") if args.programs else sorted(PROGRAMS)
    questions = load_examples(args.dataset / "public.jsonl", limit=args.limit)
    with tempfile.TemporaryDirectory(prefix="arag-overhead-") as work, isolated_cache(enabled=args.cache == "on"):
        retriever = BM25Retriever.build(load_corpus(args.dataset / "corpus.jsonl"), Path(work) / "bm25")
        measure(names[0], retriever, questions[:1])  # imports and first-use set-up are not per-call costs
        results = [measure(name, retriever, questions) for name in names]
        stats, requests = profile(names, retriever, questions[: max(1, len(questions) // 3)])
    print(f"HotpotQA, {len(questions)} questions per program, stand-in LM with no latency, DSPy cache {args.cache}\n")
    print("| program | LM calls | CPU ms / call, all | scripted engine | retrieval | framework |")
    print("|---|---|---|---|---|---|")
    for r in results:
        calls = max(r.requests, 1)
        print(f"| {r.program} | {r.requests} | {1000 * r.total_s / calls:.2f} | {1000 * r.engine_s / calls:.2f} "
              f"| {1000 * r.retrieval_s / calls:.2f} | {r.framework_ms:.2f} |")
    print()
    print("\n".join(profile_report(stats, requests)))
    print()
    worst = max(results, key=lambda r: r.framework_ms)
    overall = sum(r.total_s - r.engine_s - r.retrieval_s for r in results) / sum(r.requests for r in results)
    print(f"ratio framework CPU per LM call: {1000 * overall:.2f} ms over all programs, worst {worst.program} "
          f"{worst.framework_ms:.2f} ms (target <= {TARGET_MS:.0f} ms: "
          + ("met)" if worst.framework_ms <= TARGET_MS else f"MISSED by {worst.framework_ms - TARGET_MS:.2f} ms)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
