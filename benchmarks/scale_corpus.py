"""The scale benchmark's corpora and queries, made from real QA passages.

A corpus of N passages is the real passages of HotpotQA, StrategyQA, MuSiQue and PopQA (the
`corpus.jsonl` of each set under the datasets folder, in that order), then synthetic passages of
SYNTHETIC_WORDS words drawn at random from the real passages' words with their real frequencies
(so term statistics keep the real collection's long tail), each under the title of a random real
passage. Queries are the first QUERY_CHARS characters of HotpotQA passages, so the passage each
came from is in every corpus. Everything is drawn from a fixed seed: the same arguments give the
same bytes.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np

from arag.data._io import atomic_writer
from arag.data.corpus import iter_corpus
from arag.passages import Passage

SOURCE_SETS = ("hotpotqa", "strategyqa", "musique_train100", "popqa_longtail")
QUERY_SET = "hotpotqa"
SYNTHETIC_WORDS = 100
QUERY_CHARS = 120
CHUNK = 10_000
SEED = 0


def real_passages(datasets: Path) -> list[Passage]:
    """The passages of every source set's corpus, in SOURCE_SETS order (sets whose folder is absent skipped)."""
    return [
        passage
        for name in SOURCE_SETS
        if (datasets / name / "corpus.jsonl").is_file()
        for passage in iter_corpus(datasets / name / "corpus.jsonl")
    ]


def write_corpus(datasets: Path, size: int, path: Path, seed: int = SEED) -> Path:
    """Writes the corpus of `size` passages to `path` (JSONL of id/title/text), streamed, unless a file made
    from the same arguments is already there (its parameters sit beside it in `path`.json)."""
    parameters = {"size": size, "seed": seed, "sources": list(SOURCE_SETS), "synthetic_words": SYNTHETIC_WORDS}
    stamp = path.with_name(path.name + ".json")
    if path.is_file() and stamp.is_file() and json.loads(stamp.read_text()) == parameters:
        return path
    real = real_passages(datasets)
    counts = Counter(word for passage in real for word in passage.text.split())
    words = np.array(list(counts), dtype=object)
    frequencies = np.array(list(counts.values()), dtype=np.float64)
    frequencies /= frequencies.sum()
    titles = np.array([passage.title for passage in real], dtype=object)
    rng = np.random.default_rng(seed)
    with atomic_writer(path) as out:
        for passage in real[:size]:
            out.write(json.dumps({"id": passage.id, "title": passage.title, "text": passage.text}) + "\n")
        for start in range(len(real), size, CHUNK):
            rows = min(CHUNK, size - start)
            drawn = words[rng.choice(len(words), size=(rows, SYNTHETIC_WORDS), p=frequencies)]
            picked_titles = titles[rng.integers(len(titles), size=rows)]
            out.writelines(
                json.dumps({"id": f"synthetic-{start + row:08d}", "title": str(picked_titles[row]),
                            "text": " ".join(drawn[row])}) + "\n"
                for row in range(rows)
            )
    stamp.write_text(json.dumps(parameters) + "\n")
    return path


def queries(datasets: Path, count: int, warm_up: int, seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """`count` measured queries and `warm_up` others, each {"query", "source_id"}: the first QUERY_CHARS
    characters of distinct HotpotQA passages drawn with `seed`."""
    passages = list(iter_corpus(datasets / QUERY_SET / "corpus.jsonl"))
    picked = random.Random(seed).sample(passages, min(len(passages), count + warm_up))
    rows = [{"query": passage.text[:QUERY_CHARS], "source_id": passage.id} for passage in picked]
    return rows[warm_up:], rows[:warm_up]
