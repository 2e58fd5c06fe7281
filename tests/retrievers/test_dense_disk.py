"""Dense indexes on disk with real faiss and a deterministic encoder (no model): the passage store, exact and
IVF-PQ search against brute force, exact re-ranking of IVF-PQ candidates, memory mapping, a build killed by SIGKILL
and resumed, progress, encoders and errors."""

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("faiss")

from arag.errors import ConfigError, DataError, RetrieverError  # noqa: E402
from arag.passages import Passage  # noqa: E402
from arag.retrievers import DenseRetriever, build_index  # noqa: E402
from arag.retrievers import dense as dense_module  # noqa: E402
from arag.retrievers import dense_build as dense_build_module  # noqa: E402
from arag.retrievers.manifest import MANIFEST_NAME, PASSAGES_FILE, PassageStore, write_records  # noqa: E402
from arag.testing.encoders import HashingEncoder  # noqa: E402

DIM = 64
N_TOPICS = 30


def topical_passages(n: int, seed: int = 0) -> list[Passage]:
    """Passages of 20 words from one of N_TOPICS vocabularies plus 10 common words: neighbours share a topic."""
    rng = np.random.default_rng(seed)
    topics = [[f"topic{t}word{i}" for i in range(60)] for t in range(N_TOPICS)]
    common = [f"common{i}" for i in range(400)]
    return [
        Passage(f"p{i}", f"Topic {i % N_TOPICS}",
                " ".join([*rng.choice(topics[i % N_TOPICS], 20), *rng.choice(common, 10)]))
        for i in range(n)
    ]


PASSAGES = topical_passages(3000)
QUERIES = [" ".join(p.text.split()[:6]) for p in PASSAGES[::20]]
IVFPQ_OPTIONS = {"exact_up_to": 0, "pq_bytes": 16, "chunk_size": 500}


@pytest.fixture(scope="module")
def encoder():
    return HashingEncoder(DIM)


@pytest.fixture(scope="module")
def exact(tmp_path_factory, encoder):
    return DenseRetriever.build(PASSAGES, tmp_path_factory.mktemp("exact") / "index", encoder=encoder, chunk_size=700)


@pytest.fixture(scope="module")
def ivfpq(tmp_path_factory, encoder):
    return DenseRetriever.build(PASSAGES, tmp_path_factory.mktemp("ivfpq") / "index", encoder=encoder, **IVFPQ_OPTIONS)


def ids(results):
    return [[p.id for p in found] for found in results]


def recall_at_10(approximate, exact):
    return np.mean([len(set(a) & set(e)) / len(e) for a, e in zip(ids(approximate), ids(exact))])


def test_passage_store_reads_any_passage_by_position(tmp_path):
    records = [(f"id{i}", f"Títle {i}", "text with ünïcode and a newline\nin it " * (i % 4)) for i in range(50)]
    assert write_records(tmp_path / PASSAGES_FILE, records) == 50
    store = PassageStore(tmp_path / PASSAGES_FILE)
    assert len(store) == 50
    assert [store.record(i) for i in (49, 0, 17)] == [records[49], records[0], records[17]]
    assert store.passage(3, 0.5) == Passage(*records[3], 0.5)
    with open(tmp_path / PASSAGES_FILE, "a") as handle:
        handle.write('["extra", "", "x"]\n')
    with pytest.raises(RetrieverError, match="passages.jsonl and its offsets disagree"):
        PassageStore(tmp_path / PASSAGES_FILE)


def test_exact_search_equals_brute_force_cosine(exact, encoder):
    vectors = encoder.encode([p.long_text for p in PASSAGES])
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    for query in QUERIES[:20]:
        query_vector = encoder.encode([query])[0]
        scores = vectors @ (query_vector / np.linalg.norm(query_vector))
        found = exact.retrieve(query, 10)
        assert [p.score for p in found] == pytest.approx(sorted(scores, reverse=True)[:10], abs=1e-5)
        assert {p.id for p in found} <= {PASSAGES[i].id for i in np.flatnonzero(scores >= found[-1].score - 1e-5)}
        assert found[0] == Passage(*_record_of(found[0].id), found[0].score)


def _record_of(passage_id):
    passage = PASSAGES[int(passage_id[1:])]
    return passage.id, passage.title, passage.text


def test_ivfpq_recall_against_exact_search(exact, ivfpq, encoder):
    settings = json.loads((ivfpq.index_dir / MANIFEST_NAME).read_text())["settings"]
    assert isinstance(settings.pop("probe"), str)  # the encoder's identity (see the encoder tests)
    assert settings == {"model": "hashing-64", "embedder": "custom", "max_seq_length": None, "dim": DIM,
                        "search": "ivfpq", "nlist": 75, "pq_bytes": 16, "nprobe": 32, "rerank": 10}
    assert ivfpq.rerank == 10 and "ivfpq nprobe=32 rerank=10" in repr(ivfpq)
    truth = exact.retrieve_batch(QUERIES, 10)
    # Stated recall@10 on this corpus (top 10s are near-ties within a topic, the hard case for 16-byte codes).
    codes_only = DenseRetriever.load(ivfpq.index_dir, encoder=encoder, rerank=0)
    assert codes_only.rerank == 0
    assert recall_at_10(codes_only.retrieve_batch(QUERIES, 10), truth) >= 0.65
    everywhere = DenseRetriever.load(ivfpq.index_dir, encoder=encoder, nprobe=75, rerank=0)
    assert everywhere.nprobe == 75 and "ivfpq nprobe=75 rerank=0" in repr(everywhere)
    assert recall_at_10(everywhere.retrieve_batch(QUERIES, 10), truth) >= 0.7
    assert recall_at_10(ivfpq.retrieve_batch(QUERIES, 10), truth) >= 0.95
    assert [p.id for p in ivfpq.retrieve("topic3word7 topic3word8", 100)[:3]] != []


def test_reranking_gives_exact_search_when_the_candidates_hold_its_top_k(exact, ivfpq, encoder):
    everywhere = DenseRetriever.load(ivfpq.index_dir, encoder=encoder, nprobe=75)
    candidates = ids(DenseRetriever.load(ivfpq.index_dir, encoder=encoder, nprobe=75, rerank=0)
                     .retrieve_batch(QUERIES, 10 * everywhere.rerank))
    truth = exact.retrieve_batch(QUERIES, 10)
    covered = [row for row, found in enumerate(truth) if {p.id for p in found} <= set(candidates[row])]
    assert len(covered) >= 0.8 * len(QUERIES)
    reranked = everywhere.retrieve_batch(QUERIES, 10)
    for row in covered:
        assert [p.id for p in reranked[row]] == [p.id for p in truth[row]]
        assert [p.score for p in reranked[row]] == pytest.approx([p.score for p in truth[row]], abs=1e-5)
    whole = DenseRetriever.load(ivfpq.index_dir, encoder=encoder, nprobe=75, rerank=len(PASSAGES))  # all candidates
    assert ids(whole.retrieve_batch(QUERIES, 10)) == ids(truth)


def test_indexes_are_memory_mapped_not_read_into_the_heap(exact, ivfpq):
    maps = open("/proc/self/maps").read()
    for retriever in (exact, ivfpq):
        assert str(retriever.index_dir / dense_module.INDEX_FILE) in maps
        assert str(retriever.index_dir / "passages.offsets") in maps
    assert str(ivfpq.index_dir / dense_module.VECTORS_FILE) in maps
    assert not (exact.index_dir / dense_module.VECTORS_FILE).exists()  # the flat index holds the vectors


def test_build_killed_by_sigkill_resumes_to_the_uninterrupted_index(tmp_path, encoder):
    corpus = tmp_path / "corpus.jsonl"
    passages = PASSAGES[:1500]
    corpus.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n" for p in passages))
    options = {**IVFPQ_OPTIONS, "chunk_size": 100}
    out_dir, partial = tmp_path / "index", dense_module.partial_dir(tmp_path / "index")
    code = ("from arag.retrievers import build_index; from arag.testing.encoders import HashingEncoder; "
            f"build_index({str(corpus)!r}, {str(out_dir)!r}, kind='dense', encoder=HashingEncoder({DIM}, delay=0.2), "
            f"**{options!r})")
    child = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(list(partial.glob("chunk-*.npy"))) < 3:
            assert child.poll() is None and time.monotonic() < deadline, "the build ended before it was killed"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    assert child.returncode == -signal.SIGKILL and not out_dir.exists()
    saved = len(list(partial.glob("chunk-*.npy")))
    assert 3 <= saved < 15
    counting = HashingEncoder(DIM)
    build_index(corpus, out_dir, kind="dense", encoder=counting, **options)
    # Saved chunks were kept, not embedded again (the one more text: the probe of the encoder's identity).
    assert counting.encoded == len(passages) - 100 * saved + 1
    assert not partial.exists()
    store = PassageStore(out_dir / PASSAGES_FILE)
    assert [store.record(i)[0] for i in range(len(store))] == [p.id for p in passages]  # each once, in order
    resumed = DenseRetriever.load(out_dir, encoder=encoder)
    whole = DenseRetriever.build(corpus_passages(passages), tmp_path / "whole", encoder=encoder, **options)
    assert resumed.retrieve_batch(QUERIES, 10) == whole.retrieve_batch(QUERIES, 10)
    vectors = np.load(out_dir / dense_module.VECTORS_FILE)
    assert vectors.shape == (len(passages), DIM)
    assert np.array_equal(vectors, np.load(whole.index_dir / dense_module.VECTORS_FILE))


def corpus_passages(passages):
    return (p for p in passages)  # a generator: builds stream their input


def test_an_interrupted_build_refuses_other_arguments_or_another_corpus(tmp_path, encoder):
    out_dir = tmp_path / "index"
    partial = dense_module.partial_dir(out_dir)

    def interrupt_after_two_chunks(passages):
        for passage in passages[:250]:
            yield passage
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        DenseRetriever.write_index(interrupt_after_two_chunks(PASSAGES), out_dir, encoder=encoder, chunk_size=100)
    assert sorted(p.name for p in partial.glob("chunk-*.npy")) == ["chunk-000000.npy", "chunk-000001.npy"]
    with pytest.raises(ConfigError, match="other arguments"):
        DenseRetriever.write_index(PASSAGES, out_dir, encoder=encoder, chunk_size=50)
    with pytest.raises(DataError, match="chunk 1 holds other passages"):
        DenseRetriever.write_index(PASSAGES[:100] + PASSAGES[150:400], out_dir, encoder=encoder, chunk_size=100)
    DenseRetriever.write_index(PASSAGES[:400], out_dir, encoder=encoder, chunk_size=100)
    assert len(PassageStore(out_dir / PASSAGES_FILE)) == 400 and not partial.exists()


def test_encoders_are_recorded_and_checked(ivfpq, tmp_path):
    with pytest.raises(ConfigError, match=r"encoder=THE_SAME_ENCODER"):
        DenseRetriever.load(ivfpq.index_dir)
    with pytest.raises(RetrieverError, match="32-dimensional embeddings, the index holds 64"):
        DenseRetriever.load(ivfpq.index_dir, encoder=HashingEncoder(32))

    class Flat:
        def encode(self, texts):
            return np.ones(len(texts), dtype=np.float32)

    with pytest.raises(ConfigError, match=r"shape \(1,\) for 1 texts"):  # the probe sentence, the first encoded
        DenseRetriever.build(PASSAGES[:3], tmp_path / "flat", encoder=Flat())
    with pytest.raises(ConfigError, match="no encode"):
        DenseRetriever.build(PASSAGES[:3], tmp_path / "none", encoder=object())
    with pytest.raises(ConfigError, match="either an encoder object or model"):
        DenseRetriever.build(PASSAGES[:3], tmp_path / "both", encoder=HashingEncoder(), model="/some/model")


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"chunk_size": 0}, ConfigError, "chunk_size"),
        ({"nlist": -2}, ConfigError, "nlist"),
        ({"exact_up_to": 0, "pq_bytes": 7}, ConfigError, "pq_bytes 7 must divide the embedding dimension 64"),
        ({"exact_up_to": 0, "nlist": 5000}, ConfigError, "nlist 5000 is above the number of passages"),
        ({"rerank": -1}, ConfigError, "rerank must be an integer >= 0, got -1"),
        ({"rerank": 2.5}, ConfigError, "rerank must be an integer >= 0, got 2.5"),
    ],
)
def test_bad_options_are_errors_naming_them(tmp_path, encoder, options, error, message):
    with pytest.raises(error, match=message):
        DenseRetriever.write_index(PASSAGES[:1200], tmp_path / "index", encoder=encoder, **options)
    assert not (tmp_path / "index").exists()


def test_rerank_options_at_load_and_indexes_without_the_float_file(ivfpq, encoder, tmp_path):
    with pytest.raises(ConfigError, match="rerank must be an integer >= 0, got -3"):
        DenseRetriever.load(ivfpq.index_dir, encoder=encoder, rerank=-3)
    unranked = DenseRetriever.build(PASSAGES[:1200], tmp_path / "unranked", encoder=encoder, exact_up_to=0,
                                    nlist=8, pq_bytes=4, rerank=1)
    assert unranked.rerank == 1 and not (unranked.index_dir / dense_module.VECTORS_FILE).exists()
    with pytest.raises(RetrieverError, match="holds no vectors.npy .* load it with rerank=0, or rebuild"):
        DenseRetriever.load(unranked.index_dir, encoder=encoder, rerank=10)
    # A folder written before re-ranking (no `rerank` setting, no float file) opens without it.
    manifest_path = unranked.index_dir / MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text())
    del manifest["settings"]["rerank"]
    manifest_path.write_text(json.dumps(manifest))
    earlier = DenseRetriever.load(unranked.index_dir, encoder=encoder)
    assert earlier.rerank == 0 and earlier.retrieve_batch(QUERIES, 10) == unranked.retrieve_batch(QUERIES, 10)
    damaged = tmp_path / "damaged"
    shutil.copytree(ivfpq.index_dir, damaged)
    with open(damaged / dense_module.VECTORS_FILE, "r+b") as handle:
        handle.truncate(handle.seek(0, os.SEEK_END) - 4)
    with pytest.raises(RetrieverError, match="damaged dense index .*vectors.npy: its size does not match"):
        DenseRetriever.load(damaged, encoder=encoder)


def test_small_corpora_cannot_train_ivfpq_and_old_formats_ask_for_a_rebuild(tmp_path, encoder):
    with pytest.raises(ConfigError, match="at least 1,000 passages"):
        DenseRetriever.write_index(PASSAGES[:50], tmp_path / "small", encoder=encoder, exact_up_to=10)
    old = tmp_path / "old"
    old.mkdir()
    (old / MANIFEST_NAME).write_text(json.dumps({"kind": "dense", "format_version": 1, "settings": {}}))
    with pytest.raises(RetrieverError, match="format 1 .* rebuild the index"):
        DenseRetriever.load(old, encoder=encoder)


def test_many_threads_get_the_serial_results(ivfpq):
    expected = [ivfpq.retrieve(q, 5) for q in QUERIES]
    with ThreadPoolExecutor(max_workers=8) as pool:
        assert list(pool.map(lambda q: ivfpq.retrieve(q, 5), QUERIES)) == expected


def damaged_copy(index_dir, destination):
    shutil.copytree(index_dir, destination)
    return destination


@pytest.mark.parametrize("damage", ["swapped", "shifted"])
def test_offsets_out_of_order_are_a_damaged_passage_store(exact, encoder, tmp_path, damage):
    damaged = damaged_copy(exact.index_dir, tmp_path / "damaged")
    offsets = np.fromfile(damaged / "passages.offsets", dtype="<u8")
    if damage == "swapped":
        offsets[1:-1] = offsets[1:-1][::-1].copy()  # every passage's start after its end
    else:
        offsets[1:-1] += 3  # every passage read from mid-line
    offsets.tofile(damaged / "passages.offsets")
    with pytest.raises(RetrieverError, match=f"{damaged}: damaged passage store .*rebuild the index"):
        DenseRetriever.load(damaged, encoder=encoder).retrieve_batch(QUERIES[:3], 10)


def test_an_encoder_of_the_same_dimension_but_another_model_is_refused_naming_both(ivfpq, encoder):
    class OtherModel(HashingEncoder):
        def encode(self, texts):
            return super().encode(texts)[:, ::-1]  # the same dimension, another embedding space

    other = OtherModel(DIM)
    other.name = "other-64"
    with pytest.raises(RetrieverError, match=f"{ivfpq.index_dir} was embedded by hashing-64; the encoder "
                                             "other-64 is another model"):
        DenseRetriever.load(ivfpq.index_dir, encoder=other)
    same_model = HashingEncoder(DIM)
    same_model.name = "renamed"  # the same model under another name: its embeddings agree
    assert DenseRetriever.load(ivfpq.index_dir, encoder=same_model).retrieve("topic3word7", 3) == \
        ivfpq.retrieve("topic3word7", 3)


def interrupted_build(out_dir, encoder):
    """A build interrupted after two saved chunks of 100 passages."""
    def interrupt_after_two_chunks(passages):
        yield from passages[:250]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        DenseRetriever.write_index(interrupt_after_two_chunks(PASSAGES), out_dir, encoder=encoder, chunk_size=100)
    return dense_module.partial_dir(out_dir)


@pytest.mark.parametrize("damaged_file, damage, message", [
    ("build.json", b"{not json", r"build.json is damaged .*remove .*index.partial to start over"),
    ("build.json", b"[1, 2]", r"build.json is damaged .*remove .*index.partial to start over"),
    ("chunk-000000.jsonl", b'["p0", "T"\n', r"chunk-000000.jsonl is damaged .*remove .*chunk-000000.npy"),
    ("chunk-000001.npy", b"\x93NUMPY garbage", r"chunk-000001.npy is damaged .*remove .*chunk-000001.npy"),
])
def test_a_damaged_file_of_an_interrupted_build_is_named_with_what_to_do(tmp_path, encoder, damaged_file, damage,
                                                                        message):
    out_dir = tmp_path / "index"
    partial = interrupted_build(out_dir, encoder)
    (partial / damaged_file).write_bytes(damage)
    with pytest.raises(RetrieverError, match=message):
        DenseRetriever.write_index(PASSAGES[:400], out_dir, encoder=encoder, chunk_size=100)
    assert not out_dir.exists() and partial.is_dir()


def test_removing_a_damaged_chunk_as_told_embeds_it_again(tmp_path, encoder):
    out_dir = tmp_path / "index"
    partial = interrupted_build(out_dir, encoder)
    vectors = partial / "chunk-000001.npy"
    vectors.write_bytes(vectors.read_bytes()[:200])  # cut short
    with pytest.raises(RetrieverError, match=f"remove {vectors}"):
        DenseRetriever.write_index(PASSAGES[:400], out_dir, encoder=encoder, chunk_size=100)
    vectors.unlink()
    counting = HashingEncoder(DIM)
    DenseRetriever.write_index(PASSAGES[:400], out_dir, encoder=counting, chunk_size=100)
    assert counting.encoded == 300 + 1  # chunks 1 to 3, and the probe sentence of the encoder's identity
    assert len(PassageStore(out_dir / PASSAGES_FILE)) == 400 and not partial.exists()


def test_a_build_shows_progress_after_each_batch_not_each_chunk(tmp_path, encoder, monkeypatch, caplog):
    class Batched(HashingEncoder):
        batch_size = 25

        def __init__(self):
            super().__init__(DIM)
            self.calls = []

        def encode(self, texts):
            self.calls.append(len(texts))
            return super().encode(texts)

    monkeypatch.setattr(dense_build_module, "LOG_EVERY_S", 0.0)
    batched = Batched()
    with caplog.at_level(logging.INFO, logger="arag"):
        DenseRetriever.write_index(PASSAGES[:230], tmp_path / "index", encoder=batched, chunk_size=100)
    assert batched.calls == [1] + [25] * 4 + [25] * 4 + [25, 5]  # the probe, then each chunk 25 at a time
    lines = [r.getMessage() for r in caplog.records if "embedded now" in r.getMessage()]
    assert len(lines) == 10 and lines[0].startswith("dense build: 25 passages (25 embedded now")
    # Batched longest first and put back in order: the index is the one of a chunk embedded at once.
    whole = DenseRetriever.build(PASSAGES[:230], tmp_path / "whole", encoder=encoder, chunk_size=100)
    assert DenseRetriever.load(tmp_path / "index", encoder=encoder).retrieve_batch(QUERIES, 10) == \
        whole.retrieve_batch(QUERIES, 10)
