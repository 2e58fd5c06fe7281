"""A causal LM run by transformers in this process, for what llama.cpp does not expose: the attention weights of
each layer and the full-vocabulary distribution each generated token is chosen from (DRAGIN reads both).

``AttentionModel.load(source)`` reads a GGUF file (transformers dequantises its weights to float32: the same
weights llama.cpp runs, at four to eight times the memory) or a Hugging Face model folder, with eager attention (the
SDPA kernels return no weights). ``generate`` decodes greedily, with no logits processor, and gives each token's
entropy over the whole vocabulary, read from the model's own logits (the prefix a prompt shares with the one before
is read from that generation's cache); ``last_layer_attention`` runs one forward
pass over given tokens and gives the last layer's attention, per head. ``attention_model_for`` finds the model a
run's LM stands on (a local GGUF model) or the one a program names. Models load once per process; one lock
serialises their calls. Needs the ``attention`` extra (transformers, torch, gguf and accelerate, which transformers
requires to read GGUF files).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from arag.errors import ConfigError
from arag.lm.local import LlamaEngine
from arag.lm.local_models import MODELS, model_path

INSTALL_HINT = "pip install 'dspy-arag[attention]'"


@dataclass(frozen=True)
class Generation:
    """A greedy continuation: its tokens, the text each adds, and the entropy (nats, over the whole vocabulary) of
    the distribution each was chosen from; ``stopped`` says why it ended (``eos``, ``stop`` or ``length``). The prompt's
    tokens that it shares with the generation before (the worked examples) are read from that one's cache."""

    prompt_tokens: int
    token_ids: tuple[int, ...]
    pieces: tuple[str, ...]
    entropies: tuple[float, ...]
    stopped: str
    reused_tokens: int = 0  # of the prompt's tokens, those read from the cache of the generation before

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def cut(self, stop: str) -> Generation:
        """This generation up to ``stop``, excluded: the token holding it keeps its text before it, or is dropped
        when that is blank."""
        end = self.text.find(stop)
        if end < 0:
            return self
        pieces, length = [], 0
        for piece in self.pieces:
            if length + len(piece) > end:
                if piece[: end - length].strip():
                    pieces.append(piece[: end - length])
                break
            pieces.append(piece)
            length += len(piece)
        kept = len(pieces)
        return replace(self, token_ids=self.token_ids[:kept], pieces=tuple(pieces), entropies=self.entropies[:kept],
                       stopped="stop")


class AttentionModel:
    """A transformers causal LM and its tokenizer (``model`` with eager attention, in evaluation mode)."""

    def __init__(self, model: Any, tokenizer: Any, name: str, threads: int | None = None) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.threads = threads  # torch's threads while it runs (None: torch's own setting, every core)
        self.lock = threading.Lock()
        self.generations = 0  # calls to generate, as an engine counts its requests
        self.kept: tuple[list[int], Any] | None = None  # the tokens the last generation's cache holds, and that cache

    @classmethod
    def load(cls, source: str | Path, threads: int | None = None) -> AttentionModel:
        """The model in ``source`` (a GGUF file or a Hugging Face model folder), loaded on first use and kept for
        the life of the process. ``threads`` bounds torch's threads while it runs (more threads than free cores
        slow it down several times over: torch's workers wait for each other)."""
        path = Path(source).expanduser()
        if not path.exists():
            raise ConfigError(f"attention model {source}: no such file or folder (give a GGUF file, a Hugging Face "
                              f"model folder, or a model of `arag models`: {', '.join(MODELS)})")
        model = _loaded(str(path.resolve()))
        if threads:
            model.threads = threads
        return model

    def encode(self, text: str, special: bool = True) -> list[int]:
        """The tokens of ``text``, with the special tokens the tokenizer adds around a text (a BOS) when
        ``special``."""
        return list(self.tokenizer(text, add_special_tokens=special)["input_ids"])

    def pieces(self, token_ids: Sequence[int]) -> list[str]:
        """The text each token adds to the decoded whole (a token inside a UTF-8 character adds nothing; the one
        that completes it adds the character), so that the pieces join into the decoded text."""
        pieces, emitted = [], 0
        for end in range(1, len(token_ids) + 1):
            text = self.tokenizer.decode(token_ids[:end])
            stable = text.rstrip("\ufffd") if end < len(token_ids) else text
            pieces.append(stable[emitted:])
            emitted = max(emitted, len(stable))
        return pieces

    def special_ids(self) -> frozenset[int]:
        return frozenset(self.tokenizer.all_special_ids)

    def generate(self, prompt: str, max_new_tokens: int, stop: str | None = None) -> Generation:
        """Greedy decoding of at most ``max_new_tokens`` tokens after ``prompt`` (no logits processor, no
        sampling), ended early by an end of sequence or another special token (dropped) or by a token whose text
        holds ``stop`` (kept whole: ``cut`` removes it). Entropies come from the model's raw logits."""
        import torch
        from transformers import GenerationConfig, StoppingCriteriaList

        prompt_ids = self.encode(prompt)
        ends = sorted(self._end_ids())
        config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=ends or None,
                                  pad_token_id=ends[0] if ends else None)
        inputs = torch.tensor([prompt_ids])
        criteria = StoppingCriteriaList([self._stop_at(stop, len(prompt_ids))] if stop else [])
        with self.running(), torch.inference_mode():
            self.generations += 1
            cache, reused = self._reusable_cache(prompt_ids)
            output = self.model.generate(inputs, attention_mask=torch.ones_like(inputs), generation_config=config,
                                         stopping_criteria=criteria, output_logits=True, return_dict_in_generate=True,
                                         **{self._cache_argument(): cache})
            held = getattr(output, self._cache_argument(), None)
            if held is not None:
                self.kept = (output.sequences[0].tolist()[: held.get_seq_length()], held)
        new_ids = output.sequences[0, len(prompt_ids):].tolist()
        log_probs = torch.log_softmax(torch.stack(output.logits)[:, 0].double(), dim=-1)
        entropies = (-(log_probs.exp() * log_probs).sum(dim=-1)).tolist()[: len(new_ids)]
        stopped = "length"
        if new_ids and new_ids[-1] in ends:
            new_ids, entropies, stopped = new_ids[:-1], entropies[:-1], "eos"
        elif stop and stop in self.tokenizer.decode(new_ids):
            stopped = "stop"
        return Generation(len(prompt_ids), tuple(new_ids), tuple(self.pieces(new_ids)), tuple(entropies), stopped,
                          reused)

    @staticmethod
    def _cache_argument() -> str:
        """What generate calls the cache it starts from and returns: ``cache`` in recent transformers 5 releases,
        ``past_key_values`` before."""
        from transformers.generation import GenerateDecoderOnlyOutput

        return "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"

    def _reusable_cache(self, prompt_ids: list[int]) -> tuple[Any, int]:
        """The last generation's cache cut to the prefix it shares with ``prompt_ids`` (the worked examples of a
        prompt like the one before), and that prefix's length; (None, 0) when none is shared. The cache is handed
        over (the caller's generation extends it), so it is forgotten here until that generation keeps its own."""
        if self.kept is None:
            return None, 0
        held_ids, cache = self.kept
        self.kept = None
        shared = 0
        for held, new in zip(held_ids, prompt_ids[:-1]):  # the prompt's last token is evaluated anew, for its logits
            if held != new:
                break
            shared += 1
        if shared == 0:
            return None, 0
        if shared < len(held_ids):
            cache.crop(shared - len(held_ids))  # a negative count removes that many: the same in transformers 4 and 5
        return cache, shared

    def last_layer_attention(self, token_ids: Sequence[int]) -> np.ndarray:
        """The last layer's attention over ``token_ids`` in one forward pass: an array [head, query, key] whose
        rows each sum to 1 over the keys at or before the query."""
        import torch

        if not token_ids:
            return np.zeros((0, 0, 0))
        with self.running(), torch.inference_mode():
            output = self.model(torch.tensor([list(token_ids)]), output_attentions=True, use_cache=False,
                                logits_to_keep=1)
        if not output.attentions or output.attentions[-1] is None:
            raise ConfigError(f"attention model {self.name} returns no attention weights: load it with "
                              "attn_implementation='eager'")
        return output.attentions[-1][0].double().numpy()

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Hold the model's lock, on its threads."""
        import torch

        with self.lock:
            previous = torch.get_num_threads()
            if self.threads:
                torch.set_num_threads(self.threads)
            try:
                yield
            finally:
                torch.set_num_threads(previous)

    def _stop_at(self, stop: str, prompt_length: int) -> Any:
        """A stopping criterion: the text generated after the prompt holds ``stop`` (transformers' own stop strings
        read the vocabulary in ways some tokenisers break)."""
        import torch
        from transformers import StoppingCriteria

        tokenizer = self.tokenizer

        class StopAtText(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                return torch.tensor([stop in tokenizer.decode(input_ids[0, prompt_length:])])

        return StopAtText()

    def _end_ids(self) -> frozenset[int]:
        """The tokens that end a generation: the model's ends of sequence and every special token but the unknown
        one (a raw completion that writes <|endoftext|> or a chat marker has left its text)."""
        ends = self.model.generation_config.eos_token_id
        ends = set() if ends is None else {ends} if isinstance(ends, int) else set(ends)
        ends.update(self.tokenizer.all_special_ids)
        ends.discard(self.tokenizer.unk_token_id)
        return frozenset(ends)


@functools.lru_cache(maxsize=None)
def _loaded(path: str) -> AttentionModel:
    try:
        import torch  # noqa: F401
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise ConfigError(f"the attention model needs transformers and torch: {INSTALL_HINT}") from None
    location = Path(path)
    where = {"pretrained_model_name_or_path": str(location.parent), "gguf_file": location.name} \
        if location.is_file() else {"pretrained_model_name_or_path": str(location)}
    try:
        tokenizer = AutoTokenizer.from_pretrained(**where)
        model = AutoModelForCausalLM.from_pretrained(**where, attn_implementation="eager", dtype="float32")
    except (ImportError, ValueError, OSError, KeyError, RuntimeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"cannot load the attention model {path}: {reason} ({INSTALL_HINT} reads GGUF files)") \
            from None
    return AttentionModel(model, tokenizer, location.name)


def attention_model_for(lm: Any, source: str = "", threads: int | None = None) -> AttentionModel:
    """The attention model a program runs: ``source`` (a GGUF file, a Hugging Face model folder, or a model of
    `arag models`) run on ``threads`` threads (else a local LM's), else the model of ``lm``: a local GGUF model's file
    (``--lm local``, on the LM's threads), or the ``attention_model`` its engine carries (a test's). A ConfigError
    names what is missing."""
    engine = getattr(lm, "engine", None)
    if source:
        threads = threads or (engine.threads if isinstance(engine, LlamaEngine) else None)
        return AttentionModel.load(model_path(source) if source in MODELS else source, threads)
    if isinstance(engine, LlamaEngine):
        return AttentionModel.load(engine.model_path, engine.threads)
    carried = getattr(engine, "attention_model", None)
    if carried is not None:
        return carried
    name = getattr(lm, "model", None) or "none configured"
    raise ConfigError(
        f"needs a model's attention weights and full-vocabulary distributions, which the LM ({name}) does not give: "
        "run it with --lm local (or local:NAME, local:PATH.gguf), or name a GGUF file, a Hugging Face model folder "
        f"or a model of `arag models` with --param attention_model=... ({INSTALL_HINT})")

