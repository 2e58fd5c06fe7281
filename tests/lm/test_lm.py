"""arag.lm: building LMs, reading log-probabilities in every shape DSPy hands back, raw completions."""

import ast
import json
import math
import pickle
import subprocess
import sys
from pathlib import Path

import dspy
import pytest
from dspy.utils.exceptions import (
    LMInvalidRequestError,
    LMTimeoutError,
    LMTransportError,
    LMUnsupportedFeatureError,
)

from arag.errors import ConfigError, LMError
from arag.lm import (
    CompletionsEngine,
    TokenLogprob,
    build_lm,
    complete_raw,
    completion_logprobs,
    completions_lm,
    field_logprobs,
    label_probabilities,
    raw_prompt_lm,
    require_lm,
)
from arag.testing import Faults, OpenAICompatibleServer, Scripted, Tokens, isolated_cache, scripted_lm

SELF_RAG_PROMPT = (
    "### Instruction:\nIs Paris in France?\n\n### Response:\n[Retrieval]<paragraph>Paris is the capital.</paragraph>\n"
)


class QA(dspy.Signature):
    """Answer the question."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField()


def verbatim_lm(pieces):
    """An LM on a custom engine whose whole completion is exactly these (token, prob[, alternatives]) pieces."""
    return scripted_lm(lambda call: Tokens(pieces), logprobs=True, top_logprobs=5)


def tokens_and_probs(tokens):
    return [(token.token, round(token.prob, 6)) for token in tokens]


# --- build_lm / require_lm ---------------------------------------------------------------------


def test_build_lm_refuses_a_model_without_provider_prefix():
    with pytest.raises(ConfigError, match=r"provider/model.*openai/gpt-4o-mini"):
        build_lm("gpt-4o-mini")


def test_build_lm_refuses_top_logprobs_without_logprobs():
    with pytest.raises(ConfigError, match="logprobs=True"):
        build_lm("openai/m", api_base="http://127.0.0.1:1/v1", top_logprobs=3)


def test_build_lm_names_the_missing_key_variable(monkeypatch):
    monkeypatch.delenv("ARAG_TEST_KEY", raising=False)
    with pytest.raises(ConfigError, match="ARAG_TEST_KEY is not set"):
        build_lm("openai/gpt-4o-mini", api_key_env="ARAG_TEST_KEY")


def test_build_lm_uses_the_key_but_never_shows_or_saves_it(monkeypatch):
    secret = "sk-test-very-secret-0123456789"
    monkeypatch.setenv("ARAG_TEST_KEY", secret)
    lm = build_lm(
        "openai/m", api_base="http://127.0.0.1:1/v1", api_key_env="ARAG_TEST_KEY", logprobs=True, top_logprobs=4
    )
    assert lm.kwargs["api_key"] == secret
    assert lm.kwargs["logprobs"] is True and lm.kwargs["top_logprobs"] == 4
    assert lm.kwargs["temperature"] == 0.0
    for shown in (repr(lm), str(lm), json.dumps(lm.dump_state())):
        assert secret not in shown


def test_build_lm_gives_a_local_server_a_placeholder_key(monkeypatch):
    monkeypatch.delenv("ARAG_TEST_KEY", raising=False)
    lm = build_lm("openai/m", api_base="http://127.0.0.1:1/v1", api_key_env="ARAG_TEST_KEY")
    assert lm.kwargs["api_key"] and lm.kwargs["api_base"] == "http://127.0.0.1:1/v1"


def test_require_lm_explains_how_to_configure_one():
    with dspy.context(lm=None):
        with pytest.raises(ConfigError) as caught:
            require_lm()
    message = str(caught.value)
    assert "dspy.configure(lm=" in message and "--lm openai/MODEL" in message and "OPENAI_API_KEY" in message
    lm = scripted_lm(lambda call: "x")
    with dspy.context(lm=lm):
        assert require_lm() is lm


# --- field_logprobs on a custom engine, tokens chosen by hand ------------------------------------


def test_field_logprobs_chat_includes_partial_tokens_and_drops_edge_whitespace():
    lm = verbatim_lm([
        ("[[ ## answer ## ]]", 1.0), ("\nPar", 0.5), ("is", 0.8), (" is", 0.9), (" big", 0.6),
        ("\n\n", 1.0), ("[[ ## completed ## ]]", 1.0),
    ])
    with dspy.context(lm=lm):
        prediction = dspy.Predict(QA)(question="What?")
    assert prediction.answer == "Paris is big"
    expected = [("\nPar", 0.5), ("is", 0.8), (" is", 0.9), (" big", 0.6)]
    assert tokens_and_probs(field_logprobs(prediction, "answer")) == expected
    assert len(completion_logprobs(prediction)) == 7


def test_field_logprobs_chat_multi_field():
    lm = verbatim_lm([
        ("[[ ## reasoning ## ]]", 1.0), ("\n", 1.0), ("It", 0.9), (" is", 0.8), (" the", 0.7), (" capital", 0.6),
        (".", 0.5), ("\n\n", 1.0), ("[[ ## answer ## ]]", 1.0), ("\n", 1.0), ("Paris", 0.3), ("\n\n", 1.0),
        ("[[ ## completed ## ]]", 1.0),
    ])
    with dspy.context(lm=lm):
        prediction = dspy.ChainOfThought(QA)(question="Capital of France?")
    assert prediction.reasoning == "It is the capital." and prediction.answer == "Paris"
    assert tokens_and_probs(field_logprobs(prediction, "reasoning")) == [
        ("It", 0.9), (" is", 0.8), (" the", 0.7), (" capital", 0.6), (".", 0.5)
    ]
    assert tokens_and_probs(field_logprobs(prediction, "answer")) == [("Paris", 0.3)]


def test_field_logprobs_json_with_escapes_and_a_token_spanning_quotes():
    lm = verbatim_lm([
        ('{"', 1.0), ("reasoning", 1.0), ('":', 1.0), (' "', 1.0), ("He", 0.9), (" said", 0.8), (' \\"', 0.7),
        ("hi", 0.6), ('\\"', 0.5), ('",', 1.0), (' "answer', 1.0), ('":', 1.0),
        (' "Yes"}', 0.7, {' "No"}': 0.2, ' "yes"}': 0.05}),
    ])
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        prediction = dspy.ChainOfThought(QA)(question="Did he greet?")
    assert prediction.reasoning == 'He said "hi"' and prediction.answer == "Yes"
    # The tokens spell the parsed value: escapes decoded, the quotes around the value left out.
    assert tokens_and_probs(field_logprobs(prediction, "reasoning")) == [
        ("He", 0.9), (" said", 0.8), (' "', 0.7), ("hi", 0.6), ('"', 0.5)
    ]
    assert "".join(t.token for t in field_logprobs(prediction, "reasoning")) == prediction.reasoning
    assert tokens_and_probs(field_logprobs(prediction, "answer")) == [("Yes", 0.7)]
    # Quote and brace around the label are stripped from every candidate: Yes 0.7 + 0.05, No 0.2.
    probabilities = label_probabilities(prediction, "answer", ["Yes", "No"])
    assert probabilities == pytest.approx({"Yes": 0.75 / 0.95, "No": 0.2 / 0.95})


def test_field_logprobs_json_reads_a_quote_the_model_left_unescaped_as_part_of_the_string():
    """What the local engine's lenient grammar lets through (the 1.5B model quoting a phrase in its reasoning):
    a quote followed by a word, or by a space and a word, is inside the string; one followed by `,` ends it."""
    lm = verbatim_lm([
        ('{\n  "', 1.0), ("reasoning", 1.0), ('": "', 1.0), ("Described", 0.9), (' as "', 0.8), ("companion", 0.7),
        (' books." ', 0.6), ("Therefore", 0.5), (".", 1.0), ('",\n  "', 1.0), ("answer", 1.0), ('": "', 1.0),
        ("Anim", 0.4), ("orphs", 0.9), ('"\n}', 1.0),
    ])
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        prediction = dspy.ChainOfThought(QA)(question="Which series?")
    assert prediction.reasoning == 'Described as "companion books." Therefore.' and prediction.answer == "Animorphs"
    assert "".join(t.token for t in field_logprobs(prediction, "reasoning")) == prediction.reasoning
    assert tokens_and_probs(field_logprobs(prediction, "answer")) == [("Anim", 0.4), ("orphs", 0.9)]


def test_field_logprobs_drops_whitespace_tokens_at_the_ends_of_a_json_string():
    lm = verbatim_lm([('{"answer": "', 1.0), (" ", 0.9), ("Paris", 0.8), (" ", 0.7), ('"}', 1.0)])
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        prediction = dspy.Predict(QA)(question="What?")
    assert tokens_and_probs(field_logprobs(prediction, "answer")) == [("Paris", 0.8)]


def test_field_logprobs_names_a_field_the_completion_lacks():
    lm = verbatim_lm([("[[ ## answer ## ]]", 1.0), ("\nParis", 0.5)])
    with dspy.context(lm=lm):
        prediction = dspy.Predict(QA)(question="What?")
    with pytest.raises(LMError, match="'verdict' is not in the completion"):
        field_logprobs(prediction, "verdict")


def test_missing_logprobs_say_how_to_enable_them():
    lm = scripted_lm(lambda call: {"answer": "Paris"})
    with dspy.context(lm=lm):
        prediction = dspy.Predict(QA)(question="What?")
        with pytest.raises(LMError, match=rf"{lm.model}.*logprobs=True"):
            field_logprobs(prediction, "answer")


def test_completion_logprobs_reads_dict_shapes():
    top = [{"token": "A", "logprob": -1.0}, {"token": "B", "logprob": -2.0}]
    raw = {"content": [{"token": "A", "logprob": -1.0, "top_logprobs": top}]}
    assert completion_logprobs({"text": "A", "logprobs": raw}) == [TokenLogprob("A", -1.0, (("A", -1.0), ("B", -2.0)))]
    assert completion_logprobs(raw)[0].prob == pytest.approx(math.exp(-1.0))


# --- label_probabilities -----------------------------------------------------------------------


def label_prediction(first_token):
    lm = verbatim_lm([("[[ ## answer ## ]]", 1.0), ("\n", 1.0), first_token, ("\n\n[[ ## completed ## ]]", 1.0)])
    with dspy.context(lm=lm):
        return dspy.Predict(QA)(question="Supported?")


def test_label_probabilities_sums_variants_and_normalises():
    prediction = label_prediction(("Yes", 0.6, {" yes": 0.1, "No": 0.2, "Maybe": 0.05}))
    # Yes: 0.6 + 0.1, No: 0.2, Maybe is not a label; normalised over 0.9.
    expected = {"Yes": 0.7 / 0.9, "No": 0.2 / 0.9}
    assert label_probabilities(prediction, "answer", ["Yes", "No"]) == pytest.approx(expected)


def test_label_probabilities_matches_first_token_prefixes():
    prediction = label_prediction(("Part", 0.5, {"Fully": 0.3, "No": 0.1, "P": 0.05}))
    labels = ["Fully supported", "Partially supported", "No support", "Perhaps"]
    # "P" begins two labels and counts for neither.
    assert label_probabilities(prediction, "answer", labels) == pytest.approx(
        {"Fully supported": 0.3 / 0.9, "Partially supported": 0.5 / 0.9, "No support": 0.1 / 0.9, "Perhaps": 0.0}
    )


def test_label_probabilities_all_zero_when_no_label_matches():
    prediction = label_prediction(("Maybe", 0.9, {"Perhaps": 0.1}))
    assert label_probabilities(prediction, "answer", ["Yes", "No"]) == {"Yes": 0.0, "No": 0.0}


def test_label_probabilities_needs_top_logprobs():
    lm = scripted_lm(lambda call: {"answer": "Yes"}, logprobs=True)
    with dspy.context(lm=lm):
        prediction = dspy.Predict(QA)(question="Supported?")
    with pytest.raises(LMError, match="top_logprobs"):
        label_probabilities(prediction, "answer", ["Yes", "No"])


# --- the native engine and the LiteLLM fallback, against the loopback server -------------------


def reasoned_answer(call):
    return {"reasoning": Scripted("Because it is.", [0.9, 0.8, 0.7, 0.6]), "answer": Scripted('say "hi"', 0.5)}


@pytest.mark.parametrize("adapter", [dspy.ChatAdapter(), dspy.JSONAdapter()], ids=["chat", "json"])
@pytest.mark.parametrize("route", ["native", "litellm"])
def test_field_logprobs_through_an_openai_compatible_server(route, adapter):
    extra = {"extra_body": {"arag_probe": 1}} if route == "litellm" else {}
    with OpenAICompatibleServer(reasoned_answer) as server:
        model = f"openai/{route}-{type(adapter).__name__}"
        lm = build_lm(model, api_base=server.url, logprobs=True, top_logprobs=5, **extra)
        with dspy.context(lm=lm, adapter=adapter):
            prediction = dspy.ChainOfThought(QA)(question="What does he say?")
    body = server.requests[-1]["body"]
    assert body["logprobs"] is True and body["top_logprobs"] == 5
    # The native engine hands back plain dicts; the LiteLLM fallback (taken for extra_body) its own objects.
    assert type(prediction.logprobs).__module__.startswith("litellm") == (route == "litellm")
    assert prediction.answer == 'say "hi"'
    expected = [("say", 0.5), (' "', 0.5), ("hi", 0.5), ('"', 0.5)]  # the value, whatever the adapter
    assert tokens_and_probs(field_logprobs(prediction, "answer")) == expected
    assert tokens_and_probs(field_logprobs(prediction, "reasoning")) == [
        ("Because", 0.9), (" it", 0.8), (" is", 0.7), (".", 0.6)
    ]


# --- CompletionsEngine -------------------------------------------------------------------------


def continuation(call):
    return Tokens([(" Yes", 0.8, {" No": 0.15}), (",", 0.5), (" it", 0.9), (" is", 0.9), (".", 1.0), (" More", 0.4)])


def test_completions_engine_sends_the_exact_prompt_and_returns_logprobs():
    with OpenAICompatibleServer(continuation) as server:
        lm = completions_lm("raw-model", server.url)
        text, tokens = complete_raw(lm, SELF_RAG_PROMPT, top_logprobs=2, stop=["."])
        assert complete_raw(lm, SELF_RAG_PROMPT, top_logprobs=2, stop=["."]) == (text, tokens)
    assert len(server.requests) == 1  # the repeated call came from DSPy's cache
    request = server.requests[0]
    assert request["path"] == "/v1/completions"
    assert request["body"]["prompt"] == SELF_RAG_PROMPT
    assert request["body"]["model"] == "raw-model" and request["body"]["logprobs"] == 2
    assert text == " Yes, it is"
    assert tokens_and_probs(tokens) == [(" Yes", 0.8), (",", 0.5), (" it", 0.9), (" is", 0.9)]
    assert [(token, round(math.exp(logprob), 6)) for token, logprob in tokens[0].top] == [(" Yes", 0.8), (" No", 0.15)]


def test_completions_engine_honours_max_tokens():
    with OpenAICompatibleServer(continuation) as server:
        text, tokens = complete_raw(completions_lm("raw-max", server.url), "Q:", max_tokens=2)
    assert text == " Yes," and len(tokens) == 2


def test_completions_engine_retries_rate_limits_and_server_errors():
    faults = Faults(rate_limit=0.3, server_error=0.2, seed=5)
    with OpenAICompatibleServer(continuation, faults=faults) as server:
        lm = completions_lm("raw-faults", server.url, num_retries=8)
        answers = [complete_raw(lm, f"Q{i}:")[0] for i in range(8)]
    assert answers == [" Yes, it is. More"] * 8
    assert server.engine.faulted and server.engine.count == 8 + len(server.engine.faulted)


def test_completions_engine_maps_errors():
    def broken(call):
        raise RuntimeError("no script for this prompt")

    with OpenAICompatibleServer(broken) as server:
        with pytest.raises(LMInvalidRequestError, match="no script for this prompt"):
            complete_raw(completions_lm("raw-400", server.url), "Q:")
        assert server.engine.count == 1  # a 400 is not retried
    with OpenAICompatibleServer(continuation, latency=0.5) as server:
        lm = dspy.LM("completions/slow", engine=CompletionsEngine(server.url, "slow", timeout=0.2), num_retries=0)
        with pytest.raises(LMTimeoutError):
            complete_raw(lm, "Q:")
    with pytest.raises(LMTransportError):
        complete_raw(completions_lm("raw-closed", server.url, num_retries=0), "Q:")


def test_completions_engine_refuses_adapter_prompts():
    with OpenAICompatibleServer(continuation) as server:
        adapter = dspy.ChatAdapter(use_json_adapter_fallback=False)
        with dspy.context(lm=completions_lm("raw-chat", server.url), adapter=adapter):
            with pytest.raises(LMUnsupportedFeatureError, match="complete_raw"):
                dspy.Predict(QA)(question="What?")
    assert server.requests == []


def test_completions_lm_saves_without_the_key(monkeypatch):
    secret = "sk-completions-secret-42"
    monkeypatch.setenv("ARAG_TEST_KEY", secret)
    with OpenAICompatibleServer(continuation) as server:
        lm = completions_lm("raw-saved", server.url, api_key_env="ARAG_TEST_KEY")
        state = lm.dump_state()
        assert secret not in json.dumps(state)
        loaded = dspy.LM.load_state(state, allow_custom_lm_class=True)
        assert complete_raw(loaded, "Q:")[0] == " Yes, it is. More"


def test_two_servers_under_one_model_name_never_answer_for_each_other_from_the_cache():
    """DSPy's cache key leaves the address out; arag keys runs by the endpoint too."""
    with isolated_cache(), OpenAICompatibleServer(lambda call: {"answer": "from A"}) as first, \
            OpenAICompatibleServer(lambda call: {"answer": "from B"}) as second:
        answers = []
        for server in (first, second, first):
            lm = build_lm("openai/same-name", api_base=server.url)
            with dspy.context(lm=lm):
                answers.append(dspy.Predict("question -> answer")(question="Which server?").answer)
        assert answers == ["from A", "from B", "from A"]
        assert len(first.requests) == 1 and len(second.requests) == 1  # the third call came from the cache


def test_importing_arag_registers_nothing_and_build_lm_declares_the_provider_it_needs():
    script = (
        "import arag, dspy\n"
        "before = [p.id for p in dspy.lm15.registered_providers()]\n"
        "lm = arag.build_lm('openai/m', api_base='http://127.0.0.1:9/v1')\n"
        "print(before, lm.model, [p.id for p in dspy.lm15.registered_providers()])\n"
    )
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert shown.split() == ["[]", "openai-compatible/m", "['openai-compatible']"]


def test_raw_prompt_lm_shares_one_completions_twin_per_server_and_setting():
    chat = build_lm("openai/m", api_base="http://127.0.0.1:9/v1")
    raw = raw_prompt_lm(chat)
    assert raw.model == "completions/m" and raw_prompt_lm(chat) is raw and raw_prompt_lm(raw) is raw
    special = raw_prompt_lm(raw, keep_special_tokens=True)
    assert special.engine.keep_special_tokens and special is raw_prompt_lm(chat, keep_special_tokens=True)
    copied = pickle.loads(pickle.dumps(special.engine))
    assert type(copied) is CompletionsEngine and copied.dump_state() == special.engine.dump_state()


def test_the_lm_package_has_no_import_circle():
    """Every import between arag.lm's modules, inside functions too, points one way."""
    folder = Path(__file__).resolve().parents[2] / "arag" / "lm"
    names = {path.stem for path in folder.glob("*.py")} - {"__init__"}
    graph = {}
    for name in names:
        tree = ast.parse((folder / f"{name}.py").read_text())
        found = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        found |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        assert "arag.lm" not in found, f"{name} imports the package that imports it"
        graph[name] = {module.removeprefix("arag.lm.") for module in found} & names
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import circle: {' -> '.join((*path, name))}"
        if name not in done:
            for imported in graph[name]:
                visit(imported, (*path, name))
            done.add(name)

    for name in sorted(names):
        visit(name, ())


@pytest.mark.parametrize(("kept", "prompt", "reused"), [
    ([], [1, 2, 3], 0),                  # a fresh model evaluates the whole prompt
    ([1, 2, 9, 9], [1, 2, 3, 4], 2),     # the shared prefix is kept
    ([1, 2, 3, 4, 5], [1, 2, 3], 2),     # a prompt held whole: its last token is evaluated again for its logits
    ([7, 2, 3], [1, 2, 3], 0),           # nothing is kept after the first difference
])
def test_the_reused_prefix_is_what_llama_cpp_keeps_of_its_kv_cache(kept, prompt, reused):
    from arag.lm.local import reused_prefix

    assert reused_prefix(kept, prompt) == reused
