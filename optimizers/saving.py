"""Compiled programs on disk: DSPy's JSON state plus what it forgets (the program's name and parameters).

DSPy's `program.save("x.json")` keeps demos and instructions but not which program they belong to
nor its thresholds, so a file alone cannot rebuild the program. The files written here hold

    {"format": "arag.compiled-program", "version": 1, "program": NAME, "params": {...},
     "dspy_version": ..., "meta": {...}, "state": <program.dump_state()>}

as plain JSON (never pickle). A compiled file holds prompts, never where or how to call an LM: each
predictor's state is written as its demos and its signature's texts (instructions, field prefixes and
descriptions) alone, without DSPy's per-predictor `lm` (the LM always comes from the command line or the
caller), and without the `logprobs` bootstrapped demos carry (they bloat files and never reach a prompt).

A file is data from wherever it came from: loading takes only those demos and texts, each checked, and the
program's declared parameters, validated; anything else (an `lm`, a `config`, demos that are not a list of
objects, an address or a key-bearing search backend in a parameter the caller did not give: `arag.trust`) is
refused with a DataError naming the key. So are the keys `lm` and `config` anywhere (in a demo, in `meta`; only
each predictor's `lm: null` stays), a version this arag does not know, and a file beyond the limits below (its
size, checked before it is read; demos a predictor; bytes a demo; bytes of a signature's text).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import dspy
import ujson

from arag.data._io import check_output_file, write_atomic
from arag.errors import AragError, ConfigError, DataError
from arag.programs.frame.base import RAGProgram
from arag.programs.frame.registry import build_program, get_program
from arag.retrievers.base import Retriever
from arag.trust import check_file_settings

FORMAT = "arag.compiled-program"
VERSION = 1
KNOWN_VERSIONS = (1,)  # the versions this arag reads
# Limits on what a compiled file may hold, far above what a compile writes (a few demos a predictor, each a few
# kB): every demo goes into every prompt of its predictor, so an oversized file is refused before it costs memory
# or tokens. The file's size is checked before it is read.
MAX_FILE_BYTES = 32 * 2**20
MAX_DEMOS = 100  # a predictor
MAX_DEMO_BYTES = 256 * 2**10  # one demo as JSON (about 64k tokens: beyond most context windows already)
MAX_TEXT_BYTES = 64 * 2**10  # a signature's instructions, or a field's prefix or description
LM_KEYS = ("lm", "config")  # keys that choose an LM or its settings in DSPy's state, refused anywhere in a file
DOCUMENT_KEYS = ("format", "version", "program", "params", "dspy_version", "meta", "state")
# What DSPy's Predict.dump_state() holds; `traces` and `train` are always empty, `lm` is written as null.
PREDICTOR_KEYS = ("traces", "train", "demos", "signature", "lm")
SIGNATURE_KEYS = ("instructions", "fields")
FIELD_KEYS = ("prefix", "description")


@dataclass
class CompiledProgram:
    """The contents of a compiled-program file."""

    program: str
    params: dict[str, Any]
    state: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)


def save_program(program: RAGProgram, path: str | Path, *, meta: Mapping[str, Any] | None = None) -> Path:
    """Write `program` (its name, resolved parameters and DSPy state) to the JSON file `path`.

    `meta` is free-form provenance stored beside (e.g. the teleprompter and metric used), without the keys
    `lm` and `config` anywhere. A program that the loader would refuse (see the limits above) is not written.
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
    path = check_output_file(path)
    text = ujson.dumps(document, indent=2, ensure_ascii=False)
    if len(text.encode("utf-8")) > MAX_FILE_BYTES:
        raise DataError(f"{path}: the compiled program would take {len(text.encode('utf-8')):,} bytes, over the "
                        f"limit of {MAX_FILE_BYTES:,} for a compiled program file")
    checked_document(path, ujson.loads(text))  # never a file that loading would refuse
    write_atomic(path, text)
    return path


def read_compiled(path: str | Path) -> CompiledProgram:
    """The program name, parameters, state (each predictor's demos and signature texts, checked) and
    provenance in a file `save_program` wrote."""
    path = Path(path)
    return checked_document(path, _parsed_file(path))


def _parsed_file(path: Path) -> Any:
    """The parsed JSON of a compiled file; a file over MAX_FILE_BYTES is refused unread."""
    if not path.exists():
        raise ConfigError(f"{path}: no such compiled program file")
    if not path.is_file():
        raise DataError(f"{path}: not a compiled program file (not a regular file)")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise DataError(f"{path}: {size:,} bytes, over the limit of {MAX_FILE_BYTES:,} for a compiled program file")
    with open(path, "rb") as handle:
        data = handle.read(MAX_FILE_BYTES + 1)  # a file that grew since: read no further than the limit
    if len(data) > MAX_FILE_BYTES:
        raise DataError(f"{path}: over the limit of {MAX_FILE_BYTES:,} bytes for a compiled program file")
    try:
        return ujson.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not a compiled program file ({exc})") from None
    except ValueError as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from None


def checked_document(path: str | Path, document: Any) -> CompiledProgram:
    """A compiled file's parsed contents, every part checked (see the module docstring); a DataError naming
    `path` and the first key at fault."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise DataError(
            f"{path}: not an arag compiled program (no \"format\": \"{FORMAT}\"); a file from DSPy's "
            "program.save() holds no program name or parameters: write it with arag.optimizers.save_program "
            "or `arag compile`"
        )
    version = document.get("version")
    if type(version) is not int or version not in KNOWN_VERSIONS:
        raise DataError(f"{path}: compiled-program format version {version!r}; this arag reads version(s) "
                        f"{', '.join(map(str, KNOWN_VERSIONS))}")
    unknown = [key for key in document if key not in DOCUMENT_KEYS]
    if unknown:
        raise DataError(f"{path}: unknown field {unknown[0]!r}; a compiled program file holds only "
                        f"{', '.join(DOCUMENT_KEYS)}")
    for key, kind in (("program", str), ("params", dict), ("state", dict), ("meta", dict)):
        if not isinstance(document.get(key, {} if key == "meta" else None), kind):
            raise DataError(f"{path}: field {key!r} is missing or not a {kind.__name__}")
    state = {name: _predictor_state(f"{path}: state[{name!r}]", saved) for name, saved in document["state"].items()}
    meta = document.get("meta", {})
    for where, value in (("params", document["params"]), ("meta", meta),
                         *((f"state[{name!r}]['demos']", saved["demos"]) for name, saved in state.items())):
        _refuse_lm_keys(f"{path}: {where}", value)
    return CompiledProgram(document["program"], document["params"], state, meta)


def _refuse_lm_keys(where: str, value: Any) -> None:
    """A DataError when an object anywhere inside `value` has a key in LM_KEYS (looked through without recursion:
    a deeply nested file cannot exhaust the stack)."""
    pending = [(where, value)]
    while pending:
        at, item = pending.pop()
        if isinstance(item, dict):
            found = next((key for key in item if key in LM_KEYS), None)
            if found is not None:
                raise DataError(f"{at} holds {found!r}; a compiled file may not hold {' or '.join(map(repr, LM_KEYS))} "
                                "anywhere (the LM and its settings come from the command line or the caller)")
            pending.extend((f"{at}[{key!r}]", inner) for key, inner in item.items())
        elif isinstance(item, list):
            pending.extend((f"{at}[{i}]", inner) for i, inner in enumerate(item))


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
    check_file_settings(str(path), compiled.params, caller_sets=params or {})
    return restore_program(compiled, path, retriever, params)


def restore_program(compiled: CompiledProgram, path: str | Path, retriever: Retriever | None = None,
                    params: Mapping[str, Any] | None = None) -> RAGProgram:
    """The program a compiled file read from `path` holds, with `params` over its saved parameters (already
    checked against what a file may choose: `load_program`, `arag.RunSpec`)."""
    try:
        cls = get_program(compiled.program)
        built = build_program(compiled.program, retriever if cls.needs_retriever else None,
                              **{**compiled.params, **(params or {})})
    except AragError as exc:
        raise type(exc)(f"{path}: {exc}") from None
    own_state = built.dump_state()
    saved = set(compiled.state)
    if set(own_state) != saved:
        raise DataError(
            f"{path}: its state does not fit program {compiled.program!r} with these parameters "
            f"(predictors missing from the file: {sorted(set(own_state) - saved) or 'none'}; "
            f"unknown to the program: {sorted(saved - set(own_state)) or 'none'})"
        )
    for name, own in own_state.items():
        fields = compiled.state[name]["signature"]["fields"]
        if len(fields) != len(own["signature"]["fields"]):
            raise DataError(f"{path}: state[{name!r}]['signature']['fields'] must be a list of "
                            f"{len(own['signature']['fields'])} fields, as the program's")
    state = {name: {**own, **compiled.state[name]} for name, own in own_state.items()}
    try:
        built.load_state(state)
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{path}: cannot restore the state of program {compiled.program!r}: {exc}") from None
    return built


def _predictor_state(where: str, saved: Any) -> dict[str, Any]:
    """A predictor's demos and signature texts from a file, checked: nothing else may be set."""
    if not isinstance(saved, dict):
        raise DataError(f"{where} is not an object")
    for key in saved:
        if key not in PREDICTOR_KEYS:
            raise DataError(f"{where} holds {key!r}, which a compiled program may not set (only demos and the "
                            "signature's instructions and field texts)")
    if saved.get("lm") is not None:
        raise DataError(f"{where}['lm'] names an LM; a compiled file may not (the LM comes from the command "
                        "line or the caller)")
    for key in ("traces", "train"):
        if saved.get(key, []) != []:
            raise DataError(f"{where}[{key!r}] must be empty")
    demos = saved.get("demos", [])
    if not isinstance(demos, list) or not all(isinstance(demo, dict) for demo in demos):
        raise DataError(f"{where}['demos'] must be a list of objects (one per demonstration)")
    if len(demos) > MAX_DEMOS:
        raise DataError(f"{where}['demos'] holds {len(demos):,} demos, over the limit of {MAX_DEMOS} a predictor")
    for i, demo in enumerate(demos):
        size = len(ujson.dumps(demo, ensure_ascii=False).encode("utf-8"))
        if size > MAX_DEMO_BYTES:
            raise DataError(f"{where}['demos'][{i}] is {size:,} bytes, over the limit of {MAX_DEMO_BYTES:,} a demo")
    return {"demos": demos, "signature": _signature_state(f"{where}['signature']", saved.get("signature"))}


def _signature_state(where: str, saved: Any) -> dict[str, Any]:
    """A signature's instructions and its fields' prefixes and descriptions."""
    if not isinstance(saved, dict) or set(saved) != set(SIGNATURE_KEYS):
        raise DataError(f"{where} must be an object of {' and '.join(SIGNATURE_KEYS)}")
    if not isinstance(saved["instructions"], str):
        raise DataError(f"{where}['instructions'] must be a string")
    if not isinstance(saved["fields"], list):
        raise DataError(f"{where}['fields'] must be a list")
    for i, field_state in enumerate(saved["fields"]):
        if not isinstance(field_state, dict) or set(field_state) != set(FIELD_KEYS) \
                or not all(isinstance(text, str) for text in field_state.values()):
            raise DataError(f"{where}['fields'][{i}] must be an object of strings {' and '.join(FIELD_KEYS)}")
    texts = {"['instructions']": saved["instructions"],
             **{f"['fields'][{i}][{key!r}]": text for i, f in enumerate(saved["fields"]) for key, text in f.items()}}
    for at, text in texts.items():
        if len(text.encode("utf-8")) > MAX_TEXT_BYTES:
            raise DataError(f"{where}{at} is {len(text.encode('utf-8')):,} bytes, over the limit of "
                            f"{MAX_TEXT_BYTES:,}")
    return {"instructions": saved["instructions"], "fields": saved["fields"]}


def portable_state(state: dict[str, Any]) -> dict[str, Any]:
    """`dump_state()` output as a compiled file holds it: each predictor's demos (without log-probabilities) and
    signature texts, no LM."""
    return {
        name: {
            "traces": [],
            "train": [],
            "demos": [{k: v for k, v in demo.items() if k != "logprobs"} for demo in predictor_state["demos"]],
            "signature": predictor_state["signature"],
            "lm": None,
        }
        for name, predictor_state in state.items()
    }
