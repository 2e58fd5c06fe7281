"""FLARE and FLARE-instruct on HotpotQA: the retrieval share grows with theta, and `arag eval` runs both over a
loopback OpenAI-compatible server, reading the token log-probabilities it returns."""

import random
import uuid
import zlib

import dspy
import pytest
import ujson
from click.testing import CliRunner
from test_flare import sentences, spelled

from arag.cli import main
from arag.data import load_examples
from arag.data.corpus import load_corpus
from arag.programs.flare.flare import FLARE
from arag.programs.frame.sentences import split_sentences
from arag.retrievers import BM25Retriever
from arag.testing import OpenAICompatibleServer, Scripted, scripted_lm, tokenize
from arag.trace import Sentence, Write, is_step


@pytest.fixture(scope="module")
def built_indexes():
    """BM25 indexes built once per module, by corpus folder."""
    return {}


@pytest.fixture
def hotpot(shared_dataset, built_indexes, tmp_path_factory):
    folder = shared_dataset("hotpotqa")
    if folder not in built_indexes:
        corpus = load_corpus(folder / "corpus.jsonl")
        built_indexes[folder] = BM25Retriever.build(corpus, tmp_path_factory.mktemp("hotpot") / "bm25")
    return folder, built_indexes[folder]


def hotpot_writer(call):
    """A fixed LM that ignores the passages: four sentences per question, with per-token probabilities
    drawn from a generator seeded by the question and the sentence's position."""
    if "continuation" not in call.output_fields:
        return {f: "A follow-up?" if f == "question" else "unused" for f in call.output_fields}
    question, done = call.inputs["question"], len(split_sentences(call.inputs["answer_so_far"]))
    plan = [f"The question is about {question.split()[-1].strip('?')}.", "The first passage names someone.",
            "The second passage connects them.", "So the answer is unknown."]
    if done >= len(plan):
        return {"continuation": ""}
    rng = random.Random(zlib.crc32(f"{question}|{done}".encode()))
    text = plan[done]
    # mostly confident tokens; 0.0005 off the thousandths, so that none sits at a tested theta or rounds onto one
    probs = [round(min(rng.betavariate(5, 1), 0.998), 3) + 0.0005 for _ in tokenize(text)]
    return {"continuation": Scripted(text, probs)}


def test_retrieval_share_grows_with_theta_on_hotpotqa(hotpot):
    folder, index = hotpot
    questions = load_examples(folder / "public.jsonl", limit=24)
    lm = scripted_lm(hotpot_writer)
    shares = []
    for theta in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0):
        program = FLARE(index, theta=theta)
        decisions = []
        with dspy.context(lm=lm):
            for example in questions:
                steps = sentences(program(question=example.question))
                assert [s["retrieved"] for s in steps] == [s["min_prob"] <= theta for s in steps]
                decisions += [s["retrieved"] for s in steps]
        assert len(decisions) == 4 * len(questions)
        shares.append(sum(decisions) / len(decisions))
    assert shares == sorted(shares)
    assert shares[0] == 0.0 and shares[-1] == 1.0 and len(set(shares)) >= 5


def run_eval(program, folder, index, out, server, *params):
    result = CliRunner().invoke(main, [
        "eval", "--program", program, "--dataset", str(folder / "public.jsonl"), "--retriever", str(index.index_dir),
        "--lm", f"openai/loopback-{uuid.uuid4().hex}", "--api-base", server.url, "--limit", "3", "--out", str(out),
        *[arg for param in params for arg in ("--param", param)],
    ], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = [ujson.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and not any("error" in row for row in rows)
    return rows


def test_arag_eval_runs_flare_over_a_loopback_server(hotpot, tmp_path, monkeypatch):
    monkeypatch.setenv("ARAG_HOME", str(tmp_path / "home"))
    folder, index = hotpot
    with OpenAICompatibleServer(hotpot_writer) as server:
        rows = run_eval("flare", folder, index, tmp_path / "flare", server, "theta=0.6", "query_mode=masked")
        chat = [r["body"] for r in server.requests if r["path"].endswith("/chat/completions")]
    assert chat and all(body["logprobs"] is True for body in chat)
    for row in rows:
        steps = [s for s in row["trace"] if is_step(s, Sentence)]
        assert len(steps) == 4 and row["prediction"] == "unknown"
        assert [s["retrieved"] for s in steps] == [s["min_prob"] <= 0.6 for s in steps]
        assert all(spelled(s["lookahead_tokens"]) == s["lookahead"] for s in steps)  # read from the server's logprobs
        assert [min(p for _, p in s["lookahead_tokens"]) for s in steps] == [s["min_prob"] for s in steps]
        assert row["retrieval_calls"] == 1 + sum(s["retrieved"] for s in steps)
        assert row["lm_calls"] == 4 + sum(s["retrieved"] for s in steps)
        assert row["outputs"]["long_answer"].endswith("So the answer is unknown.")
    assert {s["retrieved"] for row in rows for s in row["trace"] if is_step(s, Sentence)} == {True, False}


def test_arag_eval_runs_flare_instruct_over_a_loopback_server(hotpot, tmp_path, monkeypatch):
    monkeypatch.setenv("ARAG_HOME", str(tmp_path / "home"))
    folder, index = hotpot

    def searcher(call):
        if call.inputs["answer_so_far"]:
            return {"continuation": "who was born there. So the answer is unknown."}
        return {"continuation": f"It is about [Search({call.inputs['question'][:30]})] and more"}

    with OpenAICompatibleServer(searcher) as server:
        rows = run_eval("flare-instruct", folder, index, tmp_path / "instruct", server)
    for row in rows:
        writes = [s for s in row["trace"] if is_step(s, Write)]
        assert [w["search"] is not None for w in writes] == [True, False]
        assert row["retrieval_calls"] == 2 and row["lm_calls"] == 2 and row["prediction"] == "unknown"
