"""Knowledge searching: the JSON search providers, page fetching and paragraphs, local:DIR, and CRAG
searching the web, all against a loopback HTTP server (no test touches the internet)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import dspy
import httpx
import pytest

from arag.errors import ConfigError, RetrieverError
from arag.passages import Passage
from arag.programs.crag.steps import Rewrite
from arag.programs.frame.registry import build_program
from arag.retrievers import BM25Retriever
from arag.retrievers.web import (
    BraveSearch,
    LocalSearch,
    NonPublicAddress,
    SearxngSearch,
    SerperSearch,
    TavilySearch,
    WebSearch,
    fetch_page,
    open_knowledge_search,
    page_paragraphs,
    refuse_non_public,
)
from arag.testing import FixedRetriever, Tokens, scripted_lm
from arag.trace import Retrieve, is_step, steps_of

ARTICLE = """<!doctype html><html><head><title>Ada Lovelace - Encyclopedia</title>
<script>var tracking = "<p>this script paragraph must never be read as text</p>";</script>
<style>p { color: red }</style></head>
<body><nav><p>Home About Contact Search the whole site now</p></nav>
<header><p>Site header with a long enough sentence here</p></header>
<h1>Ada   Lovelace</h1>
<p>Ada Lovelace was an English mathematician and writer.</p>
<p>Too short.</p>
<p>She is chiefly known for her work on Charles Babbage's <b>Analytical Engine</b>.</p>
<p>Ada Lovelace was an English mathematician and writer.</p>
<div><p>Her notes include what is<br>recognised as the first published algorithm.</p></div>
<footer><p>Copyright notice for this page and all of its content</p></footer>
</body></html>"""

LONG_PAGE = "".join(f"<p>Paragraph number {i} has enough words in it.</p>" for i in range(40))


class FakeWeb:
    """A loopback server speaking the providers' JSON APIs under /serper, /tavily, /brave and /searx,
    and serving pages under /pages; every request is recorded."""

    def __init__(self):
        self.requests = []
        self.status = 200
        self.hits = []
        web = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.route("GET", b"")

            def do_POST(self):
                self.route("POST", self.rfile.read(int(self.headers.get("Content-Length") or 0)))

            def route(self, method, body):
                url = urlparse(self.path)
                web.requests.append({"method": method, "path": url.path, "query": parse_qs(url.query),
                                     "headers": dict(self.headers), "body": json.loads(body) if body else None})
                if url.path.startswith("/pages/"):
                    self.page(url.path.removeprefix("/pages/"))
                elif url.path == "/serper/search":
                    self.send_json({"organic": [{"title": t, "link": u, "snippet": s} for t, u, s in web.hits]})
                elif url.path == "/tavily/search":
                    self.send_json({"query": "q", "results": [{"title": t, "url": u, "content": s, "score": 0.9}
                                                              for t, u, s in web.hits]})
                elif url.path == "/brave/res/v1/web/search":
                    results = [{"title": f"<strong>{t}</strong>", "url": u, "description": f"{s} <strong>x</strong>"}
                               for t, u, s in web.hits]
                    self.send_json({"type": "search", "web": {"results": results}})
                elif url.path == "/searx/search":
                    self.send_json({"results": [{"title": t, "url": u, "content": s} for t, u, s in web.hits]})
                elif url.path == "/broken/search":
                    self.send(200, "text/html", b"<html>maintenance</html>")
                else:
                    self.send(404, "text/plain", b"not found")

            def page(self, name):
                pages = {"article.html": ("text/html; charset=utf-8", ARTICLE), "long.html": ("text/html", LONG_PAGE),
                         "paper.pdf": ("application/pdf", "%PDF-1.4 <p>not html at all, never parsed</p>")}
                if name not in pages:
                    self.send(404, "text/html", b"<p>This page does not exist on this server</p>")
                else:
                    content_type, text = pages[name]
                    self.send(200, content_type, text.encode())

            def send_json(self, payload):
                self.send(web.status, "application/json", json.dumps(payload).encode())

            def send(self, status, content_type, data):
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def web(monkeypatch):
    for name, key in (("SERPER_API_KEY", "serper-secret"), ("TAVILY_API_KEY", "tvly-secret"),
                      ("BRAVE_API_KEY", "brave-secret")):
        monkeypatch.setenv(name, key)
    server = FakeWeb()
    server.hits = [
        ("Ada Lovelace", f"{server.url}/pages/article.html", "English mathematician"),
        ("Missing page", f"{server.url}/pages/gone.html", "A snippet standing in for a missing page"),
        ("A paper", f"{server.url}/pages/paper.pdf", "A snippet standing in for a PDF"),
    ]
    yield server
    server.close()


def searches(web):
    return [r for r in web.requests if not r["path"].startswith("/pages/")]


# --- providers ------------------------------------------------------------------------------------


def test_serper_posts_the_query_with_its_key(web):
    hits = SerperSearch(base_url=f"{web.url}/serper").search("Ada Lovelace, occupation", 2)
    (request,) = searches(web)
    assert request["method"] == "POST" and request["body"] == {"q": "Ada Lovelace, occupation", "num": 2}
    assert request["headers"]["X-API-KEY"] == "serper-secret"
    assert [(h.title, h.snippet) for h in hits] == [("Ada Lovelace", "English mathematician"),
                                                    ("Missing page", "A snippet standing in for a missing page")]


def test_tavily_posts_the_query_with_a_bearer_token(web):
    hits = TavilySearch(base_url=f"{web.url}/tavily").search("Ada Lovelace", 5)
    (request,) = searches(web)
    assert request["body"] == {"query": "Ada Lovelace", "max_results": 5}
    assert request["headers"]["Authorization"] == "Bearer tvly-secret"
    assert [h.url for h in hits] == [url for _, url, _ in web.hits]


def test_brave_gets_the_query_and_drops_markup(web):
    hits = BraveSearch(base_url=f"{web.url}/brave").search("Ada Lovelace", 3)
    (request,) = searches(web)
    assert request["method"] == "GET" and request["query"] == {"q": ["Ada Lovelace"], "count": ["3"]}
    assert request["headers"]["X-Subscription-Token"] == "brave-secret"
    assert (hits[0].title, hits[0].snippet) == ("Ada Lovelace", "English mathematician x")


def test_searxng_asks_for_json_from_the_configured_instance(web, monkeypatch):
    monkeypatch.setenv("SEARXNG_URL", f"{web.url}/searx")
    hits = SearxngSearch().search("Ada Lovelace", 1)
    (request,) = searches(web)
    assert request["query"] == {"q": ["Ada Lovelace"], "format": ["json"]}
    assert [h.title for h in hits] == ["Ada Lovelace"]
    monkeypatch.delenv("SEARXNG_URL")
    with pytest.raises(ConfigError, match="SEARXNG_URL"):
        SearxngSearch()


@pytest.mark.parametrize("provider", [SerperSearch, TavilySearch, BraveSearch])
def test_a_missing_key_names_its_variable(provider, monkeypatch):
    monkeypatch.delenv(provider.key_env, raising=False)
    with pytest.raises(ConfigError, match=provider.key_env):
        provider()


def test_provider_failures_are_clear_and_never_show_the_key(web):
    web.status = 401
    with pytest.raises(RetrieverError, match="SERPER_API_KEY") as refused:
        SerperSearch(base_url=f"{web.url}/serper").search("q", 3)
    assert "serper-secret" not in str(refused.value)
    web.status = 500
    with pytest.raises(RetrieverError, match="HTTP 500"):
        TavilySearch(base_url=f"{web.url}/tavily").search("q", 3)
    with pytest.raises(RetrieverError, match="did not answer JSON"):
        SerperSearch(base_url=f"{web.url}/broken").search("q", 3)
    with pytest.raises(RetrieverError, match="failed"):
        SerperSearch(base_url="http://127.0.0.1:9").search("q", 3)


# --- pages --------------------------------------------------------------------------------------


def test_page_paragraphs_reads_real_paragraphs_only():
    heading, paragraphs = page_paragraphs(ARTICLE)
    assert heading == "Ada Lovelace"
    assert paragraphs == [
        "Ada Lovelace was an English mathematician and writer.",
        "She is chiefly known for her work on Charles Babbage's Analytical Engine.",
        "Her notes include what is recognised as the first published algorithm.",
    ]
    assert page_paragraphs(LONG_PAGE, max_paragraphs=4)[1][-1] == "Paragraph number 3 has enough words in it."
    assert page_paragraphs("<html><head><title> Only   a title </title></head><body>hi</body></html>") == (
        "Only a title", [])


def test_web_search_fetches_pages_and_falls_back_to_snippets(web):
    documents = WebSearch(SerperSearch(base_url=f"{web.url}/serper"), max_paragraphs=2,
                          allow_private=True).search("Ada", 3)
    article, missing, pdf = documents
    assert article.fetched and article.title == "Ada Lovelace"
    assert [p.text for p in article.passages] == [
        "Ada Lovelace was an English mathematician and writer.",
        "She is chiefly known for her work on Charles Babbage's Analytical Engine.",
    ]
    assert [p.id for p in article.passages] == [f"{article.url}#1", f"{article.url}#2"]
    for document, snippet in ((missing, "A snippet standing in for a missing page"),
                              (pdf, "A snippet standing in for a PDF")):
        assert not document.fetched and [p.text for p in document.passages] == [snippet]
    fetched = sorted(r["path"] for r in web.requests if r["path"].startswith("/pages/"))
    assert fetched == ["/pages/article.html", "/pages/gone.html", "/pages/paper.pdf"]
    assert article.summary() == {"title": "Ada Lovelace", "url": article.url, "paragraphs": 2, "fetched": True}


def test_result_pages_at_loopback_private_or_link_local_addresses_are_not_fetched_by_default(web):
    port = web.url.rsplit(":", 1)[1]
    web.hits = [("Loopback", f"{web.url}/pages/article.html", "Snippet one"),
                ("By name", f"http://localhost:{port}/pages/article.html", "Snippet two"),
                ("IPv6 loopback", f"http://[::1]:{port}/pages/article.html", "Snippet three"),
                ("Cloud metadata", "http://169.254.169.254/latest/meta-data/", "Snippet four"),
                ("Intranet", "http://10.1.2.3/admin", "Snippet five")]
    documents = WebSearch(SerperSearch(base_url=f"{web.url}/serper"), fetch_timeout=1).search("Ada", 5)
    assert [(d.fetched, [p.text for p in d.passages]) for d in documents] == [
        (False, [snippet]) for _, _, snippet in web.hits]
    assert not [r for r in web.requests if r["path"].startswith("/pages/")], "a private page was fetched"


def test_a_redirect_to_a_private_address_is_not_followed():
    public = "http://93.184.215.14/article"
    requested = []

    def internet(request: httpx.Request) -> httpx.Response:
        requested.append(str(request.url))
        if request.url.host == "93.184.215.14":
            return httpx.Response(302, headers={"Location": "http://127.0.0.1:9/internal"})
        return httpx.Response(200, html="<p>An internal page that no search result may make arag read.</p>")

    client = httpx.Client(transport=httpx.MockTransport(internet), follow_redirects=True,
                          event_hooks={"request": [refuse_non_public]})
    with client:
        assert fetch_page(client, public) is None
    assert requested == [public]
    with pytest.raises(NonPublicAddress, match="127.0.0.1"):
        refuse_non_public(httpx.Request("GET", "http://127.0.0.1:9/internal"))


def test_the_switch_lets_searches_fetch_private_pages(web, monkeypatch):
    spec = f"serper:{web.url}/serper"
    assert open_knowledge_search(spec).allow_private is False
    monkeypatch.setenv("ARAG_WEB_ALLOW_PRIVATE", "1")
    search = open_knowledge_search(spec)
    assert search.allow_private is True and search.search("Ada", 1)[0].fetched


def test_open_knowledge_search_specs(web, tmp_path):
    assert open_knowledge_search("none") is None
    serper = open_knowledge_search(f"serper:{web.url}/serper")
    assert isinstance(serper, WebSearch) and serper.provider.base_url == f"{web.url}/serper" and str(serper) == "serper"
    assert open_knowledge_search("tavily").provider.base_url == "https://api.tavily.com"
    for bad in ("google", "local:", "local:/no/such/index", ""):
        with pytest.raises(ConfigError, match="parameter 'web'"):
            open_knowledge_search(bad)

    BM25Retriever.build([Passage("w1", "Ada Lovelace", "Ada Lovelace wrote the first algorithm."),
                         Passage("w2", "Grace Hopper", "Grace Hopper built the first compiler.")], tmp_path / "second")
    local = open_knowledge_search(f"local:{tmp_path / 'second'}")
    assert isinstance(local, LocalSearch) and str(local) == f"local:{tmp_path / 'second'}"
    (document,) = local.search("compiler", 5)
    assert (document.url, document.title, [p.id for p in document.passages]) == ("w2", "Grace Hopper", ["w2"])


# --- CRAG searching the web ------------------------------------------------------------------------


def test_crag_searches_the_web_when_retrieval_is_incorrect(web, monkeypatch):
    monkeypatch.setenv("ARAG_WEB_ALLOW_PRIVATE", "1")  # the pages are on this machine's loopback server
    keywords_seen = []

    def responder(call):
        if call.output_fields == ["relevant"]:
            passage = call.inputs["passage"]
            if "Analytical Engine" in passage or "algorithm" in passage:
                return {"relevant": Tokens([("yes", 0.95, {"no": 0.05})])}
            return {"relevant": Tokens([("no", 0.99, {"yes": 0.01})])}
        if call.output_fields == ["keywords"]:
            keywords_seen.append(call.inputs["question"])
            return {"keywords": ["Ada Lovelace", "known for", "machine", "extra"]}
        return {"answer": "the Analytical Engine"}

    retriever = FixedRetriever([Passage("c1", "Cheese", "Brie is a soft cheese from France.")])
    program = build_program("crag", retriever, web=f"serper:{web.url}/serper", reasoning="direct", web_k=3)
    with dspy.context(lm=scripted_lm(responder)):
        prediction = program(question="Which machine is Ada Lovelace known for?")

    assert prediction.action == "incorrect" and prediction.answer == "the Analytical Engine"
    assert keywords_seen == ["Which machine is Ada Lovelace known for?"]
    (search_request,) = searches(web)
    assert search_request["body"] == {"q": "Ada Lovelace, known for, machine", "num": 3}
    assert steps_of(prediction, Rewrite)[-1]["query"] == "Ada Lovelace, known for, machine"
    web_step = [s for s in prediction.trace if is_step(s, Retrieve)][1]
    assert web_step["why"] == "knowledge search (serper)"
    assert [d["url"] for d in web_step["documents"]] == [url for _, url, _ in web.hits]
    assert [d["fetched"] for d in web_step["documents"]] == [True, False, False]
    # Strips come from the fetched page, scored against the question; the snippets score 0.01 -> -0.98.
    assert prediction.knowledge == [
        "Ada Lovelace | She is chiefly known for her work on Charles Babbage's Analytical Engine.",
        "Ada Lovelace | Her notes include what is recognised as the first published algorithm.",
    ]
    assert prediction.retrieval_calls == 2 and prediction.distinct_passages == 4
