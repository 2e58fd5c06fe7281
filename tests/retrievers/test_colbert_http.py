"""The ColBERTv2 HTTP protocol: dspy.ColBERTv2 and arag's client against arag's server; errors, limits, concurrency,
and `arag serve` under a load of concurrent clients."""

import importlib.util
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dspy
import pytest
import requests

from arag.data import load_corpus, load_examples, sample_paths
from arag.errors import ConfigError, RetrieverError
from arag.passages import Passage
from arag.retrievers import BM25Retriever, ColBERTv2Retriever, SearchServer, colbert_http, open_retriever
from arag.testing import PassageTemplate, TemplateRetriever

PASSAGES = [
    Passage("10", "Lighthouse", "A lighthouse guides ships with a rotating beam of light."),
    Passage("007", "Beekeeping", "Beekeepers harvest honey and wax from hives of honeybees."),
    Passage("glacier", "Glacier", "A glacier is a slowly moving mass of ice formed from compacted snow."),
    Passage("untitled", "", "An untitled note | with a bar in its text about ships and light."),
    Passage("pipe", "A | B", "A title holding the separator, about honey and ships."),
] + [Passage(f"filler-{i}", f"Filler {i}", f"Filler passage number {i} mentions ships once.") for i in range(150)]
QUERIES = ["ships and light", "honey from hives", "ice and snow", "bar in its text", "ships"]


@pytest.fixture(scope="module")
def bm25(tmp_path_factory):
    return BM25Retriever.build(PASSAGES, tmp_path_factory.mktemp("bm25") / "index")


@pytest.fixture(scope="module")
def server(bm25):
    with SearchServer(bm25, port=0) as running:
        yield running


def long_texts(passages):
    return [p.long_text for p in passages]


@pytest.mark.parametrize("post", [False, True])
def test_dspy_colbertv2_gets_the_passages_of_a_direct_search(server, bm25, post):
    client = dspy.ColBERTv2(url=server.url, post_requests=post)
    for query in QUERIES:
        direct = bm25.retrieve(query, 7)
        hits = client(query, k=7)
        assert [hit["long_text"] for hit in hits] == long_texts(direct)
        assert [hit["text"] for hit in hits] == long_texts(direct)
        assert [hit["score"] for hit in hits] == pytest.approx([p.score for p in direct])
        assert [hit["rank"] for hit in hits] == list(range(1, len(direct) + 1))
        probs = [hit["prob"] for hit in hits]
        assert sum(probs) == pytest.approx(1.0) and probs == sorted(probs, reverse=True)
    assert client("ships and light", k=3, simplify=True) == long_texts(bm25.retrieve("ships and light", 3))


def test_answers_are_the_protocol_shape_with_integer_pids_where_ids_are_integers(server, bm25):
    answer = requests.get(server.url, params={"query": "lighthouse beekeepers", "k": 2}, timeout=10).json()
    assert answer["query"] == "lighthouse beekeepers"
    fields = {"text", "long_text", "pid", "rank", "score", "prob", "id", "title"}
    assert [set(hit) for hit in answer["topk"]] == [fields, fields]
    assert {hit["id"]: hit["pid"] for hit in answer["topk"]} == {"10": 10, "007": "007"}


@pytest.mark.parametrize("post", [False, True])
def test_arag_client_gets_exactly_the_direct_passages(server, bm25, post):
    client = ColBERTv2Retriever(server.url, post=post)
    assert client.retrieve_batch(QUERIES, 9) == bm25.retrieve_batch(QUERIES, 9)
    assert client.retrieve("   ", 3) == []


def test_retriever_specs_open_servers_by_url(server, bm25):
    by_spec = open_retriever(server.url)
    assert isinstance(by_spec, ColBERTv2Retriever)
    assert by_spec.retrieve("ice and snow", 2) == bm25.retrieve("ice and snow", 2)
    bare = ColBERTv2Retriever(server.url.removesuffix("/api/search"))
    assert bare.url == server.url and bare.retrieve("honey", 1) == bm25.retrieve("honey", 1)
    with pytest.raises(ConfigError):
        ColBERTv2Retriever("ftp://example.org/search")


def test_k_is_capped_at_100_and_defaults_to_10(server):
    assert len(requests.get(server.url, params={"query": "ships", "k": 500}, timeout=10).json()["topk"]) == 100
    assert len(requests.get(server.url, params={"query": "ships"}, timeout=10).json()["topk"]) == 10
    posted = requests.post(server.url, json={"query": "ships", "k": 1000}, timeout=10).json()
    assert len(posted["topk"]) == 100


@pytest.mark.parametrize(
    "method, kwargs, status, message",
    [
        ("get", {"params": {"k": 3}}, 400, "missing 'query'"),
        ("get", {"params": {"query": "x", "k": 0}}, 400, "positive integer"),
        ("get", {"params": {"query": "x", "k": "ten"}}, 400, "must be an integer"),
        ("get", {"params": {"query": "x" * (colbert_http.MAX_QUERY_CHARS + 1)}}, 400, "longer than"),
        ("post", {"data": b"{not json", "headers": {"Content-Type": "application/json"}}, 400, "not valid JSON"),
        ("post", {"json": ["ships"]}, 400, "JSON object"),
        ("post", {"json": {"query": 42}}, 400, "must be a string"),
        ("post", {"json": {"query": "x", "k": 2.5}}, 400, "positive integer"),
        ("post", {"data": b"x" * (colbert_http.MAX_BODY_BYTES + 1)}, 413, "body above"),
        ("put", {}, 405, "use GET or POST"),
    ],
)
def test_bad_requests_get_clear_json_errors(server, method, kwargs, status, message):
    response = getattr(requests, method)(server.url, timeout=10, **kwargs)
    assert response.status_code == status
    assert response.headers["Content-Type"].startswith("application/json")
    assert message in response.json()["message"] and response.json()["error"]


def test_unknown_paths_and_malformed_requests_are_json_errors_too(server):
    host, port = server.url.split("/")[2].split(":")
    response = requests.get(f"http://{host}:{port}/search", params={"query": "x"}, timeout=10)
    assert response.status_code == 404 and "/api/search" in response.json()["message"]
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(b"GET /api/search?query=x extra HTTP/1.1\r\n\r\n")
        reply = b"".join(iter(lambda: raw.recv(4096), b"")).decode()  # the server closes after an error
    assert reply.startswith("HTTP/1.1 400") and '"error": "http"' in reply


@pytest.mark.parametrize("declared", ["-1", "-65536", "12abc", "0x10", "1e3"])
def test_a_negative_or_malformed_content_length_is_refused_before_reading(server, declared):
    """The client sends its headers and keeps the connection open, as a client streaming an endless body would:
    a server that trusted the length would read until the client hung up, and never answer."""
    host, port = server.url.split("/")[2].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        raw.sendall(f"POST /api/search HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {declared}\r\n\r\n".encode())
        reply = b"".join(iter(lambda: raw.recv(4096), b"")).decode()
    assert reply.startswith("HTTP/1.1 400"), reply
    assert '"message": "Content-Length must be a number of bytes' in reply


def test_a_lone_surrogate_in_the_query_is_a_400_and_the_server_goes_on(server, bm25):
    response = requests.post(server.url, data=b'{"query": "river \\ud800", "k": 2}', timeout=10,
                             headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and "not valid Unicode" in response.json()["message"]
    assert ColBERTv2Retriever(server.url, post=True).retrieve("ships", 2) == bm25.retrieve("ships", 2)


def test_dspy_sees_server_errors(server):
    with pytest.raises(requests.HTTPError):
        dspy.ColBERTv2(url=server.url)("ships", k=0)


def test_client_errors_name_the_server(server):
    free_port = _free_port()
    with pytest.raises(RetrieverError, match=f"127.0.0.1:{free_port}.*did not answer"):
        ColBERTv2Retriever(f"http://127.0.0.1:{free_port}/api/search").retrieve("x", 3)
    with pytest.raises(RetrieverError, match="answered 404: no such endpoint"):
        ColBERTv2Retriever(server.url.replace("/api/search", "/elsewhere")).retrieve("x", 3)


class ColBERTAIHandler(BaseHTTPRequestHandler):
    """Answers like colbert-ai's server: integer pids and `Title | text` only."""

    def do_GET(self):
        body = json.dumps({"query": "q", "topk": [
            {"text": "Lighthouse | A lighthouse guides ships.", "pid": 3, "rank": 1, "score": 21.5, "prob": 0.7},
            {"text": "No title here", "pid": 8, "rank": 2, "score": 20.0, "prob": 0.3},
        ]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_client_reads_colbert_ai_style_answers():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), ColBERTAIHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        passages = ColBERTv2Retriever(f"http://127.0.0.1:{httpd.server_address[1]}/wiki").retrieve("q", 5)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert passages == [
        Passage("3", "Lighthouse", "A lighthouse guides ships.", 21.5),
        Passage("8", "", "No title here", 20.0),
    ]


def test_requests_are_answered_concurrently():
    delay, clients = 0.5, 8
    with SearchServer(TemplateRetriever(PassageTemplate(id="{query}"), delay=delay), port=0) as slow:
        client = ColBERTv2Retriever(slow.url)
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=clients) as pool:
            answers = list(pool.map(lambda i: client.retrieve(f"q{i}", 1), range(clients)))
        elapsed = time.perf_counter() - started
    assert [a[0].id for a in answers] == [f"q{i}" for i in range(clients)]
    assert elapsed < delay * clients / 2  # serial answering would take delay * clients


def test_stop_ends_serve_forever_even_from_a_request_s_own_thread(bm25):
    servers = []

    class Stopping:  # asks the server to stop while answering: waiting for the loop there would deadlock
        def retrieve(self, query, k):
            servers[0].stop()
            return bm25.retrieve(query, k)

    servers.append(SearchServer(Stopping(), port=0))
    loop = threading.Thread(target=servers[0].serve_forever, daemon=True)
    loop.start()
    assert ColBERTv2Retriever(servers[0].url).retrieve("ships", 2) == bm25.retrieve("ships", 2)
    loop.join(timeout=10)
    assert not loop.is_alive()
    with pytest.raises(OSError):  # serve_forever() closed its socket on the way out
        socket.create_connection(("127.0.0.1", urllib.parse.urlsplit(servers[0].url).port), timeout=1)


def test_many_parallel_clients_get_the_direct_results(server, bm25):
    queries = QUERIES * 20
    client = ColBERTv2Retriever(server.url)
    with ThreadPoolExecutor(max_workers=16) as pool:
        assert list(pool.map(lambda q: client.retrieve(q, 5), queries)) == [bm25.retrieve(q, 5) for q in queries]


def test_loopback_by_default_and_a_warning_otherwise(bm25, caplog):
    with SearchServer(bm25, port=0) as local:
        assert local.url.startswith("http://127.0.0.1:")
    assert SearchServer.__init__.__defaults__ == ("127.0.0.1", colbert_http.DEFAULT_PORT)
    caplog.set_level(logging.WARNING, logger="arag")
    SearchServer(bm25, host="0.0.0.0", port=0).close()
    assert "without authentication" in caplog.text
    with pytest.raises(ConfigError, match="port"):
        SearchServer(bm25, port=70000)


def test_serve_shares_an_index_folder_with_other_processes(bm25, tmp_path):
    port = _free_port()
    code = f"from arag.retrievers.colbert_http import serve; serve({str(bm25.index_dir)!r}, port={port})"
    process = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONWARNINGS": "ignore"})
    try:
        url = f"http://127.0.0.1:{port}/api/search"
        _wait_until_listening(port, process)
        hits = dspy.ColBERTv2(url=url)("honey from hives", k=4)
        assert [hit["long_text"] for hit in hits] == long_texts(bm25.retrieve("honey from hives", 4))
    finally:
        process.terminate()
        process.wait(timeout=120)
    assert process.returncode == 0  # SIGTERM stops the server as Ctrl-C does


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("colbert") is None, reason="needs the colbert extra (colbert-ai)")
def test_dspy_colbertv2_gets_the_passages_of_a_direct_colbert_search(tmp_path):
    from arag.retrievers.colbert import ColBERTRetriever, make_test_checkpoint

    checkpoint = make_test_checkpoint(tmp_path / "checkpoint")
    colbert = ColBERTRetriever.build(PASSAGES[:40], tmp_path / "index", checkpoint=checkpoint)
    with SearchServer(open_retriever(str(tmp_path / "index")), port=0) as served:
        client, arag_client = dspy.ColBERTv2(url=served.url), ColBERTv2Retriever(served.url)
        for query in QUERIES + ["Filler passage number 7"]:
            direct = colbert.retrieve(query, 5)
            assert [hit["long_text"] for hit in client(query, k=5)] == long_texts(direct)
            assert arag_client.retrieve(query, 5) == direct


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_until_listening(port: int, process: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"serve() exited: {process.stderr.read()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listened on port {port} within {timeout} s")


def test_a_deeply_nested_body_is_a_400_not_a_server_error(server, bm25, caplog):
    caplog.set_level(logging.DEBUG, logger="arag")
    for body in (b"[" * 65_000, b'{"query": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"):
        response = requests.post(server.url, data=body, headers={"Content-Type": "application/json"}, timeout=10)
        assert response.status_code == 400 and "nested too deeply" in response.json()["message"]
    assert "Traceback" not in caplog.text and "RecursionError" not in caplog.text
    assert ColBERTv2Retriever(server.url, post=True).retrieve("ships", 2) == bm25.retrieve("ships", 2)


def test_a_client_that_hangs_up_early_is_one_log_line(caplog, capfd):
    caplog.set_level(logging.INFO, logger="arag")
    slow = TemplateRetriever(PassageTemplate(id="{query} #{rank}", text="word " * 2000), delay=0.3)
    with SearchServer(slow, port=0) as running:
        host, port = running.url.split("/")[2].split(":")
        for _ in range(3):
            raw = socket.create_connection((host, int(port)), timeout=5)
            raw.sendall(b"GET /api/search?query=ships&k=100 HTTP/1.1\r\nHost: x\r\n\r\n")
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            raw.close()  # before the answer: the server's write meets a reset connection
        time.sleep(1.5)
        assert ColBERTv2Retriever(running.url).retrieve("ships", 1)[0].id == "ships #1"
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err + captured.out + caplog.text
    hung_up = [r for r in caplog.records if "closed the connection" in r.getMessage()]
    assert len(hung_up) == 3 and all("\n" not in r.getMessage() and not r.exc_info for r in hung_up)


def test_arag_serve_binds_loopback_caps_its_input_and_answers_a_concurrent_load_correctly(tmp_path):
    _, corpus = sample_paths()
    index = BM25Retriever.build(load_corpus(corpus), tmp_path / "bm25")
    server = subprocess.Popen([sys.executable, "-m", "arag.cli", "-v", "serve", "--index", f"bm25:{index.index_dir}",
                               "--port", "0"], stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        while " at http" not in line:
            line = server.stderr.readline()
            assert line, "the server exited before serving"
        url = re.search(r"at (http://\S+)", line).group(1)
        assert url.startswith("http://127.0.0.1:")
        # Read the rest of its log (a line per request with -v): a full pipe would block the server's logging.
        threading.Thread(target=server.stderr.read, daemon=True).start()
        questions = [example.question for example in load_examples(sample_paths()[0])]

        def ask(number: int) -> tuple[int, dict, object]:
            query, k = questions[number % len(questions)], (1, 5, 10, 100, 500)[number % 5]
            if number % 17 == 0:
                query = "why " * (colbert_http.MAX_QUERY_CHARS // 4 + 1)
            if number % 2:
                request = urllib.request.Request(url, json.dumps({"query": query, "k": k}).encode(),
                                                 {"Content-Type": "application/json"})
            else:
                request = f"{url}?{urllib.parse.urlencode({'query': query, 'k': k})}"
            try:
                with urllib.request.urlopen(request, timeout=120) as answer:
                    return answer.status, json.loads(answer.read()), (query, min(k, 100))
            except urllib.error.HTTPError as refused:
                return refused.code, json.loads(refused.read()), (query, k)

        # Four clients at a time: within the server's listen backlog (socketserver's default of 5 pending
        # connections; more concurrent clients overflow it, see the hardening notes in benchmarks/README.md).
        with ThreadPoolExecutor(max_workers=4) as pool:
            answers = list(pool.map(ask, range(640)))
        assert server.poll() is None, "the server died under load"
        for status, body, (query, k) in answers:
            if len(query) > colbert_http.MAX_QUERY_CHARS:
                assert status == 400 and str(colbert_http.MAX_QUERY_CHARS) in body["message"]
            else:
                assert status == 200, body
                assert [hit["id"] for hit in body["topk"]] == [p.id for p in index.retrieve(query, k)]
        assert sum(status == 200 for status, _, _ in answers) == 640 - len(range(0, 640, 17))
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=600)
        except subprocess.TimeoutExpired:
            server.kill()
            raise AssertionError("the server did not stop within 600 s of Ctrl-C") from None
    assert server.returncode == 0  # Ctrl-C finishes the request loop and the process exits cleanly
