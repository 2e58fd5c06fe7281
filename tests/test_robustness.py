"""A real model's output on scripted endpoints: budgets that servers honour, log-probabilities that arrive,
outputs decoded under the signature's schema, and failures that stay with their question."""

from __future__ import annotations

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
from arag.signatures.relevance import JudgeRelevance
from arag.testing import (
    NUMBERED,
    OpenAICompatibleServer,
    Scripted,
    TemplateRetriever,
    Tokens,
    isolated_cache,
    scripted_lm,
)
from arag.trace import Answer, Evaluate, Retrieve, Unreadable, is_step, kinds_of


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
