"""What one answer costs on the local model, against what llama.cpp's own rates predict, and what a prefix cache buys.

    python benchmarks/answer_cost.py [--model qwen2.5-coder-1.5b] [--threads 1] [--n 3] [--programs single-rag,ircot]

In one run, each in a child process of its own (its own model load, its own DSPy cache):
- llama.cpp's rates on this machine at --threads: prompt tokens/s (one HotpotQA prompt of about 1,000 tokens
  evaluated from an empty cache) and generation tokens/s (64 greedy tokens after it), best of two;
- each program of --programs on the first --n HotpotQA questions, through arag's engine as the quality table runs
  it (chat template, the lenient JSON grammar, log-probabilities read), every LM call timed: its seconds, the
  prompt tokens llama.cpp evaluated (those it did not reuse from the call before) and the tokens it generated.
  What the raw rates predict for those tokens, against the seconds the calls took, is the engine's overhead
  (grammar, log-probabilities, chat formatting, DSPy);
- the same with llama.cpp's prefix state cache (llama-cpp-python's LlamaRAMCache): after every call the KV state is
  kept, and a later prompt starts from the longest kept prefix, so a program whose calls alternate between
  signatures, or the next question's first call, does not evaluate the instructions and demonstrations again.
  Its answers must be byte-identical to the first configuration's to count.
Ratios are against the first configuration, measured in the same run on the same machine.
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
CONFIGURATIONS = ("arag's engine", "arag's engine + prefix state cache")
PREFIX_CACHE_BYTES = 2 << 30


def raw_rates(model: str, threads: int) -> dict:
    """llama.cpp's prompt and generation tokens/s here, through the bindings arag's engine uses."""
    from local_runtime import CONFIGURATIONS as RUNTIME
    from local_runtime import measure

    return measure(model, threads, 2, RUNTIME["extra buffers off, arag's logprobs"])


def answer(model: str, threads: int, n: int, program_name: str, prefix_cache: bool) -> dict:
    """The program's answers to the first n HotpotQA questions, and each LM call's seconds and tokens."""
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
    lm = arag.build_lm(f"local:{model}", logprobs=True, top_logprobs=5, threads=threads)
    if prefix_cache:
        lm.engine.model.llama.set_cache(llama_cpp.LlamaRAMCache(capacity_bytes=PREFIX_CACHE_BYTES))
    examples = arag.load_examples(str(HOTPOTQA / "public.jsonl"))[:n]
    program = arag.build_program(program_name, arag.open_retriever(corpus=str(HOTPOTQA / "corpus.jsonl")))
    answers, started = [], time.perf_counter()
    with isolated_cache(), dspy.context(lm=lm):
        for example in examples:
            answers.append(program(question=example.question).answer)
    return {"answers": answers, "calls": calls, "seconds": time.perf_counter() - started}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="a name of `arag models`")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n", type=int, default=3, help="HotpotQA questions per program")
    parser.add_argument("--programs", default="single-rag,ircot")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.child == "rates":
            result = raw_rates(args.model, args.threads)
        else:
            program, configuration = args.child.split("|")
            result = answer(args.model, args.threads, args.n, program, configuration == CONFIGURATIONS[1])
        print(json.dumps(result))
        return 0

    def child(name: str) -> dict:
        done = subprocess.run([sys.executable, __file__, "--model", args.model, "--threads", str(args.threads),
                               "--n", str(args.n), "--child", name], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{name} failed (exit {done.returncode}): {done.stderr.strip()[-800:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    from local_runtime import cpu_name

    rates = child("rates")
    print(f"{args.model}, {args.threads} thread(s), {cpu_name()}: llama.cpp evaluates {rates['prompt_per_s']:.1f} "
          f"prompt tok/s and generates {rates['generation_per_s']:.1f} tok/s "
          f"({rates['prompt_tokens']}-token HotpotQA prompt)\n")
    print("| program | configuration | s/q | LM calls/q | prompt tok/q | evaluated/q | generated/q | predicted s/q "
          "| actual ÷ predicted | answers/hour × | same answers |")
    print("|---" * 11 + "|")
    for program in args.programs.split(","):
        first = None
        for configuration in CONFIGURATIONS:
            run = child(f"{program}|{configuration}")
            calls, n = run["calls"], args.n
            evaluated = sum(c["prompt"] - c["reused"] for c in calls)
            generated = sum(c["completion"] for c in calls)
            predicted = evaluated / rates["prompt_per_s"] + generated / rates["generation_per_s"]
            # With the prefix cache, llama.cpp restores more than the call before's prefix, which is what the
            # engine counts as reused: the prediction holds for the first configuration only.
            prediction = (f"{predicted / n:.1f} | {run['seconds'] / predicted:.2f}" if first is None else "— | —")
            first = first or run
            print(f"| {program} | {configuration} | {run['seconds'] / n:.1f} | {len(calls) / n:.1f} "
                  f"| {sum(c['prompt'] for c in calls) / n:,.0f} | {evaluated / n:,.0f} | {generated / n:.0f} "
                  f"| {prediction} | {first['seconds'] / run['seconds']:.2f} "
                  f"| {'yes' if run['answers'] == first['answers'] else 'NO'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
