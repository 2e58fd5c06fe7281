"""The baselines FLARE is compared with: previous-window, previous-sentence, Self-Ask and ReAct."""

import json
import logging.handlers
import uuid
import zlib

import dspy
import jsonschema
import pytest
import ujson
from click.testing import CliRunner

from arag.adapters import output_schema
from arag.cli import main
from arag.errors import ConfigError
from arag.lm import build_lm
from arag.programs.baselines.multi_time import PreviousSentence, PreviousWindow
from arag.programs.baselines.react import ARGUMENT_CHARS, ReActSearch
from arag.programs.baselines.self_ask import WRITTEN_CHAINS, SelfAsk, chain_entry
from arag.programs.baselines.steps import Act, FollowUp, Observation
from arag.testing import FOUND_FOR, OpenAICompatibleServer, Scripted, TemplateRetriever, scripted_lm, tokenize
from arag.trace import (
    Answer,
    Retrieve,
    Sentence,
    Stop,
    StopReason,
    Window,
    is_step,
    kinds_of,
    shown_probability,
    steps_of,
)

QUESTION = "What government position was held by the woman who portrayed Corliss Archer in the film Kiss and Tell?"
LONG_ANSWER = ("Shirley Temple played Corliss Archer in Kiss and Tell, in 1945. She later served as Chief of "
               "Protocol of the United States. So the answer is Chief of Protocol.")
FOLLOW_UPS = ["Who portrayed Corliss Archer in Kiss and Tell?", "What government position did Shirley Temple hold?"]
INTERMEDIATE = {FOLLOW_UPS[0]: "Shirley Temple", FOLLOW_UPS[1]: "Chief of Protocol"}


def continue_text(text, prob=0.9):
    """A writer that continues `text` from wherever the answer so far stops (signature or raw prompt)."""

    def respond(call):
        written = call.prompt.rpartition("Answer:")[2].strip() if call.raw else call.inputs["answer_so_far"]
        assert text.startswith(written), f"the pieces {written!r} do not rebuild the text"
        rest = text[len(written):]
        if call.raw:
            return Scripted(rest + "\n\nQuestion: cut off by the stop sequence", prob) if rest else ""
        return {"continuation": Scripted(rest.strip(), prob) if rest.strip() else ""}

    return respond


def run(program_class, responder, **params):
    lm, retriever = scripted_lm(responder), TemplateRetriever(FOUND_FOR)
    with dspy.context(lm=lm):
        prediction = program_class(retriever, **params)(question=QUESTION)
    return prediction, lm.engine, retriever


# --- previous-window ---------------------------------------------------------------------------------


@pytest.mark.parametrize("prompt_style", ["signature", "raw"])
def test_prev_window_retrieves_every_window_with_the_previous_window(prompt_style):
    prediction, engine, retriever = run(PreviousWindow, continue_text(LONG_ANSWER), window=4,
                                        prompt_style=prompt_style)
    windows = [step["text"] for step in steps_of(prediction, Window)]
    assert windows[:3] == ["Shirley Temple played Corliss", "Archer in Kiss and", "Tell, in 1945."]
    assert " ".join(windows) == prediction.long_answer == LONG_ANSWER
    assert retriever.queries == [QUESTION, *windows[:-1]]
    assert [step["retrieved"] for step in steps_of(prediction, Window)] == [False] + [True] * (len(windows) - 1)
    assert engine.count == prediction.lm_calls == len(windows)
    assert prediction.answer == "Chief of Protocol"


def test_prev_window_replaces_the_passages_with_the_last_windows():
    seen = []

    def responder(call):
        seen.append(call.inputs["passages"])
        return continue_text(LONG_ANSWER)(call)

    prediction, _, _ = run(PreviousWindow, responder, window=4)
    windows = [step["text"] for step in steps_of(prediction, Window)]
    assert "found for: " + QUESTION in seen[0]
    for passages, previous in zip(seen[1:], windows[:-1], strict=True):
        assert "found for: " + previous in passages and "found for: " + QUESTION not in passages


def token_prob(token):
    """A probability for each token of the scripted writer, read from its text: 0.5 to 0.999."""
    return 0.5 + zlib.crc32(token.encode()) % 500 / 1000


def token_writer(text):
    """Writes `text` as `continue_text` does, each token with its `token_prob`."""
    def respond(call):
        written = call.prompt.rpartition("Answer:")[2].strip() if call.raw else call.inputs["answer_so_far"]
        rest = text[len(written):] if call.raw else text[len(written):].strip()
        if not rest.strip():
            return "" if call.raw else {"continuation": ""}
        value = rest + "\n\nQuestion: cut off by the stop sequence" if call.raw else rest
        scripted = Scripted(value, [token_prob(token) for token in tokenize(value)])
        return scripted if call.raw else {"continuation": scripted}

    return respond


@pytest.mark.parametrize("prompt_style", ["signature", "raw"])
@pytest.mark.parametrize("program_class, kind, params", [(PreviousWindow, Window, {"window": 4}),
                                                         (PreviousSentence, Sentence, {})])
def test_each_piece_records_its_tokens_with_their_probabilities(program_class, kind, params, prompt_style):
    prediction, _, _ = run(program_class, token_writer(LONG_ANSWER), prompt_style=prompt_style, **params)
    pieces = steps_of(prediction, kind)
    assert len(pieces) > 2 and " ".join(step["text"] for step in pieces) == LONG_ANSWER
    for step in pieces:
        assert "".join(token for token, _ in step["tokens"]).strip() == step["text"]
        assert [p for _, p in step["tokens"]] == [shown_probability(token_prob(t)) for t, _ in step["tokens"]]
        assert "lookahead_tokens" not in step


# --- previous-sentence -------------------------------------------------------------------------------


def test_prev_sentence_retrieves_with_the_previous_sentence_and_accumulates_up_to_the_cap():
    seen = []
    plan = ("Shirley Temple played Corliss Archer. She was an actress. She became a diplomat. "
            "She was Chief of Protocol. So the answer is Chief of Protocol.")

    def responder(call):
        seen.append(call.inputs["passages"].count("found for:"))
        return continue_text(plan)(call)

    prediction, engine, retriever = run(PreviousSentence, responder, k=2, max_passages=5)
    written = [step["text"] for step in steps_of(prediction, Sentence)]
    assert retriever.queries == [QUESTION, written[0], written[1]]  # then the cap of 5 passages is full
    assert seen == [2, 4, 5, 5, 5]
    assert [step["retrieved"] for step in steps_of(prediction, Sentence)] == [False, True, True, False, False]
    assert steps_of(prediction, Sentence)[3]["skipped"] == "the passage cap is reached"
    assert engine.count == prediction.lm_calls == 5 and prediction.distinct_passages == 6
    assert prediction.answer == "Chief of Protocol"


def test_prev_sentence_needs_room_for_the_first_retrieval():
    with pytest.raises(ConfigError, match="'max_passages'"):
        PreviousSentence(TemplateRetriever(FOUND_FOR), k=5, max_passages=3)
    assert PreviousSentence(TemplateRetriever(FOUND_FOR)).config["max_passages"] == 15


@pytest.mark.parametrize(
    "params, name", [({"window": 0}, "window"), ({"k": "two"}, "k"), ({"max_tokens": 2}, "max_tokens")]
)
def test_prev_window_parameters_are_validated(params, name):
    with pytest.raises(ConfigError, match=f"'{name}'"):
        PreviousWindow(TemplateRetriever(FOUND_FOR), **params)


# --- Self-Ask ---------------------------------------------------------------------------------------


def self_asker(follow_ups, finals):
    """Asks `follow_ups` in order, answers each from its passages, and records the final chain."""

    def respond(call):
        if "needs_follow_up" in call.output_fields:
            asked = call.inputs["follow_ups"].count("Follow up:")
            more = asked < len(follow_ups)
            return {"needs_follow_up": more, "follow_up": follow_ups[asked] if more else ""}
        if "passages" in call.inputs:
            assert "found for: " + call.inputs["question"] in call.inputs["passages"]
            return {"answer": INTERMEDIATE.get(call.inputs["question"], "unknown")}
        finals.append(call.inputs["follow_ups"])
        return {"answer": "Chief of Protocol"}

    return respond


def test_self_ask_retrieves_each_follow_up_then_answers_from_the_chain():
    finals = []
    prediction, engine, retriever = run(SelfAsk, self_asker(FOLLOW_UPS, finals))
    assert retriever.queries == FOLLOW_UPS
    chain = [(s["question"], s["intermediate_answer"]) for s in steps_of(prediction, FollowUp)]
    assert chain == list(INTERMEDIATE.items())
    assert finals == [json.dumps([f"Follow up: {q} Intermediate answer: {a}" for q, a in INTERMEDIATE.items()])]
    assert engine.count == prediction.lm_calls == 3 + 2 + 1  # follow-up decisions, intermediate answers, answer
    assert prediction.answer == "Chief of Protocol"


def test_self_ask_stops_at_the_cap_and_at_a_repeated_follow_up():
    many = [f"Which detail number {n} matters?" for n in range(6)]
    prediction, engine, retriever = run(SelfAsk, self_asker(many, []), max_follow_ups=2)
    assert retriever.queries == many[:2] and engine.count == 2 + 2 + 1
    assert steps_of(prediction, Stop)[0]["reason"] == StopReason.FOLLOW_UP_CAP

    prediction, engine, retriever = run(SelfAsk, self_asker([FOLLOW_UPS[0], FOLLOW_UPS[0]], []))
    assert retriever.queries == FOLLOW_UPS[:1] and engine.count == 2 + 1 + 1
    assert steps_of(prediction, Stop)[0]["reason"] == StopReason.FOLLOW_UP_REPEATED


def test_self_ask_asks_only_the_question_a_model_writes_before_an_intermediate_answer():
    """A small model copies the chain's format into its follow-up ("Follow up: Q Intermediate answer: A", as
    the 1.5B model did on HotpotQA): the question is what comes before the answer, and written again it is a
    repeat."""
    first, answer = FOLLOW_UPS[0], INTERMEDIATE[FOLLOW_UPS[0]]
    written = [f"Follow up: {first}", f"{first} intermediate answer: {answer}", FOLLOW_UPS[1]]
    prediction, engine, retriever = run(SelfAsk, self_asker(written, []))
    assert retriever.queries == FOLLOW_UPS[:1] and engine.count == 2 + 1 + 1
    assert steps_of(prediction, Stop)[0]["reason"] == StopReason.FOLLOW_UP_REPEATED


def test_self_ask_shows_the_written_chains_as_demos_by_default():
    with OpenAICompatibleServer(self_asker(FOLLOW_UPS, [])) as server:
        lm = build_lm(f"openai/self-ask-{uuid.uuid4().hex}", api_base=server.url)
        with dspy.context(lm=lm):
            SelfAsk(TemplateRetriever(FOUND_FOR))(question=QUESTION)
    decision, intermediate = (request["body"]["messages"] for request in server.requests[:2])
    final = server.requests[-1]["body"]["messages"]
    # Each chain gives three decisions (its two follow-ups, then none) as user and assistant turns.
    demos = decision[1:-1]
    assert [m["role"] for m in decision] == ["system"] + ["user", "assistant"] * 9 + ["user"]
    assert QUESTION in decision[-1]["content"]
    for number, chain in enumerate(WRITTEN_CHAINS):
        asked, said = demos[6 * number:6 * number + 6:2], demos[6 * number + 1:6 * number + 6:2]
        assert all(chain.question in m["content"] for m in asked)
        assert chain_entry(*chain.hops[0]) in asked[1]["content"] and chain_entry(*chain.hops[1]) in asked[2]["content"]
        assert [json.loads(m["content"]) for m in said] == [
            {"needs_follow_up": True, "follow_up": chain.hops[0][0]},
            {"needs_follow_up": True, "follow_up": chain.hops[1][0]},
            {"needs_follow_up": False, "follow_up": ""}]
    assert [json.loads(m["content"])["answer"] for m in final[2:-1:2]] == [c.answer for c in WRITTEN_CHAINS]
    assert QUESTION in final[-1]["content"]
    assert [m["role"] for m in intermediate] == ["system", "user"]  # an intermediate answer reads passages only


def test_self_ask_demos_false_runs_zero_shot():
    program = SelfAsk(TemplateRetriever(FOUND_FOR), demos="false")
    assert program.next_follow_up.demos == [] and program.answer_question.demos == []
    prompts = []

    def responder(call):
        prompts.append(call.prompt)
        return self_asker(FOLLOW_UPS, [])(call)

    with dspy.context(lm=scripted_lm(responder)):
        prediction = program(question=QUESTION)
    assert prediction.answer == "Chief of Protocol"
    assert not any(chain.question in prompt for chain in WRITTEN_CHAINS for prompt in prompts)


def test_self_ask_written_chains_are_no_benchmark_questions(shared_dataset):
    written = {chain.question for chain in WRITTEN_CHAINS}
    for name in ("hotpotqa", "popqa_longtail"):
        questions = {ujson.loads(line)["question"] for line in open(shared_dataset(name) / "public.jsonl")}
        assert not written & questions, name


# --- ReAct ------------------------------------------------------------------------------------------


def react_agent(searches, observations):
    """Searches `searches` in order, then finishes; records what each step observed."""

    def respond(call):
        if "next_tool_name" in call.output_fields:
            done = call.prompt.count("[[ ## observation_")
            observations.append(call.prompt)
            if done < len(searches):
                return {"next_thought": f"I need: {searches[done]}", "next_tool_name": "search",
                        "next_tool_args": {"query": searches[done]}}
            return {"next_thought": "I know enough.", "next_tool_name": "finish", "next_tool_args": {}}
        return {"reasoning": "Shirley Temple was Chief of Protocol.", "answer": "Chief of Protocol"}

    return respond


def test_react_searches_through_the_retriever_and_answers():
    prompts = []
    prediction, engine, retriever = run(ReActSearch, react_agent(FOLLOW_UPS, prompts))
    assert retriever.queries == FOLLOW_UPS
    assert [s["why"] for s in steps_of(prediction, Retrieve)] == ["react search"] * 2
    assert "Passage 0 found for: " + FOLLOW_UPS[0] in prompts[1]  # the tool's passages come back as an observation
    assert [(s["tool"], s["args"]) for s in steps_of(prediction, Act)] == [
        ("search", {"query": FOLLOW_UPS[0]}), ("search", {"query": FOLLOW_UPS[1]}), ("finish", {})]
    assert engine.count == prediction.lm_calls == 3 + 1  # three steps, then the answer is extracted
    assert prediction.answer == "Chief of Protocol"


def test_react_stops_at_max_iters():
    endless = [f"Search number {n}" for n in range(10)]
    prediction, engine, retriever = run(ReActSearch, react_agent(endless, []), max_iters=2)
    assert retriever.queries == endless[:2] and engine.count == 2 + 1


def test_react_ends_the_trajectory_when_the_model_repeats_a_search():
    """The 1.5B model searched one query seven times, to the step cap: the repeat ends the trajectory and the
    answer is extracted from what was read, with no warning (the trace says it); stop_repeated=false runs to
    max_iters, as the paper."""
    again = [FOLLOW_UPS[0]] * 10
    warnings = logging.handlers.BufferingHandler(100)
    react_logger = logging.getLogger("dspy.predict.react")
    react_logger.addHandler(warnings)
    try:
        prediction, engine, retriever = run(ReActSearch, react_agent(again, []), max_iters=5)
    finally:
        react_logger.removeHandler(warnings)
    assert warnings.buffer == []
    assert retriever.queries == FOLLOW_UPS[:1]
    assert len(steps_of(prediction, Act)) == 2 and engine.count == prediction.lm_calls == 2 + 1
    assert steps_of(prediction, Stop)[0]["reason"] == StopReason.REPEATED_ACTION
    assert prediction.answer == "Chief of Protocol"

    prediction, engine, retriever = run(ReActSearch, react_agent(again, []), max_iters=5, stop_repeated="false")
    assert retriever.queries == again[:5] and engine.count == 5 + 1 and not steps_of(prediction, Stop)


SCHEMA_SHAPED = {"query": {"type": "string", "value": "Shirley Temple"}}  # what a small model wrote, unconstrained


def scripted_steps(calls, prompts):
    """Takes the steps `calls` ((tool, args) pairs) in order, then the answer; records each step's prompt."""

    def respond(call):
        if "next_tool_name" not in call.output_fields:
            return {"reasoning": "From the trajectory.", "answer": "Chief of Protocol"}
        prompts.append(call.prompt)
        tool, args = calls[len(prompts) - 1]
        return {"next_thought": f"Next: {tool}.", "next_tool_name": tool, "next_tool_args": args}

    return respond


def test_react_step_schema_holds_each_tool_to_its_own_arguments():
    with OpenAICompatibleServer(scripted_steps([("finish", {})], [])) as server:
        lm = build_lm(f"openai/react-{uuid.uuid4().hex}", api_base=server.url)
        with dspy.context(lm=lm):
            ReActSearch(TemplateRetriever(FOUND_FOR))(question=QUESTION)
    step_format = server.requests[0]["body"]["response_format"]["json_schema"]
    properties = step_format["schema"]["properties"]
    assert step_format["strict"] is True and properties["next_tool_name"]["enum"] == ["search", "finish"]
    search_args = {"type": "object", "properties": {"query": {"type": "string", "maxLength": ARGUMENT_CHARS}},
                   "required": ["query"], "additionalProperties": False}
    finish_args = {"type": "object", "properties": {}, "required": [], "additionalProperties": False}
    assert properties["next_tool_args"] == {"anyOf": [search_args, finish_args]}
    jsonschema.validate({"query": "Shirley Temple"}, properties["next_tool_args"])
    jsonschema.validate({}, properties["next_tool_args"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(SCHEMA_SHAPED, properties["next_tool_args"])


def test_react_step_schema_without_lengths_keeps_the_arguments_closed():
    step = ReActSearch(TemplateRetriever(FOUND_FOR)).agent.react.signature
    unbounded = output_schema(step, lengths=False)["properties"]["next_tool_args"]
    assert "maxLength" not in str(unbounded)
    assert [branch["required"] for branch in unbounded["anyOf"]] == [["query"], []]
    assert all(branch["additionalProperties"] is False for branch in unbounded["anyOf"])


def test_react_records_a_failed_tool_call_as_an_observation_and_counts_it():
    prompts = []
    calls = [("search", SCHEMA_SHAPED), ("search", {"query": FOLLOW_UPS[0]}), ("finish", {})]
    prediction, engine, retriever = run(ReActSearch, scripted_steps(calls, prompts))
    assert kinds_of(prediction) == [Act, Observation, Act, Retrieve, Observation, Act, Observation, Answer]
    failed = prediction.trace[1]
    assert failed["tool"] == "search" and failed["error"].startswith("ValueError: Arg query is invalid")
    assert "observation" not in failed
    assert "Execution error in search" in prompts[1]  # the LM reads the error in its trajectory too
    assert retriever.queries == FOLLOW_UPS[:1]
    assert prediction.failed_tool_calls == 1 and prediction.retrieval_calls == 1
    assert engine.count == prediction.lm_calls == 3 + 1


def test_react_records_a_good_search_with_its_passages():
    calls = [("search", {"query": FOLLOW_UPS[0]}), ("finish", {})]
    prediction, _, _ = run(ReActSearch, scripted_steps(calls, []), k=2)
    act, retrieve, observation, finish, completed = prediction.trace[:5]
    assert is_step(act, Act) and (act["tool"], act["args"], act["thought"]) == (
        "search", {"query": FOLLOW_UPS[0]}, "Next: search.")
    assert retrieve["query"] == FOLLOW_UPS[0] and retrieve["why"] == "react search"
    assert [p["id"] for p in retrieve["passages"]] == [f"{FOLLOW_UPS[0]}#0", f"{FOLLOW_UPS[0]}#1"]
    assert observation == {"step": Observation.kind, "tool": "search", "observation": [
        f"[1] About {FOLLOW_UPS[0]} | Passage 0 found for: {FOLLOW_UPS[0]}",
        f"[2] About {FOLLOW_UPS[0]} | Passage 1 found for: {FOLLOW_UPS[0]}"]}
    assert (finish["tool"], completed) == ("finish", {"step": Observation.kind, "tool": "finish",
                                                      "observation": "Completed."})
    assert prediction.failed_tool_calls == 0


# --- arag eval over a loopback server ------------------------------------------------------------------


def hotpot_responder(call):
    """One LM for every baseline on HotpotQA: a fixed long answer per question, two follow-ups, two searches."""
    fields = call.output_fields
    if "continuation" in fields:
        topic = call.inputs["question"].split()[-1]
        return continue_text(f"The question is about {topic} That names someone. So the answer is unknown.")(call)
    if "needs_follow_up" in fields:
        return self_asker(["Who is the first person?", "What did they do?"], [])(call)
    if "next_tool_name" in fields:
        return react_agent(["first hop", "second hop"], [])(call)
    return {field: "unknown" for field in fields}


@pytest.fixture
def hotpot_index(shared_dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("ARAG_HOME", str(tmp_path / "home"))
    return shared_dataset("hotpotqa")


@pytest.mark.parametrize(
    "program, kind, retrievals, lm_calls",
    [("prev-window", Window, None, None), ("prev-sentence", Sentence, None, None),
     ("self-ask", FollowUp, 2, 6), ("react", Act, 2, 4)],
)
def test_arag_eval_runs_the_baselines_over_a_loopback_server(program, kind, retrievals, lm_calls, hotpot_index,
                                                              tmp_path):
    out = tmp_path / program
    with OpenAICompatibleServer(hotpot_responder) as server:
        result = CliRunner().invoke(main, [
            "eval", "--program", program, "--dataset", str(hotpot_index / "public.jsonl"),
            "--corpus", str(hotpot_index / "corpus.jsonl"), "--lm", f"openai/loopback-{uuid.uuid4().hex}",
            "--api-base", server.url, "--logprobs", "--limit", "2", "--out", str(out),
        ], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert all(request["body"].get("logprobs") is True for request in server.requests)
    rows = [ujson.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and not any("error" in row for row in rows)
    for row in rows:
        decisions = steps_of(row, kind)
        assert decisions and row["prediction"] == "unknown"
        expected = (retrievals, lm_calls)
        if kind in (Window, Sentence):
            assert decisions[0]["retrieved"] is False and all(step["retrieved"] for step in decisions[1:])
            queries = [s["query"] for s in row["trace"] if is_step(s, Retrieve)][1:]
            assert queries == [step["text"] for step in decisions[:-1]]
            assert all("".join(t for t, _ in step["tokens"]).strip() == step["text"] for step in decisions)
            expected = (len(decisions), len(decisions))  # one retrieval and one LM call per piece
        assert (row["retrieval_calls"], row["lm_calls"]) == expected
