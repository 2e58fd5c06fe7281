"""The one retriever protocol every program uses, and the adapter that brings DSPy's retrievers and plain search
functions into it. Passages and their helpers live in `arag.passages`."""

from __future__ import annotations

import inspect
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Iterable, Protocol, Sequence, runtime_checkable

from arag.passages import TITLE_SEPARATOR, Passage, split_title, text_id

MAX_K = 100

ACCEPTED_RETRIEVERS = (
    "an arag retriever (arag.open_retriever(...)), a DSPy retriever (dspy.ColBERTv2, dspy.retrievers.Embeddings "
    "or EmbeddingsWithScores, dspy.Retrieve and its subclasses), or a function (query, k) -> results whose "
    "results are strings (`Title | text`), dicts or DSPy dotdicts with 'long_text' or 'text', arag Passages, "
    "or a dspy.Prediction (or dict) holding them under 'passages'"
)
"""What `as_retriever` (and so every program) accepts as a retriever."""

PASSAGE_LIST_FIELDS = ("passages", "docs", "topk")
"""Where a dict or dspy.Prediction of results holds its passages (DSPy's retrievers, DatabricksRM, ColBERTv2)."""

ID_LIST_FIELDS = ("ids", "pids", "indices", "doc_ids")
"""Where such results hold the passages' ids, in the same order (dspy.retrievers.Embeddings gives corpus `indices`)."""


@runtime_checkable
class Retriever(Protocol):
    """Anything that returns the top-k passages for a query."""

    def retrieve(self, query: str, k: int) -> list[Passage]: ...

    def retrieve_batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]: ...


class BaseRetriever:
    """Gives `retrieve_batch` and k validation to retrievers that only implement `_search`."""

    def retrieve(self, query: str, k: int) -> list[Passage]:
        check_k(k)
        if not query or not query.strip():
            return []
        return self._search(query, k)

    def retrieve_batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        return [self.retrieve(q, k) for q in queries]

    def _search(self, query: str, k: int) -> list[Passage]:
        raise NotImplementedError

    def __deepcopy__(self, memo: dict) -> "BaseRetriever":
        # DSPy's optimizers deep-copy programs; an index is read-only and shared, never copied.
        return self


def as_retriever(source: Any) -> Retriever:
    """`source` as a retriever of the one protocol: arag retrievers as they are, DSPy's retrievers and
    search functions `(query, k) -> results` wrapped in a `CallableRetriever`.

    Anything else (a spec string, a class, an object that cannot search) is a ConfigError saying what is accepted.
    """
    from arag.errors import ConfigError

    if isinstance(source, type):
        raise ConfigError(
            f"{source.__name__} is a class, not a retriever: pass an instance, e.g. {source.__name__}(...); "
            f"accepted: {ACCEPTED_RETRIEVERS}"
        )
    if callable(getattr(source, "retrieve", None)):
        return source
    if isinstance(source, (str, os.PathLike)):
        raise ConfigError(
            f"{os.fspath(source)!r} is a retriever spec, not a retriever: open it with arag.open_retriever(spec)"
        )
    if not callable(source):
        raise ConfigError(f"{_excerpt(source)} is not a retriever; accepted: {ACCEPTED_RETRIEVERS}")
    return CallableRetriever(source)


class CallableRetriever(BaseRetriever):
    """A DSPy retriever or search function, called with the query and k, its results read as passages.

    k goes as `k=` when the function has a parameter `k` (dspy.ColBERTv2, dspy.Retrieve) or `**kwargs`, as the
    second argument when it requires one, and otherwise through the source's own `k` attribute
    (dspy.retrievers.Embeddings fixes k when built): a request for more passages than that sets it for the
    call, one such call at a time, and restores it. See `passages_from` for the results it reads.
    """

    def __init__(self, source: Callable[..., Any]) -> None:
        self.source = source
        self.k_argument = _k_argument(source)
        self.own_k: int | None = None
        if self.k_argument is None:
            self._k_lock = _k_lock(source)
            with self._k_lock:  # not while another call has raised it
                own_k = getattr(source, "k", None)
            if isinstance(own_k, int) and not isinstance(own_k, bool):
                self.own_k = own_k

    def __repr__(self) -> str:
        return f"CallableRetriever({self.source!r})"

    def _search(self, query: str, k: int) -> list[Passage]:
        return passages_from(self._call(query, k), k)

    def _call(self, query: str, k: int) -> Any:
        if self.k_argument == "keyword":
            return self.source(query, k=k)
        if self.k_argument == "positional":
            return self.source(query, k)
        if self.own_k is None or k <= self.own_k:
            return self.source(query)  # at least k passages (or all there are): passages_from keeps the first k
        with self._k_lock:
            self.source.k = k
            try:
                return self.source(query)
            finally:
                self.source.k = self.own_k


def _k_argument(source: Callable[..., Any]) -> str | None:
    """How `source` takes k: "keyword", "positional", or None when it takes a query alone.

    Read from its `forward` where it has one (DSPy modules and retrievers), else from the callable itself;
    a ConfigError when it cannot be called with a query, or needs arguments besides the query and k.
    """
    from arag.errors import ConfigError

    target = getattr(source, "forward", None)
    if not callable(target):
        target = source
    try:
        parameters = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return "positional"  # no signature to read (a builtin): take it at its word, (query, k)
    kinds = {parameter.kind for parameter in parameters}
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not positional and inspect.Parameter.VAR_POSITIONAL not in kinds:
        raise ConfigError(
            f"{_excerpt(source)} cannot be called with a query, so it is not a retriever; "
            f"accepted: {ACCEPTED_RETRIEVERS}"
        )
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    required = [p for p in parameters[1:] if p.default is p.empty and p.kind not in variadic]
    if len(required) > 1 or (required and required[0].kind is required[0].KEYWORD_ONLY and required[0].name != "k"):
        raise ConfigError(
            f"{_excerpt(source)} needs more than a query and k ({', '.join(p.name for p in required)}), so it is not "
            f"a retriever; accepted: {ACCEPTED_RETRIEVERS}"
        )
    named_k = next((p for p in parameters if p.name == "k"), None)
    if named_k is not None:
        return "positional" if named_k.kind is named_k.POSITIONAL_ONLY else "keyword"
    if len(positional) >= 2 and positional[1].default is positional[1].empty:
        return "positional"
    if inspect.Parameter.VAR_POSITIONAL in kinds:
        return "positional"
    if inspect.Parameter.VAR_KEYWORD in kinds:
        return "keyword"
    return None


_k_locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_k_locks_guard = threading.Lock()
_shared_k_lock = threading.Lock()


def _k_lock(source: Any) -> threading.Lock:
    """The lock of a source whose k is an attribute, shared by every CallableRetriever over it."""
    with _k_locks_guard:
        try:
            return _k_locks.setdefault(source, threading.Lock())
        except TypeError:  # neither hashable nor weakly referable: one lock for all such sources
            return _shared_k_lock


def passages_from(results: Any, k: int | None = None) -> list[Passage]:
    """The passages (the first k) in what a DSPy retriever or search function returned.

    `results` is a list of passages, or a dict or dspy.Prediction holding one under `passages` (`docs`,
    `topk`), with the passages' ids and scores in lists beside it where it has them (`ids`, `pids`,
    `indices`, `doc_ids`; `scores`). See `passage_from` for the passages themselves.
    """
    from arag.errors import RetrieverError

    fields = _fields(results)
    if fields is not None:
        name = next((name for name in PASSAGE_LIST_FIELDS if fields.get(name) is not None), None)
        if name is None:
            raise RetrieverError(
                f"search results hold no passages under {', '.join(map(repr, PASSAGE_LIST_FIELDS))}: "
                f"{_excerpt(results)}"
            )
        items = list(fields[name])
        ids = _beside(fields, ID_LIST_FIELDS, len(items))
        scores = _beside(fields, ("scores",), len(items))
    elif isinstance(results, Iterable) and not isinstance(results, (str, bytes)):
        items = list(results)
        ids = scores = [None] * len(items)
    else:
        raise RetrieverError(f"search results must be a list of passages, got {_excerpt(results)}")
    if k is not None:
        items = items[:k]
    return [
        passage_from(item, default_id=passage_id, default_score=score)
        for item, passage_id, score in zip(items, ids, scores)
    ]


def passage_from(item: Any, *, default_id: Any = None, default_score: Any = None) -> Passage:
    """One passage read from an arag Passage, a string, or a dict (DSPy dotdict, dspy.Prediction) with
    `long_text` or `text`.

    The title is the dict's `title`, else read from the `Title | text` form ColBERTv2 indexes use. The id
    is the dict's `id` or (ColBERTv2) `pid`, else `default_id`, else a hash of the text, so the same
    passage gets the same id on every call. The score is the dict's `score`, else `default_score`, else 0.
    """
    from arag.errors import RetrieverError

    if isinstance(item, Passage):
        return item
    if isinstance(item, str):
        fields, long_text = {}, item
    else:
        fields = _fields(item) or {}
        long_text = fields.get("long_text") or fields.get("text")
    if not isinstance(long_text, str):
        raise RetrieverError(
            f"cannot read a passage from {_excerpt(item)}: expected a string, an arag Passage, "
            "or a dict with 'long_text' or 'text'"
        )
    title = fields.get("title")
    if isinstance(title, str):
        text = long_text.removeprefix(f"{title}{TITLE_SEPARATOR}") if title else long_text
    else:
        title, text = split_title(long_text)
    passage_id = next((fields[name] for name in ("id", "pid") if fields.get(name) is not None), default_id)
    score = fields.get("score")
    score = default_score if score is None else score
    try:
        score = 0.0 if score is None else float(score)
    except (TypeError, ValueError):
        raise RetrieverError(f"passage score {score!r} is not a number, in {_excerpt(item)}") from None
    return Passage(text_id(long_text) if passage_id is None else str(passage_id), title, text, score)


def _fields(value: Any) -> Mapping | None:
    """The fields of a dict, DSPy dotdict or dspy.Example/Prediction; None for anything else."""
    if isinstance(value, Mapping):
        return value
    if callable(getattr(value, "items", None)) and callable(getattr(value, "keys", None)):
        try:
            return dict(value.items())
        except (TypeError, ValueError):
            return None
    return None


def _beside(fields: Mapping, names: Sequence[str], length: int) -> list:
    """The first list under `names` with one value per passage, else one None per passage."""
    for name in names:
        values = fields.get(name)
        if values is not None and not isinstance(values, (str, bytes)):
            values = list(values)
            if len(values) == length:
                return values
    return [None] * length


def _excerpt(value: Any) -> str:
    """`value`'s type and the start of its repr, for messages."""
    text = repr(value)
    return f"{type(value).__name__} {text[:120]}{'...' if len(text) > 120 else ''}"


def check_k(k: int) -> int:
    from arag.errors import ConfigError

    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ConfigError(f"k must be an integer between 1 and {MAX_K}, got {k!r}")
    return k
