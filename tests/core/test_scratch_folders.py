"""Scratch folders: arag works in and removes only folders it made (they carry its marker); a folder of the user's,
or a link, where a scratch folder would go is refused, left as it was, never followed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from arag import scratch
from arag.data._io import atomic_writer
from arag.errors import AragError
from arag.passages import Passage
from arag.retrievers import BM25Retriever, build_index
from arag.retrievers.manifest import STAGING_PREFIX
from arag.scratch import ForeignFolder

PASSAGES = [Passage(f"p{i}", f"Title {i}", f"passage number {i} about topic {i % 7}") for i in range(40)]


def dead_pid() -> int:
    """The id of a process that has ended."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def user_folder(path):
    """A folder of the user's: one file of notes in it."""
    path.mkdir()
    (path / "notes.txt").write_text("my notes\n")
    return path


def test_a_scratch_folder_is_arags_only_with_its_marker(tmp_path):
    made = scratch.create_scratch(tmp_path / "deep" / "work")
    assert scratch.is_scratch(made) and (made / scratch.MARKER).is_file()
    assert scratch.open_scratch(made) == made  # resumed
    scratch.remove_scratch(made)
    assert not made.exists() and (tmp_path / "deep").is_dir()
    scratch.remove_scratch(made, missing_ok=True)

    mine = user_folder(tmp_path / "mine")
    link = tmp_path / "link"
    link.symlink_to(made.parent)  # a link to anywhere, even to a folder holding arag's scratch
    plain_file = tmp_path / "file"
    plain_file.write_text("data\n")
    for path, what in ((mine, "a folder"), (link, "a symbolic link"), (plain_file, "a file")):
        for action in (scratch.open_scratch, scratch.remove_scratch, scratch.create_scratch):
            with pytest.raises(ForeignFolder, match=f"{path} is {what} that arag did not create"):
                action(path)
    assert (mine / "notes.txt").read_text() == "my notes\n" and plain_file.read_text() == "data\n"
    assert link.is_symlink()


def test_a_marker_that_is_a_link_does_not_make_a_folder_arags(tmp_path):
    made = scratch.create_scratch(tmp_path / "made")
    forged = user_folder(tmp_path / "forged")
    (forged / scratch.MARKER).symlink_to(made / scratch.MARKER)
    with pytest.raises(ForeignFolder):
        scratch.remove_scratch(forged)
    assert (forged / "notes.txt").exists()


def test_only_marked_folders_of_ended_processes_are_removed_as_abandoned(tmp_path):
    gone, alive = dead_pid(), os.getpid()
    abandoned = scratch.create_scratch(tmp_path / f".x.building-{gone}-aaaa")
    running = scratch.create_scratch(tmp_path / f".x.building-{alive}-bbbb")
    users = user_folder(tmp_path / f".x.building-{gone}-cccc")
    assert scratch.remove_abandoned(tmp_path, ".x.building-") == [abandoned]
    assert running.exists() and (users / "notes.txt").exists()


def test_an_index_build_leaves_a_lookalike_staging_folder_of_the_users_alone(tmp_path):
    out = tmp_path / "index"
    lookalike = user_folder(tmp_path / f"{STAGING_PREFIX.format(name='index')}{dead_pid()}-0000abcd")
    BM25Retriever.build(PASSAGES, out)
    assert (lookalike / "notes.txt").read_text() == "my notes\n"
    assert not (out / scratch.MARKER).exists()  # the published index is no scratch folder
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([lookalike.name, "index"])


def test_a_failed_build_removes_its_own_staging_folder(tmp_path):
    def failing():
        yield from PASSAGES[:5]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        BM25Retriever.build(failing(), tmp_path / "index")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n" for p in PASSAGES))
    return path


def test_a_dense_build_refuses_a_partial_folder_it_did_not_create(tmp_path, corpus):
    pytest.importorskip("faiss")
    from arag.testing.encoders import HashingEncoder

    out = tmp_path / "idx"
    partial = user_folder(tmp_path / "idx.partial")
    with pytest.raises(ForeignFolder, match=f"{partial} is a folder that arag did not create"):
        build_index(corpus, out, kind="dense", encoder=HashingEncoder(16))
    assert sorted(p.name for p in partial.iterdir()) == ["notes.txt"] and not out.exists()


def test_a_dense_build_does_not_follow_a_partial_link(tmp_path, corpus):
    pytest.importorskip("faiss")
    from arag.testing.encoders import HashingEncoder

    elsewhere = user_folder(tmp_path / "elsewhere")
    (tmp_path / "idx.partial").symlink_to(elsewhere)
    with pytest.raises(ForeignFolder, match="is a symbolic link that arag did not create"):
        build_index(corpus, tmp_path / "idx", kind="dense", encoder=HashingEncoder(16))
    assert sorted(p.name for p in elsewhere.iterdir()) == ["notes.txt"]
    assert (tmp_path / "idx.partial").is_symlink() and not (tmp_path / "idx").exists()


def test_the_cli_refuses_a_users_partial_folder_in_one_line(tmp_path, corpus):
    pytest.importorskip("faiss")
    partial = user_folder(tmp_path / "idx.partial")
    done = subprocess.run([sys.executable, "-m", "arag.cli", "index", "build", "--kind", "dense", "--corpus",
                           str(corpus), "--out", str(tmp_path / "idx")], capture_output=True, text=True, timeout=300)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert str(partial) in errors[0] and "arag did not create" in errors[0] and "Traceback" not in done.stderr
    assert (partial / "notes.txt").read_text() == "my notes\n" and not (tmp_path / "idx").exists()


def test_a_lucene_build_keeps_its_collection_in_its_own_scratch(tmp_path, monkeypatch):
    pytest.importorskip("pyserini", reason="needs the lucene extra")
    from arag.retrievers import LuceneRetriever

    index = LuceneRetriever.build(PASSAGES, tmp_path / "lucene", threads=1)
    assert [p.id for p in index.retrieve("passage number 3", 1)] == ["p3"]
    assert not (tmp_path / "lucene" / "collection").exists() and not (tmp_path / "lucene" / scratch.MARKER).exists()


def test_an_atomic_write_never_removes_a_file_it_did_not_make(tmp_path, monkeypatch):
    fixed = uuid.UUID(int=7)
    monkeypatch.setattr(uuid, "uuid4", lambda: fixed)
    target = tmp_path / "out.json"
    theirs = tmp_path / f".out.json.{os.getpid()}-{fixed.hex[:12]}.tmp"
    theirs.write_text("someone else's\n")
    with pytest.raises(FileExistsError):
        with atomic_writer(target) as handle:
            handle.write("mine")
    assert theirs.read_text() == "someone else's\n" and not target.exists()


def test_foreign_folders_are_arag_errors():
    assert issubclass(ForeignFolder, AragError)
