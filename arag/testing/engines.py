"""Scripted DSPy LMs: engines that answer each request through a responder, with chosen token
probabilities, latency and injected faults, and a DSPy cache of their own for a test.

A *responder* is a function ``responder(call: ScriptedCall)`` returning the answer: a dict
``{output field: value}`` for adapter calls (ChatAdapter or JSONAdapter), or a plain string for
raw prompts. A value may be a ``Scripted`` or ``Tokens`` to choose token probabilities.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import re
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import dspy
import pydantic
from dspy import lm15

from arag.lm import ThreadedAsyncEngine

TOKEN_PATTERN = re.compile(r" ?\w+| ?[^\w\s]|\s*\n+|\s+(?!\S)|\s+")
GARBAGE_TEXT = "Sorry, I lost track of the requested format."

_INPUTS_HEADING = "Your input fields are:"
_OUTPUTS_HEADING = "Your output fields are:"
_STRUCTURE_HEADING = "All interactions will be structured"
_OBJECTIVE_MARKER = "your objective is:"
_JSON_STRUCTURE_MARKER = "Outputs will be a JSON object"
_OUTPUT_REQUIREMENTS = ("\n\nRespond with the corresponding output fields", "\n\nRespond with a JSON object")
_LISTED_FIELD = re.compile(r"^\d+\. `(\w+)`", re.MULTILINE)
_FIELD_HEADER = re.compile(r"^\[\[ ## (\w+) ## \]\][ \t]*$", re.MULTILINE)


def tokenize(text: str) -> list[str]:
    """Split text into words (with their leading space), punctuation, newline runs and other whitespace.

    Joined, the tokens give the text back.
    """
    return TOKEN_PATTERN.findall(text)


def _check_prob(prob: float, what: str) -> float:
    if not 0.0 < prob <= 1.0:
        raise ValueError(f"{what} must be a probability in (0, 1], got {prob!r}")
    return float(prob)


@dataclass(frozen=True)
class ScriptedToken:
    """One token of a scripted answer, its probability and alternative tokens with theirs."""

    text: str
    prob: float = 1.0
    alternatives: tuple[tuple[str, float], ...] = ()

    @property
    def logprob(self) -> float:
        return math.log(self.prob)

    def top(self, k: int) -> list[tuple[str, float]]:
        """The k most probable candidates at this position (the token itself included), as (token, logprob)."""
        candidates = {self.text: self.prob}
        for token, prob in self.alternatives:
            candidates.setdefault(token, prob)
        ranked = sorted(candidates.items(), key=lambda item: -item[1])[:k]
        return [(token, math.log(prob)) for token, prob in ranked]


class Tokens:
    """A value given token by token: ``(token, prob)`` or ``(token, prob, {alternative: prob})``."""

    def __init__(self, pieces: Sequence[tuple]):
        tokens = []
        for piece in pieces:
            if len(piece) not in (2, 3):
                raise ValueError(f"a Tokens piece is (token, prob) or (token, prob, alternatives), got {piece!r}")
            token, prob = piece[0], _check_prob(piece[1], f"probability of {piece[0]!r}")
            alternatives = dict(piece[2]) if len(piece) == 3 else {}
            checked = tuple((alt, _check_prob(p, f"probability of {alt!r}")) for alt, p in alternatives.items())
            tokens.append(ScriptedToken(token, prob, checked))
        self.tokens: tuple[ScriptedToken, ...] = tuple(tokens)

    @property
    def text(self) -> str:
        return "".join(token.text for token in self.tokens)


class Scripted(Tokens):
    """A text value whose tokens (see ``tokenize``) get ``probs``: one probability for all, or one per token."""

    def __init__(self, text: str, probs: float | Sequence[float] = 1.0):
        pieces = tokenize(text)
        if isinstance(probs, (int, float)):
            probs = [probs] * len(pieces)
        if len(probs) != len(pieces):
            raise ValueError(f"Scripted({text!r}) has {len(pieces)} tokens {pieces}, but {len(probs)} probabilities")
        super().__init__(list(zip(pieces, probs)))


@dataclass(frozen=True)
class Faults:
    """Fractions of calls that fail, drawn from a generator seeded with ``seed`` (reproducible per engine).

    Timeouts, rate limits (HTTP 429) and server errors (HTTP 500) are raised as the lm15 errors DSPy
    retries, with a ``retry_after`` hint (seconds) so retries need not wait; ``unparseable`` calls
    answer text no adapter can parse.
    """

    timeout: float = 0.0
    rate_limit: float = 0.0
    server_error: float = 0.0
    unparseable: float = 0.0
    seed: int = 0
    retry_after: float = 0.0

    def __post_init__(self):
        rates = (self.timeout, self.rate_limit, self.server_error, self.unparseable)
        if any(not 0.0 <= rate <= 1.0 for rate in rates) or sum(rates) > 1.0:
            raise ValueError(f"fault rates must lie in [0, 1] and sum to at most 1, got {rates}")

    def draw(self, rng: random.Random) -> str | None:
        """The fault for the next call ('timeout', 'rate_limit', 'server_error', 'unparseable'), or None."""
        point = rng.random()
        for kind in ("timeout", "rate_limit", "server_error", "unparseable"):
            point -= getattr(self, kind)
            if point < 0:
                return kind
        return None

    def error(self, kind: str) -> lm15.LM15Error:
        """The lm15 error a real endpoint would cause for this fault."""
        if kind == "timeout":
            return lm15.TimeoutError("scripted fault: the request timed out", status=504, retry_after=self.retry_after)
        if kind == "rate_limit":
            return lm15.RateLimitError("scripted fault: rate limited", status=429, retry_after=self.retry_after)
        return lm15.ServerError("scripted fault: internal server error", status=500, retry_after=self.retry_after)


@dataclass(frozen=True)
class ScriptedCall:
    """What a responder sees of one request.

    ``instructions``: the signature's docstring; ``inputs``: input field name -> text, read from the
    ``[[ ## name ## ]]`` blocks of the last user message; ``output_fields``: names in signature order;
    ``prompt``: the system text and every message, joined by blank lines; ``model``: the requested model.
    ``adapter`` is "chat" or "json" for DSPy adapter prompts and "raw" for any other prompt
    (``raw`` is then True and ``prompt`` is exactly the text sent). ``input_fields``: the signature's input
    names, in its order (``inputs`` holds those the last message gave).
    """

    instructions: str
    inputs: dict[str, str]
    output_fields: list[str]
    prompt: str
    raw: bool
    adapter: str
    model: str = ""
    input_fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class ScriptedAnswer:
    """A rendered answer: its tokens and why generation stopped ("stop" or "length")."""

    tokens: tuple[ScriptedToken, ...]
    finish_reason: str = "stop"

    @property
    def text(self) -> str:
        return "".join(token.text for token in self.tokens)


def _listed_fields(system: str, heading: str, end_marker: str) -> list[str]:
    section = system.partition(heading)[2].partition(end_marker)[0]
    return _LISTED_FIELD.findall(section)


def _input_blocks(user_text: str, names: Sequence[str]) -> dict[str, str]:
    headers = list(_FIELD_HEADER.finditer(user_text))
    blocks = {}
    for index, header in enumerate(headers):
        end = headers[index + 1].start() if index + 1 < len(headers) else len(user_text)
        value = user_text[header.end() : end]
        if index + 1 == len(headers):
            cut = max(value.rfind(marker) for marker in _OUTPUT_REQUIREMENTS)
            value = value[:cut] if cut >= 0 else value
        if header.group(1) in names and header.group(1) not in blocks:
            blocks[header.group(1)] = value.strip()
    return blocks


def scripted_call(
    system: str | None,
    turns: Sequence[tuple[str, str]],
    *,
    json_mode: bool = False,
    raw: bool = False,
    model: str = "",
) -> ScriptedCall:
    """Read a request (system text and (role, text) turns) the way a responder sees it."""
    prompt = "\n\n".join(([system] if system else []) + [text for _, text in turns])
    if raw or not system or _OUTPUTS_HEADING not in system:
        return ScriptedCall("", {}, [], prompt, True, "raw", model)
    input_names = _listed_fields(system, _INPUTS_HEADING, _OUTPUTS_HEADING)
    output_names = _listed_fields(system, _OUTPUTS_HEADING, _STRUCTURE_HEADING)
    instructions = textwrap.dedent(system.partition(_OBJECTIVE_MARKER)[2]).strip()
    last_user = next((text for role, text in reversed(turns) if role == "user"), "")
    adapter = "json" if json_mode or _JSON_STRUCTURE_MARKER in system else "chat"
    inputs = _input_blocks(last_user, input_names)
    return ScriptedCall(instructions, inputs, output_names, prompt, False, adapter, model, tuple(input_names))


def _plain_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump_json()
    return json.dumps(value, ensure_ascii=False)


def _value_tokens(value: Any, default_prob: float) -> list[ScriptedToken]:
    if isinstance(value, Tokens):
        return list(value.tokens)
    return [ScriptedToken(piece, default_prob) for piece in tokenize(_plain_text(value))]


def _markup(text: str) -> list[ScriptedToken]:
    return [ScriptedToken(piece) for piece in tokenize(text)]


def _json_escaped(tokens: list[ScriptedToken]) -> list[ScriptedToken]:
    """Tokens of a JSON string's content: each token escaped on its own, so their concatenation stays valid."""

    def escape(text: str) -> str:
        return json.dumps(text, ensure_ascii=False)[1:-1]

    return [
        ScriptedToken(escape(token.text), token.prob, tuple((escape(alt), p) for alt, p in token.alternatives))
        for token in tokens
    ]


def _render(call: ScriptedCall, answer: Any, default_prob: float = 1.0) -> list[ScriptedToken]:
    """Tokens of a responder's answer in the format the call expects (markup tokens have probability 1)."""
    if not isinstance(answer, Mapping):
        return _value_tokens(answer, default_prob)
    if call.raw:
        raise ValueError("a raw prompt is answered with a string, Scripted or Tokens, not a dict")
    missing = [name for name in call.output_fields if name not in answer]
    unknown = [name for name in answer if name not in call.output_fields]
    if missing or unknown:
        raise ValueError(
            f"the responder must answer exactly {call.output_fields}; missing {missing}, unknown {unknown}"
        )
    tokens: list[ScriptedToken] = []
    if call.adapter == "json":
        for index, name in enumerate(call.output_fields):
            value = answer[name]
            textual = isinstance(value, (str, Tokens))
            quote = '"' if textual else ""
            tokens += _markup(("{" if index == 0 else ", ") + json.dumps(name) + ": " + quote)
            value_tokens = _value_tokens(value, default_prob)
            tokens += _json_escaped(value_tokens) if textual else value_tokens
            tokens += _markup(quote)
        return tokens + _markup("}")
    for index, name in enumerate(call.output_fields):
        tokens += _markup(("\n\n" if index else "") + f"[[ ## {name} ## ]]\n")
        tokens += _value_tokens(answer[name], default_prob)
    return tokens + _markup("\n\n[[ ## completed ## ]]")


def _limit(tokens: list[ScriptedToken], max_tokens: int | None, stop: Sequence[str]) -> ScriptedAnswer:
    text = "".join(token.text for token in tokens)
    cuts = [text.find(marker) for marker in stop if marker and marker in text]
    if cuts:
        cut, kept, position = min(cuts), [], 0
        for token in tokens:
            if position >= cut:
                break
            inside = position + len(token.text) <= cut
            kept.append(token if inside else ScriptedToken(token.text[: cut - position], token.prob))
            position += len(token.text)
        tokens = kept
    if max_tokens is not None and len(tokens) > max_tokens:
        return ScriptedAnswer(tuple(tokens[:max_tokens]), "length")
    return ScriptedAnswer(tuple(tokens), "stop")


class ScriptedEngine:
    """A DSPy engine answering every request through ``responder(call)``; counts calls and can inject faults.

    ``calls`` lists every request received, faulted ones included; ``faulted`` the kind of each injected fault.

    Pass it as ``dspy.LM(name, engine=ScriptedEngine(...))`` (``scripted_lm`` does this with a unique name).
    """

    supported_params = frozenset(
        {"temperature", "max_tokens", "stop", "logprobs", "top_logprobs", "response_format"}
    )

    def __init__(
        self,
        responder: Callable[[ScriptedCall], Any],
        *,
        default_prob: float = 1.0,
        latency: float = 0.0,
        faults: Faults | None = None,
    ):
        self.responder = responder
        self.default_prob = _check_prob(default_prob, "default_prob")
        self.latency = latency
        self.faults = faults
        self.calls: list[ScriptedCall] = []
        self.faulted: list[str] = []
        self._lock = threading.Lock()
        self._rng = random.Random(faults.seed if faults else 0)

    @property
    def attention_model(self) -> Any:
        """The responder's attention model (`StandInModel`'s tiny random Llama), for the programs that read a model's
        attention and entropies (DRAGIN); None when it carries none."""
        return getattr(self.responder, "attention_model", None)

    @property
    def count(self) -> int:
        """Requests received, faulted ones included."""
        with self._lock:
            return len(self.calls)

    def answer(
        self, call: ScriptedCall, *, max_tokens: int | None = None, stop: Sequence[str] = ()
    ) -> ScriptedAnswer:
        """Record the call, apply latency and faults, and render the responder's answer."""
        with self._lock:
            self.calls.append(call)
            fault = self.faults.draw(self._rng) if self.faults else None
            if fault:
                self.faulted.append(fault)
        if self.latency:
            time.sleep(self.latency)
        if fault == "unparseable":
            tokens = _markup(GARBAGE_TEXT)
        elif fault is not None:
            raise self.faults.error(fault)
        else:
            tokens = _render(call, self.responder(call), self.default_prob)
        return _limit(tokens, max_tokens, stop)

    def complete(self, request: lm15.Request) -> lm15.Response:
        system = request.system
        if system is not None and not isinstance(system, str):
            system = "".join(getattr(part, "text", "") for part in system)
        turns = [(message.role, message.text or "") for message in request.messages]
        json_mode = request.config.response_format is not None
        call = scripted_call(system, turns, json_mode=json_mode, model=request.model)
        answer = self.answer(call, max_tokens=request.config.max_tokens, stop=request.config.stop)
        top = request.config.logprobs
        logprobs = None
        if top is not None:
            logprobs = tuple(
                lm15.TokenLogprob(token.text, token.logprob, top=tuple(lm15.TopLogprob(*alt) for alt in token.top(top)))
                for token in answer.tokens
            )
        return lm15.Response(
            id=f"scripted-{uuid.uuid4().hex[:12]}",
            model=request.model,
            message=lm15.Message.assistant((lm15.TextPart(answer.text),)),
            finish_reason=answer.finish_reason,
            usage=lm15.Usage(input_tokens=len(tokenize(call.prompt)), output_tokens=len(answer.tokens)),
            logprobs=logprobs,
        )

    def stream(self, request: lm15.Request):
        yield from lm15.response_to_events(self.complete(request))

    def close(self) -> None:
        """Nothing to release."""

    def __deepcopy__(self, memo):
        return self


class NoLogprobsEngine(ScriptedEngine):
    """A ScriptedEngine playing an endpoint that never returns log-probabilities, even when asked."""

    def complete(self, request: lm15.Request) -> lm15.Response:
        return replace(super().complete(request), logprobs=None)


def scripted_lm(
    responder: Callable[[ScriptedCall], Any],
    *,
    default_prob: float = 1.0,
    latency: float = 0.0,
    faults: Faults | None = None,
    name: str | None = None,
    **lm_kwargs,
) -> dspy.LM:
    """A ``dspy.LM`` on a fresh ScriptedEngine (reachable as ``lm.engine``), named ``scripted/<uuid>``.

    The unique name keeps DSPy's cache, which is keyed by the request and not the engine, from answering
    one scripted LM with another's output. `name` gives another (for one model behind several engines, e.g. a
    run resumed after its endpoint failed: the run records the model's name). ``lm_kwargs`` go to ``dspy.LM``
    (e.g. ``logprobs=True``).
    """
    engine = ScriptedEngine(responder, default_prob=default_prob, latency=latency, faults=faults)
    name = name or f"scripted/{uuid.uuid4().hex}"
    return dspy.LM(name, engine=engine, async_engine=ThreadedAsyncEngine(engine), **lm_kwargs)


def no_logprobs_lm(responder: Callable[[ScriptedCall], Any]) -> dspy.LM:
    """A ``dspy.LM`` on a fresh NoLogprobsEngine, named ``scripted/<uuid>``."""
    return dspy.LM(f"scripted/{uuid.uuid4().hex}", engine=NoLogprobsEngine(responder))


@contextlib.contextmanager
def isolated_cache(*, enabled: bool = True, folder: str | Path | None = None) -> Iterator[Any]:
    """Point DSPy at a cache of its own (or at no cache) for the duration of the block: in `folder`, kept for a
    later run, or else in a temporary folder."""
    from dspy.clients.cache import Cache

    previous = dspy.cache
    with contextlib.ExitStack() as stack:
        where = str(folder) if folder is not None else stack.enter_context(
            tempfile.TemporaryDirectory(prefix="arag-dspy-cache-"))
        cache = Cache(enable_disk_cache=enabled, enable_memory_cache=enabled, disk_cache_dir=where)
        dspy.cache = cache
        try:
            yield cache
        finally:
            dspy.cache = previous
            if enabled:
                cache.disk_cache.close()
