"""The dense encoder's backends on the CPU: all-MiniLM-L6-v2 on ONNX Runtime (the `dense` extra) against
sentence-transformers on torch (`dense-torch`): the same vectors, their speed, and what each extra installs.

    nice -n 10 python benchmarks/dense_backends.py [--dataset DIR] [--passages N] [--questions Q] [--rounds R]
                                                   [--install-sizes [--pip-isolated]] [--quick]

Encodes the first N passages of ../shared/datasets/hotpotqa's corpus (`Title | text`, as a dense index does) with
each backend, R rounds each, alternating in one process so that both see the same load, and prints each one's model
load time and passages a second (its best round). Then the cosine of each passage's two vectors and of the two
encoder probes (an index records its encoder's probe and refuses another model at open), and, over the first Q
questions as queries, how many of one backend's exact top 10 among those passages the other returns.
`--install-sizes` also makes a fresh virtual environment for the core package and for each extra in a temporary
folder and prints its size on disk and whether torch or an nvidia-* package is in it (pip as configured on this
machine; with `--pip-isolated`, the package index alone, as a plain `pip install` elsewhere: no local wheels, such as
a CPU torch, and no constraints). Ratio lines: onnx against torch speed and load time, dense against dense-torch
size, the least cosine, the top-10 overlap.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from arag.passages import Passage
from arag.retrievers.encoders import SentenceEncoder, embed, encoder_probe, probe_cosine

DEFAULT_DATASET = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "hotpotqa"
REPO = Path(__file__).resolve().parents[1]
BACKENDS = ("onnx", "torch")
EXTRAS = ("", "dense", "dense-torch")
K = 10


def read_jsonl(path: Path, limit: int) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line, _ in zip(handle, range(limit))]


def threads(backend: str) -> int:
    if backend == "torch":
        import torch

        return torch.get_num_threads()
    return os.cpu_count() or 1  # ONNX Runtime's default: one intra-op thread a core


def top_k(queries: np.ndarray, passages: np.ndarray) -> list[set[int]]:
    scores = queries @ passages.T
    return [set(np.argsort(-row, kind="stable")[:K].tolist()) for row in scores]


def directory_size(path: Path) -> int:
    """Bytes on disk under `path`, as du counts them (allocated blocks)."""
    return sum(entry.stat().st_blocks * 512 for entry in path.rglob("*") if not entry.is_symlink())


def install_size(extra: str, work: Path, isolated: bool) -> tuple[int, float, list[str]]:
    """(bytes on disk, seconds, torch and nvidia-* distributions) of a fresh venv with dspy-arag[extra]."""
    venv = work / (extra or "core")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    started = time.perf_counter()
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                    *(["--isolated"] if isolated else []), f"{REPO}[{extra}]" if extra else str(REPO)], check=True)
    seconds = time.perf_counter() - started
    listed = subprocess.run([str(venv / "bin" / "pip"), "list", "--format=freeze", "--disable-pip-version-check"],
                            check=True, capture_output=True, text=True).stdout.split()
    heavy = sorted((line for line in listed if line.lower().startswith(("torch==", "nvidia-"))),
                   key=lambda line: (not line.lower().startswith("torch=="), line))  # torch first
    return directory_size(venv), seconds, heavy


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=DEFAULT_DATASET, help="folder with corpus.jsonl, public.jsonl")
    parser.add_argument("--passages", type=int, default=1000, help="corpus passages encoded (default 1000)")
    parser.add_argument("--questions", type=int, default=100, help="questions searched (default 100)")
    parser.add_argument("--rounds", type=int, default=2, help="timed encodings of the passages a backend (default 2)")
    parser.add_argument("--install-sizes", action="store_true", help="also measure fresh installs of each extra")
    parser.add_argument("--pip-isolated", action="store_true", help="installs from the package index alone")
    parser.add_argument("--quick", action="store_true", help="32 passages, 10 questions, one round")
    args = parser.parse_args(argv)
    if args.quick:
        args.passages, args.questions, args.rounds = 32, 10, 1
    passages = [Passage(r["id"], r["title"], r["text"]).long_text
                for r in read_jsonl(args.dataset / "corpus.jsonl", args.passages)]
    questions = [r["question"] for r in read_jsonl(args.dataset / "public.jsonl", args.questions)]

    encoders, loads = {}, {}
    for backend in BACKENDS:
        started = time.perf_counter()
        encoders[backend] = SentenceEncoder(backend=backend)
        loads[backend] = time.perf_counter() - started
    seconds = {backend: [] for backend in BACKENDS}
    vectors = {}
    for _ in range(args.rounds):
        for backend in BACKENDS:
            started = time.perf_counter()
            vectors[backend] = embed(encoders[backend], passages)
            seconds[backend].append(time.perf_counter() - started)
    rates = {backend: len(passages) / min(seconds[backend]) for backend in BACKENDS}

    print(f"all-MiniLM-L6-v2, {len(passages):,} HotpotQA passages, batches of {encoders['onnx'].batch_size}, "
          f"{args.rounds} round(s) a backend, {os.cpu_count()} cores\n")
    print("| backend | threads | model load | passages/s (best round) | every round (s) |")
    print("|---|---|---|---|---|")
    for backend in BACKENDS:
        print(f"| {backend} | {threads(backend)} | {loads[backend]:.1f} s | {rates[backend]:.1f} | "
              f"{', '.join(f'{s:.1f}' for s in seconds[backend])} |")

    cosines = (vectors["onnx"] * vectors["torch"]).sum(axis=1)
    probe = {backend: encoder_probe(encoders[backend]) for backend in BACKENDS}
    probes = probe_cosine(probe["onnx"], probe["torch"], "probe")
    probe_itself = probe_cosine(probe["torch"], probe["torch"], "probe")
    found = {backend: top_k(embed(encoders[backend], questions), vectors[backend]) for backend in BACKENDS}
    overlap = np.mean([len(a & b) / K for a, b in zip(found["onnx"], found["torch"])])
    identical = np.mean([a == b for a, b in zip(found["onnx"], found["torch"])])
    print(f"\ncosine of the two backends' vectors, per passage: least {cosines.min():.7f}, mean {cosines.mean():.7f}; "
          f"of their recorded probes (float16): {probes:.6f}, a probe with itself {probe_itself:.6f}")
    print(f"top {K} over the {len(passages):,} passages, {len(questions)} questions: overlap {overlap:.3f}, "
          f"the same {K} passages for {identical:.0%} of the questions")

    if args.install_sizes:
        print("\n| install | size on disk | pip install | torch, nvidia-* |")
        print("|---|---|---|---|")
        sizes = {}
        with tempfile.TemporaryDirectory(prefix="arag-install-") as work:
            for extra in EXTRAS:
                size, took, heavy = install_size(extra, Path(work), args.pip_isolated)
                sizes[extra] = size
                label = f"dspy-arag[{extra}]" if extra else "dspy-arag"
                print(f"| {label} | {size / 2**30:.2f} GiB | {took:.0f} s | "
                      f"{', '.join(heavy[:2]) + (f' +{len(heavy) - 2}' if len(heavy) > 2 else '') or '—'} |")
        print(f"ratio dense / dense-torch install size: {sizes['dense'] / sizes['dense-torch']:.3f} "
              f"({sizes['dense'] / 2**30:.2f} / {sizes['dense-torch'] / 2**30:.2f} GiB)")

    print(f"\nratio onnx / torch encoding speed: {rates['onnx'] / rates['torch']:.2f} "
          f"({rates['onnx']:.1f} / {rates['torch']:.1f} passages/s)")
    print(f"ratio onnx / torch model load time: {loads['onnx'] / loads['torch']:.2f}")
    print(f"ratio least per-passage cosine onnx-torch: {cosines.min():.7f} (tolerance 0.999)")
    print(f"ratio top-{K} overlap onnx-torch: {overlap:.3f}")


if __name__ == "__main__":
    main()
