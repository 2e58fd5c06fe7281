"""A real model's output on scripted endpoints: budgets that servers honour, log-probabilities that arrive,
outputs decoded under the signature's schema, and failures that stay with their question; LM faults over a
300-question evaluation, retried as DSPy retries them, and over HTTP through the command line."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time

import dspy
import pytest
from click.testing import CliRunner

from arag.adapters import SchemaAdapter, TextAdapter, output_schema, output_token_budget
from arag.cli import main
from arag.data import sample_paths
from arag.errors import QuestionFailed
from arag.evaluate import evaluate
from arag.lm import build_lm, complete_raw, completions_lm
from arag.programs import build_program
from arag.programs.crag.steps import Evaluate
from arag.runs import read_rows
from arag.signatures.relevance import JudgeRelevance
from arag.testing import (
    NUMBERED,
    Faults,
    OpenAICompatibleServer,
    Scripted,
    TemplateRetriever,
    Tokens,
    isolated_cache,
    scripted_lm,
)
from arag.trace import Answer, Retrieve, Unreadable, is_step, kinds_of


def examples(n):
    return [dspy.Example(id=f"q{i}", question=f"Question {i}?", answers=["Budapest"]).with_inputs("question")
            for i in range(n)]


def answer_all(call):
    return {field: "Budapest" if field == "answer" else "Because." for field in call.output_fields}


@pytest.fixture(autouse=True)
def fresh_cache():
    with isolated_cache():
        yield


# --- what reaches the endpoint -----------------------------------------------------------------


def test_an_openai_compatible_server_gets_max_tokens_and_a_budget_that_fits_the_fields():
    with OpenAICompatibleServer(lambda call: {"relevant": "yes"}, dialect="llama.cpp") as server:
        lm = build_lm("openai/small", api_base=server.url)
        with dspy.context(lm=lm, adapter=SchemaAdapter()):
            dspy.Predict(JudgeRelevance)(question="q", passage="p")
    body = server.requests[-1]["body"]
    assert "max_completion_tokens" not in body
    assert body["max_tokens"] == output_token_budget(JudgeRelevance) < 32
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"]["properties"]["relevant"]["enum"] == ["yes", "no"]


def test_string_fields_carry_their_length_budget_and_the_budget_covers_it():
    class Note(dspy.Signature):
        """Write a note."""

        question: str = dspy.InputField()
        note: str = dspy.OutputField(max_length=2000)
        queries: list[str] = dspy.OutputField()

    schema = output_schema(Note)
    assert schema["properties"]["note"] == {"type": "string", "maxLength": 2000}
    assert schema["properties"]["queries"]["maxItems"] >= 1 and schema["required"] == ["note", "queries"]
    assert output_token_budget(Note) >= 2000 + 5 * 300  # a token per character: a string always fits
    assert "maxLength" not in str(output_schema(Note, lengths=False))


def test_programs_get_log_probabilities_from_a_llama_cpp_server():
    """llama-cpp-python's server sends none for `logprobs: true` alone; programs ask for top_logprobs too."""
    def continuation(call):
        text = "" if call.inputs.get("answer_so_far") else "So the answer is Budapest."
        return {"continuation": Scripted(text, 0.9)} if text else {"continuation": ""}

    with OpenAICompatibleServer(continuation, dialect="llama.cpp") as server:
        lm = build_lm("openai/small", api_base=server.url)
        with dspy.context(lm=lm):
            prediction = build_program("prev-window", TemplateRetriever(NUMBERED), k=2)(question="Where?")
    assert prediction.answer == "Budapest"
    assert all(r["body"].get("top_logprobs") for r in server.requests if r["body"].get("logprobs"))


def test_raw_completions_read_log_probabilities_in_both_shapes():
    tokens = Tokens([(" Paris", 0.8, {" Lyon": 0.1}), (".", 0.9)])
    for dialect in ("openai", "llama.cpp"):
        with OpenAICompatibleServer(lambda call: tokens, dialect=dialect) as server:
            lm = completions_lm("small", server.url)
            text, read = complete_raw(lm, "The capital of France is", top_logprobs=2)
        assert text == " Paris." and [t.token for t in read] == [" Paris", "."], dialect
        assert read[0].prob == pytest.approx(0.8) and read[0].top[1][0] == " Lyon", dialect


# --- outputs that parse, or fail plainly ----------------------------------------------------------


def test_a_non_string_for_a_string_field_is_a_parse_failure_not_its_repr():
    lm = scripted_lm(lambda call: {**answer_all(call), "answer": {"title": "Big Stone Gap"}})
    with dspy.context(lm=lm), pytest.raises(QuestionFailed, match="AdapterParseError in generate_answer") as failure:
        build_program("single-rag", TemplateRetriever(NUMBERED), k=2)(question="Where?")
    assert "must be a string" in str(failure.value)


def test_the_text_adapter_refuses_non_strings_in_its_json_fallback_too():
    def respond(call):
        return "garbage" if call.adapter == "chat" else {**answer_all(call), "answer": {"title": "x"}}

    lm = scripted_lm(respond)
    with dspy.context(lm=lm, adapter=TextAdapter()), pytest.raises(QuestionFailed, match="must be a string"):
        build_program("no-retrieval")(question="Where?")
    assert [call.adapter for call in lm.engine.calls] == ["chat", "json"]


def test_an_unreadable_relevance_judgement_falls_back_and_says_so():
    def judge(call):
        if "relevant" in call.output_fields:
            return "I think maybe" if "Passage 2" in call.inputs["passage"] else {"relevant": "yes"}
        return answer_all(call)

    lm = scripted_lm(judge, logprobs=True, top_logprobs=5)
    with dspy.context(lm=lm):
        prediction = build_program("crag", TemplateRetriever(NUMBERED), k=3)(question="Where?")
    unreadable = [s for s in prediction.trace if is_step(s, Unreadable)]  # the passage, then its strip
    assert unreadable and all(s["signature"] == "JudgeRelevance" and s["fallback"].startswith("score 0")
                              for s in unreadable)
    scores = next(s for s in prediction.trace if is_step(s, Evaluate))["scores"]
    assert [s["score"] for s in scores] == [1.0, 0.0, 1.0]
    assert prediction.answer == "Budapest"


def test_react_ends_its_trajectory_on_an_unreadable_step_and_still_answers():
    def react(call):
        if "next_tool_name" in call.output_fields:
            return "not json at all"
        return answer_all(call)

    with dspy.context(lm=scripted_lm(react)):
        prediction = build_program("react", TemplateRetriever(NUMBERED))(question="Where?")
    assert prediction.answer == "Budapest"
    assert kinds_of(prediction)[-2:] == [Unreadable, Answer]


# --- failures stay with their question --------------------------------------------------------


def fail_every_second_question(call):
    if "answer" in call.output_fields and call.inputs.get("question", "").rstrip("?").endswith(("1", "3")):
        return "no JSON here"
    return answer_all(call)


def test_a_failed_question_keeps_its_trace_its_cost_and_the_step_that_failed(tmp_path):
    lm = scripted_lm(fail_every_second_question)
    with dspy.context(lm=lm):
        program = build_program("single-rag", TemplateRetriever(NUMBERED), k=2)
        result = evaluate(program, examples(4), out_dir=tmp_path, progress=False)
    failed = [row for row in result.rows if row.failed]
    assert [row.id for row in failed] == ["q1", "q3"]
    for row in failed:
        assert row.error_kind == "AdapterParseError" and row.error_step == "generate_answer"
        assert row.lm_calls == 1 and row.prompt_tokens > 0 and row.retrieval_calls == 1
        assert kinds_of(row) == [Retrieve]
    summary = result.summary
    assert summary["failures"] == {"AdapterParseError": 2}
    assert summary["totals"]["lm_calls"] == 4 == lm.engine.count


def test_a_retry_reaches_the_model_instead_of_replaying_the_cached_failure(tmp_path):
    program = build_program("single-rag", TemplateRetriever(NUMBERED), k=2)
    lm = scripted_lm(fail_every_second_question)
    with dspy.context(lm=lm):
        evaluate(program, examples(4), out_dir=tmp_path, progress=False)
        assert lm.engine.count == 4
        retried = evaluate(program, examples(4), out_dir=tmp_path, progress=False)
    assert lm.engine.count == 6  # the two failed questions were sent again, not read back from the cache
    assert sorted(row.attempt or 0 for row in retried.rows) == [0, 0, 1, 1]


def test_max_errors_stops_a_run_whose_every_question_fails_and_names_the_step(tmp_path):
    lm = scripted_lm(lambda call: "no JSON here")
    with dspy.context(lm=lm), pytest.raises(Exception, match=r"3 failed examples in a row.*in generate_answer"):
        evaluate(build_program("no-retrieval"), examples(10), out_dir=tmp_path, progress=False, max_errors=3)
    with dspy.context(lm=lm):
        result = evaluate(build_program("no-retrieval"), examples(5), out_dir=tmp_path / "all", progress=False,
                          max_errors=None)
    assert result.summary["n_failed"] == 5


def test_the_command_line_without_an_lm_points_at_the_local_model(tmp_path, monkeypatch):
    monkeypatch.delenv("ARAG_LM", raising=False)
    questions, corpus = sample_paths()
    result = CliRunner().invoke(main, ["eval", "--program", "single-rag", "--dataset", str(questions), "--corpus",
                                       str(corpus), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "--lm local" in result.output


# --- a cost cap per question ------------------------------------------------------------------------


def judge_yes(call):
    return {"relevant": "yes"} if call.output_fields == ["relevant"] else answer_all(call)


def test_a_question_stops_at_its_cap_on_lm_calls_with_what_it_spent(tmp_path):
    lm = scripted_lm(judge_yes, logprobs=True, top_logprobs=5)
    # 5 judgements, 5 strips, 1 answer
    program = build_program("crag", TemplateRetriever(NUMBERED), k=5, reasoning="direct")
    with dspy.context(lm=lm):
        result = evaluate(program, examples(2), out_dir=tmp_path, progress=False, max_lm_calls=7)
        uncapped = evaluate(program, examples(2), out_dir=tmp_path / "uncapped", progress=False, max_lm_calls=0)
    for row in result.rows:
        assert row.error_kind == "LMCallBudgetSpent" and "7 LM calls" in row.error
        assert row.lm_calls == 7 and kinds_of(row)[:2] == [Retrieve, Evaluate]
    assert all(not row.failed and row.lm_calls == 11 for row in uncapped.rows)
    assert program.default_max_lm_calls() == 150  # 100 + 10 per passage of k


def test_a_trial_whose_questions_all_reach_the_cap_is_pruned_and_a_study_stops_at_its_lm_calls(tmp_path):
    from arag.optimizers.tuning import SearchSpace, TuningConfig, tune

    lm = scripted_lm(judge_yes, logprobs=True, top_logprobs=5)
    space = SearchSpace(names=("k",), ranges={"k": (4, 6)}, fixed={"reasoning": "direct"})
    common = {"objectives": ("em",), "space": space, "plots": False, "seed": 0, "pruner": "none"}
    capped = tune("crag", examples(2), TemplateRetriever(NUMBERED),
                  TuningConfig(trials=2, out_dir=tmp_path / "capped", max_lm_calls=3, **common), lm=lm)
    assert [t.state.name for t in capped.study.trials] == ["PRUNED", "PRUNED"]
    with isolated_cache(enabled=False):  # every call reaches the LM and is spent
        limited = tune("crag", examples(2), TemplateRetriever(NUMBERED),
                       TuningConfig(trials=10, out_dir=tmp_path / "limited", max_study_lm_calls=30, **common), lm=lm)
    assert len(limited.study.trials) < 10 and limited.cost["lm_calls_spent"] >= 30
    most_a_trial_spent = max(t.user_attrs["arag"]["lm_calls_spent"] for t in limited.study.trials)
    assert limited.cost["lm_calls_spent"] - 30 < most_a_trial_spent


# --- LM faults: retried as DSPy retries them, else kept with their question ------------------------

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
