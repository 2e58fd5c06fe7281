"""Compiled programs on disk: saved with their name and parameters, reloaded to the same program."""

import hashlib
import os
import subprocess
import sys
import uuid

import dspy
import pytest
import ujson

from arag.data import load_corpus, load_examples, sample_paths
from arag.errors import ConfigError, DataError
from arag.optimizers.compile import compile
from arag.optimizers.saving import load_program, portable_state, read_compiled, save_program
from arag.programs import build_program
from arag.retrievers import BM25Retriever
from arag.testing import OpenAICompatibleServer, scripted_lm

QUESTIONS, CORPUS = sample_paths()
EXAMPLES = load_examples(QUESTIONS)
GOLD = {e.question: e.answers[0] for e in EXAMPLES}


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    return BM25Retriever.build(load_corpus(CORPUS), tmp_path_factory.mktemp("idx") / "bm25")


def knows_the_answers(call):
    answer = GOLD.get(call.inputs.get("question"), "?")
    return {f: answer if f == "answer" else "From the passages." for f in call.output_fields}


def prompt_digest(call):
    """Answers with a digest of the whole prompt: equal answers mean equal prompts (demos included)."""
    digest = hashlib.sha256(call.prompt.encode()).hexdigest()[:12]
    return {f: digest if f == "answer" else "." for f in call.output_fields}


@pytest.fixture(scope="module")
def compiled(retriever):
    lm = scripted_lm(knows_the_answers, logprobs=True, top_logprobs=2)
    with dspy.context(lm=lm):
        return compile(build_program("single-rag", retriever, k=3), EXAMPLES[:6], teleprompter="bootstrap",
                       max_bootstrapped_demos=2, max_labeled_demos=3)


def test_a_compiled_program_saved_and_reloaded_gives_identical_predictions_and_parameters(compiled, retriever,
                                                                                         tmp_path):
    path = save_program(compiled, tmp_path / "single-rag.json", meta={"teleprompter": "bootstrap"})
    loaded = load_program(path, retriever)

    assert type(loaded) is type(compiled) and loaded.config == compiled.config == {"k": 3, "reasoning": "cot"}
    assert loaded.k == 3
    assert loaded.dump_state() == portable_state(compiled.dump_state())
    demos = loaded.generate_answer.predict.demos
    assert len(demos) == 3 and sum(bool(d.get("augmented")) for d in demos) == 2

    lm = scripted_lm(prompt_digest)
    questions = [e.question for e in EXAMPLES[8:12]]
    with dspy.context(lm=lm):
        before = [compiled(question=q).answer for q in questions]
        after = [loaded(question=q).answer for q in questions]
        uncompiled = [build_program("single-rag", retriever, k=3)(question=q).answer for q in questions]
    assert after == before
    assert not set(uncompiled) & set(before), "the demos did not reach the prompts"


def test_the_file_keeps_name_parameters_and_prompts_but_no_lm_logprobs_or_credentials(compiled, retriever, tmp_path):
    assert "logprobs" in compiled.generate_answer.predict.demos[0], "bootstrapped demos should carry logprobs here"
    compiled = compiled.deepcopy()
    compiled.generate_answer.predict.lm = dspy.LM("openai/gpt-x", api_key="sk-very-secret",
                                                  extra_headers={"Authorization": "Bearer sk-very-secret"})
    path = save_program(compiled, tmp_path / "p.json")
    text = path.read_text()
    assert "sk-very-secret" not in text and "logprobs" not in text and "gpt-x" not in text
    document = ujson.loads(text)
    assert document["format"] == "arag.compiled-program" and document["version"] == 1
    assert document["program"] == "single-rag" and document["params"] == {"k": 3, "reasoning": "cot"}
    assert document["state"]["generate_answer.predict"]["lm"] is None
    assert set(read_compiled(path).state["generate_answer.predict"]) == {"demos", "signature"}
    assert load_program(path, retriever).generate_answer.predict.lm is None


def test_loading_with_overridden_parameters_keeps_the_prompts(compiled, retriever, tmp_path):
    path = save_program(compiled, tmp_path / "p.json")
    loaded = load_program(path, retriever, params={"k": 2})
    assert loaded.config == {"k": 2, "reasoning": "cot"}
    assert loaded.generate_answer.predict.demos == load_program(path, retriever).generate_answer.predict.demos


def test_bad_files_give_clear_errors(compiled, retriever, tmp_path):
    path = save_program(compiled, tmp_path / "p.json")
    with pytest.raises(ConfigError, match="no such compiled program file"):
        load_program(tmp_path / "missing.json", retriever)
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": ')
    with pytest.raises(DataError, match="not valid JSON"):
        load_program(broken, retriever)
    plain = tmp_path / "plain.json"
    compiled.save(str(plain))
    with pytest.raises(DataError, match="not an arag compiled program"):
        load_program(plain, retriever)
    with pytest.raises(ConfigError, match="holds a compiled 'single-rag' program, not 'no-retrieval'"):
        load_program(path, retriever, program="no-retrieval")
    with pytest.raises(DataError, match=r"does not fit program 'single-rag'.*generate_answer\.predict"):
        load_program(path, retriever, params={"reasoning": "direct"})
    with pytest.raises(ConfigError, match="parameter 'k' must be in"):
        load_program(path, retriever, params={"k": 0})
    newer = tmp_path / "newer.json"
    newer.write_text(path.read_text().replace('"version": 1', '"version": 2'))
    with pytest.raises(DataError, match="format version 2"):
        load_program(newer, retriever)
    with pytest.raises(ConfigError, match="needs an arag program"):
        save_program(dspy.Predict("question -> answer"), tmp_path / "x.json")


ATTACKER_URL = "http://127.0.0.1:9/v1"
TAMPERED = [
    ("config sends calls elsewhere", lambda state: state.update(config={"api_base": ATTACKER_URL}),
     r"state\['generate_answer.predict'\] holds 'config'"),
    ("an LM by name", lambda state: state.update(lm={"model": "openai/attacker-choice"}),
     r"\['lm'\] names an LM"),
    ("an LM at an address", lambda state: state.update(lm={"model": "openai/m", "api_base": ATTACKER_URL}),
     r"\['lm'\] names an LM"),
    ("demos as a string", lambda state: state.update(demos="abc"), r"\['demos'\] must be a list of objects"),
    ("a demo that is no object", lambda state: state["demos"].append(1), r"\['demos'\] must be a list of objects"),
    ("traces", lambda state: state.update(traces=[{"x": 1}]), r"\['traces'\] must be empty"),
    ("instructions not text", lambda state: state["signature"].update(instructions=5),
     r"\['instructions'\] must be a string"),
    ("a field too few", lambda state: state["signature"]["fields"].pop(), r"\['fields'\] must be a list of 4 fields"),
    ("a field with more than texts", lambda state: state["signature"]["fields"][0].update(type="x"),
     r"\['fields'\]\[0\] must be an object of strings"),
]


@pytest.mark.parametrize("tamper, message", [case[1:] for case in TAMPERED], ids=[case[0] for case in TAMPERED])
def test_a_tampered_predictor_state_is_refused_naming_the_key(compiled, retriever, tmp_path, tamper, message):
    path = save_program(compiled, tmp_path / "p.json")
    document = ujson.loads(path.read_text())
    tamper(document["state"]["generate_answer.predict"])
    path.write_text(ujson.dumps(document))
    with pytest.raises(DataError, match=message):
        load_program(path, retriever)


def test_a_file_holds_only_its_own_fields_and_no_address_the_caller_did_not_give(compiled, retriever, tmp_path,
                                                                               monkeypatch):
    path = save_program(compiled, tmp_path / "p.json")
    document = ujson.loads(path.read_text())
    path.write_text(ujson.dumps({**document, "lm": {"model": "openai/attacker-choice"}}))
    with pytest.raises(DataError, match="unknown field 'lm'"):
        load_program(path, retriever)
    path.write_text(ujson.dumps({**document, "meta": "abc"}))
    with pytest.raises(DataError, match="field 'meta' is missing or not a dict"):
        load_program(path, retriever)

    monkeypatch.setenv("SERPER_API_KEY", "serper-secret")
    search = f"serper:{ATTACKER_URL}"
    crag = save_program(build_program("crag", retriever, web=search), tmp_path / "crag.json")
    with pytest.raises(DataError, match=r"params\['web'\] names an address \(serper:http://127.0.0.1:9/v1\)"):
        load_program(crag, retriever)
    assert load_program(crag, retriever, params={"web": search}).config["web"] == search


def test_a_tampered_file_cannot_send_the_key_or_the_prompts_to_another_server(compiled, tmp_path):
    """The attack as a user meets it: `arag eval --compiled FILE --api-base MINE` with a key in the environment, a
    file whose state points a predictor at another server. Nothing may reach either server."""
    path = save_program(compiled, tmp_path / "p.json")
    document = ujson.loads(path.read_text())
    with OpenAICompatibleServer(knows_the_answers) as chosen, OpenAICompatibleServer(knows_the_answers) as attacker:
        document["state"]["generate_answer.predict"]["config"] = {"api_base": attacker.url}
        path.write_text(ujson.dumps(document))
        env = {**os.environ, "OPENAI_API_KEY": "sk-user-SECRET", "ARAG_HOME": str(tmp_path / "home")}
        done = subprocess.run(
            [sys.executable, "-m", "arag.cli", "eval", "--compiled", str(path), "--dataset", str(QUESTIONS),
             "--corpus", str(CORPUS), "--lm", f"openai/m-{uuid.uuid4().hex}", "--api-base", chosen.url,
             "--limit", "4", "--out", str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=300)
        assert (attacker.requests, chosen.requests) == ([], [])
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"error: {path}: state['generate_answer.predict'] holds 'config', which a "
                                        "compiled program may not set (only demos and the signature's instructions "
                                        "and field texts)"]
