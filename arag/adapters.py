"""How programs' signatures reach the LM: decoded under their JSON schema, with a token budget per call.

`SchemaAdapter` (the default for every arag program) sends each call's output fields as a JSON schema
(`response_format`), so an endpoint that constrains decoding — llama.cpp, vLLM, Ollama, OpenAI's
structured outputs, arag's local model — can only produce output that parses: labels from their
`Literal`, booleans as booleans, strings closed within their length. `TextAdapter` is DSPy's
ChatAdapter (`[[ ## field ## ]]` sections, JSON as a fallback) for endpoints that refuse schemas.

Both hold one of the process's LM-call slots (`arag.concurrency`) while a call runs, and give each call a
`max_tokens` that fits its output fields (a yes/no judgement needs a few tokens,
not the LM's whole budget) unless the caller set one, and JSON output whose `str` field holds an object
or a list is refused instead of passed on as its Python repr.
"""

from __future__ import annotations

import typing
from typing import Any

import annotated_types
import dspy
import json_repair
import pydantic
from dspy.utils.exceptions import AdapterParseError

from arag.concurrency import lm_slot

# Length budgets, in characters, of string output fields that declare none (dspy.OutputField(max_length=N)).
REASONING_CHARS = 600
STRING_CHARS = 300
LIST_ITEMS = 5
SCALAR_TOKENS = 8  # a label, a boolean or a number
FIELD_MARKUP_TOKENS = 12  # the field's key or header and its punctuation
# One token per character: a string's grammar-enforced length then always fits its token budget, however the
# model spells it (a small model repeating "0" writes one character per token; a cut string cannot parse).
CHARS_PER_TOKEN = 1
LENGTH_KEYWORDS = ("maxLength", "maxItems")  # left out for endpoints whose strict mode refuses them


def field_chars(name: str, field: pydantic.fields.FieldInfo) -> int:
    """The declared `max_length` of a string field, else the default for its name."""
    for item in field.metadata:
        if isinstance(item, annotated_types.MaxLen):
            return item.max_length
    return REASONING_CHARS if name == "reasoning" else STRING_CHARS


def _is_str_list(annotation: Any) -> bool:
    return typing.get_origin(annotation) is list and typing.get_args(annotation) in ((str,),)


def _is_scalar(annotation: Any) -> bool:
    return annotation in (bool, int, float) or typing.get_origin(annotation) is typing.Literal


def without_lengths(schema: Any) -> Any:
    """A JSON schema without its `maxLength`/`maxItems` keywords, at any depth."""
    if isinstance(schema, dict):
        return {key: without_lengths(value) for key, value in schema.items()
                if key not in LENGTH_KEYWORDS or not isinstance(value, int)}
    if isinstance(schema, list):
        return [without_lengths(item) for item in schema]
    return schema


def field_schema(name: str, field: pydantic.fields.FieldInfo, *, lengths: bool = True) -> dict[str, Any]:
    """The JSON schema of one output field; strings carry their length budget as `maxLength`. `lengths=False`
    leaves length keywords out, those of a type's own schema too."""
    annotation = field.annotation
    if annotation is str:
        return {"type": "string", **({"maxLength": field_chars(name, field)} if lengths else {})}
    if _is_str_list(annotation):
        item = {"type": "string", **({"maxLength": field_chars(name, field)} if lengths else {})}
        return {"type": "array", "items": item, **({"maxItems": LIST_ITEMS} if lengths else {})}
    schema = pydantic.TypeAdapter(annotation).json_schema()
    schema.pop("title", None)
    return schema if lengths else without_lengths(schema)


def output_schema(signature: type[dspy.Signature], *, lengths: bool = True) -> dict[str, Any]:
    """The JSON schema of a signature's outputs: every field required, no others allowed."""
    properties = {name: field_schema(name, field, lengths=lengths) for name, field in signature.output_fields.items()}
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def output_token_budget(signature: type[dspy.Signature]) -> int:
    """Tokens enough for every output field at its length budget."""
    total = 0
    for name, field in signature.output_fields.items():
        annotation = field.annotation
        if _is_scalar(annotation):
            total += SCALAR_TOKENS
        elif annotation is str:
            total += field_chars(name, field) // CHARS_PER_TOKEN
        elif _is_str_list(annotation):
            total += LIST_ITEMS * field_chars(name, field) // CHARS_PER_TOKEN
        else:
            total += STRING_CHARS // CHARS_PER_TOKEN
        total += FIELD_MARKUP_TOKENS
    return total


def _with_budget(lm: dspy.BaseLM, lm_kwargs: dict[str, Any], signature: type[dspy.Signature]) -> None:
    if "max_tokens" in lm_kwargs or "max_completion_tokens" in lm_kwargs:
        return
    cap = (getattr(lm, "kwargs", None) or {}).get("max_tokens")
    budget = output_token_budget(signature)
    lm_kwargs["max_tokens"] = min(budget, cap) if cap else budget


def _check_strings(adapter: str, signature: type[dspy.Signature], completion: str) -> None:
    """Refuse a JSON answer whose `str` field holds an object, list or number (DSPy would pass on its repr)."""
    fields = json_repair.loads(completion)
    if not isinstance(fields, dict):
        return
    for name, value in fields.items():
        field = signature.output_fields.get(name)
        if field is not None and field.annotation is str and not isinstance(value, str):
            raise AdapterParseError(
                adapter_name=adapter, signature=signature, lm_response=completion, parsed_result=fields,
                message=f"field {name!r} must be a string, got {type(value).__name__} {value!r:.80}",
            )


class SchemaAdapter(dspy.JSONAdapter):
    """JSON output decoded under the signature's schema (`response_format` json_schema).

    `lengths=False` leaves `maxLength`/`maxItems` out of the schema for endpoints whose strict mode
    refuses them (OpenAI's structured outputs); `constrained=False` sends no schema at all (JSON asked
    for in the prompt only). The token budget applies either way.
    """

    def __init__(self, *, lengths: bool = True, constrained: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lengths = lengths
        self.constrained = constrained

    def __call__(self, lm, lm_kwargs, signature, demos, inputs):
        with lm_slot():
            return super().__call__(lm, lm_kwargs, signature, demos, inputs)

    async def acall(self, lm, lm_kwargs, signature, demos, inputs):
        with lm_slot():
            return await super().acall(lm, lm_kwargs, signature, demos, inputs)

    def _prepare_response_format(self, lm, lm_kwargs, signature):
        _with_budget(lm, lm_kwargs, signature)
        if "response_format" in lm_kwargs or not self.constrained:
            return
        open_mapping = any(typing.get_origin(f.annotation) is dict for f in signature.output_fields.values())
        lm_kwargs["response_format"] = {
            "type": "json_schema",
            "json_schema": {
                "name": signature.__name__,
                "schema": output_schema(signature, lengths=self.lengths),
                "strict": not open_mapping,
            },
        }

    def parse(self, signature: type[dspy.Signature], completion: str) -> dict[str, Any]:
        fields = super().parse(signature, completion)
        _check_strings(type(self).__name__, signature, completion)
        return fields

    # The prompt this adapter sends, and the JSON it expects back (DSPy's JSONAdapter leaves this unwritten).
    format_finetune_data = dspy.ChatAdapter.format_finetune_data


class TextAdapter(dspy.ChatAdapter):
    """DSPy's ChatAdapter (`[[ ## field ## ]]` sections, then JSON asked for in the prompt when the
    sections do not parse) with the per-call token budget."""

    def _make_json_adapter_fallback(self):
        return SchemaAdapter(constrained=False, callbacks=self.callbacks)

    def __call__(self, lm, lm_kwargs, signature, demos, inputs):
        _with_budget(lm, lm_kwargs, signature)
        with lm_slot():
            return super().__call__(lm, lm_kwargs, signature, demos, inputs)

    async def acall(self, lm, lm_kwargs, signature, demos, inputs):
        _with_budget(lm, lm_kwargs, signature)
        with lm_slot():
            return await super().acall(lm, lm_kwargs, signature, demos, inputs)


def default_adapter(lm: dspy.BaseLM | None = None, structured: bool = True) -> dspy.Adapter:
    """The adapter arag programs use when none is configured: SchemaAdapter, without length keywords for
    OpenAI's own API (its strict mode refuses them); TextAdapter when `structured` is off."""
    if not structured:
        return TextAdapter()
    model = getattr(lm, "model", "") or ""
    hosted_openai = model.startswith("openai/") and not (getattr(lm, "kwargs", None) or {}).get("api_base")
    return SchemaAdapter(lengths=not hosted_openai)
