"""Building DSPy LMs, reading token log-probabilities, and raw ``/v1/completions`` calls.

This is the one place the project reads log-probabilities: ``completion_logprobs`` (a whole
completion), ``field_logprobs`` (one output field of a prediction), ``label_probabilities`` (a label field)
and ``token_label_probabilities`` (labels at one token position, e.g. a model's reflection tokens).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import math
import os
import re
import socket
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from json.decoder import scanstring
from typing import Any
from urllib.parse import urlsplit

import dspy
from dspy import lm15
from dspy._vendor.lm15.errors import map_http_error
from dspy.utils.exceptions import LMConfigurationError

from arag.errors import ConfigError, LMError

PLACEHOLDER_API_KEY = "no-key-needed"
DEFAULT_MAX_TOKENS = 4096  # a cap: each call asks for what its output fields need (arag.adapters)
COMPATIBLE_PROVIDER = "openai-compatible"
DEFAULT_TIMEOUT_S = 120.0

_ENABLE_LOGPROBS_HINT = (
    "build the LM with logprobs=True (arag.build_lm(..., logprobs=True, top_logprobs=5), or "
    "dspy.Predict(..., logprobs=True)) and use an endpoint that returns log-probabilities "
    "(OpenAI, vLLM and llama.cpp servers do; not every provider does)"
)


def _register_compatible_provider() -> None:
    """`openai-compatible/MODEL`: the OpenAI chat wire with `max_tokens`, which every OpenAI-compatible server
    honours (DSPy's `openai/` route sends only `max_completion_tokens`, which llama.cpp's server ignores)."""
    from dspy._vendor.lm15.compat import OpenAIChatCompat
    from dspy._vendor.lm15.registry import ProviderDefinition

    compat = dataclasses.replace(OpenAIChatCompat.preset("openai"), max_tokens_field="max_tokens",
                                 thinking_format="none")
    access = lm15.AccessPolicy(provider=COMPATIBLE_PROVIDER, env_keys=("OPENAI_API_KEY",), base_url="http://127.0.0.1:8000/v1")
    dspy.lm15.register_provider(ProviderDefinition.chat(access, compat=compat),
                                supports=dspy.lm15.ModelSupport(response_schema=True))


_register_compatible_provider()


def build_lm(
    model: str,
    *,
    api_base: str | None = None,
    api_key_env: str = "OPENAI_API_KEY",
    logprobs: bool = False,
    top_logprobs: int | None = None,
    temperature: float | None = 0.0,
    max_tokens: int | None = DEFAULT_MAX_TOKENS,
    cache: bool = True,
    **kwargs: Any,
) -> dspy.LM:
    """A ``dspy.LM`` for ``provider/model``, e.g. ``openai/gpt-4o-mini``, or ``openai/MODEL`` with
    ``api_base="http://HOST:PORT/v1"`` for any OpenAI-compatible server (vLLM, Ollama, llama.cpp), or
    ``local`` / ``local:PATH.gguf`` for a llama.cpp model in this process (``arag.local``; its options
    ``context_length`` and ``threads`` go in ``kwargs``).

    For ``openai/`` models and any model at ``api_base`` the key is read from the environment
    variable ``api_key_env`` (a local server without one gets a placeholder); other providers read
    their own variable (e.g. ``ANTHROPIC_API_KEY``) inside DSPy. ``openai/MODEL`` at an ``api_base``
    becomes ``openai-compatible/MODEL``, which sends ``max_tokens``. Extra ``kwargs`` go to ``dspy.LM``.
    """
    if top_logprobs is not None and not logprobs:
        raise ConfigError(f"top_logprobs={top_logprobs} needs logprobs=True")
    if model == "local" or model.startswith("local:"):
        from arag.local import local_lm

        if api_base:
            raise ConfigError("--lm local runs the model in this process; it takes no --api-base")
        options = {"logprobs": True, "top_logprobs": top_logprobs or 5} if logprobs else {}
        return local_lm(model, temperature=temperature, max_tokens=max_tokens, cache=cache, **options, **kwargs)
    provider, slash, name = model.partition("/")
    if not (slash and provider and name):
        raise ConfigError(
            f"LM {model!r} has no provider prefix: write it as provider/model, e.g. openai/gpt-4o-mini, "
            f"or openai/{model or 'MODEL'} with api_base=http://HOST:PORT/v1 for an OpenAI-compatible server"
        )
    settings = dict(kwargs)
    if logprobs:
        settings["logprobs"] = True
        if top_logprobs is not None:
            settings["top_logprobs"] = top_logprobs
    if api_base:
        settings["api_base"] = api_base
        # DSPy's cache key leaves the address out: without the endpoint in the rollout id (part of the key, never
        # sent), two servers answering under one model name would answer for each other from the cache.
        settings.setdefault("rollout_id", f"endpoint {api_base}")
        if provider == "openai":
            model = f"{COMPATIBLE_PROVIDER}/{name}"
            if "extra_body" in settings:  # server-specific fields: only DSPy's LiteLLM engine carries them
                settings.setdefault("engine", "litellm")
    if api_base or provider == "openai":
        key = os.environ.get(api_key_env)
        if not key and not api_base:
            raise ConfigError(
                f"{api_key_env} is not set: export {api_key_env}=<your key> for {model}, name the variable that "
                "holds it (--api-key-env VAR, or api_key_env= in Python), or for a local OpenAI-compatible "
                "server give its address (--api-base http://HOST:PORT/v1, or api_base=)"
            )
        settings["api_key"] = key or PLACEHOLDER_API_KEY
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="rollout_id has no effect")  # it keys the cache, as meant
            return dspy.LM(model, temperature=temperature, max_tokens=max_tokens, cache=cache, **settings)
    except (ValueError, TypeError, LMConfigurationError) as exc:
        raise ConfigError(f"cannot build LM {model!r}: {exc}") from exc


def check_server(api_base: str, timeout: float = 5.0) -> None:
    """Fail fast when nothing listens at an OpenAI-compatible server's address: a ConfigError for a URL that
    is not http(s)://HOST[:PORT]/..., an LMError when no connection can be opened (instead of every call
    failing after DSPy's retries)."""
    parts = urlsplit(api_base)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise ConfigError(f"--api-base must be a URL such as http://127.0.0.1:8000/v1, got {api_base!r}")
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError as exc:
        raise LMError(f"cannot reach the LM server at {api_base} ({exc.strerror or exc}): start it, or fix "
                      "--api-base") from None


def require_lm() -> dspy.BaseLM:
    """The configured ``dspy.settings.lm``; a ConfigError saying how to configure one if there is none."""
    lm = dspy.settings.lm
    if lm is None:
        raise ConfigError(
            "no LM is configured. In Python: dspy.configure(lm=arag.build_lm('local')) for the bundled local model, "
            "or arag.build_lm('openai/MODEL'), adding api_base='http://HOST:PORT/v1' for an OpenAI-compatible server. "
            "On the command line: --lm local, or --lm openai/MODEL [--api-base URL]. The API key is read from "
            "OPENAI_API_KEY (a local server needs none)."
        )
    return lm


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token, its log-probability, and the top candidates ``(token, logprob)`` at its position."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()

    @property
    def prob(self) -> float:
        return math.exp(self.logprob)


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def _raw_logprobs(source: Any) -> Any:
    if isinstance(source, lm15.Response):
        return source.logprobs
    if isinstance(source, dspy.Example):
        return source.get("logprobs")
    if isinstance(source, Mapping) and "content" not in source:
        return source.get("logprobs")
    return source


def _missing_logprobs(what: str) -> LMError:
    lm = dspy.settings.lm
    configured = f" (configured LM: {lm.model})" if getattr(lm, "model", None) else ""
    return LMError(f"{what} carries no token log-probabilities{configured}: {_ENABLE_LOGPROBS_HINT}")


def completion_logprobs(source: Any) -> list[TokenLogprob]:
    """The tokens of a whole completion, adapter markup included.

    ``source`` is a prediction (``pred.logprobs``), an LM call output (``{"text", "logprobs"}``), an
    ``lm15.Response``, or a logprobs object itself; native, LiteLLM and custom-engine shapes alike.
    """
    raw = _raw_logprobs(source)
    entries = raw if raw is None or isinstance(raw, (list, tuple)) else _get(raw, "content")
    if not entries:
        raise _missing_logprobs("the prediction" if isinstance(source, dspy.Example) else "the LM output")
    tokens = []
    for entry in entries:
        top = _get(entry, "top_logprobs")
        top = _get(entry, "top") if top is None else top
        tokens.append(
            TokenLogprob(
                token=_get(entry, "token"),
                logprob=float(_get(entry, "logprob")),
                top=tuple((_get(item, "token"), float(_get(item, "logprob"))) for item in top or ()),
            )
        )
    return tokens


_CHAT_HEADER = re.compile(r"^[ \t]*\[\[ ## (\w+) ## \]\][ \t]*", re.MULTILINE)


def _chat_span(text: str, field: str) -> tuple[int, int] | None:
    headers = list(_CHAT_HEADER.finditer(text))
    for index, header in enumerate(headers):
        if header.group(1) == field:
            start = header.end()
            end = headers[index + 1].start() if index + 1 < len(headers) else len(text)
            while start < end and text[start].isspace():
                start += 1
            while end > start and text[end - 1].isspace():
                end -= 1
            return start, end
    return None


def _skip_space(text: str, index: int) -> int:
    while index < len(text) and text[index].isspace():
        index += 1
    return index


def _json_span(text: str, field: str) -> tuple[int, int] | None:
    """Span of a top-level member's value in the first JSON object of text (a string's content, without quotes;
    to the end of the text when the completion stopped inside it)."""
    index = text.find("{")
    if index < 0:
        return None
    decoder = json.JSONDecoder(strict=False)
    index = _skip_space(text, index + 1)
    try:
        while text.startswith('"', index):
            key, index = scanstring(text, index + 1, False)
            index = _skip_space(text, index)
            if not text.startswith(":", index):
                return None
            index = _skip_space(text, index + 1)
            if text.startswith('"', index):
                try:
                    _, end = scanstring(text, index + 1, False)
                except ValueError:
                    if key != field:
                        raise
                    return index + 1, len(text.rstrip())  # a string cut short by the token budget
                span = (index + 1, end - 1)
            else:
                _, end = decoder.raw_decode(text, index)
                span = (index, end)
            if key == field:
                return span
            index = _skip_space(text, end)
            if not text.startswith(",", index):
                return None
            index = _skip_space(text, index + 1)
    except ValueError:
        return None
    return None


@dataclass(frozen=True)
class _FieldTokens:
    tokens: list[TokenLogprob]  # as generated (a JSON string's escapes included)
    head: str
    tail: str
    spelled: list[TokenLogprob]  # each token's share of the field's value, as the adapter parsed it


def _json_unescaped(raw: str) -> list[str]:
    """For each character of a JSON string's raw content, the text it stands for: an escape sequence decodes at
    its backslash and its other characters stand for nothing."""
    out, index = [], 0
    while index < len(raw):
        if raw[index] == "\\" and index + 1 < len(raw):
            width = 6 if raw[index + 1] == "u" else 2
            sequence = raw[index:index + width]
            try:
                out.append(json.loads(f'"{sequence}"'))
            except ValueError:  # cut short by the token budget
                out.append(sequence)
            out.extend([""] * (len(sequence) - 1))
            index += len(sequence)
        else:
            out.append(raw[index])
            index += 1
    return out


def _field_tokens(source: Any, field: str) -> _FieldTokens:
    tokens = completion_logprobs(source)
    text = "".join(token.token for token in tokens)
    span = _chat_span(text, field) or _json_span(text, field)
    if span is None:
        raise LMError(
            f"output field {field!r} is not in the completion (neither a [[ ## {field} ## ]] section nor a JSON "
            "member): the LM did not produce it, or its answer was cut short (raise max_tokens)"
        )
    start, end = span
    selected, position = [], 0
    for token in tokens:
        token_start, position = position, position + len(token.token)
        if token_start < end and position > start:
            selected.append((token, token_start))
    while selected and not selected[0][0].token.strip():
        selected.pop(0)
    while selected and not selected[-1][0].token.strip():
        selected.pop()
    if not selected:
        return _FieldTokens([], "", "", [])
    first, first_start = selected[0]
    head = first.token[: max(start - first_start, 0)]
    tail = first.token[max(end - first_start, 0) :] if first_start + len(first.token) > end else ""
    spelled = [token for token, _ in selected]
    if start > 0 and text[start - 1] == '"' and _chat_span(text, field) is None:  # a JSON string's content
        decoded = _json_unescaped(text[start:end])
        spelled = [
            replace(token, token="".join(decoded[max(at, start) - start : min(at + len(token.token), end) - start]))
            for token, at in selected
        ]
    return _FieldTokens([token for token, _ in selected], head, tail, spelled)


def field_logprobs(prediction: Any, field: str) -> list[TokenLogprob]:
    """The tokens of one output field's text, for ChatAdapter (``[[ ## field ## ]]``) and JSON output.

    Tokens partly inside the field's text are included (e.g. a token joining a JSON quote and a word);
    whitespace-only tokens at either end are not. A JSON string's tokens are spelled as its value: their
    text is their share of it, escapes decoded and quotes left out, so that they join into the value
    the adapter parsed (e.g. `\\"hi\\"` comes back as `"hi"`).
    """
    return _field_tokens(prediction, field).spelled


def _matching_label(candidate: str, labels: Sequence[str]) -> str | None:
    text = candidate.strip().lower()
    if not text:
        return None
    exact = [label for label in labels if label.lower() == text]
    if exact:
        return exact[0]
    prefixed = [label for label in labels if label.lower().startswith(text)]
    return prefixed[0] if len(prefixed) == 1 else None

def has_top_logprobs(prediction: dspy.Prediction, field: str) -> bool:
    """Whether the LM returned the top candidates of the field's first token (logprobs and top_logprobs)."""
    if not prediction.get("logprobs"):
        return False
    tokens = field_logprobs(prediction, field)
    return bool(tokens and tokens[0].top)


def label_probabilities(prediction: Any, field: str, labels: Sequence[str]) -> dict[str, float]:
    """Probability of each label for a classification-like output field, normalised over ``labels``.

    Read from the top candidates of the field's first token: a candidate counts for the label it spells
    or begins (case-insensitive, surrounding whitespace ignored, so " Yes" and "yes" both count for "Yes").
    Labels should differ in their first token. All zeros when no candidate matches any label.
    """
    found = _field_tokens(prediction, field)
    if not found.tokens:
        raise LMError(f"output field {field!r} is empty: there is no token to read label probabilities from")
    first = found.tokens[0]
    if not first.top:
        raise LMError(
            f"the first token of field {field!r} has no top log-probabilities: build the LM with logprobs=True "
            f"and top_logprobs=k (k at least {len(labels)}, e.g. 5), on an endpoint that returns them"
        )

    def label_of(token: str) -> str | None:
        if found.head and token.startswith(found.head):
            token = token[len(found.head) :]
        if found.tail and token.endswith(found.tail):
            token = token[: -len(found.tail)]
        return _matching_label(token, labels)

    return token_label_probabilities(first, label_of, labels)


def token_label_probabilities(token: TokenLogprob, label_of: Callable[[str], str | None],
                              labels: Sequence[str]) -> dict[str, float]:
    """Each label's probability at one token position: the probability mass of the token and its top candidates
    that `label_of` maps to the label, normalised over `labels` (all zeros when none maps to any)."""
    candidates = dict(token.top)
    candidates.setdefault(token.token, token.logprob)
    masses = dict.fromkeys(labels, 0.0)
    for candidate, logprob in candidates.items():
        label = label_of(candidate)
        if label is not None:
            masses[label] += math.exp(logprob)
    total = sum(masses.values())
    return {label: (mass / total if total else 0.0) for label, mass in masses.items()}


class ThreadedAsyncEngine:
    """The async counterpart of a sync engine: each call runs in a worker thread."""

    def __init__(self, engine: Any):
        self.engine = engine

    async def complete(self, request: lm15.Request) -> lm15.Response:
        return await asyncio.to_thread(self.engine.complete, request)

    async def stream(self, request: lm15.Request):
        for event in lm15.response_to_events(await self.complete(request)):
            yield event

    async def aclose(self) -> None:
        await asyncio.to_thread(self.engine.close)


def _retry_after(headers: Any) -> float | None:
    try:
        return float(headers.get("retry-after"))
    except (TypeError, ValueError, AttributeError):
        return None


def _completions_arguments(config: lm15.Config, keep_special_tokens: bool = False) -> dict[str, Any]:
    refused = [name for name in ("response_format", "tool_choice", "reasoning") if getattr(config, name) is not None]
    if refused:
        raise lm15.UnsupportedFeatureError(
            f"/v1/completions takes a plain prompt; it has no {', '.join(refused)}", feature=f"config.{refused[0]}"
        )
    arguments = {
        name: getattr(config, name)
        for name in ("max_tokens", "temperature", "top_p", "seed", "frequency_penalty", "presence_penalty")
        if getattr(config, name) is not None
    }
    if config.stop:
        arguments["stop"] = list(config.stop)
    if config.logprobs is not None:
        arguments["logprobs"] = config.logprobs
    extra = dict(config.extensions or {})
    if config.top_k is not None:
        extra["top_k"] = config.top_k
    if keep_special_tokens:
        extra["skip_special_tokens"] = False
    if extra:
        arguments["extra_body"] = extra
    return arguments


def lm15_tokens(logprobs: Any, top: int | None = None) -> tuple[lm15.TokenLogprob, ...]:
    """lm15 tokens from a completion's log-probabilities in either shape servers send (dicts or SDK objects):
    the chat shape ``content[] = {token, logprob, top_logprobs[]}`` (chat calls everywhere, and llama.cpp's
    /v1/completions), or the legacy completions shape ``tokens`` / ``token_logprobs`` / ``top_logprobs``
    (``{token: logprob}`` per position; OpenAI's and vLLM's /v1/completions). ``top`` caps the candidates kept."""

    def token(text: str, logprob: Any, alternatives: list[tuple[str, float]]) -> lm15.TokenLogprob:
        alternatives = sorted(alternatives, key=lambda item: -item[1])[:top]
        return lm15.TokenLogprob(text, float(logprob), top=tuple(lm15.TopLogprob(t, lp) for t, lp in alternatives))

    content = _get(logprobs, "content")
    if content is not None:
        return tuple(
            token(_get(entry, "token"), _get(entry, "logprob"),
                  [(_get(alt, "token"), float(_get(alt, "logprob"))) for alt in _get(entry, "top_logprobs") or ()])
            for entry in content
        )
    tokens = _get(logprobs, "tokens") or []
    tops = _get(logprobs, "top_logprobs") or [None] * len(tokens)
    return tuple(
        token(text, logprob, [(t, float(lp)) for t, lp in (alternatives or {}).items()])
        for text, logprob, alternatives in zip(tokens, _get(logprobs, "token_logprobs") or [], tops)
    )


class CompletionsEngine:
    """A DSPy engine posting one prompt, exactly as given, to an OpenAI-compatible ``/v1/completions``.

    DSPy's own ``model_type="text"`` rewrites prompts; this engine sends the single user message's text
    unchanged and returns lm15 token log-probabilities, so DSPy's cache and retries still apply.
    The API key is read from ``api_key_env`` on first use (a placeholder when unset) and never saved.
    ``keep_special_tokens`` asks the server (vLLM's ``skip_special_tokens=false``) to keep special tokens
    in the text and log-probabilities, as Self-RAG's reflection tokens need.
    """

    def __init__(
        self, api_base: str, model: str, api_key_env: str = "OPENAI_API_KEY", timeout: float = DEFAULT_TIMEOUT_S,
        keep_special_tokens: bool = False,
    ):
        self.api_base = api_base
        self.model = model
        self.api_key_env = api_key_env
        self.timeout = timeout
        self.keep_special_tokens = keep_special_tokens
        self._client = None
        self._lock = threading.Lock()

    def _openai(self):
        with self._lock:
            if self._client is None:
                import openai

                self._client = openai.OpenAI(
                    base_url=self.api_base,
                    api_key=os.environ.get(self.api_key_env) or PLACEHOLDER_API_KEY,
                    timeout=self.timeout,
                    max_retries=0,
                )
            return self._client

    def complete(self, request: lm15.Request) -> lm15.Response:
        import openai

        if request.system or len(request.messages) != 1 or request.messages[0].role != "user" or request.tools:
            raise lm15.UnsupportedFeatureError(
                "CompletionsEngine sends one raw prompt: call it with a single user message "
                "(arag.lm.complete_raw(lm, prompt)), not through a DSPy adapter",
                feature="messages",
            )
        prompt = request.messages[0].text or ""
        try:
            completion = self._openai().completions.create(
                model=self.model, prompt=prompt, **_completions_arguments(request.config, self.keep_special_tokens)
            )
        except openai.APITimeoutError as exc:
            raise lm15.TimeoutError(f"{self.api_base}/completions timed out after {self.timeout}s") from exc
        except openai.APIConnectionError as exc:
            raise lm15.TransportError(f"cannot reach {self.api_base}/completions: {exc}") from exc
        except openai.APIStatusError as exc:
            raise map_http_error(
                exc.status_code, exc.message, provider="completions", retry_after=_retry_after(exc.response.headers)
            ) from exc
        return self._response(completion, request)

    def _response(self, completion: Any, request: lm15.Request) -> lm15.Response:
        choice = completion.choices[0]
        tokens = lm15_tokens(choice.logprobs, request.config.logprobs) if choice.logprobs is not None else ()
        counts = completion.usage
        usage = lm15.Usage(counts.prompt_tokens, counts.completion_tokens) if counts else lm15.Usage()
        return lm15.Response(
            id=completion.id or None,
            model=completion.model or self.model,
            message=lm15.Message.assistant((lm15.TextPart(choice.text or ""),)),
            finish_reason="length" if choice.finish_reason == "length" else "stop",
            usage=usage,
            logprobs=tokens if request.config.logprobs is not None and tokens else None,
        )

    def stream(self, request: lm15.Request):
        yield from lm15.response_to_events(self.complete(request))

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def dump_state(self) -> dict[str, Any]:
        return {
            "api_base": self.api_base,
            "model": self.model,
            "api_key_env": self.api_key_env,
            "timeout": self.timeout,
            "keep_special_tokens": self.keep_special_tokens,
        }

    @classmethod
    def load_state(cls, state: Mapping[str, Any]) -> CompletionsEngine:
        return cls(**state)

    def __reduce__(self):
        return type(self), (self.api_base, self.model, self.api_key_env, self.timeout, self.keep_special_tokens)


class AsyncCompletionsEngine(ThreadedAsyncEngine):
    """The async counterpart of CompletionsEngine, savable with a program."""

    def dump_state(self) -> dict[str, Any]:
        return self.engine.dump_state()

    @classmethod
    def load_state(cls, state: Mapping[str, Any]) -> AsyncCompletionsEngine:
        return cls(CompletionsEngine.load_state(state))


def completions_lm(
    model: str,
    api_base: str,
    *,
    api_key_env: str = "OPENAI_API_KEY",
    timeout: float = DEFAULT_TIMEOUT_S,
    temperature: float | None = 0.0,
    max_tokens: int | None = DEFAULT_MAX_TOKENS,
    keep_special_tokens: bool = False,
    **kwargs: Any,
) -> dspy.LM:
    """A ``dspy.LM`` named ``completions/<model>`` that sends raw prompts to ``api_base``'s /v1/completions.

    Call it through ``complete_raw``; extra ``kwargs`` (e.g. ``stop``, ``cache``) go to ``dspy.LM``.
    """
    engine = CompletionsEngine(api_base, model, api_key_env=api_key_env, timeout=timeout,
                               keep_special_tokens=keep_special_tokens)
    return dspy.LM(
        f"completions/{model}",
        engine=engine,
        async_engine=AsyncCompletionsEngine(engine),
        temperature=temperature,
        max_tokens=max_tokens,
        **kwargs,
    )


def complete_raw(
    lm: dspy.BaseLM, prompt: str, *, top_logprobs: int | None = None, **config: Any
) -> tuple[str, list[TokenLogprob]]:
    """Send ``prompt`` as the single user message and return the completion text and its tokens.

    ``config`` overrides the LM's settings for this call (``stop``, ``max_tokens``, ``temperature`` ...).
    Cached like any DSPy call.
    """
    from arag.concurrency import lm_slot

    if top_logprobs is not None:
        config["top_logprobs"] = top_logprobs
    with lm_slot():
        output = lm(prompt, logprobs=True, **config)[0]
    text = output.get("text") or ""
    return (text, completion_logprobs(output)) if text else ("", [])


def raw_prompt_lm(lm: dspy.BaseLM, *, keep_special_tokens: bool = False) -> dspy.BaseLM:
    """The LM that sends raw prompts to the model behind ``lm``: the /v1/completions of its OpenAI-compatible
    server (``api_base``, or a completions engine's), the same local GGUF model without its chat template,
    else ``lm`` itself (e.g. a scripted LM). ``keep_special_tokens`` asks the server to keep special tokens
    in its text and log-probabilities (Self-RAG's reflection tokens)."""
    from arag.local import raw_twin

    engine = getattr(lm, "engine", None)
    if isinstance(engine, CompletionsEngine):
        if engine.keep_special_tokens == keep_special_tokens:
            return lm
        return _completions_lm(engine.api_base, engine.model, engine.api_key_env, engine.timeout, keep_special_tokens)
    twin = raw_twin(lm)
    if twin is not None:
        return twin
    api_base = (getattr(lm, "kwargs", None) or {}).get("api_base")
    if api_base:
        return _completions_lm(api_base, lm.model.partition("/")[2], "OPENAI_API_KEY", DEFAULT_TIMEOUT_S,
                               keep_special_tokens)
    return lm


@functools.lru_cache(maxsize=None)
def _completions_lm(api_base: str, model: str, api_key_env: str, timeout: float, keep_special_tokens: bool) -> dspy.LM:
    return completions_lm(model, api_base, api_key_env=api_key_env, timeout=timeout,
                          keep_special_tokens=keep_special_tokens)
