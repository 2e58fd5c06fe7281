"""ColBERTRetriever: a colbert-ai PLAID index built and searched end to end on CPU with a locally made checkpoint.

The checkpoint is the untrained MiniLM one from `make_test_checkpoint`; it matches distinctive
words well enough for these checks, nothing more. The first run on a machine compiles colbert-ai's
C++ extensions (a few minutes, cached per environment), hence the `slow` marks.
"""

import importlib.util
import json
import multiprocessing
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

if importlib.util.find_spec("colbert") is None:  # found, not imported: importing colbert-ai has side effects
    pytest.skip("needs the colbert extra (colbert-ai)", allow_module_level=True)

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from arag.errors import ConfigError, RetrieverError  # noqa: E402
from arag.retrievers import (  # noqa: E402
    ColBERTRetriever,
    Passage,
    build_index,
    index_for_corpus,
    open_index,
    open_retriever,
)
from arag.retrievers import colbert as colbert_module  # noqa: E402
from arag.retrievers.dense import model_path  # noqa: E402
from arag.retrievers.manifest import MANIFEST_NAME  # noqa: E402

TOPICS = [
    ("Zanzibar", "Zanzibar is an archipelago off Tanzania, famous for cloves, nutmeg and other spices."),
    ("Marie Curie", "Marie Curie discovered polonium and radium and won two Nobel Prizes."),
    ("Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris completed in 1889."),
    ("Photosynthesis", "Chlorophyll lets plants turn sunlight, water and carbon dioxide into glucose."),
    ("Kilimanjaro", "Kilimanjaro is a dormant volcano and the highest mountain in Africa."),
    ("Ada Lovelace", "Ada Lovelace wrote an algorithm for Babbage's Analytical Engine."),
    ("Great Barrier Reef", "The Great Barrier Reef off Queensland is the largest coral reef system."),
    ("Johannes Gutenberg", "Gutenberg brought movable-type printing to Europe around 1440."),
    ("Saxophone", "Adolphe Sax patented the saxophone, a single-reed woodwind of brass, in 1846."),
    ("Axolotl", "The axolotl is a Mexican salamander that regenerates lost limbs."),
    ("Tardigrade", "Tardigrades are microscopic water bears that survive vacuum and radiation."),
    ("Origami", "Origami is the Japanese art of folding paper into cranes and other figures."),
    ("Stonehenge", "Stonehenge is a prehistoric ring of standing sarsen stones on Salisbury Plain."),
    ("Penicillin", "Alexander Fleming noticed in 1928 that a mould killed Staphylococcus bacteria."),
    ("Sourdough", "Sourdough bread rises with wild yeast and lactobacilli instead of baker's yeast."),
    ("Hadron collider", "The Large Hadron Collider near Geneva smashes protons in a 27 km ring."),
    ("Monsoon", "The Indian monsoon brings heavy seasonal rain between June and September."),
    ("Flamenco", "Flamenco is an Andalusian art of cante singing, guitar playing and zapateado dancing."),
    ("Bonsai", "Bonsai growers prune and wire miniature trees kept in shallow pots."),
    ("Aurora borealis", "The aurora borealis glows when solar wind particles strike the upper atmosphere."),
    ("Kimchi", "Kimchi is Korean fermented napa cabbage seasoned with gochugaru chili."),
    ("Venus", "Venus has a thick carbon dioxide atmosphere and the hottest surface of any planet."),
    ("Chess", "In chess a pawn reaching the last rank is promoted, usually to a queen."),
    ("Okapi", "The okapi is a striped forest giraffid of the Congo basin."),
    ("Hanseatic League", "The Hanseatic League linked merchant guilds of Lübeck, Hamburg and Bergen."),
    ("Glacier", "Glaciers form where compacted snow turns into ice that creeps down valleys."),
    ("Espresso", "Espresso is brewed by forcing hot water through finely ground coffee under pressure."),
    ("Cuneiform", "Cuneiform was wedge-shaped writing pressed into clay tablets in Mesopotamia."),
    ("Velcro", "George de Mestral invented Velcro after burrs stuck to his dog's fur."),
    ("Pangolin", "Pangolins are scaly anteaters that roll into a ball when threatened."),
]
PASSAGES = [Passage(f"p{i:02d}", title, text) for i, (title, text) in enumerate(TOPICS)]
QUERIES = {
    "Zanzibar cloves": "p00",
    "polonium radium": "p01",
    "Eiffel Tower Paris": "p02",
    "Kilimanjaro": "p04",
    "Axolotl salamander": "p09",
    "tardigrades water bears": "p10",
    "Stonehenge sarsen stones": "p12",
    "Hadron Collider protons": "p15",
    "kimchi cabbage": "p20",
    "okapi": "p23",
    "cuneiform clay tablets": "p27",
    "pangolins": "p29",
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return colbert_module.make_test_checkpoint(tmp_path_factory.mktemp("colbert") / "checkpoint")


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n" for p in PASSAGES))
    return path


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, checkpoint, corpus_file):
    out_dir = tmp_path_factory.mktemp("colbert-index") / "index"
    return build_index(corpus_file, out_dir, kind="colbert", checkpoint=checkpoint)


@pytest.fixture(scope="module")
def retriever(index_dir):
    return ColBERTRetriever.load(index_dir)


# The checkpoint and the transformers 5 adjustment (no C++ extension needed).


def test_test_checkpoint_is_minilm_with_a_seeded_projection(checkpoint):
    config = json.loads((checkpoint / colbert_module.CHECKPOINT_METADATA).read_text())
    assert config["dim"] == 128 and config["doc_maxlen"] == 180 and config["query_maxlen"] == 32
    weights = load_file(checkpoint / "model.safetensors")
    minilm = load_file(model_path() / "model.safetensors")
    encoder = {name.split(".", 1)[1]: tensor for name, tensor in weights.items() if name.startswith("bert.")}
    assert encoder.keys() == minilm.keys() - {"embeddings.position_ids"}  # a buffer, not a weight
    assert all(torch.equal(encoder[name], minilm[name]) for name in encoder)
    assert weights["linear.weight"].shape == (128, 384)
    assert (checkpoint / "tokenizer.json").is_file()


@pytest.mark.slow
def test_the_seed_decides_the_projection(tmp_path, checkpoint):
    other = colbert_module.make_test_checkpoint(tmp_path / "seed1", seed=1)
    same = colbert_module.make_test_checkpoint(tmp_path / "seed0", seed=0)
    projection = load_file(checkpoint / "model.safetensors")["linear.weight"]
    assert torch.equal(load_file(same / "model.safetensors")["linear.weight"], projection)
    assert not torch.equal(load_file(other / "model.safetensors")["linear.weight"], projection)


@pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5, reason="transformers 4 needs no patch")
def test_without_the_post_init_adjustment_transformers_5_cannot_load_colbert(checkpoint, monkeypatch):
    from colbert.modeling import base_colbert

    colbert_module.colbert_ai()
    monkeypatch.setattr(base_colbert, "class_factory", base_colbert.class_factory.__wrapped__)
    with pytest.raises(AttributeError, match="all_tied_weights_keys"):
        base_colbert.BaseColBERT(str(checkpoint))


def test_importing_colbert_ai_leaves_multiprocessing_alone():
    colbert_module.colbert_ai()
    assert multiprocessing.get_start_method(allow_none=True) != "spawn"


def test_extensions_are_cached_per_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    here = colbert_module.torch_extensions_dir()
    monkeypatch.setattr(colbert_module.sys, "prefix", "/some/other/venv")
    elsewhere = colbert_module.torch_extensions_dir()
    assert here.parent == elsewhere.parent == tmp_path / "arag" / "torch-extensions"
    assert here != elsewhere


def test_a_build_lock_left_by_a_killed_build_is_cleared_in_arags_folder(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = colbert_module.torch_extensions_dir()
    (folder / "filter_pids_cpp").mkdir(parents=True)
    stale = folder / "filter_pids_cpp" / "lock"
    stale.touch()
    with colbert_module.build_guard(folder):
        assert not stale.exists()
    assert "left by a killed process" in caplog.text and str(stale) in caplog.text


def test_a_build_lock_in_a_shared_extension_folder_is_reported_and_kept(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = tmp_path / "shared-extensions"
    (folder / "filter_pids_cpp").mkdir(parents=True)
    (folder / "filter_pids_cpp" / "lock").touch()
    with colbert_module.build_guard(folder):
        pass
    assert (folder / "filter_pids_cpp" / "lock").exists()
    assert "delete it" in caplog.text


def test_a_live_build_keeps_its_lock_and_the_next_load_waits_for_it(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = colbert_module.torch_extensions_dir()
    lock = folder / "segmented_maxsim_cpp" / "lock"
    builder = subprocess.Popen(  # holds the guard and builds until its stdin closes
        [sys.executable, "-c", BUILDER, str(folder), str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert builder.stdout.readline() == b"building\n"

    def load():
        with colbert_module.build_guard(folder):
            pass

    waiter = threading.Thread(target=load)
    waiter.start()
    waiter.join(timeout=1)
    assert waiter.is_alive() and lock.exists()
    builder.stdin.close()
    assert builder.wait(timeout=60) == 0
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    assert "left by a killed process" not in caplog.text


BUILDER = """
import sys
from pathlib import Path
from arag.retrievers.colbert import build_guard

folder, lock = Path(sys.argv[1]), Path(sys.argv[2])
with build_guard(folder):
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.touch()
    print("building", flush=True)
    sys.stdin.read()
    lock.unlink()
"""


@pytest.mark.slow
def test_colbert_loads_after_a_build_was_killed_midway():
    colbert_module.colbert_ai()  # compiles the extensions once, if this machine has not yet
    folder = colbert_module.torch_extensions_dir()
    with colbert_module.build_guard(folder):  # as a build killed midway leaves it
        (folder / "filter_pids_cpp" / "lock").touch()
    loading = subprocess.run(
        [sys.executable, "-c", "from arag.retrievers.colbert import colbert_ai; colbert_ai()"],
        capture_output=True,
        text=True,
        timeout=600,  # torch waits on a stale lock forever
    )
    assert loading.returncode == 0, loading.stderr
    assert not (folder / "filter_pids_cpp" / "lock").exists()


# Options and errors, before anything is encoded.


def test_checkpoints_must_be_colbert_checkpoint_folders(tmp_path, corpus_file):
    with pytest.raises(ConfigError, match="not a folder"):
        build_index(corpus_file, tmp_path / "a", kind="colbert", checkpoint=tmp_path / "missing")
    with pytest.raises(ConfigError, match="not a ColBERT checkpoint"):
        build_index(corpus_file, tmp_path / "b", kind="colbert", checkpoint=model_path())
    with pytest.raises(ConfigError, match="needs checkpoint"):
        build_index(corpus_file, tmp_path / "c", kind="colbert")
    with pytest.raises(ConfigError, match="ColBERT indexes need checkpoint"):
        index_for_corpus(corpus_file, kind="colbert")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "options, message",
    [
        ({"nbits": 3}, "nbits"),
        ({"doc_maxlen": 4}, "doc_maxlen"),
        ({"doc_maxlen": "long"}, "doc_maxlen"),
        ({"kmeans": 4}, "kmeans"),
    ],
)
def test_bad_index_options_are_config_errors(tmp_path, checkpoint, corpus_file, options, message):
    with pytest.raises(ConfigError, match=message):
        build_index(corpus_file, tmp_path / "index", kind="colbert", checkpoint=checkpoint, **options)
    assert not (tmp_path / "index").exists()


# End to end: build, search, reload (slow on a machine's first run: colbert-ai compiles its extensions).


@pytest.mark.slow
@pytest.mark.parametrize("query, expected", sorted(QUERIES.items()))
def test_distinctive_queries_find_their_passage(retriever, query, expected):
    assert expected in [p.id for p in retriever.retrieve(query, 3)]


@pytest.mark.slow
def test_results_are_corpus_passages_best_first(retriever):
    by_id = {p.id: p for p in PASSAGES}
    results = retriever.retrieve("volcano mountain in Africa", 5)
    assert len(results) == 5 and len({p.id for p in results}) == 5
    assert all(p == Passage(p.id, by_id[p.id].title, by_id[p.id].text, p.score) for p in results)
    scores = [p.score for p in results]
    assert scores == sorted(scores, reverse=True) and scores[0] > scores[-1]
    assert [p.id for p in retriever.retrieve("volcano mountain in Africa", 2)] == [p.id for p in results[:2]]
    assert retriever.retrieve("  ", 5) == []
    with pytest.raises(ConfigError):
        retriever.retrieve("okapi", 0)


@pytest.mark.slow
def test_the_index_reloads_without_rebuilding(index_dir, retriever, monkeypatch):
    def no_rebuild(*args, **kwargs):
        raise AssertionError("the index was rebuilt")

    monkeypatch.setattr(ColBERTRetriever, "write_index", no_rebuild)
    for reopened in (ColBERTRetriever.load(index_dir), open_index(index_dir), open_retriever(f"colbert:{index_dir}")):
        assert isinstance(reopened, ColBERTRetriever) and len(reopened) == len(PASSAGES)
        assert reopened.retrieve_batch(list(QUERIES), 4) == retriever.retrieve_batch(list(QUERIES), 4)


@pytest.mark.slow
def test_manifest_records_checkpoint_and_settings(index_dir, checkpoint, corpus_file):
    manifest = json.loads((index_dir / MANIFEST_NAME).read_text())
    assert manifest["kind"] == "colbert" and manifest["n_passages"] == len(PASSAGES)
    assert manifest["settings"] == {"checkpoint": str(checkpoint.resolve()), "nbits": 2, "doc_maxlen": 180}
    assert len(manifest["corpus_sha256"]) == 64
    assert (index_dir / colbert_module.PLAID_DIR / "ivf.pid.pt").is_file()
    assert not (index_dir / "colbert-run").exists()


@pytest.mark.slow
def test_a_moved_checkpoint_is_named_and_can_be_given(tmp_path, index_dir, retriever):
    moved_index = tmp_path / "index"
    shutil.copytree(index_dir, moved_index)
    manifest = json.loads((moved_index / MANIFEST_NAME).read_text())
    original_checkpoint = manifest["settings"]["checkpoint"]
    manifest["settings"]["checkpoint"] = str(tmp_path / "gone")
    (moved_index / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(RetrieverError, match="cannot use the checkpoint"):
        ColBERTRetriever.load(moved_index)
    given = ColBERTRetriever.load(moved_index, checkpoint=original_checkpoint)
    assert given.retrieve("okapi", 3) == retriever.retrieve("okapi", 3)


@pytest.mark.slow
def test_encoding_at_batch_length_gives_the_same_embeddings(retriever, checkpoint):
    from colbert.modeling.checkpoint import Checkpoint

    config = retriever._searcher.config
    trimmed_class = colbert_module._encoding_at_batch_length(Checkpoint)
    plain = Checkpoint(str(checkpoint), colbert_config=config)
    trimmed = trimmed_class(str(checkpoint), colbert_config=config)
    widths = []
    encoder_forward = trimmed.bert.forward

    def counting_forward(input_ids, **kwargs):
        widths.append(input_ids.size(1))
        return encoder_forward(input_ids, **kwargs)

    trimmed.bert.forward = counting_forward
    texts = [p.long_text * (1 + i % 4) for i, p in enumerate(PASSAGES)]  # lengths from one to four passages
    plain_embeddings, plain_lengths = plain.docFromText(texts, bsize=8, keep_dims="flatten")
    trimmed_embeddings, trimmed_lengths = trimmed.docFromText(texts, bsize=8, keep_dims="flatten")
    assert trimmed_lengths == plain_lengths
    assert torch.allclose(trimmed_embeddings, plain_embeddings, atol=1e-5)
    assert len(widths) == 4 and widths == sorted(widths) and widths[0] < widths[-1]


@pytest.mark.slow
def test_many_threads_get_the_serial_results(retriever):
    queries = list(QUERIES) * 3
    expected = [retriever.retrieve(q, 3) for q in queries]
    with ThreadPoolExecutor(max_workers=6) as pool:
        assert list(pool.map(lambda q: retriever.retrieve(q, 3), queries)) == expected
