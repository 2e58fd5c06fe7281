"""Files arag writes and reads: one file written by two processes at once, and corpus passages too long to prompt."""

import json
import logging
import subprocess
import sys
from collections import Counter

import dspy

from arag.data import load_corpus
from arag.data.corpus import MAX_PASSAGE_CHARS
from arag.programs import build_program
from arag.retrievers import BM25Retriever
from arag.testing import scripted_lm

WRITER = """
import sys, time
from arag.data._io import write_atomic
path, letter, seconds = sys.argv[1:]
print("ready", flush=True)
sys.stdin.readline()
until = time.monotonic() + float(seconds)
while time.monotonic() < until:
    write_atomic(path, letter * 20_000)
"""


def test_two_processes_writing_one_file_never_fail_and_a_reader_sees_only_whole_files(tmp_path):
    target = tmp_path / "summary.json"
    whole = {letter * 20_000 + "\n" for letter in "ab"}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(target), letter, "2"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for letter in "ab"]
    assert [writer.stdout.readline() for writer in writers] == ["ready\n", "ready\n"]
    for writer in writers:  # both start writing at once
        writer.stdin.write("go\n")
        writer.stdin.flush()
    reads: Counter[str] = Counter()
    while any(writer.poll() is None for writer in writers):
        try:
            text = target.read_text()
        except FileNotFoundError:
            continue
        reads["whole" if text in whole else "torn"] += 1
    errors = [writer.communicate()[1] for writer in writers]
    assert [writer.returncode for writer in writers] == [0, 0], errors
    assert reads["torn"] == 0 and reads["whole"] > 0
    assert [path.name for path in tmp_path.iterdir()] == ["summary.json"], "a staged file was left behind"


def test_a_runaway_passage_is_cut_at_load_and_never_reaches_the_lm_whole(tmp_path, caplog):
    corpus = tmp_path / "corpus.jsonl"
    records = [
        {"id": "p1", "title": "Otters", "text": "Otters hold hands while they sleep."},
        {"id": "p2", "title": "Dump", "text": "Otters " + "and more words " * 400_000},
        {"id": "p3", "title": "T" * (MAX_PASSAGE_CHARS + 5), "text": "A title that never ends."},
    ]
    corpus.write_text("".join(json.dumps(record) + "\n" for record in records))
    with caplog.at_level(logging.WARNING, logger="arag"):
        passages = load_corpus(corpus)
    assert [(len(p.title), len(p.text)) for p in passages] == [
        (6, 35), (4, MAX_PASSAGE_CHARS), (MAX_PASSAGE_CHARS, 24)]
    assert f"2 passage(s) longer than {MAX_PASSAGE_CHARS} characters cut to that length (line 2 and others)" \
        in caplog.text

    lm = scripted_lm(lambda call: {field: "asleep" for field in call.output_fields})
    program = build_program("single-rag", BM25Retriever.build(passages, tmp_path / "bm25"), k=3, reasoning="direct")
    with dspy.context(lm=lm):
        program(question="What do otters do?")
    (call,) = lm.engine.calls
    assert len(call.prompt) < 3 * MAX_PASSAGE_CHARS + 5_000
