"""BM25 retrieval (bm25s, Lucene variant) over passage titles and texts, saved to and memory-mapped from a folder."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import bm25s

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

SCORE_ARRAYS = ("data", "indices", "indptr")


NUMBA_MIN_PASSAGES = 20_000


def engine_backend(n_passages: int) -> str:
    """bm25s' numba backend (about 25x faster per query, but seconds to compile in every process) for
    corpora of NUMBA_MIN_PASSAGES or more when numba imports; its numpy one below that size."""
    return "numba" if bm25s.NUMBA_AVAILABLE and n_passages >= NUMBA_MIN_PASSAGES else "numpy"


def new_stemmer(language: str | None):
    """A PyStemmer stemmer for `language`, or None for no stemming; a ConfigError when that is impossible."""
    if language is None:
        return None
    try:
        import Stemmer
    except ImportError:
        raise ConfigError("stemming needs PyStemmer: pip install PyStemmer (or build with stemmer=None)") from None
    if language not in Stemmer.algorithms():
        raise ConfigError(f"unknown stemmer {language!r}; known: {', '.join(sorted(Stemmer.algorithms()))}")
    return Stemmer.Stemmer(language)


def tokenize(texts: Sequence[str], stopwords, stemmer) -> list[list[str]]:
    """The stemmed, stopword-free tokens of each text: the one tokenization used for indexing and querying."""
    try:
        return bm25s.tokenize(list(texts), stopwords=stopwords, stemmer=stemmer, return_ids=False, show_progress=False)
    except ValueError as exc:
        raise ConfigError(f"bad BM25 stopwords {stopwords!r}: {exc}") from None


class BM25Retriever(BaseRetriever):
    """BM25 over `title + text`; safe to call from many threads at once.

    Queries run through bm25s' serial numba kernel, which releases the GIL and shares no state, so
    threads search in parallel without a lock; PyStemmer stemmers are not thread-safe, so each
    thread gets its own. Like Lucene, results are only the passages sharing an indexed token with
    the query (at most k, best first, k above the corpus size allowed): a query with none (empty,
    punctuation, stopwords only, unseen words) returns [].
    """

    kind = "bm25"
    label = "BM25"
    format_version = 1

    def __init__(self, index_dir: Path, engine: bm25s.BM25, records: list[tuple[str, str, str]], settings: dict):
        self.index_dir = index_dir
        self.settings = settings
        self._engine = engine
        self._records = records
        self._thread_state = threading.local()
        self._warm_up()

    def __len__(self) -> int:
        return len(self._records)

    def __repr__(self) -> str:
        return f"BM25Retriever({str(self.index_dir)!r}, {len(self):,} passages)"

    @classmethod
    def build(
        cls,
        passages: Iterable[Passage],
        out_dir: str | Path,
        *,
        stemmer: str | None = "english",
        stopwords: str | list[str] | None = "en",
        k1: float = 1.5,
        b: float = 0.75,
        corpus_sha256: str | None = None,
    ) -> BM25Retriever:
        """Indexes `passages` into `out_dir` (which must not hold anything yet) and opens the result."""
        cls.write_index(
            passages, out_dir, stemmer=stemmer, stopwords=stopwords, k1=k1, b=b, corpus_sha256=corpus_sha256
        )
        return cls.load(out_dir)

    @classmethod
    def write_index(
        cls,
        passages: Iterable[Passage],
        out_dir: str | Path,
        *,
        stemmer: str | None = "english",
        stopwords: str | list[str] | None = "en",
        k1: float = 1.5,
        b: float = 0.75,
        corpus_sha256: str | None = None,
    ) -> Path:
        """Indexes `passages` into `out_dir` without opening it; the folder appears only once complete."""
        out_dir = Path(out_dir)
        records = [(p.id, p.title, p.text) for p in passages]
        if not records:
            raise DataError(f"no passages to index into {out_dir}")
        settings = {"stemmer": stemmer, "stopwords": stopwords, "k1": k1, "b": b, "method": "lucene"}
        tokens = tokenize([f"{title} {text}" for _, title, text in records], stopwords, new_stemmer(stemmer))
        with staged_directory(out_dir) as staging:
            engine = bm25s.BM25(k1=k1, b=b, method="lucene", backend="numpy")
            engine.index(tokens, show_progress=False)
            engine.save(staging, show_progress=False)
            write_index_files(staging, cls.kind, cls.format_version, records, corpus_sha256=corpus_sha256,
                              settings=settings, bm25s_version=bm25s.__version__)
        return out_dir

    @classmethod
    def load(cls, index_dir: str | Path, mmap: bool = True) -> BM25Retriever:
        """Opens a folder written by `build` (score arrays memory-mapped unless mmap=False) and warms it up."""
        index_dir = Path(index_dir)
        manifest, settings = read_index_manifest(index_dir, cls.kind, cls.label, cls.format_version,
                                                 {"stemmer", "stopwords"})
        try:
            backend = engine_backend(manifest.get("n_passages", 0))
            engine = bm25s.BM25.load(index_dir, mmap=mmap, backend=backend, show_progress=False)
            records = read_records(index_dir / PASSAGES_FILE)
        except (OSError, ValueError, TypeError) as exc:
            raise RetrieverError(f"{index_dir}: damaged BM25 index ({exc})") from None
        if not len(records) == engine.scores["num_docs"] == manifest.get("n_passages"):
            raise RetrieverError(f"{index_dir}: damaged BM25 index (passage counts disagree)")
        for name in SCORE_ARRAYS:
            # Read-only like the memory-mapped arrays, so both share one compiled numba kernel.
            engine.scores[name].flags.writeable = False
        return cls(index_dir, engine, records, settings)

    def retrieve_batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """The results of many queries from one bm25s call."""
        check_k(k)
        return self._search_many(list(queries), k)

    def _search(self, query: str, k: int) -> list[Passage]:
        return self._search_many([query], k)[0]

    def _search_many(self, queries: list[str], k: int) -> list[list[Passage]]:
        token_ids = self._token_ids(queries)
        answerable = [row for row, ids in enumerate(token_ids) if ids]
        results: list[list[Passage]] = [[] for _ in queries]
        if not answerable:
            return results
        found = self._engine.retrieve(
            [token_ids[row] for row in answerable], k=min(k, len(self._records)), show_progress=False
        )
        for row, doc_indices, scores in zip(answerable, found.documents, found.scores):
            results[row] = [self._passage(int(i), float(s)) for i, s in zip(doc_indices, scores) if s > 0]
        return results

    def _token_ids(self, queries: list[str]) -> list[list[int]]:
        vocab = self._engine.vocab_dict
        tokens = tokenize([q or "" for q in queries], self.settings["stopwords"], self._stemmer())
        return [[vocab[t] for t in query_tokens if t in vocab] for query_tokens in tokens]

    def _stemmer(self):
        if self.settings["stemmer"] is None:
            return None
        stemmer = getattr(self._thread_state, "stemmer", None)
        if stemmer is None:
            stemmer = self._thread_state.stemmer = new_stemmer(self.settings["stemmer"])
        return stemmer

    def _passage(self, index: int, score: float) -> Passage:
        pid, title, text = self._records[index]
        return Passage(id=pid, title=title, text=text, score=score)

    def _warm_up(self) -> None:
        """Compiles bm25s' numba kernel now (seconds, once per process) instead of during the first query."""
        self._stemmer()
        if self._engine.vocab_dict:
            any_token = next(iter(self._engine.vocab_dict.values()))
            self._engine.retrieve([[any_token]], k=1, show_progress=False)

