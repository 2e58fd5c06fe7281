"""Token log-probabilities, the one place the project reads them: ``completion_logprobs`` (a whole completion),
``field_logprobs`` (one output field of a prediction), ``label_probabilities`` (a label field),
``token_label_probabilities`` (labels at one token position, e.g. a model's reflection tokens), and ``lm15_tokens``
(a server's log-probabilities as lm15 tokens, for the engines).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from json.decoder import scanstring
from typing import Any

import dspy
from dspy import lm15

from arag.errors import LMError

_ENABLE_LOGPROBS_HINT = (
    "build the LM with logprobs=True (arag.build_lm(..., logprobs=True, top_logprobs=5), or "
    "dspy.Predict(..., logprobs=True)) and use an endpoint that returns log-probabilities "
    "(OpenAI, vLLM and llama.cpp servers do; not every provider does)"
)


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token, its log-probability, and the top candidates ``(token, logprob)`` at its position."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()

    @property
    def prob(self) -> float:
        return math.exp(self.logprob)


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def _raw_logprobs(source: Any) -> Any:
    if isinstance(source, lm15.Response):
        return source.logprobs
    if isinstance(source, dspy.Example):
        return source.get("logprobs")
    if isinstance(source, Mapping) and "content" not in source:
        return source.get("logprobs")
    return source


def _missing_logprobs(what: str) -> LMError:
    lm = dspy.settings.lm
    configured = f" (configured LM: {lm.model})" if getattr(lm, "model", None) else ""
    return LMError(f"{what} carries no token log-probabilities{configured}: {_ENABLE_LOGPROBS_HINT}")


def completion_logprobs(source: Any) -> list[TokenLogprob]:
    """The tokens of a whole completion, adapter markup included.

    ``source`` is a prediction (``pred.logprobs``), an LM call output (``{"text", "logprobs"}``), an
    ``lm15.Response``, or a logprobs object itself; native, LiteLLM and custom-engine shapes alike.
    """
    raw = _raw_logprobs(source)
    entries = raw if raw is None or isinstance(raw, (list, tuple)) else _get(raw, "content")
    if not entries:
        raise _missing_logprobs("the prediction" if isinstance(source, dspy.Example) else "the LM output")
    tokens = []
    for entry in entries:
        top = _get(entry, "top_logprobs")
        top = _get(entry, "top") if top is None else top
        tokens.append(
            TokenLogprob(
                token=_get(entry, "token"),
                logprob=float(_get(entry, "logprob")),
                top=tuple((_get(item, "token"), float(_get(item, "logprob"))) for item in top or ()),
            )
        )
    return tokens


_CHAT_HEADER = re.compile(r"^[ \t]*\[\[ ## (\w+) ## \]\][ \t]*", re.MULTILINE)


def _chat_span(text: str, field: str) -> tuple[int, int] | None:
    headers = list(_CHAT_HEADER.finditer(text))
    for index, header in enumerate(headers):
        if header.group(1) == field:
            start = header.end()
            end = headers[index + 1].start() if index + 1 < len(headers) else len(text)
            while start < end and text[start].isspace():
                start += 1
            while end > start and text[end - 1].isspace():
                end -= 1
            return start, end
    return None


def _skip_space(text: str, index: int) -> int:
    while index < len(text) and text[index].isspace():
        index += 1
    return index


# What may follow a JSON string's closing quote, after at most one space: a quote followed by anything else is
# read as part of the string. The local engine's lenient grammar keeps such quotes in strings (`arag.lm.local`),
# and DSPy's JSON parser (json_repair) reads them the same way.
AFTER_STRING_END = ',:}]"\\ \t\n'


def json_string_end(text: str, start: int) -> int:
    """The index just past the quote that ends the JSON string whose content begins at `start`, where a quote the
    model left unescaped stays inside the string unless AFTER_STRING_END says it ends it; ValueError when the
    string is never closed (cut short by the token budget)."""
    index = start
    while index < len(text):
        if text[index] == "\\":
            index += 2
            continue
        if text[index] == '"':
            after = index + 1 + text.startswith(" ", index + 1)
            if after >= len(text) or text[after] in AFTER_STRING_END:
                return index + 1
        index += 1
    raise ValueError(f"unterminated string starting at {start}")


def _json_span(text: str, field: str) -> tuple[int, int] | None:
    """Span of a top-level member's value in the first JSON object of text (a string's content, without quotes;
    to the end of the text when the completion stopped inside it)."""
    index = text.find("{")
    if index < 0:
        return None
    decoder = json.JSONDecoder(strict=False)
    index = _skip_space(text, index + 1)
    try:
        while text.startswith('"', index):
            key, index = scanstring(text, index + 1, False)
            index = _skip_space(text, index)
            if not text.startswith(":", index):
                return None
            index = _skip_space(text, index + 1)
            if text.startswith('"', index):
                try:
                    end = json_string_end(text, index + 1)
                except ValueError:
                    if key != field:
                        raise
                    return index + 1, len(text.rstrip())  # a string cut short by the token budget
                span = (index + 1, end - 1)
            else:
                _, end = decoder.raw_decode(text, index)
                span = (index, end)
            if key == field:
                return span
            index = _skip_space(text, end)
            if not text.startswith(",", index):
                return None
            index = _skip_space(text, index + 1)
    except ValueError:
        return None
    return None


@dataclass(frozen=True)
class _FieldTokens:
    tokens: list[TokenLogprob]  # as generated (a JSON string's escapes included)
    head: str
    tail: str
    spelled: list[TokenLogprob]  # each token's share of the field's value, as the adapter parsed it


def _json_unescaped(raw: str) -> list[str]:
    """For each character of a JSON string's raw content, the text it stands for: an escape sequence decodes at
    its backslash and its other characters stand for nothing."""
    out, index = [], 0
    while index < len(raw):
        if raw[index] == "\\" and index + 1 < len(raw):
            width = 6 if raw[index + 1] == "u" else 2
            sequence = raw[index:index + width]
            try:
                out.append(json.loads(f'"{sequence}"'))
            except ValueError:  # cut short by the token budget
                out.append(sequence)
            out.extend([""] * (len(sequence) - 1))
            index += len(sequence)
        else:
            out.append(raw[index])
            index += 1
    return out


def _field_tokens(source: Any, field: str) -> _FieldTokens:
    tokens = completion_logprobs(source)
    text = "".join(token.token for token in tokens)
    span = _chat_span(text, field) or _json_span(text, field)
    if span is None:
        raise LMError(
            f"output field {field!r} is not in the completion (neither a [[ ## {field} ## ]] section nor a JSON "
            "member): the LM did not produce it, or its answer was cut short (raise max_tokens)"
        )
    start, end = span
    selected, position = [], 0
    for token in tokens:
        token_start, position = position, position + len(token.token)
        if token_start < end and position > start:
            selected.append((token, token_start))
    while selected and not selected[0][0].token.strip():
        selected.pop(0)
    while selected and not selected[-1][0].token.strip():
        selected.pop()
    if not selected:
        return _FieldTokens([], "", "", [])
    first, first_start = selected[0]
    head = first.token[: max(start - first_start, 0)]
    tail = first.token[max(end - first_start, 0) :] if first_start + len(first.token) > end else ""
    spelled = [token for token, _ in selected]
    if start > 0 and text[start - 1] == '"' and _chat_span(text, field) is None:  # a JSON string's content
        decoded = _json_unescaped(text[start:end])
        spelled = [
            replace(token, token="".join(decoded[max(at, start) - start : min(at + len(token.token), end) - start]))
            for token, at in selected
        ]
    return _FieldTokens([token for token, _ in selected], head, tail, spelled)


def field_logprobs(prediction: Any, field: str) -> list[TokenLogprob]:
    """The tokens of one output field's text, for ChatAdapter (``[[ ## field ## ]]``) and JSON output.

    Tokens partly inside the field's text are included (e.g. a token joining a JSON quote and a word);
    whitespace-only tokens at either end are not. A JSON string's tokens are spelled as its value: their
    text is their share of it, escapes decoded and quotes left out, so that they join into the value
    the adapter parsed (e.g. `\\"hi\\"` comes back as `"hi"`).
    """
    return _field_tokens(prediction, field).spelled


def _matching_label(candidate: str, labels: Sequence[str]) -> str | None:
    text = candidate.strip().lower()
    if not text:
        return None
    exact = [label for label in labels if label.lower() == text]
    if exact:
        return exact[0]
    prefixed = [label for label in labels if label.lower().startswith(text)]
    return prefixed[0] if len(prefixed) == 1 else None

def has_top_logprobs(prediction: dspy.Prediction, field: str) -> bool:
    """Whether the LM returned the top candidates of the field's first token (logprobs and top_logprobs)."""
    if not prediction.get("logprobs"):
        return False
    tokens = field_logprobs(prediction, field)
    return bool(tokens and tokens[0].top)


def label_probabilities(prediction: Any, field: str, labels: Sequence[str]) -> dict[str, float]:
    """Probability of each label for a classification-like output field, normalised over ``labels``.

    Read from the top candidates of the field's first token: a candidate counts for the label it spells
    or begins (case-insensitive, surrounding whitespace ignored, so " Yes" and "yes" both count for "Yes").
    Labels should differ in their first token. All zeros when no candidate matches any label.
    """
    found = _field_tokens(prediction, field)
    if not found.tokens:
        raise LMError(f"output field {field!r} is empty: there is no token to read label probabilities from")
    first = found.tokens[0]
    if not first.top:
        raise LMError(
            f"the first token of field {field!r} has no top log-probabilities: build the LM with logprobs=True "
            f"and top_logprobs=k (k at least {len(labels)}, e.g. 5), on an endpoint that returns them"
        )

    def label_of(token: str) -> str | None:
        if found.head and token.startswith(found.head):
            token = token[len(found.head) :]
        if found.tail and token.endswith(found.tail):
            token = token[: -len(found.tail)]
        return _matching_label(token, labels)

    return token_label_probabilities(first, label_of, labels)


def token_label_probabilities(token: TokenLogprob, label_of: Callable[[str], str | None],
                              labels: Sequence[str]) -> dict[str, float]:
    """Each label's probability at one token position: the probability mass of the token and its top candidates
    that `label_of` maps to the label, normalised over `labels` (all zeros when none maps to any)."""
    candidates = dict(token.top)
    candidates.setdefault(token.token, token.logprob)
    masses = dict.fromkeys(labels, 0.0)
    for candidate, logprob in candidates.items():
        label = label_of(candidate)
        if label is not None:
            masses[label] += math.exp(logprob)
    total = sum(masses.values())
    return {label: (mass / total if total else 0.0) for label, mass in masses.items()}


def lm15_tokens(logprobs: Any, top: int | None = None) -> tuple[lm15.TokenLogprob, ...]:
    """lm15 tokens from a completion's log-probabilities in either shape servers send (dicts or SDK objects):
    the chat shape ``content[] = {token, logprob, top_logprobs[]}`` (chat calls everywhere, and llama.cpp's
    /v1/completions), or the legacy completions shape ``tokens`` / ``token_logprobs`` / ``top_logprobs``
    (``{token: logprob}`` per position; OpenAI's and vLLM's /v1/completions). ``top`` caps the candidates kept."""

    def token(text: str, logprob: Any, alternatives: list[tuple[str, float]]) -> lm15.TokenLogprob:
        alternatives = sorted(alternatives, key=lambda item: -item[1])[:top]
        return lm15.TokenLogprob(text, float(logprob), top=tuple(lm15.TopLogprob(t, lp) for t, lp in alternatives))

    content = _get(logprobs, "content")
    if content is not None:
        return tuple(
            token(_get(entry, "token"), _get(entry, "logprob"),
                  [(_get(alt, "token"), float(_get(alt, "logprob"))) for alt in _get(entry, "top_logprobs") or ()])
            for entry in content
        )
    tokens = _get(logprobs, "tokens") or []
    tops = _get(logprobs, "top_logprobs") or [None] * len(tokens)
    return tuple(
        token(text, logprob, [(t, float(lp)) for t, lp in (alternatives or {}).items()])
        for text, logprob, alternatives in zip(tokens, _get(logprobs, "token_logprobs") or [], tops)
    )
