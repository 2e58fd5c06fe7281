"""arag.testing: scripted engines and the loopback OpenAI-compatible server."""

import asyncio
import copy
import json
import math
import random
import time
import urllib.error
import urllib.request

import dspy
import pytest
from dspy.utils.exceptions import AdapterParseError, LMTimeoutError, LMUnexpectedError

from arag.lm import field_logprobs
from arag.testing import (
    Faults,
    OpenAICompatibleServer,
    Scripted,
    ScriptedEngine,
    Tokens,
    isolated_cache,
    scripted_lm,
    tokenize,
)


class Grounded(dspy.Signature):
    """Answer from the passages.
    Say 'unknown' when they do not tell."""

    question: str = dspy.InputField()
    passages: list[str] = dspy.InputField()
    answer: str = dspy.OutputField()
    confidence: float = dspy.OutputField()
    supported: bool = dspy.OutputField()


class QA(dspy.Signature):
    """Answer the question."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField()


def echo(call):
    return {"answer": call.inputs["question"].upper()}


def post(url, body):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def test_tokenize_splits_words_punctuation_and_whitespace():
    assert tokenize("Paris is big.\n\nOK  then") == ["Paris", " is", " big", ".", "\n\n", "OK", " ", " then"]
    text = '[[ ## answer ## ]]\n{"a": "b\\"c"}\t end '
    assert "".join(tokenize(text)) == text


def test_scripted_probabilities_must_match_the_tokens():
    assert [token.prob for token in Scripted("Paris is big", [0.1, 0.2, 0.3]).tokens] == [0.1, 0.2, 0.3]
    with pytest.raises(ValueError, match="3 tokens"):
        Scripted("Paris is big", [0.5, 0.5])
    with pytest.raises(ValueError, match="probability"):
        Tokens([("Yes", 1.5)])


@pytest.mark.parametrize("adapter", [dspy.ChatAdapter(), dspy.JSONAdapter()], ids=["chat", "json"])
def test_the_responder_sees_the_call_and_typed_answers_parse(adapter):
    seen = []

    def responder(call):
        seen.append(call)
        return {"answer": "Paris", "confidence": 0.75, "supported": True}

    with dspy.context(lm=scripted_lm(responder), adapter=adapter):
        prediction = dspy.Predict(Grounded)(question="Capital of France?", passages=["Paris is the capital.", "Lyon"])
    assert (prediction.answer, prediction.confidence, prediction.supported) == ("Paris", 0.75, True)
    (call,) = seen
    assert call.instructions == "Answer from the passages.\nSay 'unknown' when they do not tell."
    assert call.inputs == {"question": "Capital of France?", "passages": '["Paris is the capital.", "Lyon"]'}
    assert call.output_fields == ["answer", "confidence", "supported"]
    assert call.adapter == ("json" if isinstance(adapter, dspy.JSONAdapter) else "chat") and not call.raw


def test_json_answers_keep_their_types():
    lm = scripted_lm(lambda call: {"answer": 'say "hi"', "confidence": 0.75, "supported": True})
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        dspy.Predict(Grounded)(question="q", passages=[])
    assert json.loads(lm.history[-1]["outputs"][0]) == {"answer": 'say "hi"', "confidence": 0.75, "supported": True}


def test_raw_prompts_reach_the_responder_verbatim():
    seen = []
    lm = scripted_lm(lambda call: seen.append(call) or "continued")
    assert lm("### Instruction:\nHi\n\n### Response:\n") == ["continued"]
    assert seen[0].raw and seen[0].adapter == "raw" and seen[0].prompt == "### Instruction:\nHi\n\n### Response:\n"


def test_calls_are_counted_and_repeats_come_from_the_cache():
    lm = scripted_lm(echo)
    with dspy.context(lm=lm):
        answers = [dspy.Predict(QA)(question=q).answer for q in ("a", "b", "a")]
    assert answers == ["A", "B", "A"]
    assert lm.engine.count == 2 and [call.inputs["question"] for call in lm.engine.calls] == ["a", "b"]


def test_each_scripted_lm_answers_for_itself():
    first, second = scripted_lm(lambda call: {"answer": "first"}), scripted_lm(lambda call: {"answer": "second"})
    assert first.model != second.model
    for lm, expected in ((first, "first"), (second, "second")):
        with dspy.context(lm=lm):
            assert dspy.Predict(QA)(question="same prompt").answer == expected


def test_faults_are_seeded_and_retried():
    faults = Faults(timeout=0.1, rate_limit=0.2, server_error=0.1, seed=11)
    runs = []
    for _ in range(2):
        lm = scripted_lm(echo, faults=faults, num_retries=10)
        with dspy.context(lm=lm):
            answers = [dspy.Predict(QA)(question=f"q{i}").answer for i in range(40)]
        assert answers == [f"Q{i}" for i in range(40)]
        runs.append(list(lm.engine.faulted))
        assert lm.engine.count == 40 + len(lm.engine.faulted)
    assert runs[0] == runs[1]
    assert set(runs[0]) == {"timeout", "rate_limit", "server_error"}
    rng = random.Random(0)
    share = sum(faults.draw(rng) is not None for _ in range(5000)) / 5000
    assert share == pytest.approx(0.4, abs=0.03)


def test_unparseable_fault_fails_both_adapters():
    lm = scripted_lm(echo, faults=Faults(unparseable=1.0))
    with dspy.context(lm=lm):
        with pytest.raises(AdapterParseError):
            dspy.Predict(QA)(question="q")
    assert lm.engine.count == 2  # ChatAdapter, then its JSONAdapter fallback


def test_timeouts_exhaust_the_retries():
    lm = scripted_lm(echo, faults=Faults(timeout=1.0), num_retries=2)
    with dspy.context(lm=lm):
        with pytest.raises(LMTimeoutError):
            dspy.Predict(QA)(question="q")
    assert lm.engine.count == 3 and lm.engine.faulted == ["timeout"] * 3


def test_latency():
    lm = scripted_lm(echo, latency=0.2)
    started = time.perf_counter()
    with dspy.context(lm=lm):
        dspy.Predict(QA)(question="slow")
    assert time.perf_counter() - started >= 0.2


def test_a_responder_must_answer_the_output_fields():
    with dspy.context(lm=scripted_lm(lambda call: {"reply": "x"})):
        with pytest.raises(LMUnexpectedError, match=r"missing \['answer'\], unknown \['reply'\]"):
            dspy.Predict(QA)(question="q")


def test_logprobs_only_when_asked():
    answer = {"answer": Scripted("Paris", 0.25)}
    with dspy.context(lm=scripted_lm(lambda call: answer)):
        assert dspy.Predict(QA)(question="q").get("logprobs") is None
    with dspy.context(lm=scripted_lm(lambda call: answer, logprobs=True)):
        prediction = dspy.Predict(QA)(question="q")
    assert [(t.token, t.prob) for t in field_logprobs(prediction, "answer")] == [("Paris", pytest.approx(0.25))]


def test_async_calls_use_the_same_engine():
    lm = scripted_lm(echo)

    async def ask():
        with dspy.context(lm=lm):
            return await dspy.Predict(QA).acall(question="async")

    assert asyncio.run(ask()).answer == "ASYNC" and lm.engine.count == 1


def test_isolated_cache():
    outer = dspy.cache
    lm = scripted_lm(echo)
    with isolated_cache() as cache:
        assert dspy.cache is cache and cache is not outer
        with dspy.context(lm=lm):
            dspy.Predict(QA)(question="q")
            dspy.Predict(QA)(question="q")
        assert lm.engine.count == 1
    with isolated_cache(enabled=False), dspy.context(lm=lm):
        dspy.Predict(QA)(question="q")
        dspy.Predict(QA)(question="q")
    assert lm.engine.count == 3 and dspy.cache is outer


def test_a_deep_copied_program_shares_the_engine():
    engine = ScriptedEngine(echo)
    program = dspy.Predict(QA)
    program.lm = dspy.LM("scripted/deepcopy-test", engine=engine)
    assert copy.deepcopy(program).lm.engine is engine


# --- the loopback server -----------------------------------------------------------------------


def test_server_chat_wire_format():
    def responder(call):
        return {"answer": Tokens([("Yes", 0.6, {"No": 0.3, "Maybe": 0.1})])}

    with OpenAICompatibleServer(responder) as server:
        assert server.url.startswith("http://127.0.0.1:") and server.url.endswith("/v1")
        with urllib.request.urlopen(server.url + "/models", timeout=5) as response:
            assert json.loads(response.read())["data"][0]["id"] == "scripted"
        system = (
            "Your input fields are:\n1. `question` (str):\n"
            "Your output fields are:\n1. `answer` (str):\n"
            "All interactions will be structured ..."
        )
        messages = [{"role": "system", "content": system}, {"role": "user", "content": "[[ ## question ## ]]\nOK?"}]
        body = {"model": "m", "messages": messages, "logprobs": True, "top_logprobs": 2}
        reply = post(server.url + "/chat/completions", body)
    assert server.requests == [{"path": "/v1/chat/completions", "body": body}]
    assert server.engine.calls[0].inputs == {"question": "OK?"}
    choice = reply["choices"][0]
    assert choice["message"]["content"] == "[[ ## answer ## ]]\nYes\n\n[[ ## completed ## ]]"
    assert choice["finish_reason"] == "stop"
    content = choice["logprobs"]["content"]
    assert "".join(item["token"] for item in content) == choice["message"]["content"]
    (yes,) = [item for item in content if item["token"] == "Yes"]
    assert yes["bytes"] == [89, 101, 115] and yes["logprob"] == pytest.approx(math.log(0.6))
    top = [(item["token"], round(math.exp(item["logprob"]), 6)) for item in yes["top_logprobs"]]
    assert top == [("Yes", 0.6), ("No", 0.3)]
    assert all(item["logprob"] == 0.0 for item in content if item["token"] != "Yes")
    assert reply["usage"]["completion_tokens"] == len(content)


def test_server_completions_honour_stop_and_max_tokens():
    with OpenAICompatibleServer(lambda call: Scripted(" Paris is nice. More text", 0.5)) as server:
        stopped = post(server.url + "/completions", {"model": "m", "prompt": "Q:", "stop": ["."], "logprobs": 1})
        limited = post(server.url + "/completions", {"model": "m", "prompt": "Q:", "max_tokens": 2})
    choice = stopped["choices"][0]
    assert choice["text"] == " Paris is nice" and choice["finish_reason"] == "stop"
    assert choice["logprobs"]["tokens"] == [" Paris", " is", " nice"]
    assert choice["logprobs"]["token_logprobs"] == [pytest.approx(math.log(0.5))] * 3
    assert choice["logprobs"]["top_logprobs"][0] == {" Paris": pytest.approx(math.log(0.5))}
    assert choice["logprobs"]["text_offset"] == [0, 6, 9]
    assert limited["choices"][0]["text"] == " Paris is" and limited["choices"][0]["finish_reason"] == "length"
    assert limited["choices"][0]["logprobs"] is None
    assert server.engine.calls[0].raw and server.engine.calls[0].prompt == "Q:"


def test_server_faults_become_http_errors():
    with OpenAICompatibleServer(echo, faults=Faults(rate_limit=1.0, retry_after=0.5)) as server:
        with pytest.raises(urllib.error.HTTPError) as caught:
            post(server.url + "/completions", {"model": "m", "prompt": "Q:"})
    assert caught.value.code == 429 and caught.value.headers["Retry-After"] == "0.5"


def test_server_binds_loopback_only():
    with pytest.raises(ValueError, match="loopback"):
        OpenAICompatibleServer(echo, host="0.0.0.0")
