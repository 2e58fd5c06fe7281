"""BM25 over a Lucene index (Anserini, the engine inside Pyserini): indexes arag builds and prebuilt Pyserini ones.

An arag-built folder is a plain Lucene index (Pyserini's `LuceneSearcher` opens it too) plus `arag-index.json`.
Each passage is one Anserini JsonCollection document: `id`, `contents` = `title + "\\n" + text` (analysed with
Anserini's default English analyzer: Porter stemming, Lucene's English stopwords) and `title`, stored whole in
the `raw` field. Folders without a manifest (a prebuilt index, or one built with Anserini's own tools) open too;
see `passage_fields` for how their titles are read. Needs the `lucene` extra: pip install 'dspy-arag[lucene]'.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from tqdm import tqdm

from arag.errors import ConfigError, DataError, RetrieverError
from arag.passages import Passage
from arag.retrievers.base import BaseRetriever, check_k
from arag.retrievers.jvm import in_java, java_class
from arag.retrievers.manifest import MANIFEST_NAME, read_index_manifest, staged_directory, write_manifest
from arag.scratch import create_scratch, remove_scratch

logger = logging.getLogger("arag")

PYSERINI_K1 = 0.9
PYSERINI_B = 0.4
"""Pyserini's BM25 parameters, those its prebuilt indexes' published figures use: the default for such folders."""

DEFAULT_K1 = 1.5
DEFAULT_B = 0.75
"""The BM25 parameters of indexes arag builds: those of its bm25 kind (bm25s), so that switching engines keeps the
ranking (top-10 agreement 9.8 of 10 on HotpotQA, against 9.1 with Pyserini's, whose recall there is lower)."""

PASSAGES_PER_FILE = 100_000
"""Passages per JsonCollection file; Anserini indexes one file per thread."""

COLLECTION_FOLDER = "collection"
DOCUMENT_FIELDS = ("raw", "contents")
"""Stored fields a passage is read from, in order of preference."""
DAMAGE_SIGNS = ("CorruptIndexException", "checksum failed", "EOFException", "IndexFormatTooOldException",
                "IndexFormatTooNewException", "NoSuchFileException")
"""What Lucene's exceptions say when an index's files are damaged or missing."""


class LuceneRetriever(BaseRetriever):
    """BM25 (Lucene's, with k1 and b from the manifest, else Pyserini's 0.9 and 0.4) over a Lucene index.

    Safe to call from many threads: searches run one at a time on the process's Java thread (see
    `arag.retrievers.jvm`); `retrieve_batch` searches its queries in parallel inside Java. Results are the
    passages sharing an analysed term with the query, at most k, best first: a query of stopwords or
    punctuation alone returns [].
    """

    kind = "lucene"
    label = "Lucene"
    format_version = 1

    def __init__(self, index_dir: Path, searcher, settings: dict, n_passages: int):
        self.index_dir = index_dir
        self.settings = settings
        self._searcher = searcher
        self._n_passages = n_passages

    def __len__(self) -> int:
        return self._n_passages

    def __repr__(self) -> str:
        return f"LuceneRetriever({str(self.index_dir)!r}, {len(self):,} passages, k1={self.settings['k1']}, " \
               f"b={self.settings['b']})"

    @classmethod
    def build(cls, passages: Iterable[Passage], out_dir: str | Path, **options) -> LuceneRetriever:
        """Indexes `passages` into `out_dir` (which must not hold anything yet) and opens the result."""
        return cls.load(cls.write_index(passages, out_dir, **options))

    @classmethod
    def write_index(
        cls,
        passages: Iterable[Passage],
        out_dir: str | Path,
        *,
        k1: float = DEFAULT_K1,
        b: float = DEFAULT_B,
        threads: int | None = None,
        corpus_sha256: str | None = None,
    ) -> Path:
        """Indexes `passages` (streamed: written to JsonCollection files, then indexed by Anserini with
        `threads` threads, default all cores) into `out_dir` without opening it.

        The folder appears only once complete: a build that fails or is killed leaves nothing loadable, and
        the next build starts afresh (removing what a killed one left), so every passage is indexed once.
        k1 and b are recorded in the manifest and used by every search of the index.
        """
        out_dir = Path(out_dir)
        _check_bm25(k1, b)
        threads = (os.cpu_count() or 1) if threads is None else threads
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ConfigError(f"threads must be a positive integer, got {threads!r}")
        with staged_directory(out_dir) as staging:
            collection = create_scratch(staging / COLLECTION_FOLDER)
            n_passages = write_collection(passages, collection)
            if not n_passages:
                raise DataError(f"no passages to index into {out_dir}")
            logger.info("indexing %s passages with Anserini (%d threads)", f"{n_passages:,}", threads)
            indexed = in_java(_index_collection, collection, staging, threads)
            if indexed != n_passages:
                raise RetrieverError(f"Anserini indexed {indexed:,} of {n_passages:,} passages into {out_dir}")
            remove_scratch(collection)
            write_manifest(staging, kind=cls.kind, format_version=cls.format_version, n_passages=n_passages,
                           corpus_sha256=corpus_sha256, settings={"k1": k1, "b": b}, anserini_jar=_anserini_jar())
        return out_dir

    @classmethod
    def load(cls, index_dir: str | Path, *, k1: float | None = None, b: float | None = None) -> LuceneRetriever:
        """Opens an arag Lucene index or any Lucene index folder Anserini can read (a prebuilt Pyserini one).

        k1 and b, when given, replace those of the manifest (or Pyserini's defaults for a folder without one).
        """
        if not str(index_dir).strip():
            raise RetrieverError("no Lucene index folder given (an empty path); give its folder, e.g. lucene:DIR")
        index_dir = Path(index_dir).expanduser()
        if (index_dir / MANIFEST_NAME).is_file():
            _, settings = read_index_manifest(index_dir, cls.kind, cls.label, cls.format_version, {"k1", "b"})
        elif not index_dir.is_dir():
            raise RetrieverError(f"{index_dir}: no such index folder")
        elif not any(index_dir.glob("segments_*")):
            raise RetrieverError(f"{index_dir} is not a Lucene index (no segments_N file) and holds no arag index")
        else:
            settings = {"k1": PYSERINI_K1, "b": PYSERINI_B}
        settings = {**settings, **{name: value for name, value in (("k1", k1), ("b", b)) if value is not None}}
        _check_bm25(settings["k1"], settings["b"])
        searcher, n_passages, stored_field = in_java(_open_searcher, index_dir, settings["k1"], settings["b"])
        return cls(index_dir, searcher, {**settings, "stored_field": stored_field}, n_passages)

    def retrieve_batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """The results of many queries, searched in parallel by Lucene."""
        check_k(k)
        answerable = [row for row, query in enumerate(queries) if query and query.strip()]
        results: list[list[Passage]] = [[] for _ in queries]
        found = in_java(self._search_many, [queries[row] for row in answerable], k)
        for row, passages in zip(answerable, found):
            results[row] = passages
        return results

    def _search(self, query: str, k: int) -> list[Passage]:
        return in_java(self._search_one, query, k)

    def _search_one(self, query: str, k: int) -> list[Passage]:
        return self._passages(_java_call(self.index_dir, self._searcher.search, query, k))

    def _search_many(self, queries: list[str], k: int) -> list[list[Passage]]:
        if not queries:
            return []
        array_list = java_class("java.util.ArrayList")
        texts, ids = array_list(), array_list()
        for row, query in enumerate(queries):
            texts.add(query)
            ids.add(str(row))
        try:
            hits = _java_call(self.index_dir, self._searcher.batch_search, texts, ids, k, os.cpu_count() or 1)
        except RetrieverError:  # a query failed on one of Lucene's threads, which says only that: find which, and why
            return [self._search_one(query, k) for query in queries]
        return [self._passages(hits.get(str(row))) for row in range(len(queries))]

    def _passages(self, hits) -> list[Passage]:
        field = self.settings["stored_field"]
        passages = []
        for hit in hits:
            stored = hit.lucene_document.get(field) if hit.lucene_document is not None else None
            if not isinstance(stored, str):
                raise damaged(self.index_dir, f"the stored passage {hit.docid!r} cannot be read")
            title, text = passage_fields(stored, field)
            passages.append(Passage(hit.docid, title, text, float(hit.score)))
        return passages


def passage_fields(stored: str, field: str = "raw") -> tuple[str, str]:
    """`(title, text)` of a passage from its stored `raw` JSON (or its `contents`, when that is what is stored).

    The title is, in this order: the raw `title` when the contents start with it and a newline (arag's
    builds); the first line of the contents when it is wrapped in double quotes, as in Pyserini's prebuilt
    `wikipedia-dpr-100w` (`"Title"\\ntext`); otherwise there is none and the contents are the text.
    """
    title = None
    contents = stored
    if field == "raw":
        try:
            document = json.loads(stored)
        except ValueError:
            document = None
        if isinstance(document, dict) and isinstance(document.get("contents"), str):
            contents, title = document["contents"], document.get("title")
    if isinstance(title, str) and contents.startswith(f"{title}\n"):
        return title, contents[len(title) + 1:]
    first_line, newline, rest = contents.partition("\n")
    if newline and len(first_line) >= 2 and first_line.startswith('"') and first_line.endswith('"'):
        return first_line[1:-1], rest
    return "", contents


def write_collection(passages: Iterable[Passage], folder: Path) -> int:
    """Writes `passages` as Anserini JsonCollection files in the folder `folder`, PASSAGES_PER_FILE a file; returns
    how many."""
    count = 0
    handle = None
    try:
        for passage in tqdm(passages, desc="writing passages", unit=" passages", disable=None):
            if count % PASSAGES_PER_FILE == 0:
                if handle is not None:
                    handle.close()
                handle = open(folder / f"passages-{count // PASSAGES_PER_FILE:05d}.jsonl", "w", encoding="utf-8")
            document = {"id": passage.id, "contents": f"{passage.title}\n{passage.text}", "title": passage.title}
            handle.write(json.dumps(document, ensure_ascii=False) + "\n")
            count += 1
    finally:
        if handle is not None:
            handle.close()
    return count


def _index_collection(collection: Path, index_dir: Path, threads: int) -> int:
    """Runs Anserini's IndexCollection over a JsonCollection folder; returns how many documents it indexed."""
    args = java_class("io.anserini.index.IndexCollection$Args")()
    args.input = str(collection)
    args.index = str(index_dir)
    args.collectionClass = "JsonCollection"
    args.generatorClass = "DefaultLuceneDocumentGenerator"
    args.threads = threads
    args.storeRaw = True
    args.quiet = True  # errors alone: the indexer sets its log level itself, so logging settings cannot quiet it
    # Anserini's 4 GB indexing buffer, less where the JVM's heap could not hold it.
    heap_mb = java_class("java.lang.Runtime").getRuntime().maxMemory() // (1 << 20)
    args.memoryBuffer = max(16, min(args.memoryBuffer, heap_mb // 2))
    indexer = java_class("io.anserini.index.IndexCollection")(args)
    _java_call(index_dir, indexer.run)
    counters = indexer.getCounters()
    problems = {name: getattr(counters, name).get() for name in ("unindexable", "empty", "skipped", "errors")}
    if any(problems.values()):
        raise RetrieverError(
            f"Anserini could not index every passage into {index_dir}: "
            + ", ".join(f"{count} {name}" for name, count in problems.items() if count)
        )
    return counters.indexed.get()


def _open_searcher(index_dir: Path, k1: float, b: float):
    """Anserini's SimpleSearcher over `index_dir` with BM25(k1, b), its passage count and the stored field to read."""
    searcher = _java_call(index_dir, java_class("io.anserini.search.SimpleSearcher"), str(index_dir))
    searcher.set_bm25(float(k1), float(b))  # also creates the IndexSearcher before any concurrent search
    n_passages = searcher.get_total_num_docs()
    stored_field = DOCUMENT_FIELDS[0]
    if n_passages:
        document = _java_call(index_dir, searcher.doc, 0)
        if document is None:
            raise damaged(index_dir, "its first stored passage cannot be read")
        stored_field = next((name for name in DOCUMENT_FIELDS if document.get(name) is not None), None)
        if stored_field is None:
            raise RetrieverError(
                f"{index_dir}: the Lucene index stores neither 'raw' nor 'contents', so passages cannot be "
                "returned; index it with Anserini's -storeRaw (as `arag index build --kind lucene` does)"
            )
    return searcher, n_passages, stored_field


REBUILD = "rebuild it: arag index build --kind lucene --corpus CORPUS --out NEW_FOLDER (or get a prebuilt index again)"


def damaged(index_dir: Path, problem: str) -> RetrieverError:
    """The error of an index folder Lucene cannot read: naming it, and how to build it again."""
    return RetrieverError(f"{index_dir}: damaged Lucene index ({problem}); {REBUILD}")


def _java_call(index_dir: Path, method, *args):
    """`method(*args)`, with a Java exception turned into a RetrieverError naming the index."""
    from jnius import JavaException

    try:
        return method(*args)
    except JavaException as exc:
        message = str(exc).splitlines()[0].removeprefix("JVM exception occurred: ")
        if any(sign in f"{getattr(exc, 'classname', '')} {message}" for sign in DAMAGE_SIGNS):
            raise damaged(index_dir, message[:300]) from None
        raise RetrieverError(f"{index_dir}: Lucene failed: {message[:300]}; if the folder was damaged, {REBUILD}") \
            from None


def _anserini_jar() -> str:
    import jnius_config

    return next((Path(path).name for path in jnius_config.get_classpath() if "anserini" in Path(path).name), "")


def _check_bm25(k1, b) -> None:
    for name, value, low, high in (("k1", k1, 0.0, None), ("b", b, 0.0, 1.0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low or \
                (high is not None and value > high):
            bounds = f"between {low} and {high}" if high is not None else f"a number >= {low}"
            raise ConfigError(f"BM25 {name} must be {bounds}, got {value!r}")
