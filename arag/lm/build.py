"""Building DSPy LMs (``build_lm``), checking a server is there (``check_server``), and the configured LM
(``require_lm``)."""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import warnings
from typing import Any
from urllib.parse import urlsplit

import dspy
from dspy import lm15
from dspy.utils.exceptions import LMConfigurationError

from arag.errors import ConfigError, LMError
from arag.lm.defaults import DEFAULT_MAX_TOKENS, PLACEHOLDER_API_KEY
from arag.lm.local import local_lm

COMPATIBLE_PROVIDER = "openai-compatible"


@functools.cache
def register_compatible_provider() -> None:
    """Declare `openai-compatible/MODEL` to DSPy, once per process: the OpenAI chat wire with `max_tokens`, which
    every OpenAI-compatible server honours (DSPy's `openai/` route sends only `max_completion_tokens`, which
    llama.cpp's server ignores). ``build_lm`` calls it for the LMs that need it; a ``dspy.LM`` built directly
    on this provider needs it called first."""
    from dspy._vendor.lm15.compat import OpenAIChatCompat
    from dspy._vendor.lm15.registry import ProviderDefinition

    compat = dataclasses.replace(OpenAIChatCompat.preset("openai"), max_tokens_field="max_tokens",
                                 thinking_format="none")
    access = lm15.AccessPolicy(provider=COMPATIBLE_PROVIDER, env_keys=("OPENAI_API_KEY",), base_url="http://127.0.0.1:8000/v1")
    dspy.lm15.register_provider(ProviderDefinition.chat(access, compat=compat),
                                supports=dspy.lm15.ModelSupport(response_schema=True))


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
    ``local`` / ``local:PATH.gguf`` for a llama.cpp model in this process (``arag.lm.local``; its options
    ``context_length`` and ``threads`` go in ``kwargs``).

    For ``openai/`` models and any model at ``api_base`` the key is read from the environment
    variable ``api_key_env`` (a local server without one gets a placeholder); other providers read
    their own variable (e.g. ``ANTHROPIC_API_KEY``) inside DSPy. ``openai/MODEL`` at an ``api_base``
    becomes ``openai-compatible/MODEL``, which sends ``max_tokens``. Extra ``kwargs`` go to ``dspy.LM``.
    """
    if top_logprobs is not None and not logprobs:
        raise ConfigError(f"top_logprobs={top_logprobs} needs logprobs=True")
    if model == "local" or model.startswith("local:"):
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
    if model.startswith(f"{COMPATIBLE_PROVIDER}/"):
        register_compatible_provider()
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
