"""ReAct (Yao et al., 2023) over the corpus: `dspy.ReAct` reasons, calls a search tool backed by the
retriever, and answers once it has what it needs.

Each step's output is decoded under a schema that holds the tool's arguments to that tool's own argument
object: `next_tool_name` is one of the tools, `next_tool_args` one of their argument objects (closed, every
argument required, strings bounded), so that a schema-constrained model cannot write a schema-shaped or
free-form object where a search query belongs. The schema cannot tie the arguments to the name chosen before
them (a root-level `anyOf` would, and OpenAI's structured outputs refuse one): a search called with the
finish tool's empty arguments fails like any other tool call.

The trace holds every step as it happens: an `act` step (thought, tool, arguments), the tool's `retrieve`
step, and an `observation` step with what the tool returned or the error it raised (which the LM reads in
its trajectory as well). The prediction counts the failed tool calls (`failed_tool_calls`).

A tool called again with the arguments of an earlier call ends the trajectory (`stop_repeated`, on by default):
the search would return what the model has already read (the 1.5B model, zero-shot on a HotpotQA question,
searched one query seven times, to the step cap, and answered "No answer"; stopped at the repeat, it answered
from the passages it had read, at 3 LM calls instead of 8). `stop_repeated=false` runs the loop to `max_iters`,
as the paper does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import dspy
from dspy.utils.exceptions import AdapterParseError
from pydantic_core import core_schema

from arag.passages import format_passages
from arag.programs.baselines.steps import Act, Observation
from arag.programs.frame.base import RAGProgram
from arag.programs.frame.params import FLARE_SETTING_K, Param
from arag.programs.frame.registry import register
from arag.signatures.generation import AnswerBySearching
from arag.trace import Stop, StopReason, Unreadable, current_trace, is_step, note, steps_of

MAX_ITERS = Param("max_iters", 7, "cap on the reason-and-act steps before the answer is extracted", low=1, high=30,
                  searched=True, search_range=(1, 10))
STOP_REPEATED = Param("stop_repeated", True, "end the trajectory when a tool is called again with the same "
                      "arguments (false: run to max_iters, as the paper)", tunable=False)
ARGUMENT_CHARS = 200  # a tool's string argument (a search query); within the adapter's token budget for the field
ERROR_CHARS = 300


def arguments_schema(tool: dspy.Tool) -> dict[str, Any]:
    """A tool's arguments as one closed JSON object: every argument required, strings at most ARGUMENT_CHARS."""
    properties = {name: {"maxLength": ARGUMENT_CHARS, **schema} if schema.get("type") == "string" else schema
                  for name, schema in tool.args.items()}
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def tool_arguments(tools: Mapping[str, dspy.Tool]) -> type:
    """The type of a step's `next_tool_args`: parsed as a dict, described (and decoded) as one of the tools'
    argument objects."""
    schema = {"anyOf": [arguments_schema(tool) for tool in tools.values()]}

    class ToolArguments(dict):
        @classmethod
        def __get_pydantic_core_schema__(cls, source, handler):
            return core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema())

        @classmethod
        def __get_pydantic_json_schema__(cls, schema_of_core, handler):
            return schema

    return ToolArguments


class ObservedTool(dspy.Tool):
    """A tool whose every call is recorded as an `observation` step: what it returned, or the error it raised."""

    @classmethod
    def of(cls, tool: dspy.Tool) -> ObservedTool:
        return cls(tool.func, name=tool.name, desc=tool.desc, args=tool.args, arg_types=tool.arg_types)

    def __call__(self, **kwargs):
        try:
            result = super().__call__(**kwargs)
        except Exception as exc:  # noqa: BLE001 — recorded, then raised on to ReAct, which shows it to the LM
            note(Observation(tool=self.name, error=f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]))
            raise
        note(Observation(tool=self.name, observation=result))
        return result


class EndTrajectory(ValueError):
    """Ends `dspy.ReAct`'s loop (which ends on any ValueError) at a step the trace already records: an unreadable
    step or a repeated tool call. DSPy's warning for that ending ("failed to select a valid tool", with a
    traceback) is dropped, as the trace says what happened."""

    MARK = "[trajectory ended]"

    def __init__(self, why: str) -> None:
        super().__init__(f"{self.MARK} {why}")


class DropEndTrajectoryWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return EndTrajectory.MARK not in record.getMessage()


logging.getLogger("dspy.predict.react").addFilter(DropEndTrajectoryWarnings())


class _ReAct(dspy.ReAct):
    """`dspy.ReAct` with each tool's arguments decoded under that tool's schema and every step recorded.

    It also ends the trajectory on an unreadable step, as it does on an invalid tool choice (DSPy 3.4.1 ends it
    on ValueError only, and AdapterParseError is not one), and, with `stop_repeated`, on a tool call that repeats
    an earlier one. The answer is then extracted from the trajectory so far; an unreadable extraction still fails
    the question."""

    def __init__(self, signature: type[dspy.Signature], tools: list[dspy.Tool], max_iters: int,
                 stop_repeated: bool) -> None:
        super().__init__(signature, tools=tools, max_iters=max_iters)
        self.stop_repeated = stop_repeated
        self.tools = {name: ObservedTool.of(tool) for name, tool in self.tools.items()}
        self.react.signature = self.react.signature.with_updated_fields("next_tool_args",
                                                                        type_=tool_arguments(self.tools))

    def _call_with_potential_trajectory_truncation(self, module, trajectory, **input_args):
        try:
            prediction = super()._call_with_potential_trajectory_truncation(module, trajectory, **input_args)
        except AdapterParseError as exc:
            if module is self.extract:
                raise
            note(Unreadable(signature=module.signature.__name__, fallback="end the trajectory",
                            error=str(exc).splitlines()[0][:ERROR_CHARS]))
            raise EndTrajectory(str(exc)) from exc
        if module is self.react:
            act = Act(thought=prediction.next_thought, tool=prediction.next_tool_name,
                      args=dict(prediction.next_tool_args))
            earlier = [(step["tool"], step["args"]) for step in steps_of(current_trace().steps, Act)]
            note(act)
            if self.stop_repeated and act.tool != "finish" and (act.tool, act.args) in earlier:
                note(Stop(reason=StopReason.REPEATED_ACTION))
                raise EndTrajectory(f"{act.tool} called again with {act.args}")
        return prediction


@register
class ReActSearch(RAGProgram):
    """ReAct: thought, search, observation, until finish; then the answer from the trajectory."""

    name = "react"
    lm_calls_formula = "thought-actions + 1 extraction"
    follows = ("the paper's loop (Yao et al., 2023) as dspy.ReAct runs it: thought, action, observation until finish, "
               "then the answer; zero-shot, where the paper prompts with worked trajectories (compile to give demos)")
    params = (FLARE_SETTING_K, MAX_ITERS, STOP_REPEATED)

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        self.agent = _ReAct(AnswerBySearching, tools=[dspy.Tool(self.search)], max_iters=self.max_iters,
                            stop_repeated=self.stop_repeated)

    def required_lm_calls(self, trace: list[dict]) -> int:
        return len(steps_of(trace, Act)) + 1

    def run(self, question: str) -> dict:
        steps = current_trace().steps
        before = len(steps)
        prediction = self.agent(question=question)
        failed = sum(is_step(step, Observation) and "error" in step for step in steps[before:])
        return {"answer": self.answered(prediction), "failed_tool_calls": failed}

    def search(self, query: str) -> list[str]:
        """Search the corpus: the passages that best match the query, as `[rank] Title | text`."""
        return format_passages(self.retrieve(query, why="react search"))
