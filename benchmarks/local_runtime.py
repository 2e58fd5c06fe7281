"""The local model's speed and memory under each llama.cpp setting arag chooses, measured in one run.

    python benchmarks/local_runtime.py [--model qwen2.5-coder-1.5b] [--threads 2] [--repeats 2]

Each configuration runs in a child process of its own (so that its peak resident memory is its own): it loads
the model, evaluates one HotpotQA prompt of about 1,000 tokens (a question and its ten passages; prompt tokens/s),
then generates 64 tokens after it (generation tokens/s), best of --repeats. The configurations:
- ``extra buffers on/off``: llama.cpp repacks quantised weights for this CPU's kernels ("extra buffer types";
  on Intel CPUs with AMX, the AMX kernels, which crash there: arag keeps them off);
- ``logits_all``: llama.cpp keeps the logits of every prompt token (what llama-cpp-python's own logprobs
  option needs), against arag's way, which reads only the generated positions' distributions
  (``arag.lm.local.TokenRecorder``), shown with and without reading them.
Ratios are against the first row, measured in the same run on the same machine. The CPU is printed.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

HOTPOTQA = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "hotpotqa"

CONFIGURATIONS = {
    "extra buffers on, arag's logprobs": {"extra_buffers": True, "logits_all": False, "recorder": True},
    "extra buffers off, arag's logprobs": {"extra_buffers": False, "logits_all": False, "recorder": True},
    "extra buffers on, no logprobs": {"extra_buffers": True, "logits_all": False, "recorder": False},
    "extra buffers on, logits_all": {"extra_buffers": True, "logits_all": True, "recorder": False},
}


def prompt_text() -> str:
    example = json.loads((HOTPOTQA / "public.jsonl").read_text().splitlines()[0])
    passages = "\n".join(f"{p['title']}: {p['text']}" for p in example["passages"])
    return f"Passages:\n{passages}\n\nQuestion: {example['question']}\nAnswer:"


def measure(model: str, threads: int, repeats: int, settings: dict) -> dict:
    """One configuration, in this process: prompt and generation tokens/s, peak resident MB."""
    import llama_cpp

    from arag.lm.local import TokenRecorder, _model_params
    from arag.lm.local_models import model_path

    with _model_params(use_extra_bufts=settings["extra_buffers"]):
        llama = llama_cpp.Llama(model_path=str(model_path(model)), n_ctx=8192, n_threads=threads,
                                n_threads_batch=threads,
                                logits_all=settings["logits_all"], verbose=False)
    prompt = llama.tokenize(prompt_text().encode())
    prompt_rates, generation_rates = [], []
    for _ in range(repeats):
        llama.reset()
        started = time.perf_counter()
        llama.eval(prompt)
        prompt_rates.append(len(prompt) / (time.perf_counter() - started))
        processors = [TokenRecorder(5)] if settings["recorder"] else None
        started = time.perf_counter()
        generated = 0
        for _token in llama.generate(prompt, temp=0.0, logits_processor=processors):
            generated += 1
            if generated == 64:
                break
        generation_rates.append(generated / (time.perf_counter() - started))
    return {"prompt_tokens": len(prompt), "prompt_per_s": max(prompt_rates), "generation_per_s": max(generation_rates),
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="a name of `arag models`")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.model, args.threads, args.repeats, CONFIGURATIONS[args.child])))
        return 0
    from arag.lm.local import cpu_has_amx

    print(f"{args.model}, {args.threads} threads, {cpu_name()} (AMX: {'yes' if cpu_has_amx() else 'no'})")
    print(f"{'configuration':<38}{'prompt tok/s':>13}{'gen tok/s':>10}{'peak MB':>9}{'prompt x':>9}{'gen x':>7}")
    first = None
    for name in CONFIGURATIONS:
        child = subprocess.run([sys.executable, __file__, "--model", args.model, "--threads", str(args.threads),
                                "--repeats", str(args.repeats), "--child", name], capture_output=True, text=True)
        if child.returncode != 0:
            print(f"{name:<38} failed (exit {child.returncode}): {child.stderr.strip().splitlines()[-1:]}")
            continue
        result = json.loads(child.stdout.strip().splitlines()[-1])
        first = first or result
        print(f"{name:<38}{result['prompt_per_s']:>13.1f}{result['generation_per_s']:>10.1f}{result['peak_mb']:>9.0f}"
              f"{result['prompt_per_s'] / first['prompt_per_s']:>9.2f}"
              f"{result['generation_per_s'] / first['generation_per_s']:>7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
