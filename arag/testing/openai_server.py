"""A loopback HTTP server speaking the OpenAI chat-completions and completions wire format, answered by
a ScriptedEngine: the same script as ``scripted_lm``, over HTTP."""

from __future__ import annotations

import ipaddress
import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dspy import lm15

from arag.testing.engines import ScriptedAnswer, ScriptedCall, ScriptedEngine, scripted_call, tokenize


def _message_text(content: Any) -> str:
    if isinstance(content, list):
        texts = (part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text")
        return "".join(texts)
    return content or ""


def _usage(call: ScriptedCall, answer: ScriptedAnswer) -> dict[str, int]:
    prompt_tokens, completion_tokens = len(tokenize(call.prompt)), len(answer.tokens)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _stops(body: Mapping) -> list[str]:
    stop = body.get("stop") or []
    return [stop] if isinstance(stop, str) else list(stop)


def _chat_logprobs(answer: ScriptedAnswer, top: int) -> dict:
    def entry(token: str, logprob: float) -> dict:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    return {
        "content": [
            {**entry(token.text, token.logprob), "top_logprobs": [entry(*item) for item in token.top(top)]}
            for token in answer.tokens
        ]
    }


def _chat_completion(engine: ScriptedEngine, body: Mapping, dialect: str = "openai") -> dict:
    messages = [(m.get("role"), _message_text(m.get("content"))) for m in body.get("messages") or []]
    instructions = [text for role, text in messages if role in ("system", "developer")]
    turns = [(role, text) for role, text in messages if role not in ("system", "developer")]
    json_mode = body.get("response_format") is not None
    call = scripted_call("\n\n".join(instructions) or None, turns, json_mode=json_mode, model=body.get("model", ""))
    max_tokens = (body.get("max_tokens") if dialect == "llama.cpp"
                  else body.get("max_completion_tokens") or body.get("max_tokens"))
    # llama-cpp-python's server answers `logprobs: true` without `top_logprobs` with no log-probabilities.
    send_logprobs = body.get("logprobs") and (dialect != "llama.cpp" or body.get("top_logprobs"))
    choices, usage = [], {}
    for index in range(int(body.get("n") or 1)):
        answer = engine.answer(call, max_tokens=max_tokens, stop=_stops(body))
        choices.append({
            "index": index,
            "message": {"role": "assistant", "content": answer.text},
            "logprobs": _chat_logprobs(answer, int(body.get("top_logprobs") or 0)) if send_logprobs else None,
            "finish_reason": answer.finish_reason,
        })
        usage = _usage(call, answer)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", ""),
        "choices": choices,
        "usage": usage,
    }


def _completion_logprobs(answer: ScriptedAnswer, top: int) -> dict:
    offsets, position = [], 0
    for token in answer.tokens:
        offsets.append(position)
        position += len(token.text)
    return {
        "tokens": [token.text for token in answer.tokens],
        "token_logprobs": [token.logprob for token in answer.tokens],
        "top_logprobs": [dict(token.top(top)) for token in answer.tokens],
        "text_offset": offsets,
    }


def _text_completion(engine: ScriptedEngine, body: Mapping, dialect: str = "openai") -> dict:
    prompt = body.get("prompt") or ""
    prompt = prompt[0] if isinstance(prompt, list) else prompt
    call = scripted_call(None, [("user", prompt)], raw=True, model=body.get("model", ""))
    answer = engine.answer(call, max_tokens=body.get("max_tokens"), stop=_stops(body))
    logprobs = None
    if body.get("logprobs") is not None:
        # llama.cpp's /v1/completions answers in the chat shape; OpenAI's and vLLM's in the legacy one.
        shape = _chat_logprobs if dialect == "llama.cpp" else _completion_logprobs
        logprobs = shape(answer, int(body["logprobs"]))
    return {
        "id": f"cmpl-{uuid.uuid4().hex[:12]}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": body.get("model", ""),
        "choices": [{"index": 0, "text": answer.text, "logprobs": logprobs, "finish_reason": answer.finish_reason}],
        "usage": _usage(call, answer),
    }


_ROUTES = {"/v1/chat/completions": _chat_completion, "/v1/completions": _text_completion}


class OpenAICompatibleServer:
    """A loopback HTTP server speaking the OpenAI chat-completions and completions wire format.

    Answers come from a ScriptedEngine (``.engine``: calls, count, faults); ``.requests`` holds every
    received ``{"path", "body"}``. Use as a context manager; ``.url`` is ``http://127.0.0.1:PORT/v1``.
    Faults become HTTP 504 (timeout), 429 and 500 with ``Retry-After``. ``dialect="llama.cpp"`` behaves
    as llama-cpp-python's server does: it ignores ``max_completion_tokens``, returns no log-probabilities
    for ``logprobs: true`` without ``top_logprobs``, and sends /v1/completions log-probabilities in the
    chat shape.
    """

    def __init__(
        self, responder: Callable[[ScriptedCall], Any], host: str = "127.0.0.1", port: int = 0, *,
        dialect: str = "openai", **engine_kwargs
    ):
        if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"the scripted server binds loopback addresses only, not {host!r}")
        if dialect not in ("openai", "llama.cpp"):
            raise ValueError(f"dialect is 'openai' or 'llama.cpp', not {dialect!r}")
        self.dialect = dialect
        self.engine = ScriptedEngine(responder, **engine_kwargs)
        self.requests: list[dict] = []
        self._requests_lock = threading.Lock()
        self._httpd = ThreadingHTTPServer((host, port), self._handler_class())
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> OpenAICompatibleServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="scripted-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> OpenAICompatibleServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _record(self, path: str, body: Any) -> None:
        with self._requests_lock:
            self.requests.append({"path": path, "body": body})

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format, *args):
                pass

            def _send(self, status: int, payload: dict, retry_after: float | None = None) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    if retry_after is not None:
                        self.send_header("Retry-After", str(retry_after))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (a timeout test); nobody is left to answer

            def _error(self, status: int, message: str, retry_after: float | None = None) -> None:
                error = {"message": message, "type": "scripted_error", "code": status}
                self._send(status, {"error": error}, retry_after)

            def do_GET(self):
                if self.path.rstrip("/") == "/v1/models":
                    model = {"id": "scripted", "object": "model", "owned_by": "arag"}
                    self._send(200, {"object": "list", "data": [model]})
                else:
                    self._error(404, f"no route {self.path}")

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError as exc:
                    self._error(400, f"request body is not JSON: {exc}")
                    return
                server._record(self.path, body)
                route = _ROUTES.get(self.path.rstrip("/"))
                if route is None:
                    self._error(404, f"no route {self.path}")
                elif body.get("stream"):
                    self._error(400, "the scripted server does not stream; send stream=false")
                else:
                    self._answer(route, body)

            def _answer(self, route, body):
                try:
                    payload = route(server.engine, body, server.dialect)
                except lm15.LM15Error as exc:
                    self._error(exc.status or 500, exc.message, exc.retry_after)
                except Exception as exc:  # a responder bug: reported to the client, never retried
                    self._error(400, f"scripted responder failed: {exc!r}")
                else:
                    self._send(200, payload)

        return Handler
