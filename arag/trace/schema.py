"""Reading traces by their declared kinds (a recorded step read back into its kind's record: `read_step`), and the
JSON schema of a trace generated from the declarations."""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from enum import Enum
from typing import Any, ClassVar, Iterable, Mapping, Union

import pydantic
import typing_extensions

from arag.trace.record import ABSENT, STEP_KINDS, Step
from arag.trace.steps import PieceStep, Stop, StopReason


def trace_steps(source: Any) -> list[Any]:
    """The steps of a prediction or a failure (`.trace`: JSON objects as recorded), a run's row read back
    (`arag.runs.Row`: records of their kinds), a predictions row as JSON (`["trace"]`) or a trace (a list)."""
    if isinstance(source, Mapping):
        return list(source.get("trace") or [])
    if isinstance(source, (list, tuple)):
        return list(source)
    return list(getattr(source, "trace", None) or [])


def steps_of(source: Any, *kinds: type[Step]) -> list[Any]:
    """The steps of the given kinds, in trace order (`steps_of(prediction, Retrieve)`), as the source holds them:
    JSON objects in a trace being recorded, records of their kinds in a row read back."""
    names = {kind.kind for kind in kinds}
    return [step for step in trace_steps(source) if _kind_name(step) in names]


def kinds_of(source: Any) -> list[type[Step] | None]:
    """The kind of every step, in trace order (None for a step no declaration reads)."""
    return [STEP_KINDS.get(_kind_name(step)) for step in trace_steps(source)]


def is_step(step: Any, kind: type[Step]) -> bool:
    return _kind_name(step) == kind.kind


def _kind_name(step: Any) -> Any:
    """The kind a step is of: its record's, the `step` key of its JSON object, None for an UnreadStep."""
    if isinstance(step, UnreadStep):
        return None
    return step.kind if isinstance(step, Step) else step.get("step")


@dataclasses.dataclass(frozen=True)
class UnreadStep:
    """A recorded step that no declaration here reads: a kind this version of arag does not declare, or facts that
    do not fit its kind's declaration (a trace written by another version). It is kept as recorded."""

    recorded: dict[str, Any]
    problem: str
    decision_field: ClassVar[None] = None

    @property
    def kind(self) -> str:
        return str(self.recorded.get("step"))

    def as_json(self) -> dict[str, Any]:
        return dict(self.recorded)


def read_step(recorded: Mapping[str, Any]) -> Step | UnreadStep:
    """A recorded step (a JSON object of a trace) as the record of its declared kind, its facts typed as declared
    (enumerations as members, tokens as tuples); an UnreadStep, saying why, when no declaration reads it."""
    kind = STEP_KINDS.get(recorded.get("step"))
    if kind is None:
        return UnreadStep(dict(recorded), f"no step kind {recorded.get('step')!r} is declared")
    try:
        return _reader(kind).validate_python({name: value for name, value in recorded.items() if name != "step"})
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        if first["type"] == "missing":
            return UnreadStep(dict(recorded), f"a {kind.kind} step without its {where}")
        return UnreadStep(dict(recorded), f"a {kind.kind} step whose {where} does not fit: {first['msg']}")


@functools.cache
def _reader(kind: type[Step]) -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(kind)


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
    if typing_extensions.is_typeddict(hint):
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
    if not stops:
        return None
    return stops[-1].reason if isinstance(stops[-1], Stop) else StopReason(stops[-1]["reason"])


def trace_declarations() -> dict[str, Any]:
    """The declarations a reader outside Python needs (the report's page): each kind by its class name, the kinds
    of answer pieces, and each stop reason's sentence."""
    return {
        "kinds": {kind.__name__: name for name, kind in STEP_KINDS.items()},
        "piece_kinds": sorted(name for name, kind in STEP_KINDS.items() if issubclass(kind, PieceStep)),
        "stop_reasons": {reason.value: reason.description for reason in StopReason},
    }
