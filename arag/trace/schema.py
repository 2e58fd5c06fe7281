"""Reading traces by their declared kinds, and the JSON schema of a trace generated from the declarations."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from enum import Enum
from typing import Any, Iterable, Mapping, Union

from arag.trace.record import ABSENT, STEP_KINDS, Step
from arag.trace.steps import PieceStep, Stop, StopReason


def trace_steps(source: Any) -> list[dict[str, Any]]:
    """The steps of a prediction or a failure (`.trace`), a predictions row (`["trace"]`) or a trace (a list)."""
    if isinstance(source, Mapping):
        return list(source.get("trace") or [])
    if isinstance(source, (list, tuple)):
        return list(source)
    return list(getattr(source, "trace", None) or [])


def steps_of(source: Any, *kinds: type[Step]) -> list[dict[str, Any]]:
    """The steps of the given kinds, in trace order (`steps_of(prediction, Retrieve)`)."""
    names = {kind.kind for kind in kinds}
    return [step for step in trace_steps(source) if step.get("step") in names]


def kinds_of(source: Any) -> list[type[Step] | None]:
    """The kind of every step, in trace order (None for a kind no declaration knows)."""
    return [STEP_KINDS.get(step.get("step")) for step in trace_steps(source)]


def is_step(step: Mapping[str, Any], kind: type[Step]) -> bool:
    return step.get("step") == kind.kind


def step_schema(kind: type[Step]) -> dict[str, Any]:
    """The JSON schema of one kind's object: `step` names the kind, every declared fact typed, nothing else."""
    hints = typing.get_type_hints(kind)
    properties: dict[str, Any] = {"step": {"const": kind.kind}}
    required = ["step"]
    for field in dataclasses.fields(kind):
        properties[field.name] = value_schema(hints[field.name])
        if field.default is not ABSENT:
            required.append(field.name)
    return {"type": "object", "description": (kind.__doc__ or "").strip(), "properties": properties,
            "required": required, "additionalProperties": False}


def value_schema(hint: Any) -> dict[str, Any]:
    """The JSON schema of a declared fact's type."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return {}
    if hint is None or hint is type(None):
        return {"type": "null"}
    if isinstance(hint, type) and issubclass(hint, Enum):
        return {"enum": [member.value for member in hint],
                "description": "; ".join(f"{member.value}: {member.description}" for member in hint)}
    if typing.is_typeddict(hint):
        fields = typing.get_type_hints(hint)
        return {"type": "object", "properties": {name: value_schema(t) for name, t in fields.items()},
                "required": sorted(hint.__required_keys__), "additionalProperties": False}
    if origin in (Union, types.UnionType):
        return {"anyOf": [value_schema(arg) for arg in args]}
    if origin is list:
        return {"type": "array", "items": value_schema(args[0])}
    if origin is tuple:
        return {"type": "array", "prefixItems": [value_schema(arg) for arg in args], "items": False}
    if origin is dict:
        return {"type": "object", "additionalProperties": value_schema(args[1])}
    simple = {str: "string", bool: "boolean", int: "integer", float: "number"}
    if hint in simple:
        return {"type": simple[hint]}
    raise TypeError(f"no JSON schema for the declared type {hint!r}")


def trace_schema(kinds: Iterable[type[Step]] | None = None) -> dict[str, Any]:
    """The JSON schema of a trace: a list of steps, each one of the declared kinds."""
    declared = sorted(kinds if kinds is not None else STEP_KINDS.values(), key=lambda kind: kind.kind)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "arag trace",
        "description": "The steps of one program call, in the order taken; each step's `step` names its kind.",
        "type": "array",
        "items": {"oneOf": [{"$ref": f"#/$defs/{kind.kind}"} for kind in declared]},
        "$defs": {kind.kind: step_schema(kind) for kind in declared},
    }


def trace_schema_text() -> str:
    """The trace schema as the committed `docs/trace.schema.json` holds it."""
    return json.dumps(trace_schema(), indent=2, ensure_ascii=False) + "\n"


def stop_reason(source: Any) -> StopReason | None:
    """The reason of the last `stop` step, None when there is none."""
    stops = steps_of(source, Stop)
    return StopReason(stops[-1]["reason"]) if stops else None


def trace_declarations() -> dict[str, Any]:
    """The declarations a reader outside Python needs (the report's page): each kind by its class name, the kinds
    of answer pieces, and each stop reason's sentence."""
    return {
        "kinds": {kind.__name__: name for name, kind in STEP_KINDS.items()},
        "piece_kinds": sorted(name for name, kind in STEP_KINDS.items() if issubclass(kind, PieceStep)),
        "stop_reasons": {reason.value: reason.description for reason in StopReason},
    }
