"""`StandInModel`: a responder for `scripted_lm` that answers every arag signature (and dspy.ReAct's), for the
benchmarks that measure programs' costs rather than their quality.

It answers in a fixed way shaped by the question and the passages it is shown; its answers are not a model's.
Each method registers the answers to its own signatures beside it, in a `stand_in.py` of its folder
(`programs/genground/stand_in.py`: two hops deduced, evidence quoted from a passage naming the sub-question's
subject, ...), with `@stand_in_for(Signature, ...)`; the programs never import those modules, `StandInModel`
does. A call is of a signature when it has the signature's input and output fields (ChainOfThought's
`reasoning` aside); a signature declared without outputs (its outputs appended when a program builds it) is
matched by its inputs. A call no registration answers gets the answers every signature shares: `reasoning`,
an `answer` naming the question's first subject, and empty text for any other field.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from typing import Any, Callable

import dspy

import arag.programs
from arag.testing.engines import Scripted, ScriptedCall, Tokens, tokenize

SURE, UNSURE = 0.92, 0.3
QUESTION_WORDS = {"what", "which", "who", "whom", "whose", "when", "where", "why", "how", "is", "are", "was",
                  "were", "did", "do", "does", "the", "in", "of", "a", "an", "and", "or", "for", "to", "on"}
ENTITY = re.compile(r"(?:[A-Z][\w'’.-]*|\d{3,4})(?:\s+(?:of|the|de|and|[A-Z][\w'’.-]*|\d+))*")
PASSAGE_TITLE = re.compile(r"\[\d+\] ([^|\"\\]+?) \|")
METHOD_MODULE = "stand_in"  # the module of a method's folder that registers its answers

Responder = Callable[[ScriptedCall], dict[str, Any]]
Shape = tuple[frozenset[str], tuple[str, ...]]
ANSWERS: dict[Shape, Responder] = {}  # a signature's input names and output names -> the answers to its calls


def shape(inputs: Any, outputs: Any) -> Shape:
    """What identifies a signature's calls: its input names, and its output names in order (`reasoning` aside)."""
    return frozenset(inputs), tuple(name for name in outputs if name != "reasoning")


def stand_in_for(*signatures: type[dspy.Signature]) -> Callable[[Responder], Responder]:
    """Register `responder(call) -> {output field: value}` as the answer to the calls of these signatures (the
    fields it leaves out get the shared answers)."""

    def register(responder: Responder) -> Responder:
        for signature in signatures:
            key = shape(signature.input_fields, signature.output_fields)
            if ANSWERS.get(key, responder) is not responder:
                raise ValueError(f"two stand-in answers for the calls of {signature.__name__}")
            ANSWERS[key] = responder
        return responder

    return register


def load_method_answers() -> None:
    """Import every method's `stand_in` module, each registering its answers."""
    for module in pkgutil.walk_packages(arag.programs.__path__, f"{arag.programs.__name__}."):
        if module.name.rpartition(".")[2] == METHOD_MODULE:
            importlib.import_module(module.name)


def responder_for(inputs: Any, outputs: Any) -> Responder | None:
    """The registered answers to a call with these fields: its signature's, else those of a signature declared
    with its inputs and no outputs; None when no registration answers it."""
    inputs, outputs = shape(inputs, outputs)
    return ANSWERS.get((inputs, outputs)) or ANSWERS.get((inputs, ()))


def entities(question: str) -> list[str]:
    """The question's capitalised phrases (without a leading question word), else its longer words: the
    names a stand-in answer talks about."""
    found = []
    for match in ENTITY.finditer(question):
        phrase = match.group(0).strip(" .?'’")
        if match.start() == 0 and phrase.split()[0].lower() in QUESTION_WORDS:
            phrase = phrase.partition(" ")[2]
        if phrase and phrase.lower() not in QUESTION_WORDS and phrase not in found:
            found.append(phrase)
    words = [w for w in re.findall(r"[A-Za-z]{5,}", question) if w.lower() not in QUESTION_WORDS]
    return found or words[:3] or ["it"]


def subjects(call: ScriptedCall) -> list[str]:
    """The names the question of a call talks about (`entities`)."""
    return entities(call.inputs.get("question", ""))


def content_words(text: str) -> set[str]:
    return {w.lower() for w in re.findall(r"[A-Za-z]{4,}", text)} - QUESTION_WORDS


def long_answer(question: str) -> list[str]:
    """The stand-in's three-sentence answer; the year in the second sentence is the unsure part."""
    names = entities(question)
    first, second = names[0], names[1 % len(names)]
    return [f"The question is about {first}.",
            f"Records about {second} go back to 1900.",
            f"So the answer is {first}."]


def continuation(question: str, so_far: str) -> Scripted:
    """The part of the long answer after `so_far` (its last sentence when `so_far` is not a prefix of it),
    with the year's tokens unsure."""
    sentences = long_answer(question)
    words, written = " ".join(sentences).split(), so_far.split()
    text = " ".join(words[len(written):]) if words[: len(written)] == written else sentences[-1]
    return Scripted(text, [UNSURE if token.strip() == "1900" else SURE for token in tokenize(text)])


def json_list(text: str) -> list:
    try:
        value = json.loads(text or "[]")
    except json.JSONDecodeError:
        return []
    return value if isinstance(value, list) else []


def label(chosen: str, prob: float, alternatives: dict[str, float]) -> Tokens:
    return Tokens([(chosen, prob, alternatives)])


def shared_answer(name: str, call: ScriptedCall) -> Any:
    """The answer of a field no registration gives: the reasoning, the answer, else empty text."""
    if name == "reasoning":
        return "Reading the material step by step."
    if name == "answer":
        return subjects(call)[0]
    return ""


class StandInModel:
    """A responder for `arag.testing.scripted_lm` that answers every arag signature (and dspy.ReAct's)."""

    def __init__(self) -> None:
        load_method_answers()
        self._attention_model = None

    @property
    def attention_model(self) -> Any:
        """A tiny random Llama (`arag.testing.attention`) for the programs that read a model's attention and
        entropies (DRAGIN), built on first use; None without transformers and torch."""
        if self._attention_model is None:
            try:
                from arag.testing.attention import tiny_attention_model

                self._attention_model = tiny_attention_model.__wrapped__()
            except ImportError:
                return None
        return self._attention_model

    @property
    def attention_generations(self) -> int:
        """The generations its attention model made (0 before one is built): requests, as the engine counts them."""
        return 0 if self._attention_model is None else self._attention_model.generations

    def __call__(self, call: ScriptedCall) -> dict[str, Any]:
        responder = responder_for(call.input_fields, call.output_fields)
        given = responder(call) if responder is not None else {}
        return {name: given[name] if name in given else shared_answer(name, call) for name in call.output_fields}
