"""Index folders of any kind: build, open by manifest, cache per corpus content, and retriever specs."""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from arag.data.corpus import iter_corpus, load_corpus
from arag.errors import ConfigError, DataError, RetrieverError
from arag.passages import Passage
from arag.retrievers.base import Retriever, as_retriever
from arag.retrievers.bm25 import BM25Retriever
from arag.retrievers.colbert import ColBERTRetriever
from arag.retrievers.colbert_client import ColBERTv2Retriever
from arag.retrievers.dense import DenseRetriever
from arag.retrievers.lucene import LuceneRetriever
from arag.retrievers.manifest import MANIFEST_NAME, IndexExistsError, read_manifest
from arag.retrievers.milvus import MilvusRetriever

logger = logging.getLogger("arag")

INDEX_KINDS: dict[str, type] = {
    cls.kind: cls for cls in (BM25Retriever, ColBERTRetriever, DenseRetriever, LuceneRetriever, MilvusRetriever)
}
"""Index classes by manifest `kind`, each with `write_index(passages, out_dir, *, corpus_sha256, **options)`
and `load(dir)`; those with `addressed_by_folder = False` (Milvus) take a location string (`URI#collection`)
in place of the folder."""

SPEC_FORMS = (
    "bm25:DIR, or DIR (a folder holding any arag index), colbert:DIR, dense:DIR, "
    "lucene:DIR (an arag Lucene index or a prebuilt Pyserini one), "
    "milvus:URI#COLLECTION (URI: a Milvus Lite file ./NAME.db or http://HOST:19530), "
    "or http(s)://HOST:PORT/PATH (a ColBERTv2 search server)"
)


def build_index(corpus: str | Path | Iterable[Passage], out_dir: str | Path, kind: str = "bm25", **options) -> Path:
    """Indexes a corpus file (or passages) into `out_dir`, which must not hold anything yet; returns `out_dir`."""
    index_class = _index_class(kind)
    _check_options(index_class, options)
    missing = [name for name in _required_options(index_class) if options.get(name) is None]
    if missing:
        raise ConfigError(f"a {index_class.label} index needs {', '.join(missing)} (e.g. --{missing[0]} PATH)")
    if isinstance(corpus, (str, os.PathLike)):
        passages, digest = iter_corpus(corpus), file_sha256(corpus)
    else:
        passages, digest = corpus, None
    target = Path(out_dir) if _addressed_by_folder(index_class) else os.fspath(out_dir)
    return index_class.write_index(passages, target, corpus_sha256=digest, **options)


def open_index(index_dir: str | Path) -> Retriever:
    """The retriever over an index folder, whatever its kind (read from its manifest)."""
    if not (Path(index_dir) / MANIFEST_NAME).exists() and any(Path(index_dir).glob("segments_*")):
        raise RetrieverError(f"{index_dir} is a Lucene index without an arag manifest: open it as lucene:{index_dir}")
    kind = read_manifest(index_dir)["kind"]
    if kind not in INDEX_KINDS:
        raise RetrieverError(
            f"{index_dir} holds a {kind!r} index, which this arag cannot open; known kinds: {_known_kinds()}"
        )
    return INDEX_KINDS[kind].load(Path(index_dir))


def index_cache_root() -> Path:
    """Where `index_for_corpus` keeps its indexes: $ARAG_HOME/indexes, else ~/.cache/arag/indexes."""
    arag_home = os.environ.get("ARAG_HOME")
    return (Path(arag_home).expanduser() if arag_home else Path.home() / ".cache" / "arag") / "indexes"


def index_for_corpus(corpus_path: str | Path, kind: str = "bm25") -> Retriever:
    """The retriever over a corpus file, indexed on first use (with default options) and reused while the
    file's content is unchanged.

    The cache is keyed by the SHA-256 of the file's bytes and the index format (an arag that writes a newer
    format builds anew beside the old one). Processes racing on the first use do not
    corrupt it: each builds in its own staging folder, one rename wins and the others load its index.
    Kinds that need an option without a default (ColBERT's checkpoint) are built with `build_index`.
    """
    index_class = _index_class(kind)
    if not _addressed_by_folder(index_class):
        raise ConfigError(f"{index_class.label} holds no cached per-corpus indexes: load the corpus with "
                          f"`arag index build --kind {kind} --out URI#COLLECTION` and pass {kind}:URI#COLLECTION")
    required = _required_options(index_class)
    if required:
        raise ConfigError(
            f"{index_class.label} indexes need {', '.join(required)}: build one with "
            f"`arag index build --kind {kind} --{required[0]} ...` and pass its folder"
        )
    digest = file_sha256(corpus_path)
    index_dir = index_cache_root() / kind / f"format-{index_class.format_version}" / digest
    if not (index_dir / MANIFEST_NAME).is_file():
        passages = load_corpus(corpus_path)
        logger.info(
            "building %s index for corpus %s (%s passages) in %s — reused on later runs",
            index_class.label,
            corpus_path,
            f"{len(passages):,}",
            index_dir,
        )
        try:
            index_class.write_index(passages, index_dir, corpus_sha256=digest)
        except IndexExistsError:
            pass  # another process published the same index first
    return index_class.load(index_dir)


def open_retriever(spec: Any = None, *, corpus: str | Path | None = None) -> Retriever:
    """The retriever a spec names (`KIND:DIR`, an index folder, or a ColBERTv2 server URL), else the
    cached BM25 index of `corpus`.

    `spec` may also be a retriever object, returned ready for any program (see `as_retriever`): an arag
    retriever, a DSPy retriever (`dspy.ColBERTv2`, `dspy.retrievers.Embeddings`, `dspy.Retrieve`, ...)
    or a search function `(query, k) -> results`. `spec` wins when both are given.
    """
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if spec is not None and not isinstance(spec, str):
        return as_retriever(spec)
    if spec:
        if spec.startswith(("http://", "https://")):
            return ColBERTv2Retriever(spec)
        kind, colon, location = spec.partition(":")
        if colon and kind in INDEX_KINDS:
            index_class = INDEX_KINDS[kind]
            if not location.strip():
                missing, form = ("index folder", "DIR") if _addressed_by_folder(index_class) else \
                    ("collection", "URI#COLLECTION")
                raise RetrieverError(f"{spec!r} names no {missing}: give {kind}:{form}")
            return index_class.load(Path(location).expanduser() if _addressed_by_folder(index_class) else location)
        if Path(spec).expanduser().is_dir():
            return open_index(Path(spec).expanduser())
        raise RetrieverError(
            f"unknown retriever spec {spec!r} (no such folder, no known prefix); known forms: {SPEC_FORMS}"
        )
    if corpus:
        return index_for_corpus(corpus)
    raise ConfigError(
        "no retriever: pass --corpus PATH (a passage corpus, indexed with BM25 on first use) "
        f"or --retriever SPEC ({SPEC_FORMS})"
    )


def file_sha256(path: str | Path) -> str:
    """The hex SHA-256 of a file's bytes."""
    if not Path(path).is_file():
        raise DataError(f"{path}: corpus file not found")
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _index_class(kind: str) -> type:
    if kind not in INDEX_KINDS:
        raise ConfigError(f"unknown index kind {kind!r}; known: {_known_kinds()}")
    return INDEX_KINDS[kind]


def _addressed_by_folder(index_class: type) -> bool:
    return getattr(index_class, "addressed_by_folder", True)


def _required_options(index_class: type) -> list[str]:
    return [
        name
        for name, parameter in inspect.signature(index_class.write_index).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and parameter.default is inspect.Parameter.empty
    ]


def _check_options(index_class: type, options: dict) -> None:
    accepted = set(inspect.signature(index_class.write_index).parameters) - {"passages", "out_dir", "corpus_sha256"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ConfigError(
            f"unknown {index_class.label} index option(s): {', '.join(unknown)}; known: {', '.join(sorted(accepted))}"
        )


def _known_kinds() -> str:
    return ", ".join(sorted(INDEX_KINDS))
