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
- the manifest, whose settings name the embedder (`model`, `embedder`), its dimension and its probe.
Resident memory is the faiss structures that are not mapped (the coarse centroids and PQ tables) plus the model.

Building (`arag.retrievers.dense_build`) streams the passages in chunks saved beside the output, so that a build
that dies, even by SIGKILL, resumes when rerun with the same arguments; the whole float matrix is never in memory.
The manifest records the encoder's identity (`arag.retrievers.encoders`): opening the index with another model is
refused, naming both.

Vectors are L2-normalised here, whatever the encoder returns, so inner product is cosine similarity. Needs the
`dense` extra: faiss-cpu, and the bundled model on ONNX Runtime (`dense-torch` adds sentence-transformers' torch
backend; see `arag.retrievers.encoders`). Format-1 folders (a float matrix loaded
whole) are refused with a request to rebuild; format-2 IVF-PQ folders written before re-ranking (no float file)
open without it.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from arag.errors import RetrieverError
from arag.passages import Passage
from arag.retrievers.base import BaseRetriever, check_k
from arag.retrievers.dense_build import (  # noqa: F401  (importable from here, as before the split)
    BUILD_FILE,
    DEFAULT_RERANK,
    EXACT,
    INDEX_FILE,
    IVFPQ,
    LOG_EVERY_S,
    MIN_RERANK,
    VECTORS_DTYPE,
    VECTORS_FILE,
    VectorFileWriter,
    chunked,
    ivfpq_shape,
    load_faiss,
    partial_dir,
    write_dense_index,
)
from arag.retrievers.encoders import (  # noqa: F401  (importable from here, as before the split)
    CUSTOM_ENCODER,
    DEFAULT_MODEL,
    SENTENCE_TRANSFORMERS,
    SentenceEncoder,
    check_positive,
    embed,
    embedder_settings,
    load_sentence_model,
    model_path,
    query_encoder,
    resolve_encoder,
)
from arag.retrievers.manifest import PASSAGES_FILE, PassageStore, read_index_manifest


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
        return load_faiss().extract_index_ivf(self._index).nprobe if self.settings["search"] == IVFPQ else None

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
        return write_dense_index(
            passages, Path(out_dir), kind=cls.kind, format_version=cls.format_version, model=model, encoder=encoder,
            batch_size=batch_size, max_seq_length=max_seq_length, chunk_size=chunk_size, exact_up_to=exact_up_to,
            nlist=nlist, pq_bytes=pq_bytes, nprobe=nprobe, rerank=rerank, corpus_sha256=corpus_sha256,
        )

    @classmethod
    def load(cls, index_dir: str | Path, encoder: Any = None, nprobe: int | None = None,
             rerank: int | None = None) -> DenseRetriever:
        """Opens a folder written by `build`, memory-mapped, with the encoder that embedded it: the recorded
        sentence-transformers model, or `encoder` (which must be given for an index built with an encoder object,
        and must be the model that embedded the index: its dimension, and its probe when one is recorded). `nprobe`
        and `rerank` override the recorded ones (IVF-PQ; re-ranking needs the float file of an index built with
        it)."""
        index_dir = Path(index_dir)
        manifest, settings = read_index_manifest(index_dir, cls.kind, cls.label, cls.format_version,
                                                 {"model", "embedder", "dim", "max_seq_length", "search"})
        faiss = load_faiss()
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
        faiss = load_faiss()
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
