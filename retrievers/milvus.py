"""Dense retrieval from a Milvus collection (`milvus:URI#collection`): a Milvus server or cluster
(`http://HOST:19530`), or Milvus Lite, the engine embedded in this process and kept in one file (`./passages.db`).

A collection made here has the fields `id` (VARCHAR primary key), `title`, `text` (VARCHAR) and `vector` (unit
embeddings of `Title | text`, indexed with `index_type`, COSINE metric), and records its embedder in the collection
property `arag.embedder` (model, embedder, max_seq_length, dim, and the encoder's probe), so queries are embedded the
same way and an encoder of another dimension, or another model, is refused. Milvus Lite indexes dense vectors with
FLAT (exact, every query reads every vector): it is for development and tests; a Milvus server or cluster is the path
to large corpora. Needs the `milvus` extra (pymilvus, milvus-lite) and, for the default model, the `dense` one.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from arag.errors import ConfigError, DataError, RetrieverError
from arag.passages import Passage
from arag.retrievers.base import BaseRetriever, check_k
from arag.retrievers.dense import (
    DEFAULT_MODEL,
    LOG_EVERY_S,
    check_positive,
    chunked,
    embed,
    embedder_settings,
    query_encoder,
    resolve_encoder,
)
from arag.retrievers.encoders import check_same_encoder, encoder_probe

logger = logging.getLogger("arag")

EMBEDDER_PROPERTY = "arag.embedder"
ID_MAX_BYTES = 1_024
VARCHAR_MAX_BYTES = 65_535
"""Milvus' largest VARCHAR (its `max_length` counts bytes); `title` and `text` get it, `id` gets ID_MAX_BYTES."""
SERVER_SCHEMES = ("http://", "https://", "tcp://", "unix:")
COLLECTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
INSTALL = "pip install 'dspy-arag[milvus]'"


def parse_target(target: str | Path) -> tuple[str, str]:
    """`(uri, collection)` of `URI#collection`: a Milvus Lite file (`*.db`, made absolute) or a server URL."""
    uri, hash_sign, collection = str(target).rpartition("#")
    if not hash_sign or not uri:
        raise ConfigError(f"Milvus target {str(target)!r} must be URI#collection, e.g. ./passages.db#wiki "
                          "or http://localhost:19530#wiki")
    if not COLLECTION_NAME.fullmatch(collection):
        raise ConfigError(f"Milvus collection name {collection!r} must start with a letter or underscore and hold "
                          "only letters, digits and underscores")
    if not uri.startswith(SERVER_SCHEMES):
        if not uri.endswith(".db"):
            raise ConfigError(f"Milvus URI {uri!r} must be a Milvus Lite file ending in .db or a server URL "
                              "(http://HOST:19530)")
        uri = str(Path(uri).expanduser().resolve())
    return uri, collection


def connect(uri: str):
    """A MilvusClient of `uri`; a ConfigError when pymilvus (or Milvus Lite) is missing, a RetrieverError when
    the server cannot be reached."""
    try:
        from pymilvus import MilvusClient
        from pymilvus.exceptions import MilvusException
    except ImportError:
        raise ConfigError(f"Milvus retrieval needs pymilvus: {INSTALL}") from None
    if uri.endswith(".db"):
        if not Path(uri).parent.is_dir():
            raise ConfigError(f"Milvus Lite file {uri}: its folder does not exist")
        try:
            import milvus_lite  # noqa: F401
        except ImportError:
            raise ConfigError(f"Milvus Lite files (*.db) need milvus-lite: {INSTALL}") from None
    try:
        return MilvusClient(uri)
    except MilvusException as exc:
        raise RetrieverError(f"cannot reach Milvus at {uri}: {exc.message}") from None


class MilvusRetriever(BaseRetriever):
    """Cosine similarity between the query's embedding and a collection's vectors, searched by Milvus; scores
    are cosines (higher is better).

    Safe to call from many threads: query encoding is serialised, searches go to Milvus concurrently.
    """

    kind = "milvus"
    label = "Milvus"
    addressed_by_folder = False
    """Built and opened at `URI#collection`, not in an index folder."""

    def __init__(self, uri: str, collection: str, client, encoder, settings: dict):
        self.uri = uri
        self.collection = collection
        self.settings = settings
        self._client = client
        self._encoder = encoder
        self._encode_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MilvusRetriever({self.uri!r}, {self.collection!r}, {self.settings['model']})"

    def __len__(self) -> int:
        return int(self._client.get_collection_stats(self.collection)["row_count"])

    @classmethod
    def build(cls, passages: Iterable[Passage], target: str, **options) -> MilvusRetriever:
        """Loads `passages` into the collection `target` names (see `write_index`) and opens it."""
        return cls.load(cls.write_index(passages, target, **options), encoder=options.get("encoder"))

    @classmethod
    def write_index(
        cls,
        passages: Iterable[Passage],
        target: str | Path,
        *,
        model: str = DEFAULT_MODEL,
        encoder: Any = None,
        batch_size: int = 16,
        max_seq_length: int | None = None,
        chunk_size: int = 1024,
        index_type: str = "AUTOINDEX",
        corpus_sha256: str | None = None,
    ) -> str:
        """Embeds `passages` into the collection of `target` (`URI#collection`), `chunk_size` at a time; returns
        `target`.

        A new collection is created with the encoder recorded; an existing one made here with the same encoder
        is resumed: only passages whose id it lacks are embedded and inserted, so a rerun after an interruption
        finishes the load. `encoder`, `model`, `batch_size` and `max_seq_length` are as for dense indexes;
        `index_type` is Milvus' vector index (AUTOINDEX lets the server choose; Milvus Lite always uses FLAT).
        `corpus_sha256` is not recorded (a collection may hold several corpora).
        """
        check_positive("chunk_size", chunk_size)
        uri, collection = parse_target(target)
        client = connect(uri)
        encoder = resolve_encoder(encoder, model, batch_size, max_seq_length)
        embedder = embedder_settings(encoder)
        probe = encoder_probe(encoder)
        settings = _recorded_settings(client, uri, collection) if client.has_collection(collection) else None
        if settings is not None:
            if {name: settings[name] for name in embedder} != embedder:
                raise ConfigError(
                    f"collection {collection} at {uri} exists, embedded by {settings['model']} "
                    f"({settings['embedder']}), not {embedder['model']}: choose another collection or drop it"
                )
            check_same_encoder(settings, encoder, probe, f"collection {collection} at {uri}", error=ConfigError)
            client.load_collection(collection)
            logger.info("milvus build: %s exists with the same embedder; adding the passages it lacks", collection)
        total = inserted = 0
        started = last_log = time.monotonic()
        for chunk in chunked(passages, chunk_size):
            for passage in chunk:
                _check_lengths(passage)
            present = {row["id"] for row in client.get(collection, ids=[p.id for p in chunk], output_fields=["id"])
                       } if settings is not None else set()
            missing = list({p.id: p for p in chunk if p.id not in present}.values())
            if missing:
                vectors = embed(encoder, [p.long_text for p in missing])
                if settings is None:
                    settings = {**embedder, "dim": int(vectors.shape[1]), "probe": probe}
                    _create_collection(client, collection, settings, index_type)
                elif vectors.shape[1] != settings["dim"]:
                    raise ConfigError(f"the encoder gives {vectors.shape[1]}-dimensional embeddings, collection "
                                      f"{collection} holds {settings['dim']}-dimensional ones")
                client.insert(collection, [{"id": p.id, "title": p.title, "text": p.text, "vector": v.tolist()}
                                           for p, v in zip(missing, vectors)])
            total += len(chunk)
            inserted += len(missing)
            if time.monotonic() - last_log >= LOG_EVERY_S:
                last_log = time.monotonic()
                logger.info("milvus build: %s passages read, %s inserted (%.0f/s) into %s", f"{total:,}",
                            f"{inserted:,}", inserted / (last_log - started), collection)
        if not total:
            raise DataError(f"no passages to load into {target}")
        client.flush(collection)
        logger.info("milvus build: %s passages in %s at %s (%s new)", f"{total:,}", collection, uri, f"{inserted:,}")
        return str(target)

    @classmethod
    def load(cls, target: str | Path, encoder: Any = None) -> MilvusRetriever:
        """Opens the collection `target` names (`URI#collection`) with the encoder recorded there, or `encoder`
        (needed for a collection embedded by an encoder object; its dimension must be the collection's)."""
        uri, collection = parse_target(target)
        client = connect(uri)
        if not client.has_collection(collection):
            raise RetrieverError(f"Milvus at {uri} has no collection {collection!r}")
        settings = _recorded_settings(client, uri, collection)
        client.load_collection(collection)
        return cls(uri, collection, client, query_encoder(settings, encoder, f"collection {collection} at {uri}"),
                   settings)

    def retrieve_batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """The results of many queries, encoded in one batch and searched in one Milvus call."""
        check_k(k)
        answerable = [row for row, query in enumerate(queries) if query and query.strip()]
        results: list[list[Passage]] = [[] for _ in queries]
        if answerable:
            for row, found in zip(answerable, self._nearest([queries[row] for row in answerable], k)):
                results[row] = found
        return results

    def _search(self, query: str, k: int) -> list[Passage]:
        return self._nearest([query], k)[0]

    def _nearest(self, queries: list[str], k: int) -> list[list[Passage]]:
        with self._encode_lock:
            vectors = embed(self._encoder, queries)
        hits = self._client.search(self.collection, data=vectors.tolist(), anns_field="vector", limit=k,
                                   output_fields=["title", "text"], search_params={"metric_type": "COSINE"})
        return [
            [Passage(id=hit["id"], title=hit["entity"]["title"], text=hit["entity"]["text"],
                     score=float(hit["distance"])) for hit in found]
            for found in hits
        ]


def _recorded_settings(client, uri: str, collection: str) -> dict:
    """The embedder settings recorded with a collection made here; a RetrieverError for any other collection."""
    recorded = client.describe_collection(collection).get("properties", {}).get(EMBEDDER_PROPERTY)
    try:
        settings = json.loads(recorded)
        if {"model", "embedder", "max_seq_length", "dim"} <= settings.keys():
            return settings
    except (TypeError, ValueError, AttributeError):
        pass
    raise RetrieverError(f"collection {collection} at {uri} was not made by arag (no valid {EMBEDDER_PROPERTY} "
                         "property): load a corpus into a new collection with `arag index build --kind milvus`")


def _create_collection(client, collection: str, settings: dict, index_type: str) -> None:
    from pymilvus import DataType

    schema = client.create_schema(auto_id=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=ID_MAX_BYTES)
    schema.add_field("title", DataType.VARCHAR, max_length=VARCHAR_MAX_BYTES)
    schema.add_field("text", DataType.VARCHAR, max_length=VARCHAR_MAX_BYTES)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=settings["dim"])
    index_params = client.prepare_index_params()
    index_params.add_index(field_name="vector", index_type=index_type, metric_type="COSINE")
    client.create_collection(collection, schema=schema, index_params=index_params,
                             properties={EMBEDDER_PROPERTY: json.dumps(settings)})


def _check_lengths(passage: Passage) -> None:
    for field, value, limit in (("id", passage.id, ID_MAX_BYTES), ("title", passage.title, VARCHAR_MAX_BYTES),
                                ("text", passage.text, VARCHAR_MAX_BYTES)):
        size = len(value.encode("utf-8"))
        if size > limit:
            raise DataError(f"passage {passage.id[:80]!r}: its {field} is {size:,} bytes in UTF-8, above the "
                            f"{limit:,} a Milvus VARCHAR field holds here; shorten it or split the passage")
