"""arag's client of the ColBERTv2 HTTP search protocol (see `arag.retrievers.colbert_http` for the protocol):
an arag retriever over `arag serve`, colbert-ai's server or any other server of the protocol."""

from __future__ import annotations

import threading
from urllib.parse import urlsplit, urlunsplit

import requests

from arag.errors import ConfigError, RetrieverError
from arag.passages import Passage
from arag.retrievers.base import BaseRetriever

SEARCH_PATH = "/api/search"
TITLE_SEPARATOR = " | "


class ColBERTv2Retriever(BaseRetriever):
    """An arag retriever over any server of the ColBERTv2 protocol: `arag serve`, colbert-ai's server, public ones.

    `url` is the search endpoint (e.g. `http://127.0.0.1:8893/api/search`); a bare `http://host:port`
    means `/api/search` there. Passages from servers that send no arag `id`/`title` get the `pid`
    as id and the title read from the `Title | text` form.
    """

    def __init__(self, url: str, *, post: bool = False, timeout: float = 30.0):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"ColBERTv2 server URL must be http(s)://host[:port]/path, got {url!r}")
        if parts.path in ("", "/"):
            parts = parts._replace(path=SEARCH_PATH)
        self.url = urlunsplit(parts)
        self.post = post
        self.timeout = timeout
        self._sessions = threading.local()

    def __repr__(self) -> str:
        return f"ColBERTv2Retriever({self.url!r}{', post=True' if self.post else ''})"

    def _search(self, query: str, k: int) -> list[Passage]:
        session = self._session()
        try:
            if self.post:
                response = session.post(self.url, json={"query": query, "k": k}, timeout=self.timeout)
            else:
                response = session.get(self.url, params={"query": query, "k": k}, timeout=self.timeout)
        except requests.RequestException as exc:
            raise RetrieverError(f"ColBERTv2 server {self.url} did not answer: {exc}") from None
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if not response.ok or not isinstance(answer, dict) or answer.get("error"):
            message = answer.get("message") if isinstance(answer, dict) else None
            raise RetrieverError(
                f"ColBERTv2 server {self.url} answered {response.status_code}: "
                f"{message or response.text[:200] or response.reason}"
            )
        topk = answer.get("topk")
        if not isinstance(topk, list):
            raise RetrieverError(f"ColBERTv2 server {self.url} sent no 'topk' list: {str(answer)[:200]}")
        try:
            return [_passage_from_hit(hit) for hit in topk[:k]]
        except (KeyError, TypeError, ValueError) as exc:
            raise RetrieverError(f"ColBERTv2 server {self.url} sent a malformed passage ({exc!r})") from None

    def _session(self) -> requests.Session:
        session = getattr(self._sessions, "session", None)
        if session is None:
            session = self._sessions.session = requests.Session()
        return session


def _passage_from_hit(hit: dict) -> Passage:
    long_text = hit.get("long_text") or hit["text"]
    if "id" in hit and "title" in hit:
        title = hit["title"]
        prefix = f"{title}{TITLE_SEPARATOR}" if title else ""
        text = long_text.removeprefix(prefix)
        return Passage(id=str(hit["id"]), title=title, text=text, score=float(hit.get("score", 0.0)))
    title, separator, text = long_text.partition(TITLE_SEPARATOR)
    if not separator:
        title, text = "", long_text
    return Passage(id=str(hit["pid"]), title=title, text=text, score=float(hit.get("score", 0.0)))
