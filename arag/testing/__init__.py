"""Scripted DSPy LMs and a loopback OpenAI-compatible server, for tests that need no real model.

A *responder* is a function ``responder(call: ScriptedCall)`` returning the answer: a dict
``{output field: value}`` for adapter calls (ChatAdapter or JSONAdapter), or a plain string for
raw prompts. A value may be a ``Scripted`` or ``Tokens`` to choose token probabilities.
The same engine code answers in-process (``scripted_lm``, in ``engines``) and over HTTP
(``OpenAICompatibleServer``, in ``openai_server``).
"""

from arag.testing.engines import (
    GARBAGE_TEXT,
    TOKEN_PATTERN,
    Faults,
    Scripted,
    ScriptedAnswer,
    ScriptedCall,
    ScriptedEngine,
    ScriptedToken,
    Tokens,
    isolated_cache,
    scripted_lm,
    tokenize,
)
from arag.testing.openai_server import OpenAICompatibleServer

__all__ = [
    "GARBAGE_TEXT",
    "TOKEN_PATTERN",
    "Faults",
    "OpenAICompatibleServer",
    "Scripted",
    "ScriptedAnswer",
    "ScriptedCall",
    "ScriptedEngine",
    "ScriptedToken",
    "Tokens",
    "isolated_cache",
    "scripted_lm",
    "tokenize",
]
