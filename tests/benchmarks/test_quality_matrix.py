"""The quality matrix (benchmarks/quality.py): killed in the middle of a cell and run again, it answers no
question twice and ends with the same results as an uninterrupted run."""

from __future__ import annotations

import base64
import fcntl
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dspy
import pytest
from sklearn.linear_model import LogisticRegression

from arag.lm.local import cpu_kind
from arag.optimizers.saving import save_program
from arag.passages import Passage
from arag.programs import build_program
from arag.programs.adaptive_rag.router import write_router_file
from arag.retrievers import BM25Retriever
from arag.testing import OpenAICompatibleServer, Scripted

ROOT = Path(__file__).resolve().parents[2]
TABLE_ROUTER = ROOT / "benchmarks" / "results" / "router" / "qwen2.5-coder-1.5b" / "router.json"


def embedded_data(html: str) -> dict:
    """The data a report page embeds (gzip-compressed JSON in base64), as its script reads it."""
    packed = html.split('<script id="report-data" type="application/octet-stream">')[1].split("</script>")[0]
    return json.loads(gzip.decompress(base64.b64decode(packed)))


def last_word(call):
    """The question's last word as the answer; every other field a sentence."""
    question = call.inputs.get("question", "")
    return {field: Scripted(question.split()[-1].strip("?") if field == "answer" else "From the passages.")
            for field in call.output_fields}


def slow_answer(call):
    time.sleep(0.2)  # a few seconds per cell: time to kill it half-way
    return last_word(call)


def failing_on_kiss_and_tell(call):
    """Answers as slow_answer does, but nothing a parser can read for one question."""
    if "Kiss and Tell" in call.inputs.get("question", ""):
        return "I cannot say."  # no field markers, no JSON
    return slow_answer(call)


def matrix(server, folder: Path, *extra: str, programs: str | None = "no-retrieval,single-rag") -> subprocess.Popen:
    command = [sys.executable, str(ROOT / "benchmarks" / "quality.py"), "--lm", "openai/loopback-matrix",
               "--api-base", server.url, "--n", "6", *(("--programs", programs) if programs else ()),
               "--datasets", "hotpotqa", "--runs", str(folder / "runs"), "--results", str(folder / "results"), *extra]
    env = {**os.environ, "ARAG_HOME": str(folder / "home")}
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def from_results(folder: Path, *options: str, programs: str = "no-retrieval,single-rag", n: str = "6",
                 datasets: str = "hotpotqa") -> str:
    """What the matrix prints from its results alone (--table, --report, --train-router), with no LM."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "quality.py"), *options, "--lm", "openai/x",
                           "--n", n, "--programs", programs, "--datasets", datasets,
                           "--results", str(folder / "results")], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


def finish(process: subprocess.Popen) -> str:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-2000:]
    return out


def results(folder: Path) -> dict:
    """Each cell's rows without what depends on the clock."""
    cells = {}
    for path in sorted((folder / "results").rglob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        cells[path.stem] = sorted(({k: v for k, v in r.items() if k not in ("seconds", "commit")} for r in rows),
                                  key=lambda r: r["id"])
    return cells


def test_a_killed_matrix_resumes_without_repeating_a_question(shared_dataset, tmp_path):
    shared_dataset("hotpotqa")
    with OpenAICompatibleServer(slow_answer) as server:
        finish(matrix(server, tmp_path / "whole"))
        uninterrupted_calls = len(server.requests)

        killed = matrix(server, tmp_path / "killed")
        rows = tmp_path / "killed" / "runs" / "hotpotqa" / "single-rag" / "predictions.jsonl"
        deadline = time.monotonic() + 240
        while not (rows.exists() and len(rows.read_text().splitlines()) >= 2):
            assert killed.poll() is None and time.monotonic() < deadline, "the matrix ended before it could be killed"
            time.sleep(0.05)
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        answered_before = len(rows.read_text().splitlines())
        assert answered_before < 6
        calls_before = len(server.requests)
        table = finish(matrix(server, tmp_path / "killed"))
        resumed_calls = len(server.requests) - calls_before

    ids = [json.loads(line)["id"] for line in rows.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 6
    assert resumed_calls <= 6 - answered_before + 1  # at most the question in flight is asked again
    assert calls_before - uninterrupted_calls + resumed_calls <= uninterrupted_calls + 1
    assert results(tmp_path / "killed") == results(tmp_path / "whole")
    assert "| HotpotQA (dev) | single-rag | 6 | --n | 0 |" in table and "| F1 − single-rag [95 %] |" in table


def test_a_cell_another_process_runs_is_skipped_and_two_processes_share_a_matrix(shared_dataset, tmp_path):
    shared_dataset("hotpotqa")
    held = tmp_path / "shared" / "runs" / "hotpotqa" / "single-rag"
    held.mkdir(parents=True)
    with OpenAICompatibleServer(slow_answer) as server:
        finish(matrix(server, tmp_path / "alone"))
        calls_alone = len(server.requests)
        with open(held / "run.lock", "w") as lock:  # as another process running that cell holds it
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            out = finish(matrix(server, tmp_path / "shared"))
        assert "is in use by another arag run" in next(line for line in out.splitlines() if "skipped" in line)
        assert len(server.requests) - calls_alone == 6  # no-retrieval's questions only
        workers = [matrix(server, tmp_path / "shared") for _ in range(2)]  # single-rag's 6 left to share
        for worker in workers:
            finish(worker)
        calls_shared = len(server.requests) - calls_alone

    assert calls_shared == calls_alone == 12  # whichever took which cell, no question was answered twice
    assert results(tmp_path / "shared") == results(tmp_path / "alone")
    assert "| HotpotQA (dev) | single-rag | 6 | --n | 0 |" in from_results(tmp_path / "shared", "--table")


def test_sync_gives_rows_the_commit_of_the_process_that_answered_them(shared_dataset, tmp_path):
    shared_dataset("hotpotqa")
    with OpenAICompatibleServer(slow_answer) as server:
        finish(matrix(server, tmp_path))
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    cell = tmp_path / "runs" / "hotpotqa" / "single-rag"
    assert (cell / "answered-at").read_text() == head
    (cell / "answered-at").write_text("abc1234\n")  # answered by another checkout's code, synced from this one
    (tmp_path / "results" / "hotpotqa" / "single-rag.jsonl").unlink()
    from_results(tmp_path, "--sync", "--runs", str(tmp_path / "runs"))
    commits = {path.stem: {json.loads(line)["commit"] for line in path.read_text().splitlines()}
               for path in (tmp_path / "results" / "hotpotqa").glob("*.jsonl")}
    assert commits == {"single-rag": {"abc1234"}, "no-retrieval": {head.strip()}}
    # Rows kept before CPU kinds were recorded get this machine's where its run folder holds them, and only there.
    path = tmp_path / "results" / "hotpotqa" / "no-retrieval.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert {row["cpu"] for row in rows} == {cpu_kind()}
    for row in rows:
        del row["cpu"]
    stranger = {**rows[0], "id": "answered-elsewhere"}  # no run folder here holds it
    path.write_text("".join(json.dumps(row) + "\n" for row in [*rows, stranger]))
    from_results(tmp_path, "--sync", "--runs", str(tmp_path / "runs"))
    cpus = {json.loads(line)["id"]: json.loads(line).get("cpu") for line in path.read_text().splitlines()}
    assert cpus == {**{row["id"]: cpu_kind() for row in rows}, "answered-elsewhere": None}
    table = from_results(tmp_path, "--table")
    assert f"CPUs they were answered on (questions): {cpu_kind()} (12)." in table  # the table's 6 questions, 2 cells


def test_the_table_is_printed_from_the_results_alone(shared_dataset, tmp_path):
    shared_dataset("hotpotqa")
    with OpenAICompatibleServer(slow_answer) as server:
        finish(matrix(server, tmp_path))
    table = from_results(tmp_path, "--table")
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[1] for line in lines] == ["program", "no-retrieval", "single-rag"]
    assert lines[0].endswith("| compl. tok/q | retrievals/q | s/q |")
    assert [line.split(" | ")[-2] for line in lines[1:]] == ["0.0", "1.0"]  # retrievals/q, before s/q
    assert "Model: openai-x. Commits the questions were answered at (questions): " in table
    for path in (tmp_path / "results").rglob("*.jsonl"):
        row = json.loads(path.read_text().splitlines()[0])
        assert "question" not in row and "trace" not in row and {"id", "metrics", "lm_calls"} <= row.keys()

    pytest.importorskip("plotly")
    from_results(tmp_path, "--report", str(tmp_path / "report"), programs="no-retrieval,single-rag,ircot")
    data = embedded_data((tmp_path / "report" / "hotpotqa.html").read_text())
    assert [run["program"] for run in data["runs"]] == ["no-retrieval", "single-rag"]  # ircot has no results
    assert [run["n"] for run in data["runs"]] == [6, 6] and data["runs"][1]["retrieval_calls"] == 1.0
    assert len(data["questions"]) == 6 and all(q["question"].endswith("?") and q["answers"] for q in data["questions"])


@pytest.mark.parametrize("bad, message", [
    (["--programs", "nope"], "unknown program or dataset: nope"),
    (["--datasets", "trivia"], "unknown program or dataset: trivia"),
    (["--n", "0"], "'0' is not a number of questions"),
    (["--n", "-3"], "'-3' is not a number of questions"),
    (["--skip", "-1"], "'-1' is not a number of questions (a whole number, 0 or more)"),
    (["--param", "flare"], "expected PROGRAM.NAME=VALUE"),
    (["--programs", "single-rag", "--param", "flare.theta=0.5"], "'flare' is not one of --programs"),
    (["--programs", "flare", "--param", "flare.theta=2"], "flare: parameter 'theta' must be in [0.0, 1.0], got 2.0"),
    (["--programs", "flare", "--param", "flare.thetaa=1"], "flare: unknown parameter(s) thetaa"),
    (["--compiled", "/no/such/file.json"], "/no/such/file.json: no such compiled program file"),
    (["--report", str(ROOT / "pyproject.toml")], "pyproject.toml is a file; give the folder"),
    (["--rerun", "--tuned", "/no/such/best_params.json"], "--rerun answers --programs again: give it without"),
    (["--rerun", "Intel Xeon"], "--rerun 'Intel Xeon': name the machine in lower-case letters and digits"),
    (["--programs", "adaptive-rag", "--param", f"adaptive-rag.classifier={TABLE_ROUTER}", "--second-router",
      "/no/such/router.json"], "--second-router: /no/such/router.json is not a router file (give a file written"),
])
def test_bad_arguments_stop_before_any_work(tmp_path, bad, message):
    """Each is refused before a dataset is read: the shared folder given does not exist."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "quality.py"), "--results", str(tmp_path),
                           "--shared", str(tmp_path / "no-datasets"), *bad], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0 and message in done.stderr
    assert not any(tmp_path.iterdir())


def test_tuned_parameters_that_are_the_defaults_are_refused_before_any_work(tmp_path):
    tuned = tmp_path / "best_params.json"
    tuned.write_text(json.dumps({"program": "crag", "params": {"upper": 0.5, "lower": -0.9, "k": 10}}))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "quality.py"), "--results",
                           str(tmp_path / "results"), "--tuned", str(tuned)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0
    assert "the tuned parameters are crag's defaults, so its row would repeat crag's" in done.stderr
    assert not (tmp_path / "results").exists()


def test_a_failed_question_counts_as_failed_in_the_table_and_the_report(shared_dataset, tmp_path):
    pytest.importorskip("plotly")
    shared_dataset("hotpotqa")
    with OpenAICompatibleServer(failing_on_kiss_and_tell) as server:
        finish(matrix(server, tmp_path))
    kept = (tmp_path / "results" / "hotpotqa" / "single-rag.jsonl").read_text().splitlines()
    assert sum("error_kind" in json.loads(row) for row in kept) == 1 and not any('"error"' in row for row in kept)
    (tmp_path / "report").mkdir()
    table = from_results(tmp_path, "--table", "--report", str(tmp_path / "report"))
    runs = embedded_data((tmp_path / "report" / "hotpotqa.html").read_text())["runs"]
    assert [run["n_failed"] for run in runs] == [1, 1]
    assert "| no-retrieval | 6 | --n | 1 |" in table and "| HotpotQA (dev) | single-rag | 6 | --n | 1 |" in table


def test_tuned_parameters_run_as_a_row_of_their_own(shared_dataset, tmp_path):
    shared_dataset("hotpotqa")
    tuned = tmp_path / "best_params.json"
    tuned.write_text(json.dumps({"program": "single-rag", "params": {"k": 2}, "values": {"f1": 0.5}, "trial": 3}))
    with OpenAICompatibleServer(slow_answer) as server:
        table = finish(matrix(server, tmp_path, "--tuned", str(tuned)))
    rows = [json.loads(line) for line in (tmp_path / "results" / "hotpotqa" / "single-rag-tuned.jsonl").read_text()
            .splitlines()]
    assert len(rows) == 6 and {row["distinct_passages"] for row in rows} == {2}
    assert "| HotpotQA (dev) | single-rag-tuned | 6 | --n | 0 |" in table
    assert "| HotpotQA (dev) | single-rag | 6 | --n | 0 |" in table
    info = json.loads((tmp_path / "runs" / "hotpotqa" / "single-rag-tuned" / "run.json").read_text())
    assert info["program"] == "single-rag" and info["params"]["k"] == 2
    # the results alone, without the parameter file: the table and the report still show the tuned row last
    (tmp_path / "report").mkdir()
    shown = from_results(tmp_path, "--table", "--report", str(tmp_path / "report")).splitlines()
    assert shown[-3].startswith("| HotpotQA (dev) | single-rag-tuned | 6 | --n | 0 |")
    runs = embedded_data((tmp_path / "report" / "hotpotqa.html").read_text())["runs"]
    assert [run["run"] for run in runs][-1] == "single-rag-tuned"
    assert "single-rag-tuned" not in from_results(tmp_path, "--table", programs="no-retrieval")


def other_machine(call):
    """last_word's answers but one: where last_word names the older of two people, this names the other."""
    if "Annie Morton" in call.inputs.get("question", ""):
        return {field: Scripted("Annie Morton" if field == "answer" else "From the passages.")
                for field in call.output_fields}
    return last_word(call)


def test_a_rerun_is_a_row_of_its_own_and_the_baseline_of_rows_answered_on_its_cpu(shared_dataset, tmp_path):
    shared_dataset("hotpotqa")
    with OpenAICompatibleServer(slow_answer) as server:
        finish(matrix(server, tmp_path))
    # single-rag's rows as if another kind of CPU had answered them; no-retrieval's stay this machine's
    first = tmp_path / "results" / "hotpotqa" / "single-rag.jsonl"
    first.write_text("".join(json.dumps({**json.loads(line), "cpu": "Another CPU"}) + "\n"
                             for line in first.read_text().splitlines()))
    with OpenAICompatibleServer(other_machine) as server:
        table = finish(matrix(server, tmp_path, "--rerun", programs="single-rag"))
    kept = {cell: {row["id"]: row for row in rows} for cell, rows in results(tmp_path).items()}
    assert kept["single-rag-rerun"].keys() == kept["single-rag"].keys() and len(kept["single-rag"]) == 6
    changed = [i for i in kept["single-rag"] if kept["single-rag"][i]["prediction"] !=
               kept["single-rag-rerun"][i]["prediction"]]
    assert [kept["single-rag-rerun"][i]["prediction"] for i in changed] == ["Annie Morton"]
    assert "| HotpotQA (dev) | single-rag-rerun | 6 | --n | 0 |" in table
    info = json.loads((tmp_path / "runs" / "hotpotqa" / "single-rag-rerun" / "run.json").read_text())
    assert info["program"] == "single-rag"
    # from the results alone: the rerun row follows its program, its difference from it measured on the same
    # questions (Terry Richardson's F1 of 0.67 lost on one question of six); no-retrieval, which gave single-rag's
    # first answers, is level with single-rag's own rows and ahead of the rerun, the one answered on its CPU
    shown = {line.split(" | ")[1]: line.split(" | ") for line in from_results(tmp_path, "--table").splitlines()
             if line.startswith("| HotpotQA")}
    assert list(shown) == ["no-retrieval", "single-rag", "single-rag-rerun"]
    assert shown["single-rag-rerun"][9].startswith("−0.11 [") and shown["single-rag-rerun"][8] == "—"
    assert shown["no-retrieval"][7].startswith("+0.00 [")
    assert shown["no-retrieval"][8].startswith("+0.11 [") and shown["no-retrieval"][8].endswith("(6)")
    # a third kind of CPU: the first rerun's answers now came from another one too, so no-retrieval pairs with no
    # baseline on its own CPU until single-rag is answered there again, into a row of that machine's name
    rerun = tmp_path / "results" / "hotpotqa" / "single-rag-rerun.jsonl"
    rerun.write_text("".join(json.dumps({**json.loads(line), "cpu": "A third CPU"}) + "\n"
                             for line in rerun.read_text().splitlines()))
    assert from_results(tmp_path, "--table").split("| no-retrieval | ")[1].split(" | ")[7] == "—"
    with OpenAICompatibleServer(last_word) as server:
        finish(matrix(server, tmp_path, "--rerun", "here", programs="single-rag"))
    shown = {line.split(" | ")[1]: line.split(" | ") for line in from_results(tmp_path, "--table").splitlines()
             if line.startswith("| HotpotQA")}
    assert list(shown) == ["no-retrieval", "single-rag", "single-rag-rerun", "single-rag-rerun-here"]
    assert shown["single-rag-rerun-here"][9].startswith("+0.00 [") and shown["single-rag-rerun-here"][8] == "—"
    assert shown["no-retrieval"][8].startswith("+0.00 [") and shown["no-retrieval"][8].endswith("(6)")


def test_the_uncertainty_gate_is_told_the_table_s_date_whatever_day_it_runs(shared_dataset, tmp_path):
    shared_dataset("hotpotqa")
    with OpenAICompatibleServer(last_word) as server:
        finish(matrix(server, tmp_path, programs="uncertainty-gate"))
        asked = [json.dumps(request["body"]) for request in server.requests if "today" in json.dumps(request["body"])]
    info = json.loads((tmp_path / "runs" / "hotpotqa" / "uncertainty-gate" / "run.json").read_text())
    assert info["params"]["today"] == "2026-11-28"
    assert len(asked) == 6 and all("2026-11-28" in body for body in asked)


def test_each_member_of_a_pareto_front_runs_as_a_row_named_by_its_trial(shared_dataset, tmp_path):
    shared_dataset("hotpotqa")
    members = []
    for trial, k in ((12, 1), (4, 2)):
        members += ["--tuned", str(tmp_path / f"trial-{trial}.json")]
        Path(members[-1]).write_text(json.dumps({"program": "single-rag", "params": {"k": k}, "trial": trial,
                                                 "values": {"f1": 0.4, "lm_calls": 1.0}}))
    with OpenAICompatibleServer(slow_answer) as server:
        finish(matrix(server, tmp_path, *members, programs="single-rag"))
    shown = from_results(tmp_path, "--table", programs="single-rag")
    rows = [row.split(" | ") for row in shown.splitlines() if row.startswith("| HotpotQA")]
    assert [row[1] for row in rows] == ["single-rag", "single-rag-tuned-4", "single-rag-tuned-12"]
    assert all(row[9] != "—" for row in rows[1:])  # each member's difference from its own program


def test_cells_sharing_a_cache_count_its_answers_as_the_calls_and_tokens_they_first_cost(shared_dataset, tmp_path):
    shared_dataset("hotpotqa")
    members = []
    for trial in (4, 9):  # the same parameters twice: the second member is answered from the first one's calls
        members += ["--tuned", str(tmp_path / f"trial-{trial}.json")]
        Path(members[-1]).write_text(json.dumps({"program": "single-rag", "params": {"k": 2}, "trial": trial,
                                                 "values": {"f1": 0.4, "lm_calls": 1.0}}))
    with OpenAICompatibleServer(slow_answer) as server:
        finish(matrix(server, tmp_path, *members, "--cache", str(tmp_path / "cache"), programs="single-rag"))
        assert server.engine.count == 12  # single-rag's 6 questions and the first member's; none for the second
    first, second = ([json.loads(line) for line in (tmp_path / "results" / "hotpotqa" / f"single-rag-tuned-{trial}"
                                                   ".jsonl").read_text().splitlines()] for trial in (4, 9))
    assert [row["lm_calls"] for row in second] == [1] * 6
    assert [row["prompt_tokens"] for row in second] == [row["prompt_tokens"] for row in first]
    assert all(row["prompt_tokens"] > 0 for row in first)
    assert [row["prediction"] for row in second] == [row["prediction"] for row in first]


def test_compiled_programs_run_as_rows_named_by_their_teleprompter_and_kept_demos(shared_dataset, tmp_path):
    shared_dataset("hotpotqa")
    demo = dspy.Example(passages=["[1] Oslo | Oslo is the capital of Norway."], question="Capital of Norway?",
                        reasoning="The passage says so.", answer="Oslo").with_inputs("passages", "question")
    retriever = BM25Retriever.build([Passage("oslo", "Oslo", "Oslo is the capital of Norway.")], tmp_path / "bm25")
    files = []
    for teleprompter, kept in (("bootstrap", False), ("bootstrap", True), ("gepa", False)):
        program = build_program("single-rag", retriever)
        program.generate_answer.predict.demos = [demo]
        files += ["--compiled", str(save_program(program, tmp_path / f"compiled-{teleprompter}-{kept}.json",
                                                 meta={"teleprompter": teleprompter, "keep_written_demos": kept}))]
    with OpenAICompatibleServer(slow_answer) as server:
        table = finish(matrix(server, tmp_path, *files, programs="single-rag"))
        assert all("Capital of Norway?" in str(request["body"]["messages"]) for request in server.requests[-6:])
    names = ["single-rag", "single-rag-compiled", "single-rag-compiled-kept", "single-rag-gepa"]
    assert [row.split(" | ")[1] for row in table.splitlines() if row.startswith("| HotpotQA")] == names
    shown = from_results(tmp_path, "--table", programs="single-rag")
    assert [row.split(" | ")[1] for row in shown.splitlines() if row.startswith("| HotpotQA")] == names


def test_a_cache_that_is_a_file_is_refused_before_any_work(tmp_path):
    (tmp_path / "cache").write_text("mine")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "quality.py"), "--cache", str(tmp_path / "cache"),
                           "--results", str(tmp_path / "results")], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0 and f"--cache {tmp_path / 'cache'} is a file" in done.stderr
    assert (tmp_path / "cache").read_text() == "mine" and not (tmp_path / "results").exists()


def test_a_file_that_is_not_tuned_parameters_is_refused_before_any_work(tmp_path):
    bad = tmp_path / "params.json"
    bad.write_text(json.dumps({"k": 2}))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "quality.py"), "--tuned", str(bad),
                           "--results", str(tmp_path / "results")], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0 and f"--tuned {bad}: not a tuning run's parameter file" in done.stderr
    assert not (tmp_path / "results").exists()


def test_the_router_trains_on_the_results_alone(shared_dataset, tmp_path):
    shared_dataset("hotpotqa"), shared_dataset("popqa_longtail")
    with OpenAICompatibleServer(last_word) as server:
        out = finish(matrix(server, tmp_path, "--skip", "20", "--n", "4", "--router-labels", "--datasets",
                            "hotpotqa,popqa", programs=None))
    answered = [json.loads(row)["id"] for row in open(tmp_path / "results" / "hotpotqa" / "no-retrieval.jsonl")]
    in_file = [json.loads(row)["id"] for row in open(shared_dataset("hotpotqa") / "public.jsonl")]
    assert sorted(answered) == sorted(in_file[20:24])  # the 4 questions after the table's 20
    # both simpler strategies missed every question: ircot decides the single-hop ones' labels alone
    assert not (tmp_path / "results" / "hotpotqa" / "ircot.jsonl").exists()
    assert "ircot                   hotpotqa     0 questions: no label waits on it" in out
    assert len((tmp_path / "results" / "popqa" / "ircot.jsonl").read_text().splitlines()) == 4
    shutil.rmtree(tmp_path / "runs")  # another machine: the results alone
    out = from_results(tmp_path, "--skip", "20", "--train-router", str(tmp_path / "router.json"), n="4",
                       programs="no-retrieval,single-rag,ircot", datasets="hotpotqa,popqa")
    router = json.loads((tmp_path / "router.json").read_text())
    # every strategy answered wrong: a multi-hop question is labelled C, a single-hop one B
    assert "labelled 8 questions: A 0, B 4, C 4" in out and "trained on 6, held apart 2" in out
    assert router["trained_on"]["questions"] == 6 and set(router["labels"]) == {"B", "C"}


def test_a_second_router_trained_apart_routes_what_the_first_learned_from(shared_dataset, tmp_path):
    shared_dataset("hotpotqa"), shared_dataset("popqa_longtail")
    table = [json.loads(line)["id"] for line in open(shared_dataset("hotpotqa") / "public.jsonl")][:6]
    first = tmp_path / "router.json"  # learned from the table's first two HotpotQA questions
    write_router_file(first, LogisticRegression().fit([[0.0] * 384, [1.0] * 384], ["B", "C"]), "all-MiniLM-L6-v2",
                      {"questions": 2, "ids": {"hotpotqa": table[:2]}})
    with OpenAICompatibleServer(last_word) as server:
        finish(matrix(server, tmp_path, "--datasets", "hotpotqa,popqa", programs="no-retrieval,single-rag,ircot"))
        out = from_results(tmp_path, "--train-router", str(tmp_path / "second.json"), "--apart-from", str(first),
                           programs="no-retrieval,single-rag,ircot", datasets="hotpotqa,popqa")
        second = json.loads((tmp_path / "second.json").read_text())
        assert f"hotpotqa: left out the 2 questions {first} learned from" in out and "labelled 10 questions" in out
        assert not set(second["trained_on"]["ids"]["hotpotqa"]) & set(table[:2])

        routed = ("--programs", "adaptive-rag", "--param", f"adaptive-rag.classifier={first}")
        refused = matrix(server, tmp_path, *routed, "--second-router", str(first), programs=None)
        _, err = refused.communicate(timeout=120)
        assert refused.returncode != 0 and f"--second-router {first} learned from 2 of the questions" in err
        assert not (tmp_path / "results" / "hotpotqa" / "adaptive-rag.jsonl").exists()

        finish(matrix(server, tmp_path, *routed, programs=None))  # without a second router: those two left out
        assert sorted(read_ids(tmp_path / "results" / "hotpotqa" / "adaptive-rag.jsonl")) == sorted(table[2:])
        finish(matrix(server, tmp_path, *routed, "--second-router", str(tmp_path / "second.json"), programs=None))

    runs = tmp_path / "runs" / "hotpotqa"
    assert sorted(read_ids(tmp_path / "results" / "hotpotqa" / "adaptive-rag.jsonl")) == sorted(table)
    assert sorted(read_ids(runs / "adaptive-rag-second-router" / "predictions.jsonl")) == sorted(table[:2])
    assert sorted(read_ids(runs / "adaptive-rag" / "predictions.jsonl")) == sorted(table[2:])
    record = json.loads((runs / "adaptive-rag-second-router" / "run.json").read_text())
    assert record["params"]["classifier"] == str(tmp_path / "second.json")


def read_ids(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip()]
