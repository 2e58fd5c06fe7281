"""MilvusRetriever against the real embedded Milvus Lite: exact cosine ranking, a load resumed by primary key,
the recorded embedder, bad targets and passages, threads, and `milvus:` specs served over HTTP."""

import importlib.util
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("pymilvus")
pytest.importorskip("milvus_lite")

from arag.cli import main  # noqa: E402
from arag.errors import ConfigError, DataError, RetrieverError  # noqa: E402
from arag.passages import Passage  # noqa: E402
from arag.retrievers import ColBERTv2Retriever, MilvusRetriever, SearchServer, index_for_corpus, open_retriever  # noqa: E402
from arag.retrievers import milvus as milvus_module  # noqa: E402
from arag.testing.encoders import HashingEncoder  # noqa: E402

DIM = 32
PASSAGES = [
    Passage(f"p{i}", f"Title {i}", f"passage {i} about {'bees honey hive' if i % 3 == 0 else 'rivers and rain'} "
            f"number{i} and {'snow' if i % 5 == 0 else 'sun'}")
    for i in range(120)
]
QUERIES = ["bees and honey", "rain over rivers", "snow number10", "sun"]


@pytest.fixture(scope="module")
def encoder():
    return HashingEncoder(DIM)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return f"{tmp_path_factory.mktemp('milvus') / 'passages.db'}#wiki"


@pytest.fixture(scope="module")
def retriever(target, encoder):
    return MilvusRetriever.build(PASSAGES, target, encoder=encoder, chunk_size=50)


def assert_same_rankings(found_lists, expected_lists):
    """The same passages in the same order; scores equal to float32 rounding, since Milvus may search
    queries that arrive together as one batch and sum their dot products in another order."""
    assert [[(p.id, p.title, p.text) for p in found] for found in found_lists] == [
        [(p.id, p.title, p.text) for p in expected] for expected in expected_lists]
    assert [[p.score for p in found] for found in found_lists] == [
        pytest.approx([p.score for p in expected], abs=1e-6) for expected in expected_lists]


def test_results_are_exact_cosine_rankings_with_whole_passages(retriever, encoder):
    vectors = encoder.encode([p.long_text for p in PASSAGES])
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    for query in QUERIES:
        query_vector = encoder.encode([query])[0]
        scores = vectors @ (query_vector / np.linalg.norm(query_vector))
        found = retriever.retrieve(query, 8)
        assert [p.score for p in found] == pytest.approx(sorted(scores, reverse=True)[:8], abs=1e-5)
        by_id = {p.id: p for p in PASSAGES}
        assert all((p.title, p.text) == (by_id[p.id].title, by_id[p.id].text) for p in found)
        assert scores[int(found[0].id[1:])] == pytest.approx(scores.max(), abs=1e-6)
    assert len(retriever) == len(PASSAGES)


def test_batches_blank_queries_and_k(retriever):
    assert retriever.retrieve("   ", 3) == []
    batched = retriever.retrieve_batch(QUERIES + [""], 4)
    assert_same_rankings(batched, [retriever.retrieve(q, 4) for q in QUERIES] + [[]])
    assert len(retriever.retrieve("sun", 100)) == 100
    with pytest.raises(ConfigError):
        retriever.retrieve("sun", 0)


def test_a_rerun_inserts_only_the_missing_passages(tmp_path):
    target = f"{tmp_path / 'resume.db'}#part"
    first = HashingEncoder(DIM)
    MilvusRetriever.write_index(PASSAGES[:70], target, encoder=first, chunk_size=25)
    rerun = HashingEncoder(DIM)
    resumed = MilvusRetriever.build(PASSAGES, target, encoder=rerun, chunk_size=25)
    # Each build embeds the probe sentence of the encoder's identity; the rerun, 50 missing passages and the opening's
    # check of the encoder too.
    assert (first.encoded, rerun.encoded) == (70 + 1, 50 + 2)
    assert len(resumed) == len(PASSAGES)
    stored = resumed._client.query("part", filter='id != ""', output_fields=["id"], limit=1000)
    assert sorted(row["id"] for row in stored) == sorted(p.id for p in PASSAGES)


def test_the_embedder_is_recorded_and_checked(retriever, target):
    with pytest.raises(ConfigError, match="encoder=THE_SAME_ENCODER"):
        MilvusRetriever.load(target)
    with pytest.raises(RetrieverError, match="16-dimensional embeddings, the index holds 32"):
        MilvusRetriever.load(target, encoder=HashingEncoder(16))
    with pytest.raises(ConfigError, match="exists, embedded by hashing-32 .* not hashing-16"):
        MilvusRetriever.write_index(PASSAGES, target, encoder=HashingEncoder(16))
    properties = retriever._client.describe_collection("wiki")["properties"]
    recorded = json.loads(properties[milvus_module.EMBEDDER_PROPERTY])
    assert isinstance(recorded.pop("probe"), str)
    assert recorded == {"model": "hashing-32", "embedder": "custom", "max_seq_length": None, "dim": DIM}

    class OtherModel(HashingEncoder):
        def encode(self, texts):
            return -super().encode(texts)  # the same dimension and name, another embedding space

    with pytest.raises(RetrieverError, match="collection wiki at .* was embedded by hashing-32; the encoder "
                                             "hashing-32 is another model"):
        MilvusRetriever.load(target, encoder=OtherModel(DIM))
    with pytest.raises(ConfigError, match="was embedded by hashing-32; the encoder hashing-32 is another model"):
        MilvusRetriever.write_index(PASSAGES[:5], target, encoder=OtherModel(DIM))


@pytest.mark.parametrize(
    "target, error, message",
    [
        ("./passages.db", ConfigError, "must be URI#collection"),
        ("./passages.db#9lives", ConfigError, "collection name '9lives'"),
        ("./passages#wiki", ConfigError, "must be a Milvus Lite file ending in .db"),
        ("/no/such/folder/passages.db#wiki", ConfigError, "its folder does not exist"),
        ("http://127.0.0.1:9#wiki", RetrieverError, "cannot reach Milvus at http://127.0.0.1:9"),
    ],
)
def test_bad_targets_are_errors_naming_them(target, error, message, encoder):
    with pytest.raises(error, match=message):
        MilvusRetriever.load(target, encoder=encoder)


def test_missing_or_foreign_collections_and_oversized_passages(retriever, target, tmp_path, encoder):
    uri = target.rpartition("#")[0]
    with pytest.raises(RetrieverError, match="has no collection 'other'"):
        MilvusRetriever.load(f"{uri}#other", encoder=encoder)
    retriever._client.create_collection("foreign", dimension=DIM)
    with pytest.raises(RetrieverError, match="was not made by arag"):
        MilvusRetriever.load(f"{uri}#foreign", encoder=encoder)
    huge = Passage("huge", "", "é" * 40_000)
    with pytest.raises(DataError, match="'huge': its text is 80,000 bytes"):
        MilvusRetriever.write_index([huge], f"{tmp_path / 'huge.db'}#c", encoder=encoder)
    with pytest.raises(DataError, match="no passages"):
        MilvusRetriever.write_index([], f"{tmp_path / 'empty.db'}#c", encoder=encoder)


def test_collections_are_not_cached_per_corpus_file(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "a", "text": "x"}\n')
    with pytest.raises(ConfigError, match="--kind milvus --out URI#COLLECTION"):
        index_for_corpus(corpus, kind="milvus")


def test_many_threads_get_the_serial_results(retriever):
    queries = QUERIES * 4
    expected = [retriever.retrieve(q, 5) for q in queries]
    with ThreadPoolExecutor(max_workers=8) as pool:
        assert_same_rankings(list(pool.map(lambda q: retriever.retrieve(q, 5), queries)), expected)


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None, reason="needs the dense extra")
def test_a_collection_built_by_the_cli_is_served_by_its_spec(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n" for p in PASSAGES[:12]))
    target = f"{tmp_path / 'served.db'}#passages"
    built = CliRunner().invoke(main, ["index", "build", "--kind", "milvus", "--corpus", str(corpus), "--out", target])
    assert built.exit_code == 0 and f"built milvus index at {target}" in built.output
    direct = open_retriever(f"milvus:{target}")
    assert isinstance(direct, MilvusRetriever) and direct.settings["model"] == "all-MiniLM-L6-v2"
    with SearchServer(direct, port=0) as served:
        remote = ColBERTv2Retriever(served.url)
        for query in QUERIES:
            assert [p.id for p in remote.retrieve(query, 5)] == [p.id for p in direct.retrieve(query, 5)]
    wrong = CliRunner().invoke(main, ["index", "build", "--kind", "milvus", "--corpus", str(corpus), "--out",
                                      f"{tmp_path / 'served.db'}"])
    assert wrong.exit_code == 2 and "must be URI#collection" in wrong.output
