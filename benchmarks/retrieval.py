"""Retrievers at 5k, 100k and 1M passages: build rate, index size, memory, query latency (single and
batched); then recall@k of HotpotQA's supporting paragraphs (benchmarks/retrieval_recall.py).

    python benchmarks/retrieval.py [--kinds bm25,dense,colbert] [--sizes 5000,100000,1000000]
                                   [--neural-sizes 5000] [--recall bm25,dense,colbert]
                                   [--dataset DIR] [--work DIR] [--quick]

Corpora: the 4,858 real passages of ../shared/datasets/hotpotqa/corpus.jsonl, then passages
resampled from them with light perturbation until the size is reached: a random real passage, each
word replaced with probability 0.10 by a word drawn from the whole corpus by frequency, and with
probability 0.02 respelled (one letter changed), so the vocabulary keeps growing with the size as a
real collection's does. Every size is built in one child process and queried in another, so that
peak memory (ru_maxrss) and the resident memory of the loaded index are those of that step alone.

Queries are HotpotQA's 300 questions (top 10): single = one `retrieve` call each (two passes,
after a warm-up); batched = `retrieve_batch` over 32 questions, reported per query. Targets (BM25):
p50 <= 2 ms at 5k and <= 20 ms at 1M passages single, and the 1M-passage index in under 4 GB of
memory (resident set of the process that loaded and queried it).

Dense (all-MiniLM-L6-v2) and ColBERT (PLAID, the untrained MiniLM test checkpoint of
retrieval_recall.py unless --checkpoint) encode every passage on the CPU, at tens of passages per
second here: they run at `--neural-sizes` only (default 5k; 100k would take hours).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

HOTPOTQA = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "hotpotqa"
BATCH = 32
TOP_K = 10
SWAP_RATE, RESPELL_RATE = 0.10, 0.02
TARGET_P50_MS = {5_000: 2.0, 1_000_000: 20.0}
TARGET_MEMORY_GB = 4.0
QUICK_SIZES = "1000,3000"
QUICK_RECALL_QUESTIONS = 20
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def resampled_passages(real: list, size: int, seed: int = 0) -> Iterator:
    """The real passages, then perturbed copies of random ones, `size` in all."""
    from arag.passages import Passage

    yield from real[:size]
    rng = random.Random(seed)
    texts = [passage.text.split() for passage in real]
    pool = [word for words in texts for word in words]
    for number in range(len(real), size):
        pick = rng.randrange(len(real))
        words = list(texts[pick])
        for index, word in enumerate(words):
            draw = rng.random()
            if draw < SWAP_RATE:
                words[index] = rng.choice(pool)
            elif draw < SWAP_RATE + RESPELL_RATE and len(word) > 3:
                at = rng.randrange(1, len(word) - 1)
                words[index] = word[:at] + rng.choice(LETTERS) + word[at + 1:]
        yield Passage(f"resampled-{number}", real[pick].title, " ".join(words))


def index_options(kind: str, checkpoint: str | None, work: Path) -> dict:
    """Build options of an index kind; ColBERT gets retrieval_recall.py's checkpoint choice."""
    if kind != "colbert":
        return {}
    import retrieval_recall

    return retrieval_recall.retriever_options(kind, checkpoint, work)[0]


def rss_gb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def build_child(dataset: Path, size: int, index_dir: Path, kind: str, options: dict) -> dict:
    from arag.data import load_corpus
    from arag.retrievers import build_index

    started = time.perf_counter()
    passages = list(resampled_passages(load_corpus(dataset / "corpus.jsonl"), size))
    generated = time.perf_counter() - started
    started = time.perf_counter()
    build_index(passages, index_dir, kind=kind, **options)
    build = time.perf_counter() - started
    return {"passages": len(passages), "generate_s": generated, "build_s": build, "build_peak_gb": peak_rss_gb(),
            "disk_bytes": folder_bytes(index_dir)}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def query_child(dataset: Path, index_dir: Path) -> dict:
    from arag.retrievers import open_index

    questions = [json.loads(line)["question"] for line in open(dataset / "public.jsonl", encoding="utf-8")]
    before = rss_gb()
    started = time.perf_counter()
    retriever = open_index(index_dir)
    load = time.perf_counter() - started
    loaded = rss_gb()
    for question in questions[:10]:
        retriever.retrieve(question, TOP_K)
    single = []
    for _ in range(2):
        for question in questions:
            started = time.perf_counter()
            retriever.retrieve(question, TOP_K)
            single.append(1000 * (time.perf_counter() - started))
    batched = []
    for _ in range(2):
        for start in range(0, len(questions) - BATCH + 1, BATCH):
            started = time.perf_counter()
            retriever.retrieve_batch(questions[start:start + BATCH], TOP_K)
            batched.append(1000 * (time.perf_counter() - started) / BATCH)
    engine = getattr(retriever, "_engine", None)
    return {"backend": getattr(engine, "backend", "—"), "load_s": load, "rss_before_gb": before,
            "rss_loaded_gb": loaded, "rss_after_queries_gb": rss_gb(), "peak_gb": peak_rss_gb(),
            "single_p50": statistics.median(single), "single_p95": percentile(single, 0.95),
            "batched_p50": statistics.median(batched), "batched_p95": percentile(batched, 0.95),
            "single_qps": 1000 * len(single) / sum(single), "batched_qps": 1000 * len(batched) / sum(batched)}


def in_child(step: str, dataset: Path, index_dir: Path, size: int, kind: str, options: dict) -> dict:
    command = [sys.executable, __file__, "--child", step, "--dataset", str(dataset), "--index", str(index_dir),
               "--size", str(size), "--kind", kind, "--options", json.dumps({k: str(v) for k, v in options.items()})]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    if done.returncode != 0:
        sys.exit(f"{kind} {step} at {size:,} passages failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def scale_table(rows: list[tuple[str, int, dict, dict]]) -> str:
    lines = [
        "| retriever | passages | build | build rate | build peak RAM | index on disk | backend | load | "
        "RSS loaded / after queries | single p50 / p95 | batched (32) p50 / p95 per query | "
        "queries/s single / batched |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, size, built, queried in rows:
        lines.append(
            f"| {kind} | {size:,} | {built['build_s']:.1f} s | {built['passages'] / built['build_s']:,.0f} passages/s "
            f"| {built['build_peak_gb']:.2f} GB | {built['disk_bytes'] / 2**20:,.0f} MB "
            f"| {queried['backend']} | {queried['load_s']:.1f} s "
            f"| {queried['rss_loaded_gb']:.2f} / {queried['rss_after_queries_gb']:.2f} GB "
            f"| {queried['single_p50']:.2f} / {queried['single_p95']:.2f} ms "
            f"| {queried['batched_p50']:.2f} / {queried['batched_p95']:.2f} ms "
            f"| {queried['single_qps']:,.0f} / {queried['batched_qps']:,.0f} |"
        )
    return "\n".join(lines)


def target_lines(rows: list[tuple[str, int, dict, dict]]) -> list[str]:
    lines = []
    for kind, size, _, queried in rows:
        p50 = queried["single_p50"]
        line = f"ratio {kind} single-query p50 at {size:,} passages: {p50:.2f} ms"
        if kind == "bm25" and size in TARGET_P50_MS:
            goal = TARGET_P50_MS[size]
            verdict = "met" if p50 <= goal else f"MISSED by {p50 - goal:.2f} ms ({p50 / goal:.1f} x the target)"
            line += f", {p50 / goal:.2f} of the {goal:g} ms target ({verdict})"
        lines.append(line)
        if kind == "bm25" and size == 1_000_000:
            memory = max(queried["rss_after_queries_gb"], queried["rss_loaded_gb"])
            verdict = "met" if memory < TARGET_MEMORY_GB else f"MISSED by {memory - TARGET_MEMORY_GB:.2f} GB"
            lines.append(f"ratio BM25 memory at 1,000,000 passages: {memory:.2f} GB resident, "
                         f"{memory / TARGET_MEMORY_GB:.2f} of the {TARGET_MEMORY_GB:g} GB target ({verdict})")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default="bm25", help="index kinds, comma-separated: bm25, dense, colbert")
    parser.add_argument("--sizes", default="5000,100000,1000000", help="comma-separated corpus sizes (BM25)")
    parser.add_argument("--neural-sizes", default="5000", help="comma-separated corpus sizes for dense and colbert")
    parser.add_argument("--checkpoint", help="ColBERT checkpoint (default: retrieval_recall.py's test checkpoint)")
    parser.add_argument("--recall", default="bm25",
                        help="retrievers for recall@k via retrieval_recall.py (bm25,dense,colbert), or none")
    parser.add_argument("--dataset", type=Path, default=HOTPOTQA, help="folder with public.jsonl and corpus.jsonl")
    parser.add_argument("--work", type=Path, help="folder for the indexes (default: a temporary one)")
    parser.add_argument("--quick", action="store_true",
                        help=f"sizes {QUICK_SIZES}, BM25 recall on {QUICK_RECALL_QUESTIONS} questions")
    parser.add_argument("--child", choices=("build", "query"), help=argparse.SUPPRESS)
    parser.add_argument("--index", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="bm25", help=argparse.SUPPRESS)
    parser.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child == "build":
        print(json.dumps(build_child(args.dataset, args.size, args.index, args.kind, json.loads(args.options))))
        return 0
    if args.child == "query":
        print(json.dumps(query_child(args.dataset, args.index)))
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="arag-retrieval-") as scratch:
        work = args.work or Path(scratch)
        for kind in args.kinds.split(","):
            sizes = QUICK_SIZES if args.quick else args.sizes if kind == "bm25" else args.neural_sizes
            options = index_options(kind, args.checkpoint, work)
            for size in [int(size) for size in sizes.split(",")]:
                index_dir = work / f"{kind}-{size}"
                print(f"{kind}, {size:,} passages: building ...", file=sys.stderr, flush=True)
                built = in_child("build", args.dataset, index_dir, size, kind, options)
                print(f"{kind}, {size:,} passages: querying ...", file=sys.stderr, flush=True)
                rows.append((kind, size, built, in_child("query", args.dataset, index_dir, size, kind, options)))
                if args.work is None:
                    shutil.rmtree(index_dir)
    print(f"bm25: bm25s, Lucene, English stemming and stopwords; top {TOP_K}, HotpotQA questions as queries; "
          f"corpora beyond the real {HOTPOTQA.name} passages resampled with perturbation\n")
    print(scale_table(rows))
    print()
    print("\n".join(target_lines(rows)))
    if args.recall != "none":
        import retrieval_recall

        print("\nRecall of the supporting paragraphs (benchmarks/retrieval_recall.py):\n", flush=True)
        recall_args = ["--retrievers", "bm25" if args.quick else args.recall, "--dataset", str(args.dataset)]
        retrieval_recall.main(recall_args + (["--limit", str(QUICK_RECALL_QUESTIONS)] if args.quick else []))
    return 0


if __name__ == "__main__":
    sys.exit(main())
