"""A BERT sentence-transformers model (all-MiniLM-L6-v2 by default) run by ONNX Runtime, without torch.

The ONNX graph is written here from the model folder's `config.json` and `model.safetensors` when the model is
loaded: BERT's embeddings, encoder layers (post-norm, exact GELU) and the folder's pooling (mean or CLS over the
attention mask), the same operations sentence-transformers runs in torch. Texts are tokenised by the folder's
`tokenizer.json` (Hugging Face tokenizers, as sentence-transformers' fast tokenizer) and cut at `max_seq_length`
tokens. No file is downloaded or written.

Folders this cannot read (another architecture, a Dense layer after pooling, weights only in a `.bin` file) are a
ConfigError that points to the torch backend.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from arag.errors import ConfigError

TORCH_HINT = "use the torch backend (pip install 'dspy-arag[dense-torch]'; ARAG_DENSE_BACKEND=torch)"
OPSET = 20
"""ONNX opset 20: the first with a Gelu operator (exact, erf-based, as BERT's `gelu`)."""
PLAIN_MODULES = {"Transformer", "Pooling", "Normalize"}
"""The sentence-transformers modules this runs."""


def load_runtime():
    """The onnx and onnxruntime modules; a ConfigError with the install line when either is missing."""
    try:
        import onnx
        import onnxruntime
    except ImportError as exc:
        raise ConfigError(f"the onnx dense backend needs onnx and onnxruntime ({exc}): "
                          "pip install 'dspy-arag[dense]'") from None
    return onnx, onnxruntime


def check_max_seq_length(max_seq_length: int, limit: int) -> None:
    """A ConfigError when `max_seq_length` is above the model's limit (any backend's)."""
    if max_seq_length > limit:
        raise ConfigError(f"max_seq_length {max_seq_length} is above the model's limit of {limit}")


class OnnxSentenceModel:
    """`encode(texts, batch_size) -> (n, dim) float32` for the model in `folder`: pooled, then normalised when its
    modules end with Normalize (as all-MiniLM-L6-v2's do)."""

    def __init__(self, folder: Path, max_seq_length: int | None = None):
        onnx, onnxruntime = load_runtime()
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        config = read_json(folder / "config.json")
        modules = read_modules(folder)
        self.pooling = pooling_mode(folder, modules)
        self.normalize = any(m.get("type", "").endswith(".Normalize") for m in modules)
        limit = model_max_length(folder, config)
        if max_seq_length is not None:
            check_max_seq_length(max_seq_length, limit)
        self.max_seq_length = max_seq_length or min(limit, default_max_seq_length(folder))
        if not (folder / "tokenizer.json").is_file():
            raise ConfigError(f"{folder} has no tokenizer.json (a fast tokenizer's file): {TORCH_HINT}")
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=self.max_seq_length)
        weights_file = folder / "model.safetensors"
        if not weights_file.is_file():
            raise ConfigError(f"{folder} has no model.safetensors: the onnx backend reads no other weights; "
                              f"{TORCH_HINT}")
        shape = bert_shape(config, folder)
        self.dim = shape["hidden"]
        graph = bert_graph(onnx, bert_weights(load_file(str(weights_file)), folder), shape, self.pooling)
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3  # errors only: no notices on the command line
        self.session = onnxruntime.InferenceSession(graph.SerializeToString(), options,
                                                    providers=["CPUExecutionProvider"])

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        """Batches of `batch_size` texts of similar token counts (the longest first), each padded to its longest."""
        encodings = self.tokenizer.encode_batch(list(texts))
        order = sorted(range(len(texts)), key=lambda i: -len(encodings[i].ids))
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            width = max(len(encodings[i].ids) for i in rows)
            ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.int64)
            for row, i in enumerate(rows):
                ids[row, :len(encodings[i].ids)] = encodings[i].ids
                mask[row, :len(encodings[i].ids)] = 1
            vectors[rows] = self.session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        if self.normalize:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors /= np.where(norms > 0, norms, 1)
        return vectors


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def read_modules(folder: Path) -> list[dict]:
    """The folder's sentence-transformers modules (none listed: a plain model, pooled by mean); a ConfigError for
    one this does not run."""
    modules = read_json(folder / "modules.json") if (folder / "modules.json").is_file() else []
    others = [m.get("type", "?") for m in modules if m.get("type", "?").rsplit(".", 1)[-1] not in PLAIN_MODULES]
    if others:
        raise ConfigError(f"{folder} has modules the onnx backend does not run ({', '.join(others)}): {TORCH_HINT}")
    return modules


def pooling_mode(folder: Path, modules: list[dict]) -> str:
    """`mean` or `cls`, from the Pooling module's config (mean when the folder has none, as sentence-transformers
    does)."""
    pooling = next((m for m in modules if m.get("type", "").endswith(".Pooling")), None)
    config_file = folder / pooling.get("path", "") / "config.json" if pooling else None
    if config_file is None or not config_file.is_file():
        return "mean"
    config = read_json(config_file)
    if "pooling_mode" in config:  # sentence-transformers 6 writes the mode by name
        modes = [config["pooling_mode"]]
    else:  # earlier releases one flag a mode: pooling_mode_mean_tokens, pooling_mode_cls_token, ...
        modes = [key.removeprefix("pooling_mode_").removesuffix("_tokens").removesuffix("_token")
                 for key, on in config.items() if key.startswith("pooling_mode_") and on is True]
    if modes not in (["mean"], ["cls"]):
        raise ConfigError(f"{config_file}: pooling {modes or 'unknown'} (the onnx backend pools by mean or CLS): "
                          f"{TORCH_HINT}")
    return modes[0]


def default_max_seq_length(folder: Path) -> int:
    settings = folder / "sentence_bert_config.json"
    return int(read_json(settings).get("max_seq_length") or 512) if settings.is_file() else 512


def model_max_length(folder: Path, config: dict) -> int:
    """The most tokens the model reads: its position table, or the tokenizer's limit when lower."""
    limit = int(config.get("max_position_embeddings", 512))
    tokenizer_config = folder / "tokenizer_config.json"
    if tokenizer_config.is_file():
        limit = min(limit, int(read_json(tokenizer_config).get("model_max_length", limit)))
    return limit


def bert_shape(config: dict, folder: Path) -> dict:
    if config.get("model_type") != "bert" or config.get("hidden_act", "gelu") != "gelu" \
            or config.get("position_embedding_type", "absolute") != "absolute":
        raise ConfigError(f"{folder} holds a {config.get('model_type')} model (the onnx backend runs BERT with "
                          f"absolute positions and GELU): {TORCH_HINT}")
    return {"layers": int(config["num_hidden_layers"]), "heads": int(config["num_attention_heads"]),
            "hidden": int(config["hidden_size"]), "eps": float(config.get("layer_norm_eps", 1e-12))}


def bert_weights(weights: dict[str, np.ndarray], folder: Path) -> dict[str, np.ndarray]:
    """The tensors by BertModel's names (a `bert.` prefix dropped), float32."""
    if "embeddings.word_embeddings.weight" not in weights:
        weights = {name.removeprefix("bert."): tensor for name, tensor in weights.items()}
    if "embeddings.word_embeddings.weight" not in weights:
        raise ConfigError(f"{folder}/model.safetensors holds no BERT embeddings: {TORCH_HINT}")
    return {name: tensor.astype(np.float32, copy=False) for name, tensor in weights.items()}


def bert_graph(onnx, weights: dict[str, np.ndarray], shape: dict, pooling: str):
    """The ONNX model: (input_ids, attention_mask) int64 [batch, tokens] -> embedding float32 [batch, hidden]."""
    helper, numpy_helper = onnx.helper, onnx.numpy_helper
    nodes, constants = [], []
    heads, hidden = shape["heads"], shape["hidden"]

    def constant(name: str, value) -> str:
        constants.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op: str, *inputs: str, **attributes) -> str:
        output = f"{op.lower()}_{len(nodes)}"
        nodes.append(helper.make_node(op, list(inputs), [output], **attributes))
        return output

    def linear(x: str, name: str) -> str:
        kernel = constant(f"{name}.weight.T", np.ascontiguousarray(weights[f"{name}.weight"].T))
        return node("Add", node("MatMul", x, kernel), constant(f"{name}.bias", weights[f"{name}.bias"]))

    def layer_norm(x: str, name: str) -> str:
        return node("LayerNormalization", x, constant(f"{name}.weight", weights[f"{name}.weight"]),
                    constant(f"{name}.bias", weights[f"{name}.bias"]), axis=-1, epsilon=shape["eps"])

    def split_heads(x: str, perm: list[int]) -> str:
        return node("Transpose", node("Reshape", x, "heads_shape"), perm=perm)

    constant("heads_shape", np.array([0, 0, heads, hidden // heads], dtype=np.int64))
    constant("hidden_shape", np.array([0, 0, hidden], dtype=np.int64))
    constant("scale", np.array(1 / np.sqrt(hidden // heads), dtype=np.float32))
    constant("axis_1", np.array([1], dtype=np.int64))
    tokens = node("Gather", node("Shape", "input_ids"), constant("one", np.array(1, dtype=np.int64)), axis=0)
    positions = node("Range", constant("zero", np.array(0, dtype=np.int64)), tokens, "one")
    x = node("Add", node("Gather", constant("word_embeddings", weights["embeddings.word_embeddings.weight"]),
                         "input_ids"),
             node("Gather", constant("position_embeddings", weights["embeddings.position_embeddings.weight"]),
                  positions))
    x = node("Add", x, constant("token_type_0", weights["embeddings.token_type_embeddings.weight"][0]))
    x = layer_norm(x, "embeddings.LayerNorm")
    mask = node("Cast", "attention_mask", to=onnx.TensorProto.FLOAT)
    padding = node("Mul", node("Sub", constant("float_one", np.array(1, dtype=np.float32)), mask),
                   constant("lowest", np.array(np.finfo(np.float32).min, dtype=np.float32)))
    padding = node("Unsqueeze", padding, constant("axes_1_2", np.array([1, 2], dtype=np.int64)))
    for i in range(shape["layers"]):
        layer = f"encoder.layer.{i}"
        query = split_heads(linear(x, f"{layer}.attention.self.query"), [0, 2, 1, 3])
        key = split_heads(linear(x, f"{layer}.attention.self.key"), [0, 2, 3, 1])
        value = split_heads(linear(x, f"{layer}.attention.self.value"), [0, 2, 1, 3])
        scores = node("Add", node("Mul", node("MatMul", query, key), "scale"), padding)
        context = node("MatMul", node("Softmax", scores, axis=-1), value)
        context = node("Reshape", node("Transpose", context, perm=[0, 2, 1, 3]), "hidden_shape")
        x = layer_norm(node("Add", linear(context, f"{layer}.attention.output.dense"), x),
                       f"{layer}.attention.output.LayerNorm")
        inner = node("Gelu", linear(x, f"{layer}.intermediate.dense"))
        x = layer_norm(node("Add", linear(inner, f"{layer}.output.dense"), x), f"{layer}.output.LayerNorm")
    if pooling == "cls":
        nodes.append(helper.make_node("Gather", [x, "zero"], ["embedding"], axis=1))
    else:
        token_mask = node("Unsqueeze", mask, constant("axis_2", np.array([2], dtype=np.int64)))
        summed = node("ReduceSum", node("Mul", x, token_mask), "axis_1", keepdims=0)
        nodes.append(helper.make_node("Div", [summed, node("ReduceSum", mask, "axis_1", keepdims=1)], ["embedding"]))
    inputs = [helper.make_tensor_value_info(name, onnx.TensorProto.INT64, ["batch", "tokens"])
              for name in ("input_ids", "attention_mask")]
    output = helper.make_tensor_value_info("embedding", onnx.TensorProto.FLOAT, ["batch", hidden])
    graph = helper.make_graph(nodes, "sentence_bert", inputs, [output], constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
