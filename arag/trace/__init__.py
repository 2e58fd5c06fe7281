"""One trace format for every program: the steps it took, each of a declared kind, and what it cost.

`recorder` records a program call; `steps` and `method_steps` declare every step kind (a frozen record each)
and why a program stops; `schema` reads traces by kind (a recorded step back into its kind's record: `read_step`)
and generates the trace's JSON schema.
"""

from arag.trace.method_steps import (
    Action,
    AnswerFromQuestion,
    BackOff,
    Beam,
    Candidate,
    Candidates,
    Chosen,
    ClosedSet,
    Compare,
    Condense,
    Contexts,
    Deduce,
    Draft,
    Dropped,
    Evaluate,
    Gate,
    Ground,
    Hop,
    NoEvidence,
    Note,
    Pair,
    Query,
    Refine,
    RetrievalDecision,
    Review,
    Rewrite,
    Search,
    Select,
    Summary,
    Turn,
    Validity,
)
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
    Act,
    Answer,
    FollowUp,
    Generate,
    Observation,
    PieceStep,
    Read,
    Retrieve,
    Route,
    Sentence,
    Stop,
    StopReason,
    Unreadable,
    Window,
    Write,
)

__all__ = [
    "ABSENT", "STEP_KINDS", "Act", "Action", "Answer", "AnswerFromQuestion", "BackOff", "Beam", "Branch", "Candidate",
    "Candidates", "Chosen", "ClosedSet", "Compare", "Condense", "Contexts", "Deduce", "Draft", "Dropped", "Evaluate",
    "FollowUp", "Gate", "Generate", "Ground", "Hop", "NoEvidence", "Note", "Observation", "Pair", "PieceStep", "Query",
    "Read", "Refine", "RetrievalDecision", "Retrieve", "Review", "Rewrite", "Route", "Search", "Select", "Sentence",
    "Step", "Stop", "StopReason", "Summary", "Trace", "Turn", "Unreadable", "UnreadStep", "Validity", "Window", "Write",
    "branch_of", "current_trace", "is_step", "kinds_of", "note", "read_step", "recording", "shown_probability",
    "steps_of", "stop_reason",
    "trace_declarations", "trace_schema", "trace_schema_text", "trace_steps",
]
