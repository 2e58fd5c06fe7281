"""Fakes and stand-ins for tests and benchmarks that need no real model and no index.

Scripted LMs (``engines``): a *responder* is a function ``responder(call: ScriptedCall)`` returning the answer: a
dict ``{output field: value}`` for adapter calls (ChatAdapter or JSONAdapter), or a plain string for raw prompts. A
value may be a ``Scripted`` or ``Tokens`` to choose token probabilities. The same engine code answers in-process
(``scripted_lm``) and over HTTP (``OpenAICompatibleServer``, in ``openai_server``). ``StandInModel`` (``stand_in``)
is a responder that answers every arag signature, for the benchmarks (each method's answers are registered from
the ``stand_in.py`` of its folder in ``programs/``, which only this package imports). Fake retrievers
(``retrievers``) give passages known in advance and record every query. ``HashingEncoder`` (``encoders``) embeds
texts for dense indexes without a model: deterministic, fast, and not semantic.
"""

from arag.testing.encoders import HashingEncoder
from arag.testing.engines import (
    GARBAGE_TEXT,
    TOKEN_PATTERN,
    Faults,
    NoLogprobsEngine,
    Scripted,
    ScriptedAnswer,
    ScriptedCall,
    ScriptedEngine,
    ScriptedToken,
    Tokens,
    isolated_cache,
    no_logprobs_lm,
    scripted_lm,
    tokenize,
)
from arag.testing.openai_server import OpenAICompatibleServer
from arag.testing.retrievers import FOUND_FOR, NUMBERED, RANKED, FixedRetriever, PassageTemplate, TemplateRetriever
from arag.testing.stand_in import StandInModel

__all__ = [
    "FOUND_FOR",
    "GARBAGE_TEXT",
    "NUMBERED",
    "RANKED",
    "TOKEN_PATTERN",
    "Faults",
    "FixedRetriever",
    "HashingEncoder",
    "NoLogprobsEngine",
    "OpenAICompatibleServer",
    "PassageTemplate",
    "Scripted",
    "ScriptedAnswer",
    "ScriptedCall",
    "ScriptedEngine",
    "ScriptedToken",
    "StandInModel",
    "TemplateRetriever",
    "Tokens",
    "isolated_cache",
    "no_logprobs_lm",
    "scripted_lm",
    "tokenize",
]
