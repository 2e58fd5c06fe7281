"""The LM layer: building DSPy LMs, reading token log-probabilities, raw prompts, and the engines behind them.

One job a module: ``build`` (``build_lm``, ``check_server``, ``require_lm``), ``logprobs`` (the one place token
log-probabilities are read), ``engines`` (what the engines share), ``completions`` (an OpenAI-compatible
server's ``/v1/completions``), ``raw_prompts`` (``complete_raw``, ``raw_prompt_lm``), ``local`` (a llama.cpp
model in this process), ``local_models`` (the named models it runs) and ``attention`` (a transformers model in this
process, for the attention weights and full-vocabulary entropies llama.cpp does not expose). Importing the package
registers nothing with DSPy: ``build_lm`` declares the ``openai-compatible`` provider when an LM needs it.
"""

from arag.lm.attention import AttentionModel, Generation, attention_model_for
from arag.lm.build import COMPATIBLE_PROVIDER, build_lm, check_server, register_compatible_provider, require_lm
from arag.lm.completions import AsyncCompletionsEngine, CompletionsEngine, completions_lm
from arag.lm.defaults import DEFAULT_MAX_TOKENS, DEFAULT_TIMEOUT_S, PLACEHOLDER_API_KEY
from arag.lm.engines import PromptEngine, ThreadedAsyncEngine
from arag.lm.local import LlamaEngine, local_lm
from arag.lm.logprobs import (
    TokenLogprob,
    completion_logprobs,
    field_logprobs,
    has_top_logprobs,
    label_probabilities,
    lm15_tokens,
    token_label_probabilities,
)
from arag.lm.raw_prompts import complete_raw, raw_prompt_lm

__all__ = [
    "COMPATIBLE_PROVIDER",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_TIMEOUT_S",
    "PLACEHOLDER_API_KEY",
    "AsyncCompletionsEngine",
    "AttentionModel",
    "CompletionsEngine",
    "Generation",
    "LlamaEngine",
    "PromptEngine",
    "ThreadedAsyncEngine",
    "TokenLogprob",
    "attention_model_for",
    "build_lm",
    "check_server",
    "complete_raw",
    "completion_logprobs",
    "completions_lm",
    "field_logprobs",
    "has_top_logprobs",
    "label_probabilities",
    "lm15_tokens",
    "local_lm",
    "raw_prompt_lm",
    "register_compatible_provider",
    "require_lm",
    "token_label_probabilities",
]
