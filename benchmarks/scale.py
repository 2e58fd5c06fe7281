"""Retrieval engines at 100k, 1M and 5M passages: build time, size on disk, memory, query latency at 1 and
16 concurrent clients, top-10 agreement; then each figure projected to DPR Wikipedia's 21M passages.

    python benchmarks/scale.py [--sizes 100000,1000000] [--engines bm25s,lucene,dense-ivfpq,dense-ivfpq-pq,dense-flat]
                               [--queries 200] [--work DIR] [--out DIR] [--pause-pid PID] [--quick]
    python benchmarks/scale.py --table-only [--out DIR]

Corpora and queries: benchmarks/scale_corpus.py (real QA passages, then 100-word passages drawn from
their words; queries are the first 120 characters of HotpotQA passages, top 10). Corpora and indexes
go under --work (default ~/.cache/arag/scale, outside the repository); each engine at each size writes
its figures to --out (default benchmarks/results/scale/ENGINE-SIZE.json) and the table is printed
from every result there, so engines measured in separate runs share one table.

Every engine goes through arag's API only (`build_index`, then `open_retriever("KIND:DIR")`, or the
index class's `load` where it needs an object such as an encoder); ENGINES lists them, one line each.
Its build runs in one child process and its serving in another, so peak and resident memory (VmHWM,
VmRSS split into anonymous and file-backed pages, from /proc/self/status) are that step's alone; CPU
time is recorded beside wall time, as it moves little with other load on the machine. Serving: open,
50 warm-up queries, then the measured queries from 1 client and from 16 concurrent clients (threads
calling `retrieve`), each query timed on its own; p50/p99. Agreement: the mean share of a reference
engine's top 10 (bm25s for Lucene, exact flat search for IVF-PQ) that an engine's top 10 holds, on the
same queries at the same size. "source hit@10": how often the HotpotQA passage a query was cut from is
in the top 10.

The dense engines are measured with arag.testing.HashingEncoder at 384 dimensions (hashed
words: not a semantic model), so that million-passage builds take minutes; MiniLM's own encoding rate
is measured on a sample and its encoding time for DPR Wikipedia projected from it.

An engine is not built at a size when the growth of its build's peak memory over the sizes already
measured projects above --memory-limit-gb: its figures there are projected instead.

--pause-pid: a process that shares the machine (another benchmark) is stopped (SIGSTOP) during the
phases named by --pause-during, and continued (SIGCONT) after, at most --pause-budget seconds in all,
so that timings are not another program's; it is continued on every exit path short of SIGKILL. Each
result records how many of its seconds ran with that process stopped, and the load average before.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))

import scale_corpus  # noqa: E402
from pausing import Pauser  # noqa: E402
from scale_table import DPR_WIKIPEDIA, FIGURES, TOP_K, growth, read_results, report  # noqa: E402

DATASETS = BENCHMARKS.parents[1] / "shared" / "datasets"
DEFAULT_WORK = Path.home() / ".cache" / "arag" / "scale"
DEFAULT_OUT = BENCHMARKS / "results" / "scale"
CLIENTS = (1, 16)
WARM_UP_QUERIES = 50
QUICK_SIZES = "5000,8000"
QUICK_QUERIES = 20
MINILM_SAMPLE = 256
DENSE_DIMENSION = 384  # all-MiniLM-L6-v2's, so that dense indexes have the default model's size
EXACT_UP_TO = 10**9  # the dense index's option that keeps search exact (flat) at every size here


def hashing_encoder() -> dict:
    """The cheap deterministic encoder the dense engines are measured with: hashed words, not a semantic model."""
    from arag.testing import HashingEncoder

    return {"encoder": HashingEncoder(dim=DENSE_DIMENSION)}


@dataclass(frozen=True)
class Engine:
    """How to build and open one retrieval engine through arag: index kind, build options, the options of the
    index class's `load` (none: opened by its spec `KIND:DIR`), and the engine whose top 10 it is compared with."""

    kind: str
    about: str
    build_options: Callable[[], dict] = dict
    load_options: Callable[[], dict] = dict
    reference: str | None = None


ENGINES: dict[str, Engine] = {
    "bm25s": Engine("bm25", "bm25s (numba backend), k1 1.5, b 0.75, score arrays memory-mapped, passages in memory"),
    "lucene": Engine("lucene", "Lucene (Anserini in Pyserini 1.6, Java 21), k1 1.5, b 0.75, 2 indexing threads",
                     reference="bm25s"),
    "dense-ivfpq": Engine("dense", "faiss IVF-PQ memory-mapped, top 10 x k re-ranked exactly from memory-mapped "
                          "vectors (the default), passages on disk; hashed-word vectors, 384 dims",
                          build_options=hashing_encoder, load_options=hashing_encoder, reference="dense-flat"),
    "dense-ivfpq-pq": Engine("dense", "faiss IVF-PQ memory-mapped, ranked by its compressed codes alone (rerank 0), "
                             "passages on disk; hashed-word vectors, 384 dims",
                             build_options=lambda: {**hashing_encoder(), "rerank": 0}, load_options=hashing_encoder,
                             reference="dense-flat"),
    "dense-flat": Engine("dense", "faiss flat (exact) memory-mapped, passages on disk; hashed-word vectors, 384 dims",
                         build_options=lambda: {**hashing_encoder(), "exact_up_to": EXACT_UP_TO},
                         load_options=hashing_encoder),
}

# ---------------------------------------------------------------- children: one engine, one step, one process


def memory() -> dict:
    """This process's peak and current resident memory in bytes, current split into anonymous and file-backed."""
    wanted = {"VmHWM": "peak", "VmRSS": "rss", "RssAnon": "rss_anon", "RssFile": "rss_file"}
    figures = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in wanted:
                figures[wanted[name]] = int(value.split()[0]) * 1024
    figures["children_peak"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return figures


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def build_child(engine: Engine, corpus: Path, index_dir: Path) -> dict:
    from arag.retrievers import build_index

    options = engine.build_options()
    started, cpu_started = time.perf_counter(), cpu_seconds()
    build_index(corpus, index_dir, kind=engine.kind, **options)
    return {"build_s": time.perf_counter() - started, "build_cpu_s": cpu_seconds() - cpu_started,
            "build_memory": memory(), "disk_bytes": folder_bytes(index_dir)}


def cpu_seconds() -> float:
    """CPU time of this process and its finished children: unlike wall time, it hardly moves with other load."""
    return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def open_engine(engine: Engine, index_dir: Path):
    from arag.retrievers import INDEX_KINDS, open_retriever

    options = engine.load_options()
    if options:
        return INDEX_KINDS[engine.kind].load(index_dir, **options)
    return open_retriever(f"{engine.kind}:{index_dir}")


def timed_queries(retriever, queries: list[str], clients: int) -> dict:
    """With `clients` threads calling `retrieve` at once: each query's milliseconds and top-k ids; queries/s, and
    the process's CPU time (all its threads: the engine's own, Java's, faiss') per query."""

    def one(query: str) -> tuple[float, list[str]]:
        started = time.perf_counter()
        found = retriever.retrieve(query, TOP_K)
        return 1000 * (time.perf_counter() - started), [passage.id for passage in found]

    started, cpu_started = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        done = list(pool.map(one, queries))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return {"ms": [ms for ms, _ in done], "ids": [ids for _, ids in done], "queries_per_s": len(queries) / wall,
            "cpu_ms_per_query": 1000 * cpu / len(queries)}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(share * len(ordered)) - 1)]


def serve_child(engine: Engine, index_dir: Path, queries_file: Path, ids_file: Path) -> dict:
    measured, warm_up = json.loads(queries_file.read_text())
    started = time.perf_counter()
    retriever = open_engine(engine, index_dir)
    figures = {"load_s": time.perf_counter() - started, "loaded_memory": memory()}
    timed_queries(retriever, [row["query"] for row in warm_up], 1)
    texts = [row["query"] for row in measured]
    for clients in CLIENTS:
        timed = timed_queries(retriever, texts, clients)
        figures[f"clients_{clients}"] = {
            "p50_ms": statistics.median(timed["ms"]), "p99_ms": percentile(timed["ms"], 0.99),
            "cpu_ms_per_query": timed["cpu_ms_per_query"], "queries_per_s": timed["queries_per_s"],
        }
        if clients == 1:
            ids_file.write_text(json.dumps(timed["ids"]))
            figures["source_hit_at_10"] = statistics.mean(
                row["source_id"] in found for row, found in zip(measured, timed["ids"]))
    figures["serving_memory"] = memory()
    return figures


def minilm_child(corpus: Path, sample: int) -> dict:
    """The encoding rate (passages/s) of the dense index's default encoder (MiniLM, its batch size and length
    limit, on its default backend) on `sample` synthetic passages."""
    from arag.data.corpus import iter_corpus
    from arag.retrievers.dense import SentenceEncoder

    texts = []
    for passage in iter_corpus(corpus):
        if passage.id.startswith("synthetic-"):
            texts.append(passage.long_text)
            if len(texts) == sample:
                break
    if len(texts) < sample:
        raise ValueError(f"{corpus} holds {len(texts)} synthetic passages, MiniLM is timed on {sample}: use a larger "
                         "--sizes")
    encoder = SentenceEncoder()
    encoder.encode(texts[:encoder.batch_size])
    started = time.perf_counter()
    encoder.encode(texts)
    seconds = time.perf_counter() - started
    return {"passages": len(texts), "seconds": seconds, "passages_per_s": len(texts) / seconds,
            "model": encoder.name, "max_seq_length": encoder.max_seq_length, "batch_size": encoder.batch_size,
            "backend": encoder.backend, "threads": encoder_threads(encoder.backend)}


def encoder_threads(backend: str) -> int:
    """The threads the encoder computes on: torch's intra-op setting, or ONNX Runtime's default of one a core."""
    if backend == "torch":
        import torch

        return torch.get_num_threads()
    return os.cpu_count() or 1


def child_main(step: str, arguments: dict) -> dict:
    if step == "minilm":
        return minilm_child(Path(arguments["corpus"]), arguments["sample"])
    engine = ENGINES[arguments["engine"]]
    if step == "build":
        return build_child(engine, Path(arguments["corpus"]), Path(arguments["index"]))
    return serve_child(engine, Path(arguments["index"]), Path(arguments["queries"]), Path(arguments["ids"]))


# ---------------------------------------------------------------- the parent: corpora, children, results


def in_child(step: str, **arguments) -> dict:
    command = [sys.executable, __file__, "--child", step, "--child-arguments", json.dumps(arguments, default=str)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"{step} {arguments} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def projected_build_peak(out: Path, name: str, size: int) -> float | None:
    measured = read_results(out).get(name, {})
    projection = growth([(n, FIGURES["build_peak"].read(r)) for n, r in measured.items()], size)
    if projection:
        return projection[0]
    if measured:  # one size: linear in n
        n, result = max(measured.items())
        return FIGURES["build_peak"].read(result) * size / n
    return None


def corpus_file(args, size: int) -> Path:
    """The corpus of `size` passages under --work, written on first use."""
    return scale_corpus.write_corpus(args.datasets, size, args.work / "corpora" / f"corpus-{size}.jsonl")


def measure(name: str, size: int, args, pauser: Pauser) -> dict | None:
    engine = ENGINES[name]
    peak = projected_build_peak(args.out, name, size)
    if peak and peak > args.memory_limit_gb * 2**30:
        print(f"{name} at {size:,}: not built, its build would peak near {peak / 2**30:.1f} GB "
              f"(over --memory-limit-gb {args.memory_limit_gb:g}); projected instead", file=sys.stderr)
        return None
    corpus = corpus_file(args, size)
    index_dir = args.work / "indexes" / f"{name}-{size}"
    ids_file = args.work / "ids" / f"{name}-{size}.json"
    ids_file.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(index_dir, ignore_errors=True)
    index_dir.parent.mkdir(parents=True, exist_ok=True)
    print(f"{name} at {size:,}: building ...", file=sys.stderr, flush=True)
    with pauser.phase("build" in args.pause_during) as build_pause:
        built = in_child("build", engine=name, corpus=corpus, index=index_dir)
    print(f"{name} at {size:,}: serving ...", file=sys.stderr, flush=True)
    with pauser.phase("serve" in args.pause_during) as serve_pause:
        served = in_child("serve", engine=name, index=index_dir, queries=args.work / "queries.json", ids=ids_file)
    result = {"engine": name, "kind": engine.kind, "about": engine.about, "size": size, "build": built,
              "serve": served, "phases": {"build": build_pause, "serve": serve_pause},
              "queries": args.queries, "clients": list(CLIENTS), "machine": machine(), "commit": commit(),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    (args.out / f"{name}-{size}.json").write_text(json.dumps(result, indent=2) + "\n")
    if not args.keep_indexes:
        shutil.rmtree(index_dir)
    return result


def record_agreements(work: Path, out: Path) -> None:
    """Adds to each result the top-10 agreement with its engine's reference at the same size, wherever both
    engines' result ids are in `work` (whichever of the two was measured first)."""
    from retrieval_agreement import ids_agreement

    for path in out.glob("*.json"):
        result = json.loads(path.read_text())
        engine = ENGINES.get(result.get("engine"))
        if engine is None or engine.reference is None:
            continue
        ids, reference_ids = (work / "ids" / f"{name}-{result['size']}.json" for name in (result["engine"],
                                                                                         engine.reference))
        if ids.is_file() and reference_ids.is_file():
            top_10 = ids_agreement(json.loads(ids.read_text()), json.loads(reference_ids.read_text()), TOP_K)
            result["agreement"] = {"with": engine.reference, "top_10": top_10}
            path.write_text(json.dumps(result, indent=2) + "\n")


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 platform.processor())
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cpu": model, "cores": os.cpu_count(), "memory_bytes": total, "python": platform.python_version()}


def commit() -> str:
    done = subprocess.run(["git", "-C", str(BENCHMARKS), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True)
    return done.stdout.strip() or "unknown"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100000,1000000", help="comma-separated corpus sizes")
    parser.add_argument("--engines", default=",".join(ENGINES),
                        help=f"comma-separated: {', '.join(ENGINES)} ('': none, e.g. to time MiniLM alone)")
    parser.add_argument("--queries", type=int, default=200, help="measured queries per engine and size")
    parser.add_argument("--datasets", type=Path, default=DATASETS, help="folder holding the QA sets' corpus.jsonl")
    parser.add_argument("--work", type=Path, help=f"corpora and indexes (default {DEFAULT_WORK}; --quick: temporary)")
    parser.add_argument("--out", type=Path, help=f"result files (default {DEFAULT_OUT}; --quick: under --work)")
    parser.add_argument("--project", default=f"5000000,{DPR_WIKIPEDIA}", help="sizes to project figures to")
    parser.add_argument("--memory-limit-gb", type=float, default=8.0,
                        help="build no engine whose build peak projects above this")
    parser.add_argument("--minilm-sample", type=int, default=MINILM_SAMPLE,
                        help="passages to time MiniLM's encoding on (0: skip)")
    parser.add_argument("--pause-pid", type=int, help="a process to stop while engines build and serve")
    parser.add_argument("--pause-budget", type=float, default=1200.0, help="seconds it may be stopped in all")
    parser.add_argument("--pause-during", default="build,serve",
                        help="phases it is stopped in: build, serve (and MiniLM's timing), or both")
    parser.add_argument("--keep-indexes", action="store_true", help="keep each index folder after measuring it")
    parser.add_argument("--table-only", action="store_true", help="print the table from the results in --out")
    parser.add_argument("--quick", action="store_true",
                        help=f"sizes {QUICK_SIZES}, {QUICK_QUERIES} queries, no MiniLM, in a temporary folder")
    parser.add_argument("--child", choices=("build", "serve", "minilm"), help=argparse.SUPPRESS)
    parser.add_argument("--child-arguments", default="{}", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child_main(args.child, json.loads(args.child_arguments))))
        return 0
    projected_sizes = [int(size) for size in args.project.split(",")]
    if args.quick:
        args.sizes, args.queries, args.minilm_sample = QUICK_SIZES, QUICK_QUERIES, 0
    with tempfile.TemporaryDirectory(prefix="arag-scale-") as scratch:
        args.work = args.work or (Path(scratch) if args.quick else DEFAULT_WORK)
        args.out = args.out or (args.work / "results" if args.quick else DEFAULT_OUT)
        if args.table_only:
            report(args.out, projected_sizes)
            return 0
        chosen = [name for name in args.engines.split(",") if name]
        unknown = sorted(set(chosen) - set(ENGINES))
        if unknown:
            sys.exit(f"unknown engine(s) {', '.join(unknown)}; known: {', '.join(ENGINES)}")
        args.out.mkdir(parents=True, exist_ok=True)
        args.work.mkdir(parents=True, exist_ok=True)
        measured, warm_up = scale_corpus.queries(args.datasets, args.queries, WARM_UP_QUERIES)
        (args.work / "queries.json").write_text(json.dumps([measured, warm_up]))
        pauser = Pauser(args.pause_pid, args.pause_budget)
        pauser.resume_on_exit()
        for size in sorted(int(size) for size in args.sizes.split(",")):
            for name in chosen:
                measure(name, size, args, pauser)
        record_agreements(args.work, args.out)
        if args.minilm_sample:
            size = min(int(size) for size in args.sizes.split(","))
            corpus = corpus_file(args, size)
            with pauser.phase("serve" in args.pause_during) as phase:
                rate = in_child("minilm", corpus=corpus, sample=args.minilm_sample)
            rate.update(phase=phase, machine=machine(), commit=commit())
            (args.out / "minilm-encoding.json").write_text(json.dumps(rate, indent=2) + "\n")
        report(args.out, projected_sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
