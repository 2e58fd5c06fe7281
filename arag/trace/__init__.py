"""One trace format for every program: the steps it took, each of a declared kind, and what it cost.

`recorder` records a program call; `record` holds the registry of step kinds (`STEP_KINDS`: a kind is registered
where it is declared), `steps` declares the kinds programs share and why a program stops, and each method declares
its own beside it (`programs/genground/steps.py`, ...); `schema` reads traces by kind (a recorded step back into
its kind's record: `read_step`) and generates the trace's JSON schema. Code that reads traces back sits above the
programs and imports them, so that every method's kinds are registered.
"""

from arag.trace.record import ABSENT, STEP_KINDS, Step
from arag.trace.recorder import Branch, Trace, branch_of, current_trace, note, recording, shown_probability
from arag.trace.schema import (
    UnreadStep,
    is_step,
    kinds_of,
    read_step,
    steps_of,
    stop_reason,
    trace_declarations,
    trace_schema,
    trace_schema_text,
    trace_steps,
)
from arag.trace.steps import (
    Answer,
    Generate,
    PieceStep,
    Read,
    Retrieve,
    Sentence,
    Stop,
    StopReason,
    Unreadable,
    Window,
    Write,
)

__all__ = [
    "ABSENT", "STEP_KINDS", "Answer", "Branch", "Generate", "PieceStep", "Read", "Retrieve", "Sentence", "Step", "Stop",
    "StopReason", "Trace", "Unreadable", "UnreadStep", "Window", "Write", "branch_of", "current_trace", "is_step",
    "kinds_of", "note", "read_step", "recording", "shown_probability", "steps_of", "stop_reason", "trace_declarations",
    "trace_schema", "trace_schema_text", "trace_steps",
]
