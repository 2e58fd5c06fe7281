"""Corpus loaders: JSON Lines and TSV passages (DPR's shape, with or without a header, gzipped), bad input naming
its line, and the shared real corpora."""

import gzip
import json
from pathlib import Path

import pytest

from arag.data import iter_corpus, load_corpus
from arag.errors import DataError
from arag.passages import Passage

FIXTURES = Path(__file__).parents[1] / "fixtures_data"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def jsonl(path: Path, rows) -> Path:
    return write(path, "".join(json.dumps(row) + "\n" for row in rows))



def test_jsonl_corpus_reads_passages_in_order(tmp_path):
    path = jsonl(
        tmp_path / "corpus.jsonl",
        [{"id": 7, "title": "Rome", "text": "Rome lies on the Tiber."}, {"id": "b", "text": "No title here."}],
    )
    assert load_corpus(path) == [
        Passage(id="7", title="Rome", text="Rome lies on the Tiber.", score=0.0),
        Passage(id="b", title="", text="No title here.", score=0.0),
    ]


def test_iter_corpus_streams_the_same_passages(tmp_path):
    path = jsonl(tmp_path / "c.jsonl", [{"id": i, "text": f"passage {i}"} for i in range(3)])
    stream = iter_corpus(path)
    assert next(stream).id == "0"
    assert [p.id for p in stream] == ["1", "2"]


def test_dpr_tsv_corpus_with_header_and_quoted_text():
    passages = load_corpus(FIXTURES / "psgs_small.tsv")
    assert passages[0] == Passage(id="1", title="Aaron", text='Aaron Aaron ( or ; "Ahärôn") is a prophet.')
    assert passages[1].title == "Second Title"


def test_headerless_tsv_is_id_text_title(tmp_path):
    path = write(tmp_path / "psgs.tsv", "10\tThe Danube flows east.\tDanube\n11\tThe Rhine flows north.\tRhine\n")
    assert [(p.id, p.title, p.text) for p in load_corpus(path)] == [
        ("10", "Danube", "The Danube flows east."),
        ("11", "Rhine", "The Rhine flows north."),
    ]


def test_tsv_header_in_another_column_order(tmp_path):
    path = write(tmp_path / "psgs.tsv", "id\ttitle\ttext\nx\tTiber\tThe Tiber reaches the sea.\n")
    assert load_corpus(path) == [Passage(id="x", title="Tiber", text="The Tiber reaches the sea.")]


def test_gzipped_corpus_and_content_sniffing(tmp_path):
    path = tmp_path / "psgs_w100.tsv.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write("id\ttext\ttitle\n1\tSome text.\tT\n")
    assert load_corpus(path)[0].text == "Some text."
    no_extension = jsonl(tmp_path / "corpus.data", [{"id": 1, "text": "sniffed as JSON Lines"}])
    assert load_corpus(no_extension)[0].text == "sniffed as JSON Lines"


def test_empty_text_is_allowed_when_there_is_a_title(tmp_path):
    path = jsonl(tmp_path / "c.jsonl", [{"id": 1, "title": "Category:Rivers", "text": ""}])
    assert load_corpus(path)[0].title == "Category:Rivers"


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"id": 1, "text": "ok"}\n{"id": 2, "text": \n', "line 2: invalid JSON"),
        ('{"id": 1, "title": "no text"}\n', "line 1: missing 'text'"),
        ('{"id": 1, "text": "a"}\n\n{"id": 1, "text": "b"}\n', "line 3: duplicate passage id '1' (first at line 1)"),
        ('{"text": "no id"}\n', "line 1: missing or invalid passage id"),
        ('{"id": 1, "title": "", "text": "  "}\n', "line 1: passage 1 has neither title nor text"),
        ('{"id": 1, "title": 5, "text": "x"}\n', "line 1: 'title' must be a string"),
        ("[1, 2]\n", "line 1: expected a JSON object"),
        ("\n\n", "empty file"),
    ],
)
def test_bad_jsonl_corpus(tmp_path, content, message):
    path = write(tmp_path / "corpus.jsonl", content)
    with pytest.raises(DataError) as error:
        load_corpus(path)
    assert str(path) in str(error.value)
    assert message in str(error.value)


def test_bad_tsv_corpus_names_the_line(tmp_path):
    path = write(tmp_path / "psgs.tsv", "id\ttext\ttitle\n1\tfine\tT\n2\tonly two columns\n")
    with pytest.raises(DataError, match=r"line 3: expected 3 tab-separated columns, got 2"):
        load_corpus(path)
    header_only = write(tmp_path / "header.tsv", "id\ttext\ttitle\n")
    with pytest.raises(DataError, match="no passages"):
        load_corpus(header_only)


def test_missing_and_non_utf8_corpus(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        iter_corpus(tmp_path / "absent.jsonl")
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"id": 1, "text": "fine"}\n{"id": 2, "text": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"line 2: not valid UTF-8"):
        load_corpus(path)


def test_unknown_corpus_format(tmp_path):
    path = jsonl(tmp_path / "c.jsonl", [{"id": 1, "text": "x"}])
    with pytest.raises(DataError, match="unknown corpus format 'csv'; known: auto, jsonl, tsv"):
        load_corpus(path, fmt="csv")


# ---------------------------------------------------------------- the shared real corpora


def test_shared_corpora_load(shared_dataset):
    counts = [("arc_challenge", 1973), ("musique_train100", 1890), ("popqa_longtail", 2488), ("pubmedqa", 1000)]
    for name, count in counts:
        assert len(load_corpus(shared_dataset(name) / "corpus.jsonl")) == count
