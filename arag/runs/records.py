"""What a run folder's files hold, declared once: a run's record (run.json) and a row (a line of predictions.jsonl).

Each is read with `from_json`, which refuses a malformed one with one line naming the file and the field, and
written with `to_json`. A row's trace is read back step by step into the declared step kinds (`read_step`; the
programs are imported first, so that every method's kinds are declared); a step no declaration reads (another
version's kind) is kept as recorded. Keys a record or a row holds that this arag does not declare are kept too
(`other`), so that what another version wrote is written back unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Annotated, Any, ClassVar, Mapping

from pydantic import AllowInfNan, BeforeValidator, ConfigDict, SkipValidation, Strict, TypeAdapter, ValidationError

import arag.programs  # noqa: F401  every method's step kinds, registered as its modules load, for read_step
from arag.errors import DataError
from arag.trace import ABSENT, Step, UnreadStep, read_step

Text = Annotated[str, Strict()]
Whole = Annotated[int, Strict()]
Flag = Annotated[bool, Strict()]
Number = Annotated[float, Strict(), AllowInfNan(False)]  # an integer is a number too; NaN and infinity are not
STEP_NAMED = "a list of steps, each an object with a 'step' name"


def _read_trace(value: Any) -> list[Step | UnreadStep]:
    if not isinstance(value, list) or not all(isinstance(step, dict) and "step" in step for step in value):
        raise ValueError(f"not {STEP_NAMED}")
    return [read_step(step) for step in value]


RecordedTrace = Annotated[SkipValidation[list[Step | UnreadStep]], BeforeValidator(_read_trace)]


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """What a run is (its run.json): the program, its parameters, the dataset, the retriever and the LM, as the
    code that started the run named them. A field left ABSENT was not recorded: run.json leaves its key out."""

    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="forbid")

    program: Text | None = ABSENT
    params: dict[str, Any] | None = ABSENT
    compiled: Text | None = ABSENT  # the compiled program's file
    prompts: Text | None = ABSENT  # a digest of the program's prompts and demos
    dataset: Text | None = ABSENT
    retriever: Text | None = ABSENT
    lm: Text | None = ABSENT
    schema: Flag | None = ABSENT  # whether outputs were constrained to each signature's JSON schema
    study: Text | None = ABSENT  # a tuning trial's study and number
    trial: Whole | None = ABSENT
    other: dict[str, Any] = field(default_factory=dict)  # keys this arag does not declare, kept as read

    @classmethod
    def from_json(cls, data: Any, where: str) -> RunRecord:
        """The record a run.json (`where`) holds; a DataError naming `where` and the field when it is malformed."""
        if not isinstance(data, Mapping):
            raise DataError(f"{where}: not a run description (a JSON object)")
        return read_declared(_RECORD, _with_other(cls, data), where, "a run description")

    def to_json(self) -> dict[str, Any]:
        """The record as run.json holds it: the recorded fields, then the undeclared keys, as plain JSON."""
        recorded = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "other"}
        held = {name: value for name, value in recorded.items() if value is not ABSENT}
        return json.loads(json.dumps({**held, **self.other}, default=str))

    def differences(self, earlier: RunRecord) -> list[str]:
        """The fields on which this record differs from `earlier` (the run being resumed), compared on what
        `earlier` holds: a field it does not hold was not recorded when that run started."""
        held, mine = earlier.to_json(), self.to_json()
        return sorted(name for name, value in held.items() if mine.get(name) != value)


@dataclass(frozen=True, kw_only=True)
class Counts:
    """What answering one question cost, as a row records it; a count is None where the row does not record it
    (rows written before the count existed)."""

    lm_calls: Whole | None = None
    prompt_tokens: Whole | None = None
    # prompt tokens the engine took from its cache of an earlier prompt's prefix (llama.cpp's KV cache, a server's
    # prefix cache) rather than evaluating them
    reused_prompt_tokens: Whole | None = None
    completion_tokens: Whole | None = None
    retrieval_calls: Whole | None = None
    distinct_passages: Whole | None = None

    def count(self, name: str) -> int | None:
        """One of COUNTS, None when the row does not record it."""
        if name not in COUNTS:
            raise KeyError(name)
        return getattr(self, name)

    def counts(self) -> dict[str, int | None]:
        """Every count by name, None where the row does not record it."""
        return {name: getattr(self, name) for name in COUNTS}

    def recorded_counts(self) -> dict[str, int]:
        """The counts the row records, as its JSON holds them."""
        return {name: value for name, value in self.counts().items() if value is not None}


COUNTS = tuple(f.name for f in fields(Counts))


@dataclass(frozen=True, kw_only=True)
class Row(Counts):
    """One question of a run (a line of predictions.jsonl): the question and its gold answers, the prediction, its
    scores, what it cost (`Counts`), its trace, and for a failed question its error."""

    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="forbid")

    id: Text
    question: Text
    answers: list[Any]
    metrics: dict[str, Number]
    trace: RecordedTrace
    prediction: Any = None
    seconds: Number | None = None
    outputs: dict[str, Any] | None = None  # the program's other output fields
    error: Text | None = None  # a failed question: the error, its kind, the step that was running
    error_kind: Text | None = None
    error_step: Text | None = None
    attempt: Whole | None = None  # the question's try: 0 the first (recorded on failures and retries)
    other: dict[str, Any] = field(default_factory=dict)  # keys this arag does not declare, kept as read

    @property
    def failed(self) -> bool:
        return self.error is not None

    @classmethod
    def from_json(cls, data: Any, where: str) -> Row:
        """The row a line (`where`: file and line) holds; a DataError naming `where` and the field when it is not a
        row of arag's."""
        if not isinstance(data, Mapping):
            raise DataError(f"{where}: not a row of arag's: a row is a JSON object, not {type(data).__name__}")
        return read_declared(_ROW, _with_other(cls, data), where, "a row of arag's", _ROW_FIELDS)

    def to_json(self) -> dict[str, Any]:
        """The row as predictions.jsonl holds it (a failed question's error kind and step with its error)."""
        row: dict[str, Any] = {"id": self.id, "question": self.question, "answers": self.answers}
        if self.seconds is not None:
            row["seconds"] = self.seconds
        row["prediction"] = self.prediction
        row["metrics"] = self.metrics
        row.update(self.recorded_counts())
        if self.outputs is not None:
            row["outputs"] = self.outputs
        if self.error is not None:
            row["error"] = self.error
            if self.error_kind is not None:
                row["error_kind"] = self.error_kind
            row["error_step"] = self.error_step
        if self.attempt is not None:
            row["attempt"] = self.attempt
        row.update(self.other)
        row["trace"] = [_plain(step.as_json()) for step in self.trace]
        return row


_RECORD = TypeAdapter(RunRecord)
_ROW = TypeAdapter(Row)
# What a value should be, as a refusal says it: by the kind of error, and for some fields of a row by the field.
_SAID = {"string_type": "should be text", "int_type": "should be a whole number", "float_type": "should be a number",
         "finite_number": "should be a finite number", "bool_type": "should be true or false",
         "dict_type": "should be a JSON object", "list_type": "should be a list", "extra_forbidden": "is not expected"}
_ROW_FIELDS = {"answers": "should be a list of gold answers", "metrics": "should map metric names to numbers",
               "trace": f"should be {STEP_NAMED}"}


def read_declared(adapter: TypeAdapter, data: Mapping[str, Any], where: str, what: str,
                  said: Mapping[str, str] | None = None) -> Any:
    """`data` as the dataclass `adapter` reads; a DataError naming `where` and the first field that is missing or
    malformed (`said`: what some fields should be, in words)."""
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        errors = exc.errors()
        missing = [str(error["loc"][0]) for error in errors if error["type"] == "missing"]
        if missing:
            raise DataError(f"{where}: not {what}: it has no {', '.join(missing)}") from None
        name, kind = str(errors[0]["loc"][0]), errors[0]["type"]
        words = (said or {}).get(name) or _SAID.get(kind) or f"is wrong: {errors[0]['msg']}"
        raise DataError(f"{where}: not {what}: {name} {words}, got {repr(data.get(name))[:80]}") from None


def _with_other(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """`data`'s declared fields, and the rest as `other`."""
    declared = {f.name for f in fields(cls)} - {"other"}
    return {**{key: value for key, value in data.items() if key in declared},
            "other": {key: value for key, value in data.items() if key not in declared}}


def _plain(value: Any) -> Any:
    """A step's facts as JSON holds them (tuples as lists)."""
    if isinstance(value, dict):
        return {key: _plain(inner) for key, inner in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(inner) for inner in value]
    return value
