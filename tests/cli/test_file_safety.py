"""Files given to arag are data: a parameters, compiled or router file may not choose where arag connects or which
key it sends; a command never writes over its own input; a compiled file has limits and holds no LM. And the API key
is in no file a run writes and nothing it prints."""

import json
import os
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import ujson
from sample_readers import evidence_reader
from test_cli_bad_input import Proxy

from arag.cli_options import given_params
from arag.data import load_corpus, sample_paths
from arag.errors import ConfigError, DataError
from arag.optimizers import saving
from arag.optimizers.saving import load_program, read_compiled, save_program
from arag.programs import build_program
from arag.programs.adaptive_rag.router import ROUTER_FORMAT, open_classifier
from arag.retrievers import BM25Retriever
from arag.testing import OpenAICompatibleServer, StandInModel

QUESTIONS, CORPUS = sample_paths()


class RecordingServer:
    """A loopback server that answers every request with an empty JSON object and records it."""

    def __init__(self):
        self.requests = []
        recorded = self.requests

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self):
                recorded.append({"method": self.command, "path": self.path, "headers": dict(self.headers)})
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            do_GET = do_POST = answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.httpd.shutdown()
        self.httpd.server_close()


def cli(*args, env=None, timeout=180):
    return subprocess.run([sys.executable, "-m", "arag.cli", *map(str, args)], capture_output=True, text=True,
                          env=env or os.environ.copy(), timeout=timeout)


def error_lines(done):
    return [line for line in done.stderr.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    return BM25Retriever.build(load_corpus(CORPUS), tmp_path_factory.mktemp("idx") / "bm25")


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------------------------------
# A file may not choose where arag connects, nor which key it sends


def command_argv(command, params_file, lm_url, tmp_path):
    common = ["--corpus", CORPUS, "--lm", f"openai/m-{uuid.uuid4().hex}", "--api-base", lm_url,
              "--params-file", params_file, "--limit", "2"]
    if command == "eval":
        return ["eval", "--program", "crag", "--dataset", QUESTIONS, *common, "--out", tmp_path / "run"]
    if command == "compile":
        return ["compile", "--program", "crag", "--trainset", QUESTIONS, *common, "--out", tmp_path / "c.json"]
    return ["tune", "--program", "crag", "--devset", QUESTIONS, *common, "--trials", "1", "--no-plots",
            "--out", tmp_path / "tune"]


@pytest.mark.parametrize("command, web", [
    ("eval", "serper:{url}"), ("eval", "searxng:{url}"), ("eval", "local:{url}/api/search"), ("eval", "brave"),
    ("compile", "serper:{url}"), ("tune", "serper:{url}"),
])
def test_a_parameters_file_cannot_send_the_search_key_anywhere(tmp_path, command, web):
    """The shared best_params.json of the audit: with SERPER_API_KEY set, no request may reach the file's address
    (nor the LM); the command stops at once with one line naming the key."""
    with RecordingServer() as chosen, OpenAICompatibleServer(StandInModel()) as lm:
        spec = web.format(url=chosen.url)
        params_file = tmp_path / "best_params.json"
        params_file.write_text(json.dumps({"program": "crag", "params": {"web": spec, "upper": 1.0, "lower": 1.0}}))
        env = {**os.environ, "SERPER_API_KEY": "serper-SECRET", "BRAVE_API_KEY": "brave-SECRET",
               "ARAG_HOME": str(tmp_path / "home")}
        done = cli(*command_argv(command, params_file, lm.url, tmp_path), env=env)
        assert (chosen.requests, lm.requests) == ([], [])
    assert done.returncode == 2, done.stderr
    assert len(error_lines(done)) == 1 and "Traceback" not in done.stderr
    assert f"--params-file {params_file}: params['web'] names " in error_lines(done)[0]
    assert f"({spec})" in error_lines(done)[0]
    assert not (tmp_path / "run").exists() and not (tmp_path / "c.json").exists()


def test_a_backend_the_caller_names_is_the_callers_own_choice(tmp_path):
    params_file = tmp_path / "best_params.json"
    params_file.write_text(json.dumps({"params": {"web": "tavily", "upper": 0.7}}))
    with pytest.raises(DataError, match=r"params\['web'\] names a search backend that is sent TAVILY_API_KEY"):
        given_params(str(params_file), ())
    assert given_params(str(params_file), ("web=tavily",)) == {"web": "tavily", "upper": 0.7}
    assert given_params(str(params_file), ("web=none",)) == {"web": "none", "upper": 0.7}
    params_file.write_text(json.dumps({"params": {"web": "searxng", "upper": 0.7}}))  # SEARXNG_URL: the environment's
    assert given_params(str(params_file), ()) == {"web": "searxng", "upper": 0.7}


def test_a_compiled_file_may_not_choose_a_key_bearing_backend(retriever, tmp_path, monkeypatch):
    monkeypatch.setenv("SERPER_API_KEY", "serper-SECRET")
    path = save_program(build_program("crag", retriever, web="serper"), tmp_path / "crag.json")
    with pytest.raises(DataError, match=r"params\['web'\] names a search backend that is sent SERPER_API_KEY"):
        load_program(path, retriever)
    assert load_program(path, retriever, params={"web": "serper"}).config["web"] == "serper"


def test_a_router_file_may_not_name_an_address(tmp_path):
    path = tmp_path / "router.json"
    path.write_text(json.dumps({"format": ROUTER_FORMAT, "encoder": "http://127.0.0.1:9/encode", "labels": ["A", "B"],
                                "coef": [[0.5, 0.5]], "intercept": [0.0], "trained_on": {}}))
    with pytest.raises(DataError, match=r"router\['encoder'\] names an address \(http://127.0.0.1:9/encode\)"):
        open_classifier(str(path))


# ----------------------------------------------------------------------------------------------------
# A command never writes over its own input


def a_run(folder: Path) -> Path:
    """A small run folder as `arag eval` writes it."""
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"program": "no-retrieval"}))
    rows = [{"id": f"q{i}", "question": f"Q{i}?", "answers": ["a"], "prediction": "a", "metrics": {"em": 1.0},
             "trace": []} for i in range(2)]
    (folder / "predictions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def an_index(folder: Path) -> Path:
    BM25Retriever.build(load_corpus(CORPUS), folder)
    return folder


def own_input_cases(tmp: Path) -> dict[str, list]:
    """Each case: the argv of a command whose output is (in, or a link to) one of its inputs."""
    dev = tmp / "dev.jsonl"
    alias = tmp / "alias.json"
    alias.symlink_to(dev)
    run = tmp / "runs" / "a"
    index = tmp / "idx"
    corpus_folder = tmp / "corpus"
    lm = ["--lm", "openai/never-called", "--api-base", "http://127.0.0.1:9/v1"]
    return {
        "report into its run": ["report", run, "--out", run / "predictions.jsonl"],
        "compile over its trainset": ["compile", "--program", "single-rag", "--trainset", dev, "--corpus", CORPUS,
                                      *lm, "--out", dev],
        "compile through a link to its trainset": ["compile", "--program", "single-rag", "--trainset", dev,
                                                   "--corpus", CORPUS, *lm, "--out", alias],
        "eval inside its index": ["eval", "--program", "single-rag", "--dataset", dev, "--retriever", f"bm25:{index}",
                                  *lm, "--out", index / "run"],
        "eval over its parameters": ["eval", "--program", "single-rag", "--dataset", dev, "--corpus", CORPUS, *lm,
                                     "--params-file", run / "summary.json", "--out", run],
        "tune over its parameters": ["tune", "--program", "single-rag", "--devset", dev, "--corpus", CORPUS, *lm,
                                     "--trials", "1", "--params-file", tmp / "tuned" / "best_params.json",
                                     "--out", tmp / "tuned"],
        "tune's study over its devset": ["tune", "--program", "single-rag", "--devset", dev, "--corpus", CORPUS, *lm,
                                         "--trials", "1", "--storage", f"sqlite:///{dev}", "--out", tmp / "t2"],
        "index build around its corpus": ["index", "build", "--corpus", corpus_folder / "corpus.jsonl",
                                          "--out", corpus_folder],
        "train-router into a run": ["train-router", run, "--out", run / "router.json"],
        "export-grounding over its rows": ["export-grounding", run / "predictions.jsonl",
                                           "--out", run / "predictions.jsonl"],
    }


@pytest.fixture(scope="module")
def own_input_workspace(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("own-input")
    (tmp / "dev.jsonl").write_bytes(QUESTIONS.read_bytes())
    a_run(tmp / "runs" / "a")
    (tmp / "runs" / "a" / "summary.json").write_text(json.dumps({"params": {"k": 3}}))
    an_index(tmp / "idx")
    (tmp / "corpus").mkdir()
    (tmp / "corpus" / "corpus.jsonl").write_bytes(CORPUS.read_bytes())
    (tmp / "tuned").mkdir()
    (tmp / "tuned" / "best_params.json").write_text(json.dumps({"params": {"k": 4}}))
    return tmp, own_input_cases(tmp)


CASE_NAMES = ["report into its run", "compile over its trainset", "compile through a link to its trainset",
              "eval inside its index", "eval over its parameters", "tune over its parameters",
              "tune's study over its devset", "index build around its corpus", "train-router into a run",
              "export-grounding over its rows"]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_a_command_refuses_to_write_over_its_own_input(own_input_workspace, case):
    tmp, cases = own_input_workspace
    before = files_under(tmp)
    done = cli(*cases[case], env={**os.environ, "ARAG_HOME": str(tmp / "home")})
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert len(error_lines(done)) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "choose another" in error_lines(done)[0]
    after = files_under(tmp)
    assert {name: data for name, data in after.items() if not name.startswith("home/")} == before


def test_the_python_report_refuses_its_own_run_too(tmp_path):
    from arag.report import report

    run = a_run(tmp_path / "a")
    (tmp_path / "link.html").symlink_to(run / "predictions.jsonl")
    before = files_under(tmp_path)
    with pytest.raises(ConfigError, match=r"a/predictions.jsonl is inside the input RUN .*/a: it would be written"):
        report([run], run / "predictions.jsonl")
    with pytest.raises(ConfigError, match=r"link.html is inside the input RUN"):
        report([run], tmp_path / "link.html")
    assert files_under(tmp_path) == before


# ----------------------------------------------------------------------------------------------------
# Compiled files: limits, no LM anywhere, a known version


@pytest.fixture
def saved(retriever, tmp_path):
    """A compiled single-rag file with one demo, and its JSON document to tamper with."""
    program = build_program("single-rag", retriever, k=2)
    program.generate_answer.predict.demos = [{"question": "Q?", "context": "[1] A | a", "reasoning": "r",
                                              "answer": "a", "augmented": True}]
    path = save_program(program, tmp_path / "p.json", meta={"teleprompter": "bootstrap"})
    return path, ujson.loads(path.read_text())


def demos(document):
    return document["state"]["generate_answer.predict"]["demos"]


TAMPERED = [
    ("too many demos", lambda d: demos(d).extend([dict(demos(d)[0])] * saving.MAX_DEMOS),
     r"\['demos'\] holds 101 demos, over the limit of 100 a predictor"),
    ("a demo too large", lambda d: demos(d)[0].update(context="x" * saving.MAX_DEMO_BYTES),
     r"\['demos'\]\[0\] is 262,\d\d\d bytes, over the limit of 262,144 a demo"),
    ("instructions too large", lambda d: d["state"]["generate_answer.predict"]["signature"].update(
        instructions="x" * (saving.MAX_TEXT_BYTES + 1)), r"\['instructions'\] is 65,537 bytes, over the limit"),
    ("an lm inside a demo", lambda d: demos(d)[0].update(lm={"model": "openai/elsewhere"}),
     r"state\['generate_answer.predict'\]\['demos'\]\[0\] holds 'lm'"),
    ("a config in meta", lambda d: d["meta"].update(options={"config": {"api_base": "http://127.0.0.1:9"}}),
     r"meta\['options'\] holds 'config'"),
    ("an lm deep in meta", lambda d: d["meta"].update(a=[{"b": [{"lm": None}]}]),
     r"meta\['a'\]\[0\]\['b'\]\[0\] holds 'lm'"),
    ("an lm among the parameters", lambda d: d["params"].update(lm="openai/elsewhere"), r"params holds 'lm'"),
    ("version 0", lambda d: d.update(version=0), "compiled-program format version 0"),
    ("version -1", lambda d: d.update(version=-1), "compiled-program format version -1"),
    ("version true", lambda d: d.update(version=True), "compiled-program format version True"),
    ("version 2", lambda d: d.update(version=2), "compiled-program format version 2"),
]


@pytest.mark.parametrize("tamper, message", [case[1:] for case in TAMPERED], ids=[case[0] for case in TAMPERED])
def test_a_compiled_file_beyond_its_limits_or_holding_an_lm_is_refused(saved, retriever, tamper, message):
    path, document = saved
    tamper(document)
    path.write_text(ujson.dumps(document))
    with pytest.raises(DataError, match=message):
        load_program(path, retriever)


def test_a_compiled_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "huge.json"
    with open(path, "wb") as handle:
        handle.truncate(saving.MAX_FILE_BYTES + 1)  # sparse: no disk spent
    monkeypatch.setattr(saving.ujson, "loads", lambda *a, **k: pytest.fail("the file was parsed"))
    with pytest.raises(DataError, match=r"huge.json: 33,554,433 bytes, over the limit of 33,554,432"):
        read_compiled(path)


def test_a_program_the_loader_would_refuse_is_never_written(retriever, tmp_path):
    program = build_program("single-rag", retriever, k=2)
    with pytest.raises(DataError, match=r"meta holds 'lm'"):
        save_program(program, tmp_path / "p.json", meta={"lm": "openai/m"})
    program.generate_answer.predict.demos = [{"question": "Q?", "answer": "a" * saving.MAX_DEMO_BYTES}]
    with pytest.raises(DataError, match=r"over the limit of 262,144 a demo"):
        save_program(program, tmp_path / "p.json")
    assert list(tmp_path.iterdir()) == []


def test_arag_eval_refuses_an_oversized_demo_in_one_line_before_any_lm_call(saved, tmp_path):
    path, document = saved
    demos(document)[0]["context"] = "x" * (20 * 2**20)  # the audit's 20 MB demo: 10 M prompt tokens a question
    path.write_text(ujson.dumps(document))
    with OpenAICompatibleServer(StandInModel()) as lm:
        done = cli("eval", "--compiled", path, "--dataset", QUESTIONS, "--corpus", CORPUS, "--lm",
                   f"openai/m-{uuid.uuid4().hex}", "--api-base", lm.url, "--limit", "1", "--out", tmp_path / "run",
                   env={**os.environ, "ARAG_HOME": str(tmp_path / "home")})
        assert lm.requests == []
    assert done.returncode == 2 and len(error_lines(done)) == 1, done.stderr
    assert "['demos'][0] is 20,971,5" in error_lines(done)[0] and "over the limit of 262,144" in error_lines(done)[0]


# ----------------------------------------------------------------------------------------------------
# The API key: sent to the LM server, and nowhere else

SECRET_KEY = "sk-arag-test-SECRET-5f0c2b9e7d41"


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
