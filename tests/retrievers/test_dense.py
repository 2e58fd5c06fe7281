"""DenseRetriever: cosine ranking with all-MiniLM-L6-v2 (offline), reloading, specs, serving, errors, threads.
(IVF-PQ, resumable builds and memory mapping: test_dense_disk.py.)"""

import json
import shutil
from concurrent.futures import ThreadPoolExecutor

import faiss
import numpy as np
import pytest

from arag.errors import ConfigError, DataError, RetrieverError
from arag.passages import Passage
from arag.retrievers import ColBERTv2Retriever, DenseRetriever, SearchServer, build_index, open_index, open_retriever
from arag.retrievers import dense as dense_module
from arag.retrievers.manifest import MANIFEST_NAME

PASSAGES = [
    Passage("cat", "Domestic cat", "Cats purr when content and sleep up to sixteen hours a day."),
    Passage("volcano", "Volcano", "Molten rock rises through the crust and erupts as lava and ash."),
    Passage("bank", "Central bank", "The central bank raised interest rates to curb inflation."),
    Passage("river", "Nile", "The Nile flows north through eleven countries into the Mediterranean Sea."),
    Passage("violin", "Violin", "A bowed string instrument with four strings tuned in perfect fifths."),
    Passage("vaccine", "Vaccination", "Vaccines train the immune system to recognise a pathogen."),
    Passage("chess", "Chess", "Two players move kings, queens, rooks and pawns on a checkered board."),
    Passage("glacier", "Glacier", "Compacted snow turns into ice that slowly slides down valleys."),
]
# Paraphrases sharing no content word with their passage: only meaning can match them.
PARAPHRASES = {
    "feline naps": "cat",
    "an eruption of magma from a mountain": "volcano",
    "monetary policy and the cost of borrowing": "bank",
    "the longest waterway of Africa": "river",
    "an orchestra's fiddle": "violin",
    "immunisation against disease": "vaccine",
    "a board game of strategy with a checkmate": "chess",
    "frozen masses moving over land": "glacier",
}


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    return DenseRetriever.write_index(PASSAGES, tmp_path_factory.mktemp("dense") / "index")


@pytest.fixture(scope="module")
def retriever(index_dir):
    return DenseRetriever.load(index_dir)


@pytest.mark.parametrize("query, expected", sorted(PARAPHRASES.items()))
def test_paraphrases_find_their_passage_first(retriever, query, expected):
    assert retriever.retrieve(query, 3)[0].id == expected


def test_scores_are_cosine_similarities_best_first(retriever):
    model = dense_module.SentenceEncoder()
    query = "frozen masses moving over land"
    results = retriever.retrieve(query, len(PASSAGES))
    assert sorted(p.id for p in results) == sorted(p.id for p in PASSAGES)
    vectors = model.encode([query] + [p.long_text for p in results])
    cosines = [
        float(np.dot(vectors[0], v) / (np.linalg.norm(vectors[0]) * np.linalg.norm(v))) for v in vectors[1:]
    ]
    assert [p.score for p in results] == pytest.approx(cosines, abs=1e-5)
    assert cosines == sorted(cosines, reverse=True)


def test_k_blank_queries_and_batches(retriever):
    assert len(retriever.retrieve("feline naps", 2)) == 2
    assert len(retriever.retrieve("feline naps", 100)) == len(PASSAGES)
    assert retriever.retrieve("   ", 3) == []
    queries = list(PARAPHRASES) + ["", "chess openings"]
    batched, single = retriever.retrieve_batch(queries, 4), [retriever.retrieve(q, 4) for q in queries]
    assert [[p.id for p in found] for found in batched] == [[p.id for p in found] for found in single]
    assert [p.score for found in batched for p in found] == pytest.approx(
        [p.score for found in single for p in found], abs=1e-5
    )
    for k in (0, 101, 2.5, True):
        with pytest.raises(ConfigError):
            retriever.retrieve("chess", k)


def test_reload_gives_identical_results_and_manifest_records_the_model(index_dir, retriever):
    again = open_retriever(f"dense:{index_dir}")
    assert isinstance(again, DenseRetriever) and len(again) == len(PASSAGES)
    assert again.retrieve_batch(list(PARAPHRASES), 5) == retriever.retrieve_batch(list(PARAPHRASES), 5)
    manifest = json.loads((index_dir / MANIFEST_NAME).read_text())
    assert manifest["kind"] == "dense" and manifest["n_passages"] == len(PASSAGES)
    assert isinstance(manifest["settings"].pop("probe"), str)  # the encoder's identity
    assert manifest["settings"] == {"model": "all-MiniLM-L6-v2", "embedder": "sentence-transformers",
                                    "max_seq_length": 256, "dim": 384, "search": "exact"}


def test_a_dense_spec_is_served_over_http(index_dir, retriever):
    with SearchServer(open_retriever(f"dense:{index_dir}"), port=0) as served:
        remote = ColBERTv2Retriever(served.url)
        for query in PARAPHRASES:
            assert [p.id for p in remote.retrieve(query, 3)] == [p.id for p in retriever.retrieve(query, 3)]


def test_max_seq_length_truncates_passages(tmp_path):
    long_preamble = "This paragraph talks at length about nothing in particular, " * 6
    passages = [Passage("late", "", long_preamble + "the saxophone"), Passage("other", "", "A trumpet.")]
    full = DenseRetriever.build(passages, tmp_path / "full")
    short = DenseRetriever.build(passages, tmp_path / "short", max_seq_length=16)
    assert json.loads((tmp_path / "short" / MANIFEST_NAME).read_text())["settings"]["max_seq_length"] == 16
    assert DenseRetriever.load(tmp_path / "short")._encoder.max_seq_length == 16
    def late_score(retriever):
        return next(p.score for p in retriever.retrieve("saxophone", 2) if p.id == "late")

    assert late_score(full) > late_score(short) + 0.1  # the 16-token index never saw the word


def test_build_index_and_open_index_know_the_dense_kind(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n" for p in PASSAGES))
    out_dir = build_index(corpus, tmp_path / "index", kind="dense", batch_size=4)
    opened = open_index(out_dir)
    assert isinstance(opened, DenseRetriever)
    assert opened.retrieve("feline naps", 1)[0].id == "cat"
    assert json.loads((out_dir / MANIFEST_NAME).read_text())["corpus_sha256"] is not None


@pytest.mark.parametrize(
    "options, message",
    [
        ({"batch_size": 0}, "batch_size"),
        ({"exact_up_to": -1}, "exact_up_to"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"max_seq_length": 100_000}, "max_seq_length"),
        ({"model": "/no/such/model"}, "/no/such/model"),
    ],
)
def test_bad_options_are_config_errors_naming_them(tmp_path, options, message):
    with pytest.raises(ConfigError, match=message):
        DenseRetriever.build(PASSAGES, tmp_path / "index", **options)
    assert not (tmp_path / "index").exists()


def test_no_passages_and_damaged_indexes(tmp_path, index_dir):
    with pytest.raises(DataError):
        DenseRetriever.build([], tmp_path / "empty")
    damaged = tmp_path / "damaged"
    shutil.copytree(index_dir, damaged)
    (damaged / dense_module.INDEX_FILE).write_bytes(b"not a faiss index")
    with pytest.raises(RetrieverError, match="damaged dense index"):
        DenseRetriever.load(damaged)
    shrunk = faiss.IndexFlatIP(384)
    shrunk.add(np.zeros((3, 384), dtype=np.float32))
    faiss.write_index(shrunk, str(damaged / dense_module.INDEX_FILE))
    with pytest.raises(RetrieverError, match="passage counts disagree"):
        DenseRetriever.load(damaged)
    (tmp_path / "bm25-like").mkdir()
    (tmp_path / "bm25-like" / MANIFEST_NAME).write_text('{"kind": "bm25", "format_version": 1}')
    with pytest.raises(RetrieverError, match="not a dense one"):
        DenseRetriever.load(tmp_path / "bm25-like")


def test_many_threads_get_the_serial_results(retriever):
    queries = list(PARAPHRASES) * 2
    expected = [retriever.retrieve(q, 3) for q in queries]
    with ThreadPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(lambda q: retriever.retrieve(q, 3), queries)) == expected


def test_an_eval_over_a_passage_store_out_of_order_is_one_error_line(tmp_path, index_dir):
    import subprocess
    import sys

    from arag.data import sample_paths
    from arag.testing import OpenAICompatibleServer

    damaged = tmp_path / "damaged"
    shutil.copytree(index_dir, damaged)
    offsets = np.fromfile(damaged / "passages.offsets", dtype="<u8")
    offsets[1:-1] = offsets[1:-1][::-1].copy()
    offsets.tofile(damaged / "passages.offsets")

    def answer(call):
        return {field: "Paris" for field in call.output_fields}

    with OpenAICompatibleServer(answer) as server:
        done = subprocess.run([sys.executable, "-m", "arag.cli", "eval", "--program", "single-rag", "--dataset",
                               str(sample_paths()[0]), "--retriever", f"dense:{damaged}", "--lm",
                               "openai/loopback-model", "--api-base", server.url, "--limit", "2", "--out",
                               str(tmp_path / "run")], capture_output=True, text=True, timeout=600)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert f"{damaged}: damaged passage store" in errors[0] and "Traceback" not in done.stderr
