"""Building a dense index (see `arag.retrievers.dense` for the folder it writes).

Passages are streamed in chunks of `chunk_size`: each chunk's passages and embeddings are saved (atomically) in
`<out>.partial/` beside the output, a scratch folder of arag's (`arag.scratch`), before the next is read. An encoder
with a `batch_size` (the sentence-transformers one) is given a chunk's passages that many at a time, longest first,
and progress is shown after each batch: a tqdm bar on a terminal, else a log line every LOG_EVERY_S seconds.

A build that dies (even by SIGKILL) is rerun with the same arguments: complete chunks are checked against the corpus
and kept, embedding goes on from the first missing one, and the finished index holds every passage
once. IVF-PQ is trained on an evenly spaced sample of the saved embeddings, then every chunk is added from its
memory-mapped file: the float matrix of the whole corpus is never in memory; the float file is written from the same
chunks, one after another. The partial folder is removed once the index is published. A damaged file in it is
named, with what to remove to go on.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from arag.data._io import atomic_writer
from arag.errors import ConfigError, DataError, RetrieverError
from arag.passages import Passage
from arag.retrievers.encoders import (
    check_positive,
    check_same_encoder,
    embed,
    embedder_settings,
    encoder_probe,
    resolve_encoder,
)
from arag.retrievers.manifest import (
    PASSAGES_FILE,
    IndexExistsError,
    PassageWriter,
    is_taken,
    staged_directory,
    write_index_files,
)
from arag.scratch import check_scratch, open_scratch, remove_scratch

logger = logging.getLogger("arag")

INDEX_FILE = "index.faiss"
VECTORS_FILE = "vectors.npy"
VECTORS_DTYPE = np.dtype("<f4")
BUILD_FILE = "build.json"
EXACT, IVFPQ = "exact", "ivfpq"
MIN_IVFPQ_PASSAGES = 1_000
TRAINING_POINTS_PER_LIST = 40
MIN_TRAINING_POINTS = 10_000
MAX_PQ_BYTES = 64
MIN_NPROBE = 32
DEFAULT_RERANK = 10
MIN_RERANK = 2
"""The smallest `rerank` factor that re-ranks: 0 and 1 keep the IVF-PQ ranking (and write no float file)."""
LOG_EVERY_S = 10.0


def load_faiss():
    try:
        import faiss
    except ImportError:
        raise ConfigError("dense indexes need faiss: pip install 'dspy-arag[dense]' (or faiss-cpu)") from None
    if not hasattr(faiss, "IO_FLAG_MMAP_IFC"):
        raise ConfigError(f"faiss {faiss.__version__} cannot memory-map flat indexes: pip install -U faiss-cpu")
    return faiss


def write_dense_index(passages: Iterable[Passage], out_dir: Path, *, kind: str, format_version: int, model: str,
                      encoder: Any, batch_size: int, max_seq_length: int | None, chunk_size: int, exact_up_to: int,
                      nlist: int | None, pq_bytes: int | None, nprobe: int | None, rerank: int,
                      corpus_sha256: str | None) -> Path:
    """`DenseRetriever.write_index`: embeds `passages` into `out_dir`, resuming an interrupted build."""
    for name, value in (("chunk_size", chunk_size), ("nlist", nlist), ("pq_bytes", pq_bytes), ("nprobe", nprobe)):
        if value is not None:
            check_positive(name, value)
    check_positive("exact_up_to", exact_up_to, allow_zero=True)
    check_positive("rerank", rerank, allow_zero=True)
    if is_taken(out_dir):
        raise IndexExistsError(f"{out_dir} already exists and is not empty; remove it or choose another folder")
    if os.path.lexists(partial_dir(out_dir)):
        check_scratch(partial_dir(out_dir))  # before the model loads
    faiss = load_faiss()
    encoder = resolve_encoder(encoder, model, batch_size, max_seq_length)
    embedder = embedder_settings(encoder)
    probe = encoder_probe(encoder)
    partial = PartialBuild(partial_dir(out_dir), {**embedder, "chunk_size": chunk_size,
                                                  "corpus_sha256": corpus_sha256}, encoder, probe)
    n_passages = partial.embed_all(passages, encoder)
    if not n_passages:
        remove_scratch(partial.folder)
        raise DataError(f"no passages to index into {out_dir}")
    dim = partial.dim()
    if n_passages > exact_up_to:
        nlist, pq_bytes, nprobe = ivfpq_shape(n_passages, dim, nlist, pq_bytes, nprobe)
        index = faiss.IndexIVFPQ(faiss.IndexFlatIP(dim), dim, nlist, pq_bytes, 8, faiss.METRIC_INNER_PRODUCT)
        logger.info("dense build: training IVF-PQ (%d lists, %d bytes a passage)", nlist, pq_bytes)
        index.train(partial.sample(min(n_passages, max(TRAINING_POINTS_PER_LIST * nlist, MIN_TRAINING_POINTS))))
        search = {"search": IVFPQ, "nlist": nlist, "pq_bytes": pq_bytes, "nprobe": nprobe, "rerank": rerank}
    else:
        index, search = faiss.IndexFlatIP(dim), {"search": EXACT}
    with staged_directory(out_dir) as staging:
        keeps_floats = search["search"] == IVFPQ and rerank >= MIN_RERANK
        floats = VectorFileWriter(staging / VECTORS_FILE, n_passages, dim) if keeps_floats else None
        with PassageWriter(staging / PASSAGES_FILE) as writer, floats or nullcontext():
            for records, vectors in partial.chunks():
                for record in records:
                    writer.write(record)
                index.add(np.ascontiguousarray(vectors))
                if floats:
                    floats.write(vectors)
        if not writer.count == index.ntotal == n_passages:
            raise RetrieverError(f"{partial.folder}: the saved chunks hold {writer.count:,} passages, "
                                 f"{n_passages:,} were embedded; remove the folder and rebuild")
        faiss.write_index(index, str(staging / INDEX_FILE))
        write_index_files(staging, kind, format_version, None, corpus_sha256=corpus_sha256,
                          settings={**embedder, "probe": probe, "dim": dim, **search}, n_passages=n_passages,
                          faiss_version=faiss.__version__)
    remove_scratch(partial.folder)
    logger.info("dense build: %s passages indexed in %s (%s)", f"{n_passages:,}", out_dir, search["search"])
    return out_dir


def partial_dir(out_dir: Path) -> Path:
    """Where the chunks of an unfinished build of `out_dir` are kept: `<out_dir>.partial` beside it."""
    return out_dir.with_name(f"{out_dir.name}.partial")


class VectorFileWriter:
    """Writes an (n, dim) float32 `.npy` file block by block, its header first: the matrix is never in memory."""

    def __init__(self, path: Path, n_rows: int, dim: int):
        self._file = open(path, "xb")
        np.lib.format.write_array_header_1_0(
            self._file, {"descr": np.lib.format.dtype_to_descr(VECTORS_DTYPE), "fortran_order": False,
                         "shape": (n_rows, dim)})

    def write(self, vectors: np.ndarray) -> None:
        self._file.write(np.ascontiguousarray(vectors, dtype=VECTORS_DTYPE).tobytes())

    def __enter__(self) -> VectorFileWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self._file.close()


def ivfpq_shape(n_passages: int, dim: int, nlist: int | None, pq_bytes: int | None,
                nprobe: int | None) -> tuple[int, int, int]:
    """`(nlist, pq_bytes, nprobe)` of an IVF-PQ index of `n_passages` vectors, defaults filled in and checked."""
    if n_passages < MIN_IVFPQ_PASSAGES:
        raise ConfigError(f"an IVF-PQ index needs at least {MIN_IVFPQ_PASSAGES:,} passages to train, got "
                          f"{n_passages:,}; raise exact_up_to to search them exactly")
    if nlist is None:
        nlist = max(1, min(round(4 * math.sqrt(n_passages)), n_passages // TRAINING_POINTS_PER_LIST))
    if nlist > n_passages:
        raise ConfigError(f"nlist {nlist} is above the number of passages ({n_passages:,})")
    if pq_bytes is None:
        pq_bytes = max(m for m in range(1, min(dim, MAX_PQ_BYTES) + 1) if dim % m == 0)
    if dim % pq_bytes:
        raise ConfigError(f"pq_bytes {pq_bytes} must divide the embedding dimension {dim}")
    return nlist, pq_bytes, min(nlist, nprobe or max(MIN_NPROBE, nlist // 32))


class PartialBuild:
    """The chunks of a build in progress: `chunk-NNNNNN.jsonl` (the passages) and `chunk-NNNNNN.npy` (their unit
    embeddings), each written atomically, the `.npy` last; `build.json` holds the arguments they were made with and
    the encoder's probe (see `arag.retrievers.encoders`)."""

    def __init__(self, folder: Path, arguments: dict, encoder, probe: str):
        self.folder = open_scratch(folder)
        record = folder / BUILD_FILE
        if os.path.lexists(record):
            earlier = self._earlier_arguments(record)
            check_same_encoder(earlier, encoder, probe, f"the interrupted build in {folder}", error=ConfigError)
            earlier.pop("probe", None)
            if earlier != arguments:
                raise ConfigError(
                    f"{folder} holds an interrupted build made with other arguments ({earlier}); "
                    "rerun with those, or remove the folder to start over"
                )
        else:
            with atomic_writer(record) as handle:
                json.dump({**arguments, "probe": probe}, handle)
        self.chunk_size = arguments["chunk_size"]
        self.saved = 0
        while self._vectors_path(self.saved).is_file():
            self.saved += 1

    def _earlier_arguments(self, record: Path) -> dict:
        try:
            earlier = json.loads(record.read_text(encoding="utf-8"))
            if not isinstance(earlier, dict) or "model" not in earlier:
                raise ValueError("not the arguments of a build")
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise RetrieverError(f"{record} is damaged ({exc}); remove {self.folder} to start over") from None
        return earlier

    def embed_all(self, passages: Iterable[Passage], encoder) -> int:
        """Embeds and saves every chunk not saved yet; returns the number of passages."""
        if self.saved:
            logger.info("dense build: resuming after %d saved chunks in %s", self.saved, self.folder)
        n_passages = chunk_no = 0
        with BuildProgress(self.folder) as progress:
            for chunk_no, chunk in enumerate(chunked(passages, self.chunk_size)):
                if chunk_no < self.saved:
                    self._check_saved(chunk_no, chunk)
                    progress.kept(len(chunk))
                else:
                    self._save(chunk_no, chunk, embed_batches(encoder, [p.long_text for p in chunk], progress))
                n_passages += len(chunk)
        if not n_passages:
            return 0
        if chunk_no + 1 < self.saved:
            raise DataError(f"{self.folder} holds {self.saved} chunks, the corpus only {chunk_no + 1}: it changed "
                            "since the interrupted build; remove the folder to start over")
        self.saved = chunk_no + 1
        return n_passages

    def dim(self) -> int:
        return int(self._vectors(0).shape[1])

    def chunks(self) -> Iterator[tuple[list[tuple[str, str, str]], np.ndarray]]:
        """Every saved chunk in order: its records and its memory-mapped embeddings."""
        for chunk_no in range(self.saved):
            records = self._records(chunk_no)
            yield records, self._vectors(chunk_no, len(records))

    def sample(self, size: int) -> np.ndarray:
        """`size` embeddings evenly spaced over the corpus (the same ones on every run)."""
        counts = [self._vectors(c).shape[0] for c in range(self.saved)]
        wanted = np.unique(np.linspace(0, sum(counts) - 1, size).round().astype(np.int64))
        starts = np.cumsum([0] + counts)
        parts = []
        for chunk_no in range(self.saved):
            rows = wanted[(wanted >= starts[chunk_no]) & (wanted < starts[chunk_no + 1])] - starts[chunk_no]
            if len(rows):
                parts.append(self._vectors(chunk_no)[rows])
        return np.ascontiguousarray(np.concatenate(parts))

    def _check_saved(self, chunk_no: int, chunk: list[Passage]) -> None:
        if [record[0] for record in self._records(chunk_no)] != [p.id for p in chunk]:
            raise DataError(f"{self.folder}: chunk {chunk_no} holds other passages than the corpus has there: it "
                            "changed since the interrupted build; remove the folder to start over")
        self._vectors(chunk_no, len(chunk))

    def _records(self, chunk_no: int) -> list[tuple[str, str, str]]:
        """The saved passages of a chunk; a RetrieverError naming the file when it is damaged."""
        path = self._records_path(chunk_no)
        try:
            with open(path, encoding="utf-8") as handle:
                records = [tuple(json.loads(line)) for line in handle]
            if not all(len(r) == 3 and all(isinstance(field, str) for field in r) for r in records):
                raise ValueError("a line is not [id, title, text]")
        except (OSError, UnicodeDecodeError, ValueError, TypeError) as exc:
            raise self._damaged(chunk_no, path, exc) from None
        return records

    def _vectors(self, chunk_no: int, n_rows: int | None = None) -> np.ndarray:
        """The saved embeddings of a chunk, memory-mapped: float32 rows of the first chunk's dimension (`n_rows` of
        them when given); a RetrieverError naming the file when it is damaged."""
        path = self._vectors_path(chunk_no)
        try:
            vectors = np.load(path, mmap_mode="r", allow_pickle=False)
            if vectors.ndim != 2 or vectors.dtype != VECTORS_DTYPE or not vectors.shape[1]:
                raise ValueError(f"an array of shape {vectors.shape} and type {vectors.dtype}")
            if chunk_no and vectors.shape[1] != self.dim():
                raise ValueError(f"{vectors.shape[1]}-dimensional rows, those of chunk 0 are {self.dim()}")
            if n_rows is not None and vectors.shape[0] != n_rows:
                raise ValueError(f"{vectors.shape[0]} rows for {n_rows} passages")
        except (OSError, ValueError, EOFError) as exc:
            raise self._damaged(chunk_no, path, exc) from None
        return vectors

    def _damaged(self, chunk_no: int, path: Path, exc: BaseException) -> RetrieverError:
        return RetrieverError(f"{path} is damaged ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
                              f"remove {self._vectors_path(chunk_no)} and rerun: that chunk and those after it are "
                              "embedded again")

    def _save(self, chunk_no: int, chunk: list[Passage], vectors: np.ndarray) -> None:
        if chunk_no and vectors.shape[1] != self.dim():
            raise ConfigError(f"{self.folder}: the encoder gives {vectors.shape[1]}-dimensional embeddings, the saved "
                              f"chunks hold {self.dim()}-dimensional ones")
        with atomic_writer(self._records_path(chunk_no)) as handle:
            handle.writelines(json.dumps([p.id, p.title, p.text], ensure_ascii=False) + "\n" for p in chunk)
        with atomic_writer(self._vectors_path(chunk_no), binary=True) as handle:
            np.save(handle, vectors)

    def _records_path(self, chunk_no: int) -> Path:
        return self.folder / f"chunk-{chunk_no:06d}.jsonl"

    def _vectors_path(self, chunk_no: int) -> Path:
        return self.folder / f"chunk-{chunk_no:06d}.npy"


class BuildProgress:
    """The progress of a build's embedding: a tqdm bar of passages on a terminal, else (logs, pipes) a log line
    every LOG_EVERY_S seconds."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.passages = self.embedded = 0
        self.started = self.logged = time.monotonic()
        self.bar = tqdm(desc="dense build", unit=" passages", disable=None, smoothing=0.1)

    def kept(self, n: int) -> None:
        """`n` passages of a saved chunk, not embedded again."""
        self.passages += n
        self.bar.update(n)

    def embedded_batch(self, n: int) -> None:
        self.passages += n
        self.embedded += n
        self.bar.update(n)
        if self.bar.disable and time.monotonic() - self.logged >= LOG_EVERY_S:
            self.logged = time.monotonic()
            logger.info("dense build: %s passages (%s embedded now, %.0f/s) in %s", f"{self.passages:,}",
                        f"{self.embedded:,}", self.embedded / (self.logged - self.started), self.folder)

    def __enter__(self) -> BuildProgress:
        return self

    def __exit__(self, *exc_info) -> None:
        self.bar.close()


def embed_batches(encoder, texts: list[str], progress: BuildProgress) -> np.ndarray:
    """`embed` of `texts`, `encoder.batch_size` at a time when it has one (longest first: a batch of similar lengths
    pads little), else all at once; progress after each batch."""
    batch_size = getattr(encoder, "batch_size", None)
    if not isinstance(batch_size, int) or batch_size < 1:
        batch_size = len(texts)
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    vectors = None
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        batch = embed(encoder, [texts[i] for i in rows])
        if vectors is None:
            vectors = np.empty((len(texts), batch.shape[1]), dtype=np.float32)
        elif batch.shape[1] != vectors.shape[1]:
            raise ConfigError(f"the encoder gave {batch.shape[1]}-dimensional embeddings after "
                              f"{vectors.shape[1]}-dimensional ones")
        vectors[rows] = batch
        progress.embedded_batch(len(rows))
    return vectors


def chunked(passages: Iterable[Passage], size: int) -> Iterator[list[Passage]]:
    """The passages in lists of `size` (the last one shorter), read lazily."""
    iterator = iter(passages)
    while chunk := list(islice(iterator, size)):
        yield chunk
