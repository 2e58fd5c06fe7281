"""Bad input through the real command line (`python -m arag.cli eval`), a table of cases: each is one `error:` line,
exit status 2, no traceback and no half-written file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from arag.data import sample_paths
from arag.testing import OpenAICompatibleServer


def answer_two(call):
    """The answer to the good line's question in every field: the cases fail before an answer matters."""
    return {field: "2" for field in call.output_fields}


def cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "arag.cli", *args], capture_output=True, text=True,
                          env=env or os.environ.copy(), timeout=timeout)


class Proxy:
    """A loopback HTTP proxy in front of an OpenAI-compatible server that drops the request's log-probability
    options (an endpoint that returns none) and records each request's Authorization header."""

    def __init__(self, upstream: str, drop_logprobs: bool = True):
        self.upstream = upstream.rsplit("/v1", 1)[0]
        self.authorizations: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                proxy.authorizations.append(self.headers.get("Authorization", ""))
                if drop_logprobs:
                    body.pop("logprobs", None)
                    body.pop("top_logprobs", None)
                request = urllib.request.Request(proxy.upstream + self.path, json.dumps(body).encode(),
                                                 {"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=120) as answer:
                    data, status = answer.read(), answer.status
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> Proxy:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...]
    message: str


GOOD = '{"id": "1", "question": "What is 1 plus one?", "answers": ["2"]}\n'
FILES = {
    "empty.jsonl": b"",
    "malformed.jsonl": (GOOD + '{"id": "2", "question": \n').encode(),
    "no_question.jsonl": (GOOD + '{"id": "2", "answers": ["3"]}\n').encode(),
    "no_answers.jsonl": (GOOD + '{"id": "2", "question": "What is 2 plus one?"}\n').encode(),
    "latin1.jsonl": GOOD.encode() + '{"id": "2", "question": "Où est Zürich?", "answers": ["a"]}\n'.encode("latin-1"),
    "duplicate_ids.jsonl": (GOOD + GOOD).encode(),
    "huge_question.jsonl": json.dumps({"id": "1", "question": "why " * 25_000, "answers": ["a"]}).encode() + b"\n",
    "corpus_empty.jsonl": b"\n\n",
    "corpus_no_text.jsonl": b'{"id": "p1", "title": "A", "text": "a"}\n{"id": "p2", "title": "B"}\n',
    "corpus_latin1.jsonl": '{"id": "p1", "title": "Zürich", "text": "a"}\n'.encode("latin-1"),
    "an_existing_file": b"not a folder",
}

CASES = [
    Case("missing dataset", ("--dataset", "{tmp}/nowhere.jsonl"), "nowhere.jsonl: file not found"),
    Case("empty dataset", ("--dataset", "{tmp}/empty.jsonl"), "empty.jsonl: empty file"),
    Case("malformed JSON line", ("--dataset", "{tmp}/malformed.jsonl"), "malformed.jsonl, line 2: invalid JSON"),
    Case("missing question", ("--dataset", "{tmp}/no_question.jsonl"), "line 2: missing or empty question"),
    Case("missing answers", ("--dataset", "{tmp}/no_answers.jsonl"), "line 2: missing answers"),
    Case("non-UTF-8 dataset", ("--dataset", "{tmp}/latin1.jsonl"), "latin1.jsonl, line 2: not valid UTF-8"),
    Case("duplicate ids", ("--dataset", "{tmp}/duplicate_ids.jsonl"), "duplicate id '1'"),
    Case("100 kB question", ("--dataset", "{tmp}/huge_question.jsonl"), "the question is 100,000 characters long"),
    Case("missing corpus", ("--corpus", "{tmp}/no_corpus.jsonl"), "no_corpus.jsonl: corpus file not found"),
    Case("empty corpus", ("--corpus", "{tmp}/corpus_empty.jsonl"), "corpus_empty.jsonl: empty file"),
    Case("corpus passage without text", ("--corpus", "{tmp}/corpus_no_text.jsonl"), "line 2: missing 'text'"),
    Case("non-UTF-8 corpus", ("--corpus", "{tmp}/corpus_latin1.jsonl"), "line 1: not valid UTF-8"),
    Case("unknown program", ("--program", "flair"), "unknown program 'flair'"),
    Case("unknown parameter", ("--param", "kk=3"), "unknown parameter(s) kk"),
    Case("k = 0", ("--param", "k=0"), "parameter 'k' must be in [1, 100], got 0"),
    Case("k = 101", ("--param", "k=101"), "parameter 'k' must be in [1, 100], got 101"),
    Case("FLARE theta above 1", ("--program", "flare", "--param", "theta=1.5"),
         "parameter 'theta' must be in [0.0, 1.0], got 1.5"),
    Case("Self-RAG delta below 0", ("--program", "self-rag", "--param", "delta=-0.1"),
         "parameter 'delta' must be in [0.0, 1.0], got -0.1"),
    Case("CRAG lower above upper", ("--program", "crag", "--param", "lower=0.6", "--param", "upper=0.5"),
         "parameter 'lower' (0.6) must not exceed parameter 'upper' (0.5)"),
    Case("unreachable LM", ("--api-base", "http://127.0.0.1:9/v1"), "cannot reach the LM server at http://127.0.0.1:9/v1"),
    Case("malformed LM URL", ("--api-base", "127.0.0.1:8000"), "--api-base must be a URL"),
    Case("unreachable retriever", ("--retriever", "http://127.0.0.1:9/api/search"), "did not answer"),
    Case("output folder is a file", ("--out", "{tmp}/an_existing_file"), "cannot use"),
    Case("FLARE on an LM without log-probabilities", ("--program", "flare", "--api-base", "{no_logprobs}"),
         "carries no token log-probabilities"),
]


def case_argv(case: Case, tmp: Path, out: Path, lm_url: str, no_logprobs_url: str) -> list[str]:
    questions, corpus = sample_paths()
    options = {"--program": "single-rag", "--dataset": str(questions), "--corpus": str(corpus),
               "--lm": "openai/scripted", "--api-base": lm_url, "--out": str(out), "--threads": "2"}
    extra = []
    for key, value in zip(case.args[::2], case.args[1::2]):
        value = value.format(tmp=tmp, no_logprobs=no_logprobs_url)
        if key in ("--param", "--retriever"):
            extra += [key, value]
            if key == "--retriever":
                options.pop("--corpus")
        else:
            options[key] = value
    return ["eval", *[part for item in options.items() for part in item], *extra]


def half_written(folder: Path) -> list[str]:
    """Files under `folder` that a crash could have left incomplete: temporaries, staging folders, JSON that
    does not parse, JSON Lines whose last line is cut."""
    found = []
    for path in folder.rglob("*"):
        if path.suffix == ".tmp" or ".building-" in path.name:
            found.append(str(path))
        elif path.is_file() and path.suffix == ".jsonl":
            text = path.read_text(encoding="utf-8")
            try:
                [json.loads(line) for line in text.splitlines()]
            except ValueError:
                found.append(str(path))
            if text and not text.endswith("\n"):
                found.append(str(path))
        elif path.is_file() and path.suffix == ".json":
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except ValueError:
                found.append(str(path))
    return found


@pytest.fixture(scope="module")
def bad_input_runs(tmp_path_factory):
    """Every case of the table through `python -m arag.cli`, four at a time."""
    tmp = tmp_path_factory.mktemp("bad-input")
    for name, data in FILES.items():
        (tmp / name).write_bytes(data)
    with OpenAICompatibleServer(answer_two) as server, Proxy(server.url) as no_logprobs:
        def run(case: Case):
            folder = tmp / re.sub(r"\W+", "-", case.name)
            env = {**{k: v for k, v in os.environ.items() if k not in {"ARAG_LM", "ARAG_API_BASE"}},
                   "ARAG_HOME": str(folder / "home")}
            argv = case_argv(case, tmp, folder / "out", server.url, no_logprobs.url)
            return case.name, (cli(*argv, env=env), folder)

        with ThreadPoolExecutor(max_workers=4) as pool:
            return dict(pool.map(run, CASES))


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bad_input_is_one_clear_line_and_a_non_zero_exit(bad_input_runs, case):
    done, folder = bad_input_runs[case.name]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert len(errors) == 1 and case.message in errors[0], done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert half_written(folder) == []
