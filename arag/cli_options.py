"""Options and option handling shared by the `arag` commands that run programs (eval, compile, tune)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import ujson

from arag.errors import ConfigError


def lm_options(fn):
    """--lm, --api-base, --api-key-env and --logprobs."""
    fn = click.option("--logprobs", is_flag=True,
                      help="Ask the LM for token log-probabilities on every call (traces then carry answer confidence).")(fn)
    fn = click.option("--api-key-env", default="OPENAI_API_KEY", show_default=True,
                      help="Environment variable holding the API key.")(fn)
    fn = click.option("--api-base", envvar="ARAG_API_BASE",
                      help="Base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1.")(fn)
    fn = click.option("--lm", "lm_spec", envvar="ARAG_LM", help="provider/model, e.g. openai/gpt-4o-mini (or set ARAG_LM).")(fn)
    return fn


def retriever_options(fn):
    """--corpus and --retriever."""
    fn = click.option("--retriever", "retriever_spec", help="An index folder, bm25:DIR, or another retriever spec.")(fn)
    fn = click.option("--corpus", type=click.Path(), help="Corpus file; its BM25 index is built on first use and reused.")(fn)
    return fn


def lm_from_options(lm_spec: str | None, api_base: str | None, api_key_env: str, logprobs: bool):
    """The dspy.LM the options describe; a clear error when none is given. Its server is checked later,
    by `check_lm_server`, once the local inputs have been read."""
    from arag.lm import build_lm

    if not lm_spec:
        raise ConfigError("no LM configured: pass --lm provider/model (with --api-base URL for a local "
                          "OpenAI-compatible server such as vLLM or Ollama), or set ARAG_LM")
    return build_lm(lm_spec, api_base=api_base, api_key_env=api_key_env, logprobs=logprobs,
                    top_logprobs=5 if logprobs else None)


def check_lm_server(api_base: str | None) -> None:
    """Fail fast, before any work, when nothing listens at --api-base."""
    from arag.lm import check_server

    if api_base:
        check_server(api_base)


def given_params(params_file: str | None, pairs: tuple[str, ...]) -> dict[str, Any]:
    """Program parameters from --params-file, overridden by --param key=value pairs (values still unchecked)."""
    from arag.programs.params import parse_assignments

    return {**read_params_file(params_file), **parse_assignments(pairs)}


def read_params_file(path: str | None) -> dict[str, Any]:
    """A JSON object of parameters, or the `params` object inside one (as `arag tune` writes)."""
    if path is None:
        return {}
    try:
        data = ujson.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"--params-file {path}: no such file") from None
    except ValueError as exc:
        raise ConfigError(f"--params-file {path}: not valid JSON ({exc})") from None
    data = data.get("params", data) if isinstance(data, dict) else data
    if not isinstance(data, dict):
        raise ConfigError(f"--params-file {path}: expected a JSON object of parameters")
    return data
