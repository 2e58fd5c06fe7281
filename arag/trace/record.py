"""What every step of a trace is: a frozen record of one kind, written once, recorded as a JSON object."""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any, ClassVar

from pydantic import ConfigDict


class _Absent:
    """The value of an optional fact a step (or a run's record) does not record: the key is left out of its JSON
    object. It is false, as a missing value is."""

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


ABSENT: Any = _Absent()

# kind -> its record class, filled as the kinds are declared (arag.trace.steps, and each method's steps.py)
STEP_KINDS: dict[str, type[Step]] = {}


class DescribedEnum(str, Enum):
    """An enumeration whose members are short stable identifiers (the JSON value) with a sentence each."""

    description: str

    def __new__(cls, value: str, description: str) -> DescribedEnum:
        member = str.__new__(cls, value)
        member._value_ = value
        member.description = description
        return member

    def __str__(self) -> str:
        return self.value


def declared(cls: type[Step]) -> type[Step]:
    """A step kind's class as a frozen, keyword-only dataclass."""
    cls = dataclasses.dataclass(frozen=True, kw_only=True)(cls)
    if cls.decision_field is not None and cls.decision_field not in {f.name for f in dataclasses.fields(cls)}:
        raise TypeError(f"{cls.__name__}: its decision {cls.decision_field!r} is none of its fields")
    return cls


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of a program call. A subclass declares one kind (`@declared class Answer(Step, kind="answer")`);
    a field whose default is `ABSENT` is an optional fact, left out when not given. A kind that records a choice
    the program made names the field holding it (`decision="action"`): `arag decisions` counts its values."""

    kind: ClassVar[str]
    decision_field: ClassVar[str | None] = None
    # how a recorded step is read back (`arag.trace.read_step`): a fact its kind does not declare is refused
    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="forbid")

    def __init_subclass__(cls, kind: str | None = None, decision: str | None = None, **rest: Any) -> None:
        super().__init_subclass__(**rest)
        if decision is not None:
            cls.decision_field = decision
        if kind is not None:
            if kind in STEP_KINDS:
                raise TypeError(f"step kind {kind!r} is declared twice")
            if any(other.__name__ == cls.__name__ for other in STEP_KINDS.values()):
                raise TypeError(f"step kind {kind!r}: another kind's class is named {cls.__name__} too (the report's "
                                "page finds kinds by class name)")
            cls.kind = kind
            STEP_KINDS[kind] = cls

    def as_json(self) -> dict[str, Any]:
        """The step as a trace holds it: `{"step": kind, fact: value, ...}`, enumerations as their values."""
        entry: dict[str, Any] = {"step": self.kind}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not ABSENT:
                entry[field.name] = value.value if isinstance(value, Enum) else value
        return entry
