"""Raw prompts: one prompt sent exactly as given (no adapter, no chat template), and the LM that takes it for
the model behind a chat LM."""

from __future__ import annotations

from typing import Any

import dspy

from arag.concurrency import lm_slot
from arag.lm.completions import CompletionsEngine
from arag.lm.engines import PromptEngine
from arag.lm.logprobs import TokenLogprob, completion_logprobs


def complete_raw(
    lm: dspy.BaseLM, prompt: str, *, top_logprobs: int | None = None, **config: Any
) -> tuple[str, list[TokenLogprob]]:
    """Send ``prompt`` as the single user message and return the completion text and its tokens.

    ``config`` overrides the LM's settings for this call (``stop``, ``max_tokens``, ``temperature`` ...).
    Cached like any DSPy call.
    """
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
    engine = getattr(lm, "engine", None)
    if isinstance(engine, PromptEngine):
        return engine.raw_prompt_lm(lm, keep_special_tokens)
    api_base = (getattr(lm, "kwargs", None) or {}).get("api_base")
    if api_base:
        return CompletionsEngine(api_base, lm.model.partition("/")[2], keep_special_tokens=keep_special_tokens).twin()
    return lm
