"""arag's server of the ColBERTv2 HTTP search protocol (see `arag.retrievers.colbert_http` for the protocol):
any retriever or index folder answers searches at `/api/search`, one thread per request (`arag serve`)."""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import os
import reprlib
import signal
import socket
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from arag.errors import AragError, ConfigError
from arag.retrievers.base import MAX_K, Retriever
from arag.retrievers.colbert_client import SEARCH_PATH
from arag.retrievers.index import open_retriever

logger = logging.getLogger("arag")

DEFAULT_PORT = 8893
DEFAULT_K = 10
MAX_QUERY_CHARS = 4_000
MAX_BODY_BYTES = 64 * 1024


def search_answer(retriever: Retriever, query: str, k: int) -> dict:
    """The protocol's answer object for `query`: the retriever's top-k passages with ranks and softmax probabilities."""
    passages = retriever.retrieve(query, k)
    top = max((p.score for p in passages), default=0.0)
    weights = [math.exp(p.score - top) for p in passages]
    total = sum(weights)
    return {
        "query": query,
        "topk": [
            {
                "text": passage.long_text,
                "long_text": passage.long_text,
                "pid": _protocol_pid(passage.id),
                "rank": rank,
                "score": passage.score,
                "prob": weight / total,
                "id": passage.id,
                "title": passage.title,
            }
            for rank, (passage, weight) in enumerate(zip(passages, weights), 1)
        ],
    }


def _protocol_pid(passage_id: str) -> int | str:
    """colbert-ai's servers send integer pids: an id that is an integer goes as one, any other id as it is."""
    return int(passage_id) if passage_id.isdecimal() and str(int(passage_id)) == passage_id else passage_id


class SearchServer:
    """Serves one retriever over the ColBERTv2 protocol at `/api/search`, one thread per request.

    `port=0` picks a free port (see `.url`). Use `serve_forever()` in the foreground, or `start()`
    / `close()` (or `with SearchServer(...) as server:`) to run it on a background thread.
    """

    def __init__(self, retriever: Retriever, host: str = "127.0.0.1", port: int = DEFAULT_PORT):
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(f"port must be an integer in [0, 65535], got {port!r}")
        self.retriever = retriever
        try:
            self._httpd = _HTTPServer((host, port), _SearchHandler)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self._httpd.retriever = retriever
        self._thread: threading.Thread | None = None
        if not _is_loopback(host):
            logger.warning(
                "serving %s on %s: any machine that reaches it can search, without authentication", retriever, host
            )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}{SEARCH_PATH}"

    def serve_forever(self) -> None:
        """Answers requests until interrupted (Ctrl-C) or `close()`d from another thread."""
        try:
            self._httpd.serve_forever()
        finally:
            self._httpd.server_close()

    def start(self) -> SearchServer:
        """Answers requests on a background thread."""
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="arag-search-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Asks the request loop to finish and returns at once: callable from a signal handler, or from the thread
        that runs `serve_forever()`, where waiting for the loop would deadlock."""
        threading.Thread(target=self._httpd.shutdown, name="arag-search-server-stop", daemon=True).start()

    def close(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> SearchServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()


def serve(index: str | os.PathLike | Retriever, host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> None:
    """Serves an index folder, retriever spec (`bm25:DIR`, `colbert:DIR`, ...) or retriever until Ctrl-C or SIGTERM.

    Either signal asks the request loop to finish (`SearchServer.stop()`), rather than raising KeyboardInterrupt
    wherever the main thread happens to be."""
    if isinstance(index, (str, os.PathLike)):
        index = open_retriever(os.fspath(index))
    server = SearchServer(index, host=host, port=port)

    in_main_thread = threading.current_thread() is threading.main_thread()  # only it may take signals
    signals = (signal.SIGINT, signal.SIGTERM) if in_main_thread else ()
    previous = {signum: signal.signal(signum, lambda signum, frame: server.stop()) for signum in signals}
    logger.info("serving %s at %s (Ctrl-C stops)", index, server.url)
    try:
        server.serve_forever()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    logger.info("stopped")


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # socketserver's backlog of 5 resets clients under a burst of connections
    retriever: Retriever

    def __init__(self, address, handler):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)

    def handle_error(self, request, client_address) -> None:
        """A client that hung up before its answer is one line in the log; anything else, a traceback."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError):
            logger.info("%s closed the connection before its answer was sent (%s)", client_address[0],
                        type(error).__name__)
        else:
            super().handle_error(request, client_address)


class _RequestError(Exception):
    def __init__(self, status: HTTPStatus, kind: str, message: str):
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


class _SearchHandler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"
    timeout = 60  # seconds a client may take to send its request

    def do_GET(self) -> None:
        self._answer(self._parameters_from_query_string)

    def do_POST(self) -> None:
        self._answer(self._parameters_from_body)

    def _answer(self, read_parameters) -> None:
        try:
            if urlsplit(self.path).path.rstrip("/") != SEARCH_PATH:
                raise _RequestError(HTTPStatus.NOT_FOUND, "not_found", f"no such endpoint; search at {SEARCH_PATH}")
            query, k = _checked(*read_parameters())
            try:
                answer = _encoded(search_answer(self.server.retriever, query, k))
            except AragError as exc:
                raise _RequestError(HTTPStatus.BAD_GATEWAY, "retriever", str(exc)) from None
        except _RequestError as exc:
            self.close_connection = True  # a POST body may be left unread
            self._send(exc.status, {"error": exc.kind, "message": exc.message})
        except Exception:
            logger.exception("search failed for %s", self.path[:200])
            failure = {"error": "internal", "message": "search failed; see the server log"}
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, failure)
        else:
            self._send(HTTPStatus.OK, answer)

    def _parameters_from_query_string(self) -> tuple:
        fields = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
        return fields.get("query", [None])[-1], fields.get("k", [None])[-1]

    def _parameters_from_body(self) -> tuple:
        declared = self.headers.get("Content-Length", "").strip()
        if not declared:
            raise _RequestError(HTTPStatus.LENGTH_REQUIRED, "bad_request", "POST needs a Content-Length")
        if not declared.isascii() or not declared.isdigit():
            raise _RequestError(HTTPStatus.BAD_REQUEST, "bad_request",
                                f"Content-Length must be a number of bytes, got {declared[:40]!r}")
        length = int(declared)
        if length > MAX_BODY_BYTES:
            raise _RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "too_large", f"body above {MAX_BODY_BYTES} bytes")
        try:
            body = json.loads(self.rfile.read(length) or b"null")
        except (ValueError, UnicodeDecodeError):
            raise _RequestError(HTTPStatus.BAD_REQUEST, "bad_request", "body is not valid JSON") from None
        except RecursionError:
            raise _RequestError(HTTPStatus.BAD_REQUEST, "bad_request", "body is nested too deeply") from None
        if not isinstance(body, dict):
            raise _RequestError(
                HTTPStatus.BAD_REQUEST, "bad_request", 'body must be a JSON object {"query": ..., "k": ...}'
            )
        return body.get("query"), body.get("k")

    def _send(self, status: HTTPStatus, payload: dict | bytes) -> None:
        body = payload if isinstance(payload, bytes) else _encoded(payload)
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (malformed request line, URI too long, unknown method) as JSON too."""
        self.close_connection = True
        status = HTTPStatus(code)
        self._send(status, {"error": "http", "message": f"{code} {message or status.phrase}"})

    def do_PUT(self) -> None:
        self.close_connection = True
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, {"error": "method_not_allowed", "message": "use GET or POST"})

    do_DELETE = do_PATCH = do_PUT

    def log_message(self, format: str, *args) -> None:
        logger.debug("%s %s", self.address_string(), format % args)


def _encoded(payload: dict) -> bytes:
    return json.dumps(payload, ensure_ascii=False).encode("utf-8")


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 3, 60, 60
"""How a bad value is quoted back to the client: cut short, however long or deeply nested it is."""


def _checked(query, k) -> tuple[str, int]:
    """The query and k of a request: k defaults to 10 and is capped at 100; the query must be a bounded string
    of valid Unicode (JSON's escapes can spell a lone surrogate, which no answer could carry)."""
    if query is None:
        raise _RequestError(HTTPStatus.BAD_REQUEST, "bad_request", "missing 'query'")
    if not isinstance(query, str):
        raise _RequestError(HTTPStatus.BAD_REQUEST, "bad_request", "'query' must be a string")
    if not query.isascii():
        try:
            query.encode("utf-8")
        except UnicodeEncodeError:
            raise _RequestError(HTTPStatus.BAD_REQUEST, "bad_request", "'query' is not valid Unicode "
                                "(it holds a lone surrogate)") from None
    if len(query) > MAX_QUERY_CHARS:
        raise _RequestError(
            HTTPStatus.BAD_REQUEST, "bad_request", f"'query' is longer than {MAX_QUERY_CHARS} characters"
        )
    if k is None or k == "":
        return query, DEFAULT_K
    if isinstance(k, str):
        try:
            k = int(k.strip())
        except ValueError:
            raise _RequestError(HTTPStatus.BAD_REQUEST, "bad_request",
                                f"'k' must be an integer, got {_SHORT.repr(k)}") from None
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise _RequestError(HTTPStatus.BAD_REQUEST, "bad_request",
                            f"'k' must be a positive integer, got {_SHORT.repr(k)}")
    return query, min(k, MAX_K)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
