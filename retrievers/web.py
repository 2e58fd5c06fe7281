"""Knowledge searching beyond the corpus: web search APIs, page fetching, or a second local index.

A knowledge search answers `search(query, n) -> list[Document]`: the top n hits, each cut into
paragraph passages. `open_knowledge_search(spec)` builds one from a spec:

- `serper`, `tavily`, `brave`: JSON search APIs, keys read from SERPER_API_KEY, TAVILY_API_KEY and
  BRAVE_API_KEY; `searxng` queries the SearXNG instance at SEARXNG_URL (no key; the instance must
  allow `format=json`). `NAME:BASE_URL` sends a provider's requests to another endpoint (a proxy,
  a self-hosted instance, a test server), e.g. `searxng:http://localhost:8888`.
- `local:DIR`: a second arag index (any spec `arag.retrievers.open_retriever` accepts), searched
  in place of the web; each hit is one passage.
- `none`: no knowledge search (`open_knowledge_search` returns None).

Web hits are fetched in parallel and parsed with BeautifulSoup (the standard library's
`html.parser` backend). A page's passages are its `<p>` paragraphs of at least MIN_PARAGRAPH_WORDS
words (scripts, navigation, headers, footers, asides and forms dropped), at most `max_paragraphs`
of them, titled with the page's first `<h1>` (else its `<title>`, else the hit's title). A page that
cannot be fetched, is not HTML, or has no such paragraph contributes the provider's snippet instead.

A search result can name any URL. Pages (and redirects) whose host is or resolves to a loopback, private,
link-local or otherwise non-public address are not fetched (the snippet stands in), so that a result cannot
make arag read a service inside the machine or its network. Set ARAG_WEB_ALLOW_PRIVATE=1 to fetch them
(a search run against an intranet, a test server); the provider's own endpoint (`NAME:BASE_URL`) is never
checked: it is the user's choice. The check resolves names before each request; a name that resolves
differently at connection time (DNS rebinding) is not caught.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx

from arag.errors import ConfigError, RetrieverError
from arag.passages import Passage
from arag.retrievers.base import Retriever

logger = logging.getLogger(__name__)

WEB_SPEC_FORMS = "serper, tavily, brave, searxng (each optionally NAME:BASE_URL), local:DIR, or none"
MIN_PARAGRAPH_WORDS = 5
MAX_PARAGRAPHS = 20
MAX_PAGE_BYTES = 2_000_000
SEARCH_TIMEOUT_S = 20.0
FETCH_TIMEOUT_S = 10.0
USER_AGENT = "arag/0.1 (CRAG knowledge search)"
ALLOW_PRIVATE_ENV = "ARAG_WEB_ALLOW_PRIVATE"
_DROPPED_ELEMENTS = ("script", "style", "noscript", "template", "nav", "header", "footer", "aside", "form")


@dataclass(frozen=True)
class SearchHit:
    """One search result as the provider returned it."""

    title: str
    url: str
    snippet: str


@dataclass(frozen=True)
class Document:
    """A found document: where it came from, the provider's snippet, and its paragraphs as passages."""

    title: str
    url: str
    snippet: str
    passages: tuple[Passage, ...]
    fetched: bool

    def summary(self) -> dict[str, Any]:
        """What a trace records of the document."""
        return {"title": self.title, "url": self.url, "paragraphs": len(self.passages), "fetched": self.fetched}


class SearchProvider:
    """A JSON search API: one request per query, hits parsed from the JSON answer."""

    name: ClassVar[str]
    default_base_url: ClassVar[str]
    key_env: ClassVar[str | None] = None

    def __init__(self, base_url: str | None = None, api_key: str | None = None, timeout: float = SEARCH_TIMEOUT_S):
        self.base_url = (base_url or self.default_base_url).rstrip("/")
        self.timeout = timeout
        self._api_key = api_key
        if self.key_env and not self._api_key:
            self._api_key = os.environ.get(self.key_env)
            if not self._api_key:
                raise ConfigError(
                    f"web={self.name} needs an API key: export {self.key_env}=<your key>, or choose another "
                    f"web option ({WEB_SPEC_FORMS})"
                )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"

    def search(self, query: str, n: int) -> list[SearchHit]:
        """The top n hits for `query`; a RetrieverError when the API fails or answers something else than JSON."""
        try:
            with httpx.Client(timeout=self.timeout, headers={"User-Agent": USER_AGENT}) as client:
                response = self._send(client, query, n)
        except httpx.HTTPError as exc:
            raise RetrieverError(f"{self.name} search at {self.base_url} failed: {exc}") from None
        if response.status_code in (401, 403) and self.key_env:
            raise RetrieverError(f"{self.name} refused the API key (HTTP {response.status_code}): check {self.key_env}")
        if response.status_code != 200:
            raise RetrieverError(f"{self.name} search answered HTTP {response.status_code}: {response.text[:200]}")
        try:
            payload = response.json()
        except ValueError:
            raise RetrieverError(f"{self.name} search did not answer JSON: {response.text[:200]}") from None
        hits = [hit for hit in self._hits(payload) if hit.url]
        return hits[:n]

    def _send(self, client: httpx.Client, query: str, n: int) -> httpx.Response:
        raise NotImplementedError

    def _hits(self, payload: Any) -> list[SearchHit]:
        raise NotImplementedError


class SerperSearch(SearchProvider):
    """Google results through serper.dev: POST /search {"q", "num"} with the X-API-KEY header."""

    name = "serper"
    default_base_url = "https://google.serper.dev"
    key_env = "SERPER_API_KEY"

    def _send(self, client, query, n):
        return client.post(f"{self.base_url}/search", json={"q": query, "num": n}, headers={"X-API-KEY": self._api_key})

    def _hits(self, payload):
        return [
            SearchHit(_text(item.get("title")), _text(item.get("link")), _text(item.get("snippet")))
            for item in _items(payload, "organic")
        ]


class TavilySearch(SearchProvider):
    """Tavily: POST /search {"query", "max_results"} with a bearer token."""

    name = "tavily"
    default_base_url = "https://api.tavily.com"
    key_env = "TAVILY_API_KEY"

    def _send(self, client, query, n):
        return client.post(
            f"{self.base_url}/search",
            json={"query": query, "max_results": n},
            headers={"Authorization": f"Bearer {self._api_key}"},
        )

    def _hits(self, payload):
        return [
            SearchHit(_text(item.get("title")), _text(item.get("url")), _text(item.get("content")))
            for item in _items(payload, "results")
        ]


class BraveSearch(SearchProvider):
    """Brave Search: GET /res/v1/web/search?q=&count= with the X-Subscription-Token header."""

    name = "brave"
    default_base_url = "https://api.search.brave.com"
    key_env = "BRAVE_API_KEY"

    def _send(self, client, query, n):
        return client.get(
            f"{self.base_url}/res/v1/web/search",
            params={"q": query, "count": n},
            headers={"X-Subscription-Token": self._api_key, "Accept": "application/json"},
        )

    def _hits(self, payload):
        web = payload.get("web") if isinstance(payload, dict) else None
        return [
            SearchHit(_markup_free(item.get("title")), _text(item.get("url")), _markup_free(item.get("description")))
            for item in _items(web, "results")
        ]


class SearxngSearch(SearchProvider):
    """A SearXNG instance: GET /search?q=&format=json (no key; SEARXNG_URL names the instance)."""

    name = "searxng"
    default_base_url = ""

    def __init__(self, base_url: str | None = None, api_key: str | None = None, timeout: float = SEARCH_TIMEOUT_S):
        base_url = base_url or os.environ.get("SEARXNG_URL")
        if not base_url:
            raise ConfigError("web=searxng needs the instance's address: web=searxng:URL, or export SEARXNG_URL=URL")
        super().__init__(base_url, api_key, timeout)

    def _send(self, client, query, n):
        return client.get(f"{self.base_url}/search", params={"q": query, "format": "json"})

    def _hits(self, payload):
        return [
            SearchHit(_text(item.get("title")), _text(item.get("url")), _text(item.get("content")))
            for item in _items(payload, "results")
        ]


PROVIDERS: dict[str, type[SearchProvider]] = {
    cls.name: cls for cls in (SerperSearch, TavilySearch, BraveSearch, SearxngSearch)
}


class WebSearch:
    """Search with a provider, then fetch the hits' pages and cut them into paragraph passages."""

    def __init__(self, provider: SearchProvider, *, max_paragraphs: int = MAX_PARAGRAPHS,
                 fetch_timeout: float = FETCH_TIMEOUT_S, allow_private: bool = False):
        self.provider = provider
        self.max_paragraphs = max_paragraphs
        self.fetch_timeout = fetch_timeout
        self.allow_private = allow_private

    def __str__(self) -> str:
        return self.provider.name

    def __deepcopy__(self, memo: dict) -> WebSearch:
        return self

    def search(self, query: str, n: int) -> list[Document]:
        hits = self.provider.search(query, n)
        if not hits:
            return []
        client = page_client(self.fetch_timeout, allow_private=self.allow_private)
        with client, ThreadPoolExecutor(max_workers=len(hits)) as pool:
            return list(pool.map(lambda hit: self._document(client, hit), hits))

    def _document(self, client: httpx.Client, hit: SearchHit) -> Document:
        page = fetch_page(client, hit.url)
        if page is not None:
            heading, paragraphs = page_paragraphs(page, self.max_paragraphs)
            if paragraphs:
                title = heading or hit.title
                passages = tuple(Passage(f"{hit.url}#{i}", title, text) for i, text in enumerate(paragraphs, 1))
                return Document(title, hit.url, hit.snippet, passages, fetched=True)
        snippet = (Passage(hit.url, hit.title, hit.snippet),) if hit.snippet.strip() else ()
        return Document(hit.title, hit.url, hit.snippet, snippet, fetched=False)


class LocalSearch:
    """A second local index searched in place of the web: each hit is one passage."""

    def __init__(self, retriever: Retriever, location: str):
        self.retriever = retriever
        self.location = location

    def __str__(self) -> str:
        return f"local:{self.location}"

    def __deepcopy__(self, memo: dict) -> LocalSearch:
        return self

    def search(self, query: str, n: int) -> list[Document]:
        return [
            Document(p.title, p.id, p.text, (p,), fetched=True) for p in self.retriever.retrieve(query, n)
        ]


KnowledgeSearch = WebSearch | LocalSearch


def open_knowledge_search(spec: str, *, max_paragraphs: int = MAX_PARAGRAPHS) -> KnowledgeSearch | None:
    """The knowledge search a `web` spec names (see the module docstring); None for `none`."""
    spec = spec.strip()
    if spec.lower() == "none":
        return None
    name, _, location = spec.partition(":")
    if name == "local":
        from arag.retrievers.index import open_retriever

        if not location:
            raise ConfigError("parameter 'web': local:DIR needs the folder of an arag index, e.g. local:/data/bm25")
        try:
            return LocalSearch(open_retriever(location), location)
        except RetrieverError as exc:
            raise ConfigError(f"parameter 'web': {exc}") from None
    if name not in PROVIDERS:
        raise ConfigError(f"parameter 'web' must be one of {WEB_SPEC_FORMS}; got {spec!r}")
    allow_private = os.environ.get(ALLOW_PRIVATE_ENV, "").strip().lower() in ("1", "true", "yes")
    return WebSearch(PROVIDERS[name](base_url=location or None), max_paragraphs=max_paragraphs,
                     allow_private=allow_private)


class NonPublicAddress(httpx.RequestError):
    """A page whose host is, or resolves to, an address outside the public internet."""


def page_client(timeout: float = FETCH_TIMEOUT_S, *, allow_private: bool = False) -> httpx.Client:
    """The HTTP client that fetches result pages, following redirects; without `allow_private`, every request
    (redirects included) to a non-public address fails with NonPublicAddress."""
    hooks = {} if allow_private else {"request": [refuse_non_public]}
    return httpx.Client(timeout=timeout, follow_redirects=True, headers={"User-Agent": USER_AGENT},
                        event_hooks=hooks)


def refuse_non_public(request: httpx.Request) -> None:
    """Raises NonPublicAddress when the request's host is, or resolves to, a loopback, private, link-local,
    multicast or reserved address."""
    host = request.url.host
    try:
        found = socket.getaddrinfo(host, request.url.port or 443, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise httpx.ConnectError(f"cannot resolve {host!r}: {exc}", request=request) from None
    for *_, address in found:
        ip = ipaddress.ip_address(address[0].partition("%")[0])
        if ip.version == 6 and ip.ipv4_mapped:
            ip = ip.ipv4_mapped
        if not ip.is_global or ip.is_multicast:
            logger.info("not fetching %s: %s is not a public address (set %s=1 to allow)", request.url, ip,
                        ALLOW_PRIVATE_ENV)
            raise NonPublicAddress(f"{host} is at {ip}, not a public address", request=request)


def fetch_page(client: httpx.Client, url: str) -> str | None:
    """The HTML of an http(s) page (at most MAX_PAGE_BYTES of it), or None when it cannot be had."""
    if not url.startswith(("http://", "https://")):
        return None
    try:
        with client.stream("GET", url) as response:
            content_type = response.headers.get("content-type", "text/html")
            if response.status_code != 200 or "html" not in content_type.lower():
                return None
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) >= MAX_PAGE_BYTES:
                    break
            encoding = response.encoding or "utf-8"
    except httpx.HTTPError:
        return None
    return bytes(body[:MAX_PAGE_BYTES]).decode(encoding, errors="replace")


def page_paragraphs(html: str, max_paragraphs: int = MAX_PARAGRAPHS) -> tuple[str, list[str]]:
    """A page's heading and its distinct paragraphs of at least MIN_PARAGRAPH_WORDS words, in page order."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    for element in soup.find_all(_DROPPED_ELEMENTS):
        element.decompose()
    for line_break in soup.find_all("br"):
        line_break.replace_with("\n")
    heading_tag = soup.find("h1") or soup.find("title")
    heading = " ".join(heading_tag.get_text().split()) if heading_tag else ""
    paragraphs: list[str] = []
    for tag in soup.find_all("p"):
        text = " ".join(tag.get_text().split())
        if len(text.split()) >= MIN_PARAGRAPH_WORDS and text not in paragraphs:
            paragraphs.append(text)
            if len(paragraphs) == max_paragraphs:
                break
    return heading, paragraphs


def _items(payload: Any, key: str) -> list[dict]:
    items = payload.get(key) if isinstance(payload, dict) else None
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def _text(value: Any) -> str:
    return " ".join(value.split()) if isinstance(value, str) else ""


def _markup_free(value: Any) -> str:
    """Brave marks query terms in titles and descriptions with HTML tags."""
    from bs4 import BeautifulSoup

    return _text(BeautifulSoup(value, "html.parser").get_text()) if isinstance(value, str) else ""
