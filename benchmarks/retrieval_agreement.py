"""How far two retrievers agree: the mean share of one's top k that the other also returns.

    python benchmarks/retrieval_agreement.py [--dataset DIR] [--limit N] [--k K] [--work DIR]

Over the corpus of ../shared/datasets/hotpotqa, builds arag's BM25 (bm25s) index and a Lucene one, and
prints, for the first N questions (200 by default), how many of Lucene's top k are in bm25s' top k on
average, with Lucene's BM25 at Pyserini's parameters (k1 0.9, b 0.4) and at bm25s' (k1 1.5, b 0.75).
`top_k_agreement` serves any pair of retrievers, `ids_agreement` their ids searched apart (the scale benchmark).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

from arag.retrievers import BM25Retriever, Retriever, build_index, open_index
from arag.retrievers.lucene import PYSERINI_B, PYSERINI_K1, LuceneRetriever

DEFAULT_DATASET = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "hotpotqa"


def top_k_agreement(first: Retriever, second: Retriever, queries: Sequence[str], k: int = 10) -> float:
    """The mean, over `queries`, of how many of `first`'s top k ids are also in `second`'s top k, over k
    (1.0: the same passages, in any order). Each side is searched with one `retrieve_batch` call."""
    if not queries:
        raise ValueError("top_k_agreement needs at least one query")
    first_ids = [[p.id for p in found] for found in first.retrieve_batch(list(queries), k)]
    second_ids = [[p.id for p in found] for found in second.retrieve_batch(list(queries), k)]
    return ids_agreement(first_ids, second_ids, k)


def ids_agreement(first_ids: Sequence[Sequence[str]], second_ids: Sequence[Sequence[str]], k: int = 10) -> float:
    """`top_k_agreement` from the result ids of the same queries, e.g. searched in different processes."""
    if len(first_ids) != len(second_ids) or not first_ids:
        raise ValueError(f"agreement needs as many results on each side, and some: {len(first_ids)}, {len(second_ids)}")
    return sum(len(set(a[:k]) & set(b[:k])) for a, b in zip(first_ids, second_ids)) / (k * len(first_ids))


def read_questions(path: Path, limit: int) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line)["question"] for line, _ in zip(handle, range(limit))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=DEFAULT_DATASET, help="folder with corpus.jsonl, public.jsonl")
    parser.add_argument("--limit", type=int, default=200, help="questions to search (default 200)")
    parser.add_argument("--k", type=int, default=10, help="depth compared (default 10)")
    parser.add_argument("--work", type=Path, help="folder for the indexes, reused when already there")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="arag-agreement-"))
    indexes = {}
    for kind in ("bm25", "lucene"):
        if not (work / kind).is_dir():
            build_index(args.dataset / "corpus.jsonl", work / kind, kind=kind)
        indexes[kind] = open_index(work / kind)
    bm25s: BM25Retriever = indexes["bm25"]
    questions = read_questions(args.dataset / "public.jsonl", args.limit)
    print(f"| Lucene BM25 | top-{args.k} agreement with bm25s (k1 {bm25s.settings['k1']}, b {bm25s.settings['b']}) |")
    print("|---|---|")
    for k1, b in ((PYSERINI_K1, PYSERINI_B), (bm25s.settings["k1"], bm25s.settings["b"])):
        lucene = LuceneRetriever.load(work / "lucene", k1=k1, b=b)
        agreement = top_k_agreement(lucene, bm25s, questions, args.k)
        print(f"| k1 {k1}, b {b} | {agreement * args.k:.2f} of {args.k} ({len(questions)} questions) |")


if __name__ == "__main__":
    main()
