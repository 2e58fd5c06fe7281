"""Index folders: build_index, open_index, the corpus-keyed cache and retriever specs."""

import hashlib
import json
import logging
import threading
from pathlib import Path

import pytest

from arag.errors import ConfigError, DataError, RetrieverError
from arag.retrievers import (
    BM25Retriever,
    Retriever,
    build_index,
    index_cache_root,
    index_for_corpus,
    open_index,
    open_retriever,
)
from arag.retrievers.manifest import MANIFEST_NAME

ROWS = [
    {"id": "a", "title": "Lighthouse", "text": "A lighthouse guides ships with a rotating beam of light."},
    {"id": "b", "title": "Beekeeping", "text": "Beekeepers harvest honey and wax from hives of honeybees."},
    {"id": "c", "title": "Glacier", "text": "A glacier is a slowly moving mass of ice formed from compacted snow."},
]


def write_corpus(path: Path, rows=ROWS) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path / "corpus.jsonl")


@pytest.fixture
def arag_home(tmp_path, monkeypatch):
    home = tmp_path / "arag-home"
    monkeypatch.setenv("ARAG_HOME", str(home))
    return home


@pytest.fixture
def builds(monkeypatch):
    """Counts the indexes BM25Retriever writes."""
    written = []
    write_index = BM25Retriever.write_index.__func__

    def counting(cls, passages, out_dir, **options):
        written.append(Path(out_dir))
        return write_index(cls, passages, out_dir, **options)

    monkeypatch.setattr(BM25Retriever, "write_index", classmethod(counting))
    return written


def test_build_index_from_a_corpus_file(corpus, tmp_path):
    out_dir = build_index(corpus, tmp_path / "index", k1=1.2)
    assert out_dir == tmp_path / "index"
    manifest = json.loads((out_dir / MANIFEST_NAME).read_text())
    assert manifest["corpus_sha256"] == hashlib.sha256(corpus.read_bytes()).hexdigest()
    assert manifest["n_passages"] == 3 and manifest["settings"]["k1"] == 1.2
    retriever = open_index(out_dir)
    assert isinstance(retriever, BM25Retriever) and isinstance(retriever, Retriever)
    assert retriever.retrieve("honey from hives", 1)[0].id == "b"


def test_build_index_from_passages(tmp_path):
    from arag.passages import Passage

    out_dir = build_index([Passage(r["id"], r["title"], r["text"]) for r in ROWS], str(tmp_path / "index"))
    assert open_index(out_dir).retrieve("ice and snow", 1)[0].id == "c"


def test_build_index_rejects_unknown_kinds_and_options(corpus, tmp_path):
    with pytest.raises(ConfigError, match="unknown index kind 'faiss'; known: bm25"):
        build_index(corpus, tmp_path / "index", kind="faiss")
    with pytest.raises(ConfigError, match="unknown BM25 index option.*k_1.*known: b, k1, stemmer, stopwords"):
        build_index(corpus, tmp_path / "index", k_1=1.0)
    with pytest.raises(DataError, match="missing.jsonl"):
        build_index(tmp_path / "missing.jsonl", tmp_path / "index")
    assert not (tmp_path / "index").exists()


def test_open_index_errors_name_the_folder(tmp_path):
    with pytest.raises(RetrieverError, match=f"{tmp_path / 'absent'}: no such index folder"):
        open_index(tmp_path / "absent")
    with pytest.raises(RetrieverError, match=f"{tmp_path} holds no arag index"):
        open_index(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(RetrieverError, match=f"{tmp_path}: unreadable {MANIFEST_NAME}"):
        open_index(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text('["bm25"]')
    with pytest.raises(RetrieverError, match=f"{tmp_path}: corrupt {MANIFEST_NAME}"):
        open_index(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text('{"kind": "splade"}')
    with pytest.raises(RetrieverError, match=f"{tmp_path} holds a 'splade' index.*known kinds: bm25"):
        open_index(tmp_path)


def test_cache_root_follows_arag_home(monkeypatch, tmp_path):
    monkeypatch.setenv("ARAG_HOME", str(tmp_path))
    assert index_cache_root() == tmp_path / "indexes"
    monkeypatch.delenv("ARAG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert index_cache_root() == tmp_path / "user" / ".cache" / "arag" / "indexes"


def test_index_for_corpus_builds_once_and_reuses(corpus, tmp_path, arag_home, builds, caplog):
    caplog.set_level(logging.INFO, logger="arag")
    first = index_for_corpus(corpus)
    second = index_for_corpus(str(corpus))
    copy = index_for_corpus(write_corpus(tmp_path / "same-content.jsonl"))
    digest = hashlib.sha256(corpus.read_bytes()).hexdigest()
    assert builds == [arag_home / "indexes" / "bm25" / "format-1" / digest]
    assert first.index_dir == second.index_dir == copy.index_dir == builds[0]
    messages = [r.getMessage() for r in caplog.records if "building BM25 index" in r.getMessage()]
    assert messages == [f"building BM25 index for corpus {corpus} (3 passages) in {builds[0]} — reused on later runs"]
    assert second.retrieve("lighthouse beam", 1)[0].id == "a"


def test_an_index_cached_in_another_format_is_built_anew(corpus, arag_home, builds, monkeypatch):
    old = index_for_corpus(corpus)
    monkeypatch.setattr(BM25Retriever, "format_version", 2)
    new = index_for_corpus(corpus)
    assert len(builds) == 2 and new.index_dir.parent.name == "format-2" and old.index_dir.is_dir()


def test_changed_corpus_content_gets_a_new_index(corpus, arag_home, builds):
    before = index_for_corpus(corpus)
    write_corpus(corpus, ROWS + [{"id": "d", "title": "Volcano", "text": "Lava erupts from a volcano."}])
    after = index_for_corpus(corpus)
    assert len(builds) == 2 and before.index_dir != after.index_dir
    assert len(before) == 3 and len(after) == 4
    assert after.retrieve("lava", 1)[0].id == "d"


def test_racing_first_uses_publish_one_index(corpus, arag_home, builds, monkeypatch):
    both_building = threading.Barrier(2, timeout=30)
    write_index = BM25Retriever.write_index.__func__

    def build_together(cls, passages, out_dir, **options):
        both_building.wait()
        return write_index(cls, passages, out_dir, **options)

    monkeypatch.setattr(BM25Retriever, "write_index", classmethod(build_together))
    results = [None, None]

    def first_use(slot):
        results[slot] = index_for_corpus(corpus)

    threads = [threading.Thread(target=first_use, args=(slot,)) for slot in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 2 and results[0].index_dir == results[1].index_dir
    assert [r.retrieve("glacier ice", 1)[0].id for r in results] == ["c", "c"]
    assert [p.name for p in results[0].index_dir.parent.iterdir()] == [results[0].index_dir.name]


def test_index_for_corpus_reports_bad_corpora(tmp_path, arag_home):
    with pytest.raises(DataError, match="missing.jsonl"):
        index_for_corpus(tmp_path / "missing.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"id": "x", "title": "T", "text": "ok"}\n{oops\n')
    with pytest.raises(DataError, match="bad.jsonl, line 2"):
        index_for_corpus(tmp_path / "bad.jsonl")
    assert not (arag_home / "indexes").exists()


def test_open_retriever_forms(corpus, tmp_path, arag_home):
    index_dir = build_index(corpus, tmp_path / "index")
    assert open_retriever(f"bm25:{index_dir}").retrieve("honeybees", 1)[0].id == "b"
    assert open_retriever(str(index_dir)).retrieve("honeybees", 1)[0].id == "b"
    from_corpus = open_retriever(corpus=str(corpus))
    assert from_corpus.index_dir.parent == arag_home / "indexes" / "bm25" / "format-1"
    assert open_retriever(str(index_dir), corpus=str(corpus)).index_dir == index_dir


@pytest.mark.parametrize("spec", ["/no/such/folder", "colbertv2:/some/index", "ftp://host/api/search"])
def test_open_retriever_refuses_unknown_specs(spec):
    with pytest.raises(RetrieverError, match="unknown retriever spec .*known forms: bm25:DIR, or DIR"):
        open_retriever(spec)


def test_open_retriever_errors(tmp_path):
    with pytest.raises(RetrieverError, match="holds no arag index"):
        open_retriever(f"bm25:{tmp_path}")
    with pytest.raises(ConfigError, match="--corpus PATH.*--retriever SPEC"):
        open_retriever()
    with pytest.raises(ConfigError):
        open_retriever("", corpus="")
