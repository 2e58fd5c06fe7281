"""BM25Retriever: ranking, the query traps of bm25s, persistence, atomic builds, threads, and recall on HotpotQA."""

import itertools
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from arag.errors import ConfigError, DataError, RetrieverError
from arag.passages import Passage
from arag.retrievers import BM25Retriever, build_index
from arag.retrievers import bm25 as bm25_module
from arag.retrievers import manifest as manifest_module
from arag.retrievers.manifest import MANIFEST_NAME
from arag.scratch import create_scratch

PASSAGES = [
    Passage("p0", "Zanzibar", "Zanzibar is an archipelago off the coast of Tanzania, famous for cloves and spices."),
    Passage("p1", "Marie Curie", "Marie Curie was a physicist and chemist who discovered polonium and radium."),
    Passage("p2", "Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris, completed in 1889."),
    Passage("p3", "Photosynthesis", "Plants convert sunlight, water and carbon dioxide into glucose and oxygen."),
    Passage(
        "p4", "Mount Kilimanjaro", "Kilimanjaro is a dormant volcano in Tanzania and the highest mountain in Africa."
    ),
    Passage("p5", "Ada Lovelace", "Ada Lovelace wrote the first algorithm intended for Babbage's Analytical Engine."),
    Passage("p6", "Great Barrier Reef", "The reef off Queensland is the largest coral reef system in the world."),
    Passage("p7", "Johannes Gutenberg", "Gutenberg introduced movable-type printing to Europe around 1440."),
]
QUERIES = [
    "which chemist discovered radium",
    "lattice tower in Paris",
    "volcano in Tanzania",
    "first algorithm analytical engine",
    "of the",
    "",
    "movable type printing press",
]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    return BM25Retriever.build(PASSAGES, tmp_path_factory.mktemp("bm25") / "index").index_dir


@pytest.fixture(scope="module")
def retriever(index_dir):
    return BM25Retriever.load(index_dir)


def ids(passages):
    return [p.id for p in passages]


@pytest.mark.parametrize(
    "query, expected",
    [
        ("Who discovered polonium?", "p1"),
        ("Eiffel", "p2"),
        ("glucose from sunlight", "p3"),
        ("highest mountain of Africa", "p4"),
        ("Babbage's engine", "p5"),
        ("coral reefs of Queensland", "p6"),
        ("Zanzibar", "p0"),  # matched through the title as well as the text
    ],
)
def test_distinctive_query_ranks_its_passage_first(retriever, query, expected):
    assert retriever.retrieve(query, 3)[0].id == expected


def test_results_are_full_passages_best_first_and_k_is_honoured(retriever):
    results = retriever.retrieve("dormant volcano in Tanzania or Paris", 3)
    assert len(results) == 3
    assert results[0] == Passage("p4", PASSAGES[4].title, PASSAGES[4].text, results[0].score)
    scores = [p.score for p in results]
    assert scores == sorted(scores, reverse=True) and scores[0] > scores[1] > 0
    assert len(retriever.retrieve("dormant volcano in Tanzania or Paris", 1)) == 1


@pytest.mark.parametrize("query", ["", "   ", "of the", "and the of", "?! ... ;", "xyzzy plugh"])
def test_queries_without_indexed_tokens_return_nothing(retriever, query):
    assert retriever.retrieve(query, 5) == []
    assert retriever.retrieve_batch([query, "Eiffel"], 5)[0] == []


def test_k_larger_than_the_corpus_returns_every_matching_passage_once(retriever):
    every_title = " ".join(p.title for p in PASSAGES)
    assert sorted(ids(retriever.retrieve(every_title, 50))) == sorted(p.id for p in PASSAGES)
    assert sorted(ids(retriever.retrieve("Tanzania", 50))) == ["p0", "p4"]  # passages sharing no word are left out


@pytest.mark.parametrize("k", [0, -1, 101, 2.5, True])
def test_bad_k_is_a_config_error(retriever, k):
    with pytest.raises(ConfigError):
        retriever.retrieve("Paris", k)
    with pytest.raises(ConfigError):
        retriever.retrieve_batch(["Paris"], k)


def test_batch_gives_the_single_query_results(retriever):
    assert retriever.retrieve_batch(QUERIES, 4) == [retriever.retrieve(q, 4) for q in QUERIES]
    assert retriever.retrieve_batch([], 4) == []


@pytest.mark.parametrize("mmap", [True, False])
def test_loading_again_gives_identical_results(index_dir, retriever, mmap):
    reloaded = BM25Retriever.load(index_dir, mmap=mmap)
    assert len(reloaded) == len(PASSAGES)
    assert reloaded.retrieve_batch(QUERIES, 8) == retriever.retrieve_batch(QUERIES, 8)


def test_numpy_backend_ranks_like_numba(index_dir, monkeypatch):
    with_numpy = BM25Retriever.load(index_dir)
    monkeypatch.setattr(bm25_module, "NUMBA_MIN_PASSAGES", 0)
    with_numba = BM25Retriever.load(index_dir)
    assert (with_numpy._engine.backend, with_numba._engine.backend) == ("numpy", "numba")
    for query in QUERIES:
        fast, slow = with_numba.retrieve(query, 2), with_numpy.retrieve(query, 2)
        assert ids(fast) == ids(slow)
        assert [p.score for p in fast] == pytest.approx([p.score for p in slow])


def test_manifest_records_kind_size_and_settings(index_dir):
    manifest = json.loads((index_dir / MANIFEST_NAME).read_text())
    assert manifest["kind"] == "bm25"
    assert manifest["format_version"] == BM25Retriever.format_version
    assert manifest["n_passages"] == len(PASSAGES)
    assert manifest["corpus_sha256"] is None
    assert manifest["settings"] == {"stemmer": "english", "stopwords": "en", "k1": 1.5, "b": 0.75, "method": "lucene"}
    assert manifest["created"].endswith("+00:00")


def test_settings_shape_indexing_and_querying(tmp_path):
    plain = BM25Retriever.build(PASSAGES, tmp_path / "plain", stemmer=None, stopwords=None, k1=1.2, b=0.5)
    assert plain.settings["k1"] == 1.2
    assert plain.retrieve("the", 2)  # "the" is indexed without a stopword list
    assert plain.retrieve("reefs", 2) == []  # and "reefs" no longer stems to "reef"


@pytest.mark.parametrize("options", [{"stemmer": "klingon"}, {"stopwords": "klingon"}])
def test_bad_tokenizer_settings_are_config_errors(tmp_path, options):
    with pytest.raises(ConfigError, match="klingon"):
        BM25Retriever.build(PASSAGES, tmp_path / "index", **options)
    assert not (tmp_path / "index").exists()


def test_no_passages_is_a_data_error(tmp_path):
    with pytest.raises(DataError):
        BM25Retriever.build([], tmp_path / "index")


def test_build_refuses_a_folder_that_holds_something(index_dir):
    with pytest.raises(RetrieverError, match="already exists"):
        BM25Retriever.build(PASSAGES, index_dir)


def test_build_killed_midway_leaves_no_loadable_index(tmp_path, monkeypatch):
    def write_half_then_die(path, records):
        path.write_text(json.dumps(records[0]) + "\n")
        raise KeyboardInterrupt

    out_dir = tmp_path / "index"
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    abandoned = tmp_path / f".index.building-{int(finished.stdout)}-deadbeef"  # what a SIGKILLed build leaves behind
    running = tmp_path / f".index.building-{os.getpid()}-cafebabe"  # a build still in progress
    for staging in (abandoned, running):
        create_scratch(staging)  # marked as arag's, as every staging folder arag makes
        (staging / MANIFEST_NAME).write_text('{"kind": "bm25"}')
    with monkeypatch.context() as patch:
        patch.setattr(manifest_module, "write_records", write_half_then_die)
        with pytest.raises(KeyboardInterrupt):
            BM25Retriever.build(PASSAGES, out_dir)
    assert not out_dir.exists()
    assert [p.name for p in tmp_path.iterdir()] == [running.name]  # the abandoned build's folder was removed
    with pytest.raises(RetrieverError, match="no such index folder"):
        BM25Retriever.load(out_dir)
    assert BM25Retriever.build(PASSAGES, out_dir).retrieve("Eiffel", 1)[0].id == "p2"


def test_damaged_index_is_a_retriever_error_naming_the_folder(tmp_path):
    out_dir = tmp_path / "index"
    BM25Retriever.build(PASSAGES, out_dir)
    (out_dir / bm25_module.PASSAGES_FILE).write_text("[]\n")
    with pytest.raises(RetrieverError, match=f"{out_dir}.*passage counts disagree"):
        BM25Retriever.load(out_dir)
    (out_dir / "vocab.index.json").unlink()
    with pytest.raises(RetrieverError, match=f"{out_dir}: damaged"):
        BM25Retriever.load(out_dir)


@pytest.mark.parametrize(
    "manifest, message",
    [
        ({"kind": "colbert", "format_version": 1}, "holds a 'colbert' index"),
        ({"kind": "bm25", "format_version": 99}, "format 99"),
        ({"kind": "bm25", "format_version": 1, "settings": {}}, "settings lack stemmer, stopwords"),
    ],
)
def test_foreign_manifests_are_refused(tmp_path, manifest, message):
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(RetrieverError, match=message):
        BM25Retriever.load(tmp_path)


def test_many_threads_get_the_serial_results(retriever):
    queries = [p.title for p in PASSAGES] + [p.text for p in PASSAGES] + QUERIES
    expected = [retriever.retrieve(q, 5) for q in queries]
    with ThreadPoolExecutor(max_workers=16) as pool:
        got = list(pool.map(lambda q: retriever.retrieve(q, 5), queries * 40))
    assert got == expected * 40


@pytest.fixture(scope="module")
def corpus_indexes(tmp_path_factory):
    """Builds each real corpus once per test module."""
    opened = {}

    def open_for(corpus_path):
        if corpus_path not in opened:
            out_dir = build_index(corpus_path, tmp_path_factory.mktemp("real") / "bm25")
            opened[corpus_path] = BM25Retriever.load(out_dir)
        return opened[corpus_path]

    return open_for


@pytest.mark.slow
def test_hotpotqa_recall_at_10(shared_dataset, corpus_indexes):
    folder = shared_dataset("hotpotqa")
    retriever = corpus_indexes(folder / "corpus.jsonl")
    with open(folder / "public.jsonl", encoding="utf-8") as handle:
        examples = [json.loads(line) for line in itertools.islice(handle, 50)]
    results = retriever.retrieve_batch([e["question"] for e in examples], 10)
    found = [{p.title for p in passages} & set(e["supporting_titles"]) for e, passages in zip(examples, results)]
    any_supporting = sum(len(titles) >= 1 for titles in found) / len(examples)
    all_supporting = sum(titles == set(e["supporting_titles"]) for titles, e in zip(found, examples)) / len(examples)
    print(f"HotpotQA recall@10 over 50 questions: any supporting title {any_supporting:.2f}, all {all_supporting:.2f}")
    assert len(retriever) == 4858
    assert any_supporting >= 0.94  # measured 0.98
    assert all_supporting >= 0.7  # measured 0.78
