"""What the package's DSPy engines share: ``ThreadedAsyncEngine`` (the async counterpart of a sync engine) and
``PromptEngine``, the base of the ``/v1/completions`` engine and the llama.cpp one."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator, Mapping
from typing import Any

import dspy
from dspy import lm15

from arag.lm.defaults import DEFAULT_MAX_TOKENS


class ThreadedAsyncEngine:
    """The async counterpart of a sync engine: each call runs in a worker thread."""

    def __init__(self, engine: Any):
        self.engine = engine

    async def complete(self, request: lm15.Request) -> lm15.Response:
        return await asyncio.to_thread(self.engine.complete, request)

    async def stream(self, request: lm15.Request):
        for event in lm15.response_to_events(await self.complete(request)):
            yield event

    async def aclose(self) -> None:
        await asyncio.to_thread(self.engine.close)


def message_text(message: lm15.Message) -> str:
    """The text of a message's parts, joined."""
    return "".join(getattr(part, "text", "") or "" for part in message.parts)


class PromptEngine:
    """The base of this package's engines. A subclass answers ``complete(request)``, names its LMs (``lm_name``),
    says which LM sends raw prompts to its model (``raw_prompt_lm``) and lists the constructor arguments that
    make up its state (``state_fields``: saved with a program, enough to rebuild the engine). This class gives
    it streaming, saving, pickling, its ``dspy.LM``, and twins: LMs on the same model with other settings."""

    state_fields: tuple[str, ...] = ()

    def complete(self, request: lm15.Request) -> lm15.Response:
        raise NotImplementedError

    @property
    def lm_name(self) -> str:
        raise NotImplementedError

    def raw_prompt_lm(self, lm: dspy.LM, keep_special_tokens: bool) -> dspy.LM:
        """The LM sending raw prompts to the model that ``lm``, an LM on this engine, answers with."""
        raise NotImplementedError

    def prompt(self, request: lm15.Request) -> str:
        """The text of the request's single user message; refused for anything else (a DSPy adapter's
        conversation, a system message, tools)."""
        if request.system or len(request.messages) != 1 or request.messages[0].role != "user" or request.tools:
            raise lm15.UnsupportedFeatureError(
                f"{type(self).__name__} sends one raw prompt: call it with a single user message "
                "(arag.lm.complete_raw(lm, prompt)), not through a DSPy adapter",
                feature="messages",
            )
        return message_text(request.messages[0])

    def stream(self, request: lm15.Request) -> Iterator[Any]:
        yield from lm15.response_to_events(self.complete(request))

    def close(self) -> None:
        """Nothing to release."""

    def dump_state(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.state_fields}

    @classmethod
    def load_state(cls, state: Mapping[str, Any]) -> PromptEngine:
        return cls(**state)

    def __reduce__(self):
        return _rebuilt, (type(self), self.dump_state())

    def async_engine(self) -> ThreadedAsyncEngine:
        return ThreadedAsyncEngine(self)

    def lm(self, **settings: Any) -> dspy.LM:
        """A ``dspy.LM`` answering through this engine; ``settings`` (temperature, max_tokens, cache ...) go to it."""
        return dspy.LM(self.lm_name, engine=self, async_engine=self.async_engine(), **settings)

    def twin(self, temperature: float | None = 0.0, **changes: Any) -> dspy.LM:
        """The LM on a copy of this engine with ``changes`` to its state (e.g. ``raw=True``), built once per
        process and shared by every caller that asks for the same."""
        return _shared_lm(type(self), tuple({**self.dump_state(), **changes}.items()), temperature)


def _rebuilt(engine_class: type[PromptEngine], state: Mapping[str, Any]) -> PromptEngine:
    return engine_class.load_state(state)


@functools.lru_cache(maxsize=None)
def _shared_lm(engine_class: type[PromptEngine], state: tuple[tuple[str, Any], ...],
               temperature: float | None) -> dspy.LM:
    return engine_class.load_state(dict(state)).lm(temperature=temperature, max_tokens=DEFAULT_MAX_TOKENS)
