"""The engine posting raw prompts to an OpenAI-compatible server's ``/v1/completions``, and its ``dspy.LM``."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

import dspy
from dspy import lm15
from dspy._vendor.lm15.errors import map_http_error

from arag.lm.defaults import DEFAULT_MAX_TOKENS, DEFAULT_TIMEOUT_S, PLACEHOLDER_API_KEY
from arag.lm.engines import PromptEngine, ThreadedAsyncEngine
from arag.lm.logprobs import lm15_tokens


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



class CompletionsEngine(PromptEngine):
    """A DSPy engine posting one prompt, exactly as given, to an OpenAI-compatible ``/v1/completions``.

    DSPy's own ``model_type="text"`` rewrites prompts; this engine sends the single user message's text
    unchanged and returns lm15 token log-probabilities, so DSPy's cache and retries still apply.
    The API key is read from ``api_key_env`` on first use (a placeholder when unset) and never saved.
    ``keep_special_tokens`` asks the server (vLLM's ``skip_special_tokens=false``) to keep special tokens
    in the text and log-probabilities, as Self-RAG's reflection tokens need.
    """

    state_fields = ("api_base", "model", "api_key_env", "timeout", "keep_special_tokens")

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

        prompt = self.prompt(request)
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
        details = getattr(counts, "prompt_tokens_details", None)  # a server's prefix cache (vLLM, OpenAI)
        usage = lm15.Usage(counts.prompt_tokens, counts.completion_tokens,
                           cache_read_tokens=getattr(details, "cached_tokens", None)) if counts else lm15.Usage()
        return lm15.Response(
            id=completion.id or None,
            model=completion.model or self.model,
            message=lm15.Message.assistant((lm15.TextPart(choice.text or ""),)),
            finish_reason="length" if choice.finish_reason == "length" else "stop",
            usage=usage,
            logprobs=tokens if request.config.logprobs is not None and tokens else None,
        )

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    @property
    def lm_name(self) -> str:
        return f"completions/{self.model}"

    def async_engine(self) -> AsyncCompletionsEngine:
        return AsyncCompletionsEngine(self)

    def raw_prompt_lm(self, lm: dspy.LM, keep_special_tokens: bool) -> dspy.LM:
        if self.keep_special_tokens == keep_special_tokens:
            return lm
        return self.twin(keep_special_tokens=keep_special_tokens)


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
    return engine.lm(temperature=temperature, max_tokens=max_tokens, **kwargs)
