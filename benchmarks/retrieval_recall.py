"""Recall of HotpotQA's supporting paragraphs for each retriever, with index build time and query latency.

    python benchmarks/retrieval_recall.py [--retrievers bm25,dense,colbert] [--checkpoint DIR]
                                          [--dataset DIR] [--work DIR] [--limit N] [--torch-threads N]

Over the 4,858-passage corpus of ../shared/datasets/hotpotqa, each of its 300 questions is searched
once (top 10, one query at a time); recall@k is the share of questions with both supporting
paragraphs ("both") or at least one ("any") in the top k. Prints a markdown table.

Without --checkpoint, ColBERT runs on the untrained test checkpoint made from all-MiniLM-L6-v2:
its row is a floor for the ColBERT pipeline, not ColBERTv2's quality (pass colbert-ir/colbertv2.0 for that).
Indexes go to --work (a temporary folder by default); with --work, indexes already there are reused
and reported with the build time recorded when they were built. On a busy machine, --torch-threads 1
keeps the dense and ColBERT query encoders from fighting other processes for cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from arag.retrievers import build_index, open_index
from arag.retrievers.manifest import MANIFEST_NAME

DEFAULT_DATASET = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "hotpotqa"
BUILD_TIMES = "build-seconds.json"
KINDS = ("bm25", "dense", "colbert")
CUTOFFS = (2, 5, 10)


@dataclass
class Row:
    name: str
    build_s: float | None
    load_s: float
    latencies_ms: list[float]
    both: dict[int, float]
    any: dict[int, float]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    questions = read_questions(args.dataset / "public.jsonl", args.limit)
    corpus = args.dataset / "corpus.jsonl"
    with tempfile.TemporaryDirectory(prefix="arag-recall-") as scratch:
        work = Path(args.work or scratch)
        rows = []
        for kind in args.retrievers:
            options, name = retriever_options(kind, args.checkpoint, work)
            rows.append(measure(name, kind, corpus, work / kind, options, questions))
    n_passages = sum(1 for line in open(corpus, encoding="utf-8") if line.strip())
    threads = f", torch threads {args.torch_threads}" if args.torch_threads else ""
    print(f"HotpotQA: {len(questions)} questions, {n_passages:,} passages, top 10 per question{threads}\n")
    print(markdown_table(rows))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--retrievers", default=",".join(KINDS), type=_kinds,
                        help=f"comma-separated, from {', '.join(KINDS)} (default: all)")
    parser.add_argument("--checkpoint",
                        help="ColBERT checkpoint folder (default: the untrained MiniLM test checkpoint)")
    parser.add_argument("--dataset", type=Path, default=DEFAULT_DATASET,
                        help="folder with public.jsonl and corpus.jsonl")
    parser.add_argument("--work", help="folder for the indexes, reused when already there (default: a temporary one)")
    parser.add_argument("--limit", type=int, help="only the first N questions")
    parser.add_argument("--torch-threads", type=int, help="torch intra-op threads (default: torch's own choice)")
    return parser.parse_args(argv)


def _kinds(value: str) -> list[str]:
    kinds = [kind.strip() for kind in value.split(",") if kind.strip()]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(
            f"unknown retriever(s) {', '.join(unknown) or '(none)'}; known: {', '.join(KINDS)}"
        )
    return kinds


def read_questions(path: Path, limit: int | None) -> list[tuple[str, set[str]]]:
    """(question, ids of its supporting passages) for each question."""
    questions = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            example = json.loads(line)
            gold = {p["id"] for p in example["passages"] if p["is_supporting"]}
            questions.append((example["question"], gold))
            if limit and len(questions) == limit:
                break
    return questions


def retriever_options(kind: str, checkpoint: str | None, work: Path) -> tuple[dict, str]:
    """The index options and the table label of a retriever kind."""
    if kind == "dense":
        return {}, "dense (all-MiniLM-L6-v2, exact cosine)"
    if kind == "colbert":
        if checkpoint:
            return {"checkpoint": checkpoint}, f"ColBERT PLAID nbits=2 ({Path(checkpoint).name})"
        test_checkpoint = work / "minilm-test-checkpoint"
        if not (test_checkpoint / "artifact.metadata").is_file():
            from arag.retrievers.colbert import make_test_checkpoint

            make_test_checkpoint(test_checkpoint)
        return {"checkpoint": test_checkpoint}, "ColBERT PLAID nbits=2 (untrained MiniLM test checkpoint)"
    return {}, "BM25 (bm25s, Lucene, stemmed)"


def measure(name: str, kind: str, corpus: Path, index_dir: Path, options: dict, questions: list) -> Row:
    build_times_file = index_dir.parent / BUILD_TIMES
    build_times = json.loads(build_times_file.read_text()) if build_times_file.is_file() else {}
    if not (index_dir / MANIFEST_NAME).is_file():
        log(f"{name}: building the index in {index_dir} ...")
        started = time.perf_counter()
        build_index(corpus, index_dir, kind=kind, **options)
        build_times[kind] = time.perf_counter() - started
        build_times_file.write_text(json.dumps(build_times))
    started = time.perf_counter()
    retriever = open_index(index_dir)
    load_s = time.perf_counter() - started
    retriever.retrieve(questions[0][0], 10)  # the first query pays one-off set-up costs
    latencies, ranked = [], []
    for question, _ in questions:
        started = time.perf_counter()
        passages = retriever.retrieve(question, 10)
        latencies.append((time.perf_counter() - started) * 1000)
        ranked.append([p.id for p in passages])
    both = {k: share(questions, ranked, k, lambda found, gold: gold <= found) for k in CUTOFFS}
    any_ = {k: share(questions, ranked, k, lambda found, gold: bool(gold & found)) for k in CUTOFFS}
    log(f"{name}: done")
    return Row(name, build_times.get(kind), load_s, latencies, both, any_)


def share(questions: list, ranked: list[list[str]], k: int, hit) -> float:
    return sum(hit(set(ids[:k]), gold) for (_, gold), ids in zip(questions, ranked)) / len(questions)


def markdown_table(rows: list[Row]) -> str:
    header = (
        "| retriever | both@2 | both@5 | both@10 | any@2 | any@5 | any@10 "
        "| index build | index load | query ms (median / p95) |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [header]
    for row in rows:
        build = "?" if row.build_s is None else f"{row.build_s:.1f} s"
        latency = sorted(row.latencies_ms)
        p95 = latency[min(len(latency) - 1, int(0.95 * len(latency)))]
        recalls = [f"{row.both[k]:.3f}" for k in CUTOFFS] + [f"{row.any[k]:.3f}" for k in CUTOFFS]
        lines.append(
            f"| {row.name} | {' | '.join(recalls)} | {build} | {row.load_s:.1f} s "
            f"| {statistics.median(latency):.1f} / {p95:.1f} |"
        )
    return "\n".join(lines)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
