"""The `arag` command line, end to end over a loopback OpenAI-compatible server: among others, runs killed and
resumed, and a run folder that a second process wants."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import ujson
from click.testing import CliRunner

from arag.cli import main
from arag.data import load_examples, sample_paths
from arag.runs import read_rows
from arag.testing import OpenAICompatibleServer, Scripted

ANSWER_PROBS = [0.9, 0.5, 0.8]


def chief_of_protocol(call):
    return {f: Scripted("Chief of Protocol", ANSWER_PROBS) if f == "answer" else "From the passages."
            for f in call.output_fields}


@pytest.fixture(autouse=True)
def private_index_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ARAG_HOME", str(tmp_path / "arag-home"))


def run_cli(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_eval_single_rag_over_http_on_hotpotqa(shared_dataset, tmp_path):
    hotpot = shared_dataset("hotpotqa")
    out = tmp_path / "run"
    with OpenAICompatibleServer(chief_of_protocol) as server:
        result = run_cli(
            "eval", "--program", "single-rag", "--dataset", str(hotpot / "public.jsonl"),
            "--corpus", str(hotpot / "corpus.jsonl"), "--lm", "openai/loopback-model", "--api-base", server.url,
            "--logprobs", "--param", "k=4", "--limit", "12", "--threads", "3", "--out", str(out),
        )
        assert result.exit_code == 0, result.output
        requests = [r for r in server.requests if r["path"].endswith("/chat/completions")]
    assert len(requests) == 12
    assert all(r["body"]["logprobs"] is True and r["body"]["top_logprobs"] == 5 for r in requests)
    rows = [ujson.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and not any("error" in r for r in rows)
    first = next(r for r in rows if r["id"] == "5a8c7595554299585d9e36b6")
    assert first["metrics"]["em"] == 1.0 and first["retrieval_calls"] == 1 and first["distinct_passages"] == 4
    answer_step = first["trace"][-1]
    assert answer_step["min_token_prob"] == pytest.approx(min(ANSWER_PROBS))
    assert answer_step["mean_token_prob"] == pytest.approx(sum(ANSWER_PROBS) / 3, abs=1e-4)
    summary = ujson.loads((out / "summary.json").read_text())
    assert summary["n"] == 12 and summary["params"] == {"k": 4, "reasoning": "cot"}
    assert summary["totals"]["lm_calls"] == 12 and summary["per_question"]["distinct_passages"] == 4


def answers_every_new_signature(call):
    """Labels questions multi-step, writes a one-sentence chain, proposes two candidates, supports both."""
    fields = {}
    for name in call.output_fields:
        if name == "complexity":
            fields[name] = "C"
        elif name == "continuation":
            fields[name] = "" if call.inputs.get("answer_so_far") else "So the answer is Chief of Protocol."
        elif name.startswith("candidate_"):
            fields[name] = ["Chief of Protocol", "Ambassador"][int(name[-1]) - 1]
        elif name == "supports_candidate":
            fields[name] = True
        elif name == "more_informative":
            fields[name] = "1"
        else:
            fields[name] = chief_of_protocol(call).get(name, "From the passages.")
    return fields


@pytest.mark.parametrize("program, lm_calls", [("ircot", 2), ("iter-retgen", 2), ("sure", 7), ("adaptive-rag", 3)])
def test_eval_the_newer_methods_over_http_on_hotpotqa(shared_dataset, tmp_path, program, lm_calls):
    hotpot = shared_dataset("hotpotqa")
    out = tmp_path / "run"
    with OpenAICompatibleServer(answers_every_new_signature) as server:
        result = run_cli("eval", "--program", program, "--dataset", str(hotpot / "public.jsonl"),
                         "--corpus", str(hotpot / "corpus.jsonl"), "--lm", f"openai/loopback-{uuid.uuid4().hex}",
                         "--api-base", server.url, "--limit", "3", "--out", str(out))  # a model of its own: no cache
        assert result.exit_code == 0, result.output
        requests = [r for r in server.requests if r["path"].endswith("/chat/completions")]
    rows = [ujson.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and not any("error" in r for r in rows)
    assert [r["lm_calls"] for r in rows] == [lm_calls] * 3
    assert 3 <= len(requests) <= 3 * lm_calls  # a repeated prompt inside a question is DSPy's cache's to answer
    assert all(r["prediction"] == "Chief of Protocol" for r in rows)


def test_programs_lists_parameters():
    result = run_cli("programs")
    assert result.exit_code == 0
    assert "single-rag" in result.output and "k=5 [1, 100]" in result.output


def test_programs_states_each_departure_with_its_source():
    from arag.programs import PROGRAMS

    output = run_cli("programs").output
    departures = [(name, d) for name, cls in PROGRAMS.items() for d in cls.departures]
    assert {name for name, _ in departures} >= {"self-rag", "flare"}
    for _, departure in departures:
        assert f"    departs: {departure}" in output
    assert "official run_short_form.py" in output and "src/retriever.py" in output


def test_index_build(tmp_path):
    _, corpus = sample_paths()
    result = run_cli("index", "build", "--corpus", str(corpus), "--out", str(tmp_path / "idx"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "idx" / "arag-index.json").is_file()


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"--program": "flair"}, "unknown program 'flair'"),
        ({"--param": "kk=3"}, "unknown parameter(s) kk"),
        ({"--param": "k=0"}, "parameter 'k' must be in [1, 100]"),
        ({"--lm": None}, "no LM configured"),
        ({"--dataset": "missing.jsonl"}, "missing.jsonl"),
        ({"--dataset": "{bad}"}, "bad.jsonl, line 2: invalid JSON"),
        ({"--corpus": "missing-corpus.jsonl"}, "missing-corpus.jsonl"),
        ({"--params-file": "missing.json"}, "--params-file missing.json: no such file"),
        ({"--lm-arg": "noequals"}, "--lm-arg expects key=value, got 'noequals'"),
        ({"--lm-arg": "temperature=abc"}, "--lm-arg temperature must be a number of at least 0, got 'abc'"),
        ({"--lm-arg": "max_tokens=-5"}, "--lm-arg max_tokens must be an integer of at least 1, got -5"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(tmp_path, overrides, message):
    questions, corpus = sample_paths()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "question": "q", "answers": ["a"]}\n{"id": "2", "question": \n')
    options = {"--program": "single-rag", "--dataset": str(questions), "--corpus": str(corpus),
               "--lm": "openai/x", "--api-base": "http://127.0.0.1:9/v1", "--out": str(tmp_path / "out")}
    options.update({key: value and value.format(bad=bad) for key, value in overrides.items()})
    argv = [part for key, value in options.items() if value is not None for part in (key, value)]
    env = {k: v for k, v in os.environ.items() if k not in {"ARAG_LM", "ARAG_API_BASE"}}
    proc = subprocess.run([sys.executable, "-m", "arag.cli", "eval", *argv], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "predictions.jsonl").exists()


def test_a_killed_eval_resumes_to_the_same_rows(tmp_path):
    questions, corpus = sample_paths()

    def command(out):
        return [sys.executable, "-m", "arag.cli", "eval", "--program", "single-rag", "--dataset", str(questions),
                "--corpus", str(corpus), "--lm", "openai/loopback-model", "--api-base", server.url,
                "--threads", "2", "--out", str(out)]

    def answer_by_question(call):
        return {f: call.inputs["question"][:12] if f == "answer" else "." for f in call.output_fields}

    env = {**os.environ, "ARAG_HOME": str(tmp_path / "home")}
    with OpenAICompatibleServer(answer_by_question, latency=0.05) as server:
        subprocess.run(command(tmp_path / "whole"), check=True, capture_output=True, env=env, timeout=300)
        killed = tmp_path / "killed"
        proc = subprocess.Popen(command(killed), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        predictions = killed / "predictions.jsonl"
        deadline = time.time() + 120
        while time.time() < deadline and (not predictions.exists() or predictions.read_text().count("\n") < 4):
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        done_before = predictions.read_text().count("\n")
        assert 4 <= done_before < 24
        subprocess.run(command(killed), check=True, capture_output=True, env=env, timeout=300)

    def rows(out):
        lines = (out / "predictions.jsonl").read_text().splitlines()
        parsed = [ujson.loads(line) for line in lines]
        assert len({r["id"] for r in parsed}) == len(parsed), "an example was answered twice"
        return {r["id"]: (r["prediction"], r["metrics"]) for r in parsed}

    assert rows(killed) == rows(tmp_path / "whole")
    assert len(rows(killed)) == 24
    assert ujson.loads((killed / "summary.json").read_text())["complete"] is True


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


def test_a_second_eval_on_a_busy_folder_exits_naming_the_holder_and_the_first_counts_every_call(tmp_path):
    questions, corpus = sample_paths()
    out = tmp_path / "run"
    env = {**os.environ, "ARAG_HOME": str(tmp_path / "home")}
    with OpenAICompatibleServer(chief_of_protocol, latency=0.4) as server:
        argv = ["eval", "--program", "single-rag", "--dataset", str(questions), "--corpus", str(corpus),
                "--lm", f"openai/busy-{os.getpid()}-{time.time_ns()}", "--api-base", server.url, "--out", str(out)]
        first = subprocess.Popen([sys.executable, "-m", "arag.cli", *argv], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env)
        predictions = out / "predictions.jsonl"
        deadline = time.time() + 120
        while time.time() < deadline and not (predictions.exists() and predictions.read_text().count("\n") >= 1):
            time.sleep(0.05)
        second = arag(*argv, env=env)
        first_output = first.communicate(timeout=300)
        calls = server.engine.count
    assert first.returncode == 0, first_output
    assert second.returncode == 2 and len(second.stderr.splitlines()) == 1, second.stderr
    assert second.stderr.startswith(f"error: {out} is in use by another arag run (pid {first.pid} on ")
    rows, n = read_rows(predictions), len(load_examples(questions))
    assert len(rows) == len({row.id for row in rows}) == n
    summary = ujson.loads((out / "summary.json").read_text())
    assert summary["n"] == n and summary["totals"]["lm_calls"] == calls == n



def test_serve_answers_dspy_colbertv2_with_the_index_passages(tmp_path):
    import socket

    import dspy

    from arag.retrievers import open_index

    _, corpus = sample_paths()
    assert run_cli("index", "build", "--corpus", str(corpus), "--out", str(tmp_path / "idx")).exit_code == 0
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "arag.cli", "serve", "--index", str(tmp_path / "idx"),
                               "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        query = "Which river flows through the capital of France?"
        served = dspy.ColBERTv2(url=f"http://127.0.0.1:{port}/api/search")(query, k=4)
        direct = open_index(tmp_path / "idx").retrieve(query, 4)
        assert [hit["long_text"] for hit in served] == [p.long_text for p in direct]
    finally:
        server.terminate()
        server.wait(timeout=120)


def arag(*args, env=None):
    return subprocess.run([sys.executable, "-m", "arag.cli", *args], capture_output=True, text=True, timeout=300,
                          env=env or os.environ.copy())


@pytest.mark.parametrize("command, out, message", [
    ("compile", "folder", "cannot write {out}: it is a folder; give the path of a file"),
    ("tune", "file", "cannot use {out} as an output folder: it is a file"),
    ("eval", "file", "cannot use {out} as an output folder: it is a file"),
    ("export-grounding", "folder", "cannot write {out}: it is a folder; give the path of a file"),
    ("index", "file", "cannot use {out} as an output folder: it is a file"),
    ("compile", "under-a-file", "cannot write {out}: {file} is a file, not a folder"),
])
def test_a_command_checks_its_output_path_before_any_work(tmp_path, command, out, message):
    questions, corpus = sample_paths()
    folder, a_file = tmp_path / "runs", tmp_path / "a-file"
    folder.mkdir()
    a_file.write_text("mine")
    target = {"folder": folder, "file": a_file, "under-a-file": a_file / "compiled.json"}[out]
    lm = ["--corpus", str(corpus), "--lm", f"openai/m-{uuid.uuid4().hex}", "--limit", "4"]
    with OpenAICompatibleServer(chief_of_protocol) as server:
        argv = {
            "compile": ["compile", "--program", "single-rag", "--trainset", str(questions), *lm],
            "tune": ["tune", "--program", "single-rag", "--devset", str(questions), "--trials", "1", *lm],
            "eval": ["eval", "--program", "single-rag", "--dataset", str(questions), *lm],
            "export-grounding": ["export-grounding", str(tmp_path)],
            "index": ["index", "build", "--corpus", str(corpus)],
        }[command]
        done = arag(*argv, *(["--api-base", server.url] if "--lm" in argv else []), "--out", str(target))
        assert server.requests == []
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"error: {message.format(out=target, file=a_file)}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "runs"] and a_file.read_text() == "mine"
    assert list(folder.iterdir()) == []


def test_a_broken_run_json_is_one_error_line_and_the_folder_is_kept(tmp_path):
    questions, corpus = sample_paths()
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text("[]")
    (out / "predictions.jsonl").write_text('{"id": "q", "metrics": {}}\n')
    with OpenAICompatibleServer(chief_of_protocol) as server:
        done = arag("eval", "--program", "single-rag", "--dataset", str(questions), "--corpus", str(corpus),
                    "--lm", "openai/m", "--api-base", server.url, "--out", str(out))
        assert server.requests == []
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"error: {out / 'run.json'}: not a run description (a JSON object); "
                                        "use another --out"]
    assert (out / "run.json").read_text() == "[]" and sorted(p.name for p in out.iterdir()) == [
        "predictions.jsonl", "run.json"]
