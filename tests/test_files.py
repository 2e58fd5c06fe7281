"""Files arag writes and reads: one file written by two processes at once."""

import subprocess
import sys
from collections import Counter

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
