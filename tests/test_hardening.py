"""Hardening: LM faults over a 300-question evaluation, kill-and-resume, a table of bad inputs through the
real CLI, and API keys kept out of everything a run writes or prints."""

from __future__ import annotations

import csv
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import dspy
import pytest
import ujson

from arag.adapters import TextAdapter
from arag.data import load_examples, sample_paths
from arag.evaluate import evaluate
from arag.programs import build_program
from arag.runs import read_rows
from arag.testing import Faults, OpenAICompatibleServer, isolated_cache, scripted_lm

SECRET_KEY = "sk-arag-test-SECRET-5f0c2b9e7d41"
SAMPLE_BY_QUESTION = {example.question: example for example in load_examples(sample_paths()[0])}
RETRYABLE = ("timeout", "rate_limit", "server_error")
FAULT_MESSAGES = {"timeout": "LMTimeoutError", "rate_limit": "LMRateLimitError", "server_error": "LMServerError",
                  "unparseable": "AdapterParseError"}


def add_one(call):
    """Answers "N+1" to "What is N plus one?" (a long answer ends "So the answer is N+1."), a short text elsewhere."""
    match = re.search(r"\d+", call.inputs.get("question", ""))
    answer = str(int(match.group()) + 1) if match else "Budapest"
    continuation = "" if call.inputs.get("answer_so_far") else f"So the answer is {answer}."
    return {field: answer if field == "answer" else continuation if field == "continuation" else "Counting on."
            for field in call.output_fields}


def sums(n: int) -> list[dspy.Example]:
    return [dspy.Example(id=f"q{i:03d}", question=f"What is {i} plus one?", answers=[str(i + 1)])
            .with_inputs("question") for i in range(n)]


def cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "arag.cli", *args], capture_output=True, text=True,
                          env=env or os.environ.copy(), timeout=timeout)


# ----------------------------------------------------------------------------------------------------
# Faults


def expected_outcome(kinds: list[str | None], num_retries: int) -> tuple[list[str], str | None]:
    """What DSPy does with one question's successive fault draws (None = a clean answer): the adapter of each
    request, and the fault that ends the question (None when it is answered). Each LM call is retried
    `num_retries` times on timeouts, 429 and 500; an unparseable answer sends the text adapter to JSON."""
    adapters, draws = [], iter(kinds)
    for adapter in ("chat", "json"):
        for attempt in range(num_retries + 1):
            adapters.append(adapter)
            kind = next(draws)
            if kind is None:
                return adapters, None
            if kind == "unparseable":
                break
            if attempt == num_retries:
                return adapters, kind
    return adapters, "unparseable"


def test_a_300_question_evaluation_survives_faults_and_records_every_failure(tmp_path):
    faults = Faults(timeout=0.06, rate_limit=0.06, server_error=0.06, unparseable=0.15, seed=7, retry_after=0.001)
    lm = scripted_lm(add_one, faults=faults, num_retries=1)
    examples = sums(300)
    # The text adapter, whose JSON fallback doubles what one unparseable answer costs.
    with isolated_cache(enabled=False), dspy.context(lm=lm, adapter=TextAdapter()):
        result = evaluate(build_program("no-retrieval"), examples, out_dir=tmp_path, threads=8, progress=False,
                          max_errors=300)
    rows = [row.to_json() for row in read_rows(tmp_path / "predictions.jsonl")]
    assert sorted(row["id"] for row in rows) == [ex.id for ex in examples], "a question was lost or answered twice"
    assert result.summary["complete"] and result.summary["n"] == 300

    # Replay the engine's fault draws (one per request, in arrival order) to know each question's faults.
    rng = random.Random(faults.seed)
    draws_by_question: dict[str, list] = {}
    adapters_by_question: dict[str, list] = {}
    for call in lm.engine.calls:
        question = call.inputs["question"]
        draws_by_question.setdefault(question, []).append(faults.draw(rng))
        adapters_by_question.setdefault(question, []).append(call.adapter)
    assert set(lm.engine.faulted) == {"timeout", "rate_limit", "server_error", "unparseable"}

    failed = 0
    for row in rows:
        draws = draws_by_question[row["question"]]
        adapters, fatal = expected_outcome(draws, num_retries=1)
        assert adapters_by_question[row["question"]] == adapters, row["id"]
        if fatal is None:
            assert "error" not in row and row["prediction"] == row["answers"][0]
        else:
            failed += 1
            assert row["prediction"] is None and row["error"].startswith(FAULT_MESSAGES[fatal]), row
    retried = sum(kind in RETRYABLE for draws in draws_by_question.values() for kind in draws)
    assert retried > 50 and 5 <= failed == result.summary["n_failed"] < 60


def first_seed(pattern: list[str | None], faults: Faults) -> int:
    """A seed whose first fault draws follow `pattern`."""
    for seed in range(10_000):
        rng = random.Random(seed)
        if [faults.draw(rng) for _ in pattern] == pattern:
            return seed
    raise AssertionError("no seed found")


@pytest.mark.parametrize("hint, pattern, least_wait, most_wait", [
    (0.15, ["rate_limit", "server_error", None], 0.3, 1.0),  # the server's Retry-After hint, twice (not 1 s + 2 s)
    (None, ["timeout", None], 1.0, None),  # no hint: DSPy waits 2 ** attempt seconds (1 s, 2 s, 4 s ...)
])
def test_retries_wait_for_the_hint_else_back_off_exponentially(hint, pattern, least_wait, most_wait):
    shape = Faults(timeout=0.2, rate_limit=0.2, server_error=0.2, retry_after=hint)
    faults = Faults(timeout=0.2, rate_limit=0.2, server_error=0.2, retry_after=hint, seed=first_seed(pattern, shape))
    lm = scripted_lm(add_one, faults=faults, num_retries=3)
    started = time.perf_counter()
    with dspy.context(lm=lm):
        prediction = build_program("no-retrieval")(question="What is 41 plus one?")
    waited = time.perf_counter() - started
    assert prediction.answer == "42" and lm.engine.count == len(pattern)
    assert waited >= least_wait and (most_wait is None or waited < most_wait)


def test_the_cli_retries_http_faults_and_keeps_every_question(tmp_path):
    questions, corpus = sample_paths()
    faults = Faults(timeout=0.05, rate_limit=0.1, server_error=0.1, seed=3, retry_after=0.01)
    env = {**os.environ, "ARAG_HOME": str(tmp_path / "home")}
    with OpenAICompatibleServer(add_one, faults=faults) as server:
        done = cli("eval", "--program", "single-rag", "--dataset", str(questions), "--corpus", str(corpus),
                   "--lm", "openai/faulty", "--api-base", server.url, "--out", str(tmp_path / "run"), env=env)
        statuses = set(server.engine.faulted)
    assert done.returncode == 0, done.stderr
    rows = read_rows(tmp_path / "run" / "predictions.jsonl")
    assert len(rows) == 24 == len({row.id for row in rows}) and not any(row.failed for row in rows)
    assert statuses == set(RETRYABLE) and server.engine.count == 24 + len(server.engine.faulted)


# ----------------------------------------------------------------------------------------------------
# Resumption


@pytest.mark.slow
def test_an_adaptive_note_eval_killed_twice_resumes_to_the_uninterrupted_rows(tmp_path):
    questions, corpus = sample_paths()

    def command(out: Path) -> list[str]:
        return [sys.executable, "-m", "arag.cli", "eval", "--program", "adaptive-note", "--dataset", str(questions),
                "--corpus", str(corpus), "--lm", "openai/notes", "--api-base", server.url, "--threads", "3",
                "--limit", "12", "--out", str(out)]

    def notes(call):
        if "query" in call.output_fields:
            return {"query": f"query {len(call.inputs['asked_queries'])} for {call.inputs['question'][:20]}"}
        if "better" in call.output_fields:
            return {"better": len(call.inputs["new_note"]) > len(call.inputs["best_note"])}
        written = f"{call.inputs['question'][:15]} {len(call.inputs.get('note', ''))}"
        return {field: written for field in call.output_fields}

    def env(cache: str) -> dict:
        return {**os.environ, "ARAG_HOME": str(tmp_path / "home"), "DSPY_CACHEDIR": str(tmp_path / cache)}

    killed = tmp_path / "killed"
    with OpenAICompatibleServer(notes, latency=0.03) as server:
        subprocess.run(command(tmp_path / "whole"), check=True, capture_output=True, env=env("cache-whole"),
                       timeout=300)
        for rows_before_kill in (2, 7):
            proc = subprocess.Popen(command(killed), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    env=env("cache-killed"))
            predictions = killed / "predictions.jsonl"
            deadline = time.time() + 120
            while time.time() < deadline and (
                    not predictions.exists() or predictions.read_text().count("\n") < rows_before_kill):
                time.sleep(0.01)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            assert predictions.read_text().count("\n") < 12, "the run finished before it could be killed"
        subprocess.run(command(killed), check=True, capture_output=True, env=env("cache-killed"), timeout=300)

    def answers(out: Path) -> dict:
        rows = [row.to_json() for row in read_rows(out / "predictions.jsonl")]
        assert len({row["id"] for row in rows}) == len(rows) == 12, "an example was lost or answered twice"
        return {row["id"]: (row["prediction"], row["metrics"], row["lm_calls"], row["trace"]) for row in rows}

    assert answers(killed) == answers(tmp_path / "whole")
    assert ujson.loads((killed / "summary.json").read_text())["complete"] is True
    assert not list(killed.glob("*.tmp"))


def evidence_reader(call):
    """Right when both supporting passages are among at most three given, else "unknown": em peaks at a middle k."""
    example = SAMPLE_BY_QUESTION[call.inputs["question"]]
    titles = {passage.split("] ", 1)[1].split(" | ")[0] for passage in json.loads(call.inputs["passages"])}
    right = set(example.supporting_titles) <= titles and len(titles) <= 3
    answer = example.answers[0] if right else "unknown"
    return {field: answer if field == "answer" else "." for field in call.output_fields}


def trials_by_state(out: Path) -> dict[str, list[dict]]:
    with open(out / "trials.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return {state: [row for row in rows if row["state"] == state] for state in {row["state"] for row in rows}}


@pytest.mark.slow
def test_a_tuning_run_killed_mid_trial_resumes_to_the_uninterrupted_result(tmp_path):
    questions, corpus = sample_paths()
    # The same `arag tune` command, with Optuna's heartbeat shortened from 10 s / 30 s grace so that the trial
    # the kill left "running" is declared failed after 2 s instead of 30 (the rerun waits for that).
    entry = ("import importlib, sys; tuning = importlib.import_module('arag.optimizers.tuning.run'); "
             "tuning.HEARTBEAT_S, tuning.GRACE_PERIOD_S = 1, 2; "
             "from arag.cli import main; sys.argv[0] = 'arag'; main()")

    def command(out: Path) -> list[str]:
        return [sys.executable, "-c", entry, "tune", "--program", "single-rag", "--devset", str(questions),
                "--limit", "8", "--corpus", str(corpus), "--lm", "openai/tuned", "--api-base", server.url,
                "--objective", "em", "--param", "reasoning=direct", "--range", "k=1:3", "--pruner", "none",
                "--trials", "6", "--seed", "0", "--no-plots", "--out", str(out)]

    def env(cache: str) -> dict:
        return {**os.environ, "ARAG_HOME": str(tmp_path / "home"), "DSPY_CACHEDIR": str(tmp_path / cache)}

    killed = tmp_path / "killed"
    with OpenAICompatibleServer(evidence_reader, latency=0.05) as server:
        subprocess.run(command(tmp_path / "whole"), check=True, capture_output=True, env=env("cache-whole"),
                       timeout=300)
        proc = subprocess.Popen(command(killed), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=env("cache-killed"))
        third_trial = killed / "trials" / "single-rag-em" / "0002" / "predictions.jsonl"
        deadline = time.time() + 120
        while time.time() < deadline and not (third_trial.exists() and third_trial.read_text().count("\n") >= 2):
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert not (killed / "best_params.json").exists(), "the run finished before it could be killed"
        time.sleep(2.5)
        subprocess.run(command(killed), check=True, capture_output=True, env=env("cache-killed"), timeout=300)

    whole, resumed = trials_by_state(tmp_path / "whole"), trials_by_state(killed)
    assert len(whole["complete"]) == len(resumed["complete"]) == 6 and len(resumed.get("fail", [])) == 1
    # The same trials, in the same order, with the same values: resuming is reproducible.
    assert ([(row["k"], row["em"]) for row in resumed["complete"]]
            == [(row["k"], row["em"]) for row in whole["complete"]])
    best = [ujson.loads((out / "best_params.json").read_text()) for out in (tmp_path / "whole", killed)]
    assert best[0]["params"] == best[1]["params"] and best[0]["values"] == best[1]["values"]


# ----------------------------------------------------------------------------------------------------
# Bad input: each a one-line message, a non-zero exit, no traceback, no half-written file


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
    with OpenAICompatibleServer(add_one) as server, Proxy(server.url) as no_logprobs:
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


# ----------------------------------------------------------------------------------------------------
# The retriever server under load


def test_arag_serve_binds_loopback_caps_its_input_and_answers_a_concurrent_load_correctly(tmp_path):
    from arag.data import load_corpus
    from arag.retrievers import BM25Retriever
    from arag.retrievers.colbert_http import MAX_QUERY_CHARS

    _, corpus = sample_paths()
    index = BM25Retriever.build(load_corpus(corpus), tmp_path / "bm25")
    server = subprocess.Popen([sys.executable, "-m", "arag.cli", "-v", "serve", "--index", f"bm25:{index.index_dir}",
                               "--port", "0"], stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        while " at http" not in line:
            line = server.stderr.readline()
            assert line, "the server exited before serving"
        url = re.search(r"at (http://\S+)", line).group(1)
        assert url.startswith("http://127.0.0.1:")
        # Read the rest of its log (a line per request with -v): a full pipe would block the server's logging.
        threading.Thread(target=server.stderr.read, daemon=True).start()
        questions = [example.question for example in load_examples(sample_paths()[0])]

        def ask(number: int) -> tuple[int, dict, object]:
            query, k = questions[number % len(questions)], (1, 5, 10, 100, 500)[number % 5]
            if number % 17 == 0:
                query = "why " * (MAX_QUERY_CHARS // 4 + 1)
            if number % 2:
                request = urllib.request.Request(url, json.dumps({"query": query, "k": k}).encode(),
                                                 {"Content-Type": "application/json"})
            else:
                request = f"{url}?{urllib.parse.urlencode({'query': query, 'k': k})}"
            try:
                with urllib.request.urlopen(request, timeout=120) as answer:
                    return answer.status, json.loads(answer.read()), (query, min(k, 100))
            except urllib.error.HTTPError as refused:
                return refused.code, json.loads(refused.read()), (query, k)

        # Four clients at a time: within the server's listen backlog (socketserver's default of 5 pending
        # connections; more concurrent clients overflow it, see the hardening notes in benchmarks/README.md).
        with ThreadPoolExecutor(max_workers=4) as pool:
            answers = list(pool.map(ask, range(640)))
        assert server.poll() is None, "the server died under load"
        for status, body, (query, k) in answers:
            if len(query) > MAX_QUERY_CHARS:
                assert status == 400 and str(MAX_QUERY_CHARS) in body["message"]
            else:
                assert status == 200, body
                assert [hit["id"] for hit in body["topk"]] == [p.id for p in index.retrieve(query, k)]
        assert sum(status == 200 for status, _, _ in answers) == 640 - len(range(0, 640, 17))
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=120)


# ----------------------------------------------------------------------------------------------------
# Secrets


def files_holding(folder: Path, secret: str) -> list[str]:
    needle = secret.encode()
    return [str(path) for path in folder.rglob("*") if path.is_file() and needle in path.read_bytes()]


def test_the_api_key_appears_in_no_file_and_no_output(tmp_path):
    questions, corpus = sample_paths()
    env = {**os.environ, "OPENAI_API_KEY": SECRET_KEY, "ARAG_HOME": str(tmp_path / "home"),
           "DSPY_CACHEDIR": str(tmp_path / "dspy-cache")}
    with OpenAICompatibleServer(evidence_reader) as server, Proxy(server.url, drop_logprobs=False) as proxy:
        lm = ["--corpus", str(corpus), "--lm", "openai/keyed", "--api-base", proxy.url]
        runs = {
            "eval": ["eval", "--program", "single-rag", "--dataset", str(questions), *lm, "--logprobs",
                     "--threads", "2", "--out", str(tmp_path / "eval")],
            "compile": ["compile", "--program", "single-rag", "--trainset", str(questions), "--limit", "6", *lm,
                        "--out", str(tmp_path / "compiled.json")],
            "tune": ["tune", "--program", "single-rag", "--devset", str(questions), "--limit", "6", *lm,
                     "--objective", "em", "--range", "k=1:4", "--trials", "2", "--out", str(tmp_path / "tune")],
            "failing": ["eval", "--program", "single-rag", "--dataset", str(questions), *lm,
                        "--retriever", "http://127.0.0.1:9/api/search", "--out", str(tmp_path / "failing")],
        }
        with ThreadPoolExecutor(max_workers=4) as pool:
            done = dict(zip(runs, pool.map(lambda argv: cli("-v", *argv, env=env), runs.values())))
    assert [done[name].returncode for name in runs] == [0, 0, 0, 2], {n: d.stderr[-500:] for n, d in done.items()}
    assert proxy.authorizations and set(proxy.authorizations) == {f"Bearer {SECRET_KEY}"}
    assert all(SECRET_KEY not in d.stdout + d.stderr for d in done.values())
    written = [tmp_path / "eval" / "predictions.jsonl", tmp_path / "compiled.json",
               tmp_path / "tune" / "best_params.json"]
    assert all(path.is_file() for path in written) and any((tmp_path / "dspy-cache").rglob("*"))
    assert files_holding(tmp_path, SECRET_KEY) == []


# ----------------------------------------------------------------------------------------------------
# One run folder, two processes


def test_a_second_eval_on_a_busy_folder_exits_naming_the_holder_and_the_first_counts_every_call(tmp_path):
    questions, corpus = sample_paths()
    out = tmp_path / "run"
    env = {**os.environ, "ARAG_HOME": str(tmp_path / "home")}
    with OpenAICompatibleServer(add_one, latency=0.4) as server:
        argv = ["eval", "--program", "single-rag", "--dataset", str(questions), "--corpus", str(corpus),
                "--lm", f"openai/busy-{os.getpid()}-{time.time_ns()}", "--api-base", server.url, "--out", str(out)]
        first = subprocess.Popen([sys.executable, "-m", "arag.cli", *argv], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env)
        predictions = out / "predictions.jsonl"
        deadline = time.time() + 120
        while time.time() < deadline and not (predictions.exists() and predictions.read_text().count("\n") >= 1):
            time.sleep(0.05)
        second = cli(*argv, env=env)
        first_output = first.communicate(timeout=300)
        calls = server.engine.count
    assert first.returncode == 0, first_output
    assert second.returncode == 2 and len(second.stderr.splitlines()) == 1, second.stderr
    assert second.stderr.startswith(f"error: {out} is in use by another arag run (pid {first.pid} on ")
    rows, n = read_rows(predictions), len(load_examples(questions))
    assert len(rows) == len({row.id for row in rows}) == n
    summary = ujson.loads((out / "summary.json").read_text())
    assert summary["n"] == n and summary["totals"]["lm_calls"] == calls == n
