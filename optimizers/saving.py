"""Compiled programs on disk: DSPy's JSON state plus what it forgets (the program's name and parameters).

DSPy's `program.save("x.json")` keeps demos and instructions but not which program they belong to
nor its thresholds, so a file alone cannot rebuild the program. The files written here hold

    {"format": "arag.compiled-program", "version": 1, "program": NAME, "params": {...},
     "dspy_version": ..., "meta": {...}, "state": <program.dump_state()>}

as plain JSON (never pickle). Secrets never reach the file: DSPy leaves API keys out of LM states,
and any key that still looks like a credential is dropped here too. The `logprobs` DSPy's
bootstrapped demos carry are dropped as well (they bloat files and never reach a prompt).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import dspy
import ujson

from arag.data._io import write_atomic
from arag.errors import AragError, ConfigError, DataError
from arag.programs.frame.base import RAGProgram
from arag.programs.frame.registry import build_program, get_program
from arag.retrievers.base import Retriever

FORMAT = "arag.compiled-program"
VERSION = 1
_SECRET_KEY = re.compile(r"api_?key|authorization|password|secret|access_token|bearer", re.IGNORECASE)


@dataclass
class CompiledProgram:
    """The contents of a compiled-program file."""

    program: str
    params: dict[str, Any]
    state: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)


def save_program(program: RAGProgram, path: str | Path, *, meta: Mapping[str, Any] | None = None) -> Path:
    """Write `program` (its name, resolved parameters and DSPy state) to the JSON file `path`.

    `meta` is free-form provenance stored beside (e.g. the teleprompter and metric used).
    """
    if not isinstance(program, RAGProgram):
        raise ConfigError(f"save_program needs an arag program (a RAGProgram), got {type(program).__name__}")
    document = {
        "format": FORMAT,
        "version": VERSION,
        "program": program.name,
        "params": dict(program.config),
        "dspy_version": dspy.__version__,
        "meta": dict(meta or {}),
        "state": portable_state(program.dump_state()),
    }
    path = Path(path)
    write_atomic(path, ujson.dumps(document, indent=2, ensure_ascii=False))
    return path


def read_compiled(path: str | Path) -> CompiledProgram:
    """The program name, parameters, state and provenance in a file `save_program` wrote."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such compiled program file") from None
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not a compiled program file ({exc})") from None
    try:
        document = ujson.loads(text)
    except ValueError as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise DataError(
            f"{path}: not an arag compiled program (no \"format\": \"{FORMAT}\"); a file from DSPy's "
            "program.save() holds no program name or parameters: write it with arag.optimizers.save_program "
            "or `arag compile`"
        )
    version = document.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise DataError(f"{path}: compiled-program format version {version!r}; "
                        f"this arag reads versions up to {VERSION}")
    for key, kind in (("program", str), ("params", dict), ("state", dict)):
        if not isinstance(document.get(key), kind):
            raise DataError(f"{path}: field {key!r} is missing or not a {kind.__name__}")
    return CompiledProgram(document["program"], document["params"], document["state"], document.get("meta") or {})


def load_program(
    path: str | Path,
    retriever: Retriever | None = None,
    *,
    program: str | None = None,
    params: Mapping[str, Any] | None = None,
) -> RAGProgram:
    """Rebuild a saved program: `build_program(name, retriever, **saved params)`, then its DSPy state.

    `program`, when given, must be the saved program's name. `params` override saved parameters
    (e.g. a threshold being tuned); they must not change the program's structure.
    """
    compiled = read_compiled(path)
    if program is not None and program != compiled.program:
        raise ConfigError(f"{path} holds a compiled {compiled.program!r} program, not {program!r}")
    try:
        cls = get_program(compiled.program)
        built = build_program(compiled.program, retriever if cls.needs_retriever else None,
                              **{**compiled.params, **(params or {})})
    except AragError as exc:
        raise type(exc)(f"{path}: {exc}") from None
    expected = {name for name, _ in built.named_parameters()}
    saved = set(compiled.state)
    if expected != saved:
        raise DataError(
            f"{path}: its state does not fit program {compiled.program!r} with these parameters "
            f"(predictors missing from the file: {sorted(expected - saved) or 'none'}; "
            f"unknown to the program: {sorted(saved - expected) or 'none'})"
        )
    try:
        built.load_state(compiled.state)
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{path}: cannot restore the state of program {compiled.program!r}: {exc}") from None
    return built


def portable_state(state: dict[str, Any]) -> dict[str, Any]:
    """`dump_state()` output without demo log-probabilities and without credentials in LM states."""
    cleaned = {}
    for name, predictor_state in state.items():
        predictor_state = dict(predictor_state)
        if isinstance(predictor_state.get("demos"), list):
            predictor_state["demos"] = [
                {k: v for k, v in demo.items() if k != "logprobs"} if isinstance(demo, dict) else demo
                for demo in predictor_state["demos"]
            ]
        if predictor_state.get("lm"):
            predictor_state["lm"] = _without_secrets(predictor_state["lm"])
        cleaned[name] = predictor_state
    return cleaned


def _without_secrets(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_secrets(v) for k, v in value.items() if not _SECRET_KEY.search(str(k))}
    if isinstance(value, list):
        return [_without_secrets(v) for v in value]
    return value
