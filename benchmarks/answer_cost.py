"""What one answer costs on the local model: against llama.cpp's own rates, and how 2 cores are best shared.

    python benchmarks/answer_cost.py [--model qwen2.5-coder-1.5b] [--n 4] [--programs single-rag,ircot]

In one run, each configuration in child processes of its own (their own model load, their own DSPy cache):
- llama.cpp's rates on this machine on one thread: prompt tokens/s (one HotpotQA prompt of about 1,000 tokens
  evaluated from an empty cache) and generation tokens/s (64 greedy tokens after it), best of two;
- each program of --programs on the first --n HotpotQA questions, through arag's engine as the quality table runs
  it (chat template, the lenient JSON grammar, log-probabilities read), every LM call timed: its seconds, the
  prompt tokens llama.cpp evaluated (those it did not reuse from the call before) and the tokens it generated.
  On one lane and one thread, what the raw rates predict for those tokens against the seconds the calls took is
  the engine's overhead (grammar, log-probabilities, chat formatting, DSPy);
- the same questions shared between lanes (processes answering at once, a question each in turn): two lanes of
  one thread, as the quality table runs; the same as it ran before arag gave llama.cpp its thread count for
  prompts too (llama-cpp-python's default evaluates prompts on every core); with llama.cpp's prefix state cache
  (llama-cpp-python's LlamaRAMCache: after every call the KV state is kept, and a later prompt starts from the
  longest kept prefix); and one lane of two threads.
Answers per hour are the configuration's questions over the time from its first lane's start to its last lane's
end. A configuration counts only if its answers are byte-identical to those of one lane on one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

HOTPOTQA = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "hotpotqa"
PREFIX_CACHE_BYTES = 2 << 30
BASELINE = "1 lane, 1 thread"
CONFIGURATIONS = {
    BASELINE: {"lanes": 1, "threads": 1},
    "2 lanes, 1 thread each, prompts on every core (before)": {"lanes": 2, "threads": 1, "prompt_threads": 0},
    "2 lanes, 1 thread each": {"lanes": 2, "threads": 1},
    "2 lanes, 1 thread each + prefix state cache": {"lanes": 2, "threads": 1, "prefix_cache": True},
    "1 lane, 2 threads": {"lanes": 1, "threads": 2},
}
"""`prompt_threads` 0: llama-cpp-python's own default for prompt evaluation (every core)."""


def raw_rates(model: str, threads: int) -> dict:
    """llama.cpp's prompt and generation tokens/s here on `threads` threads, through the bindings arag's engine
    uses."""
    from local_runtime import CONFIGURATIONS as RUNTIME
    from local_runtime import measure

    return measure(model, threads, 2, RUNTIME["extra buffers off, arag's logprobs"])


def answer(model: str, n: int, program_name: str, configuration: dict, lane: int) -> dict:
    """One lane's answers (every `lanes`-th of the first n HotpotQA questions, from `lane`), by question id, with
    each LM call's seconds and tokens and the lane's start and end (wall clock)."""
    import dspy
    import llama_cpp

    import arag
    from arag.lm.local import LlamaEngine
    from arag.testing import isolated_cache

    calls = []
    complete = LlamaEngine.complete

    def timed(engine, request):
        started = time.perf_counter()
        response = complete(engine, request)
        usage = response.usage
        calls.append({"seconds": time.perf_counter() - started, "prompt": usage.input_tokens,
                      "reused": usage.cache_read_tokens or 0, "completion": usage.output_tokens})
        return response

    LlamaEngine.complete = timed
    if configuration.get("prompt_threads") == 0:  # the engine as it was: llama-cpp-python's default for prompts
        load = llama_cpp.Llama.__init__

        def every_core(llama, *args, **kwargs):
            kwargs.pop("n_threads_batch", None)
            load(llama, *args, **kwargs)

        llama_cpp.Llama.__init__ = every_core
    lm = arag.build_lm(f"local:{model}", logprobs=True, top_logprobs=5, threads=configuration["threads"])
    if configuration.get("prefix_cache"):
        lm.engine.model.llama.set_cache(llama_cpp.LlamaRAMCache(capacity_bytes=PREFIX_CACHE_BYTES))
    examples = arag.load_examples(str(HOTPOTQA / "public.jsonl"))[:n][lane::configuration["lanes"]]
    program = arag.build_program(program_name, arag.open_retriever(corpus=str(HOTPOTQA / "corpus.jsonl")))
    lm.engine.model.llama.reset()  # the model loads before the clock starts
    answers, started = {}, time.time()
    with isolated_cache(), dspy.context(lm=lm):
        for example in examples:
            answers[example.id] = program(question=example.question).answer
    return {"answers": answers, "calls": calls, "start": started, "end": time.time()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="a name of `arag models`")
    parser.add_argument("--n", type=int, default=4, help="HotpotQA questions per program and configuration")
    parser.add_argument("--programs", default="single-rag,ircot")
    parser.add_argument("--configurations", default=";".join(CONFIGURATIONS),
                        help="separated by semicolons, of: " + "; ".join(CONFIGURATIONS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.child == "rates":
            result = raw_rates(args.model, 1)
        else:
            program, configuration, lane = args.child.split("|")
            result = answer(args.model, args.n, program, CONFIGURATIONS[configuration], int(lane))
        print(json.dumps(result))
        return 0
    chosen = [name.strip() for name in args.configurations.split(";") if name.strip()]
    unknown = [name for name in chosen if name not in CONFIGURATIONS]
    if unknown or BASELINE not in chosen:
        raise SystemExit(f"--configurations: unknown {unknown}" if unknown else f"--configurations needs {BASELINE!r}")

    def children(names: list[str]) -> list[dict]:
        started = [subprocess.Popen([sys.executable, __file__, "--model", args.model, "--n", str(args.n),
                                     "--child", name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for name in names]
        results = []
        for name, process in zip(names, started):
            out, err = process.communicate()
            if process.returncode != 0:
                raise SystemExit(f"{name} failed (exit {process.returncode}): {err.strip()[-800:]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results

    from local_runtime import cpu_name

    rates = children(["rates"])[0]
    print(f"{args.model}, {cpu_name()}: on 1 thread llama.cpp evaluates {rates['prompt_per_s']:.1f} prompt tok/s "
          f"and generates {rates['generation_per_s']:.1f} tok/s ({rates['prompt_tokens']}-token HotpotQA prompt)\n")
    print("| program | configuration | answers/hour | LM calls/q | prompt tok/q | evaluated/q | generated/q "
          "| predicted s/q | actual ÷ predicted | answers/hour × | same answers |")
    print("|---" * 11 + "|")
    for program in args.programs.split(","):
        baseline = None
        for name in [BASELINE] + [name for name in chosen if name != BASELINE]:
            lanes = children([f"{program}|{name}|{lane}" for lane in range(CONFIGURATIONS[name]["lanes"])])
            calls = [call for lane in lanes for call in lane["calls"]]
            answers = {qid: text for lane in lanes for qid, text in lane["answers"].items()}
            hours = (max(lane["end"] for lane in lanes) - min(lane["start"] for lane in lanes)) / 3600
            per_hour = args.n / hours
            evaluated = sum(c["prompt"] - c["reused"] for c in calls)
            generated = sum(c["completion"] for c in calls)
            if baseline is None:
                predicted = evaluated / rates["prompt_per_s"] + generated / rates["generation_per_s"]
                prediction = f"{predicted / args.n:.1f} | {hours * 3600 / predicted:.2f}"
                baseline = {"per_hour": per_hour, "answers": answers}
            else:  # several lanes share the cores, and the prefix cache restores more than the call before's
                prediction = "— | —"
            print(f"| {program} | {name} | {per_hour:.0f} | {len(calls) / args.n:.1f} "
                  f"| {sum(c['prompt'] for c in calls) / args.n:,.0f} | {evaluated / args.n:,.0f} "
                  f"| {generated / args.n:.0f} | {prediction} | {per_hour / baseline['per_hour']:.2f} "
                  f"| {'yes' if answers == baseline['answers'] else 'NO'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
