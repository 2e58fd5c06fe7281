"""Options and option handling shared by the `arag` commands that run programs (eval, compile, tune)."""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from typing import Any

import click
import ujson

from arag.errors import ConfigError
from arag.setup import LMSetup

# --lm-arg settings whose type arag knows, with their least value: a wrong one fails before any work, not at
# every question. Other settings go to the LM unchecked.
LM_SETTING_TYPES: dict[str, tuple[type, float | None]] = {
    "temperature": (float, 0), "top_p": (float, 0), "frequency_penalty": (float, None),
    "presence_penalty": (float, None), "timeout": (float, 0), "max_tokens": (int, 1), "max_completion_tokens": (int, 1),
    "n": (int, 1), "seed": (int, None), "num_retries": (int, 0), "top_k": (int, 0), "context_length": (int, 1),
    "threads": (int, 1),
}


def lm_settings(pairs: tuple[str, ...]) -> dict[str, Any]:
    """--lm-arg key=value pairs, values read as JSON (else kept as text), known settings checked."""
    settings = {key: _json_value(value) for key, value in option_assignments(pairs, "--lm-arg").items()}
    for key, value in settings.items():
        if key not in LM_SETTING_TYPES:
            continue
        kind, least = LM_SETTING_TYPES[key]
        numeric = not isinstance(value, bool) and isinstance(value, (int, float) if kind is float else int)
        if not numeric or not math.isfinite(value) or least is not None and value < least:
            what = "a number" if kind is float else "an integer"
            bound = f" of at least {least}" if least is not None else ""
            raise ConfigError(f"--lm-arg {key} must be {what}{bound}, got {value!r}")
    return settings


def option_assignments(pairs: tuple[str, ...], option: str) -> dict[str, str]:
    """`key=value` pairs of a repeatable option into a dict; a pair without `=` is an error naming `option`."""
    from arag.programs.frame.params import parse_assignments

    for pair in pairs:
        if "=" not in pair or not pair.partition("=")[0].strip():
            raise ConfigError(f"{option} expects key=value, got {pair!r}")
    return parse_assignments(pairs)


def _json_value(text: str) -> Any:
    try:
        return ujson.loads(text)
    except ValueError:
        return text


def lm_options(fn):
    """--lm, --api-base, --api-key-env, --logprobs, --lm-arg, --no-schema and --lm-concurrency, passed on as
    `lm_setup`."""

    @functools.wraps(fn)
    def command(*args, lm_spec, api_base, api_key_env, logprobs, lm_args, no_schema, lm_concurrency, **kwargs):
        setup = LMSetup(lm_spec, api_base, api_key_env, logprobs, lm_settings(lm_args), not no_schema, lm_concurrency)
        return fn(*args, lm_setup=setup, **kwargs)

    command = click.option("--lm-concurrency", type=click.IntRange(min=1),
                           help="At most this many LM calls at once in this process, shared by --threads and the "
                                "independent calls inside a question (default 32; 1: one call at a time).")(command)
    command = click.option("--no-schema", is_flag=True,
                           help="Do not constrain outputs to each signature's JSON schema (for endpoints that refuse "
                                "response_format): DSPy's [[ ## field ## ]] format instead.")(command)
    command = click.option("--lm-arg", "lm_args", multiple=True,
                           help="LM setting key=value (repeatable; JSON values), e.g. context_length=4096, "
                                "threads=2 or temperature=0.7 for --lm local.")(command)
    command = click.option("--logprobs", is_flag=True,
                           help="Ask the LM for token log-probabilities on every call (traces then carry answer "
                                "confidence).")(command)
    command = click.option("--api-key-env", default="OPENAI_API_KEY", show_default=True,
                           help="Environment variable holding the API key.")(command)
    command = click.option("--api-base", envvar="ARAG_API_BASE",
                           help="Base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1.")(command)
    command = click.option("--lm", "lm_spec", envvar="ARAG_LM",
                           help="local (the bundled small model), local:PATH.gguf, or provider/model, e.g. "
                                "openai/gpt-4o-mini (or set ARAG_LM).")(command)
    return command


def retriever_options(fn):
    """--corpus and --retriever."""
    fn = click.option("--retriever", "retriever_spec", help="An index folder, bm25:DIR, or another retriever spec.")(fn)
    fn = click.option("--corpus", type=click.Path(),
                      help="Corpus file; its BM25 index is built on first use and reused.")(fn)
    return fn


def retriever_paths(spec: str | None) -> list[str]:
    """The local path a --retriever spec reads (an index folder, a Milvus Lite file), none for a server's URL."""
    if not spec or "://" in spec:
        return []
    kind, colon, location = spec.partition(":")
    if colon and re.fullmatch(r"[A-Za-z][\w-]*", kind) and not Path(spec).exists():
        return [location.partition("#")[0]]
    return [spec]


def given_params(params_file: str | None, pairs: tuple[str, ...]) -> dict[str, Any]:
    """Program parameters from --params-file, overridden by --param key=value pairs (values still unchecked)."""
    from arag.programs.frame.params import parse_assignments
    from arag.trust import check_file_settings

    from_file, given = read_params_file(params_file), parse_assignments(pairs)
    check_file_settings(f"--params-file {params_file}", from_file, caller_sets=given)
    return {**from_file, **given}


def searched_space(search: tuple[str, ...], range_pairs: tuple[str, ...], fixed: dict[str, Any]):
    """`arag tune`'s --search NAME or NAME=LOW:HIGH (`--search all`: every tunable parameter), --range
    NAME=LOW:HIGH and the fixed parameters as a SearchSpace (bounds still text, checked against the program)."""
    from arag.optimizers.tuning import SearchSpace

    ranges = {name: _bounds("--range", name, text) for name, text in option_assignments(range_pairs, "--range").items()}
    names = []
    for entry in search:
        name, equals, text = entry.partition("=")
        if equals:
            ranges[name] = _bounds("--search", name, text)
        names.append(name)
    if names == ["all"]:
        return SearchSpace(every_tunable=True, ranges=ranges, fixed=fixed)
    return SearchSpace(names=tuple(names), ranges=ranges, fixed=fixed)


def _bounds(option: str, name: str, text: str) -> tuple[str, str]:
    bounds = text.split(":")
    if len(bounds) != 2:
        raise ConfigError(f"{option} {name}: give LOW:HIGH, got {text!r}")
    return bounds[0], bounds[1]


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
