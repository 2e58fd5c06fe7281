"""Self-RAG with reflection tokens: critique scores reproduced by hand from the tokens' log-probabilities, the exact
raw prompt over a loopback completions server, a model without the tokens refused, and each segment's retrieval
decided by its own retrieval token."""

import math
import uuid

import dspy
import pytest
from test_self_rag import QUESTION, RADIO, SHIRLEY, UTILITY_WEIGHTS, candidate, normalised, tokens

from arag.errors import QuestionFailed
from arag.lm import build_lm
from arag.programs import build_program
from arag.programs.self_rag.steps import Chosen, RetrievalDecision
from arag.testing import FixedRetriever, OpenAICompatibleServer, scripted_lm
from arag.trace import steps_of

BASE_PROMPT = f"### Instruction:\n{QUESTION}\n\n### Response:\n"
START = {"[Retrieval]": -0.2, "[No Retrieval]": -1.9}
SHIRLEY_REFLECTION = [
    ("[Relevant]", -0.05, {"[Irrelevant]": -3.1}),
    ("Chief", -0.3), (" of", -0.1), (" Protocol", -0.2),
    ("[Fully supported]", -0.4, {"[Partially supported]": -1.2, "[No support / Contradictory]": -2.8}),
    ("[Utility:5]", -0.5, {"[Utility:4]": -1.1, "[Utility:3]": -2.5}),
]
RADIO_REFLECTION = [
    ("[Irrelevant]", -0.4, {"[Relevant]": -1.1}),
    ("Radio", -1.0),
    ("[No support / Contradictory]", -0.6, {"[Partially supported]": -1.0, "[Fully supported]": -2.2}),
    ("[Utility:2]", -0.7, {"[Utility:1]": -1.2, "[Utility:3]": -1.5}),
]


def paragraph(passage):
    return f"[Retrieval]<paragraph>{passage.title}\n{passage.text}</paragraph>"


def reflection_responder(call):
    assert call.raw
    if call.prompt == BASE_PROMPT:
        return tokens([("[Retrieval]", START["[Retrieval]"], {"[No Retrieval]": START["[No Retrieval]"]})])
    if call.prompt == BASE_PROMPT + paragraph(SHIRLEY):
        return tokens(SHIRLEY_REFLECTION)
    if call.prompt == BASE_PROMPT + paragraph(RADIO):
        return tokens(RADIO_REFLECTION)
    raise AssertionError(f"unexpected prompt {call.prompt!r}")


def expected_reflection_score(pieces):
    groups = {piece[0]: {piece[0]: piece[1], **piece[2]} for piece in pieces if len(piece) == 3}
    relevance = normalised(groups.get("[Relevant]") or groups["[Irrelevant]"])["[Relevant]"]
    support_p = normalised(next(g for t, g in groups.items() if "support" in t))
    support = support_p["[Fully supported]"] + 0.5 * support_p["[Partially supported]"]
    utility_p = normalised(next(g for t, g in groups.items() if t.startswith("[Utility")))
    utility = sum(UTILITY_WEIGHTS[t[-2]] * p for t, p in utility_p.items())
    sequence = sum(piece[1] for piece in pieces) / len(pieces)  # reflection tokens are part of y_t
    return math.exp(sequence) + relevance + support + 0.5 * utility


def check_reflection_run(pred):
    (decision,) = steps_of(pred, RetrievalDecision)
    p_yes = 1 / (1 + math.exp(START["[No Retrieval]"] - START["[Retrieval]"]))
    assert decision["p_retrieve"] == pytest.approx(p_yes, abs=1e-6)
    assert candidate(pred, "1")["score"] == pytest.approx(expected_reflection_score(SHIRLEY_REFLECTION), abs=1e-5)
    assert candidate(pred, "2")["score"] == pytest.approx(expected_reflection_score(RADIO_REFLECTION), abs=1e-5)
    assert candidate(pred, "1")["text"] == "Chief of Protocol" and candidate(pred, "2")["text"] == "Radio"
    assert pred.answer == "Chief of Protocol"


def test_reflection_token_scores_match_the_hand_computation():
    lm = scripted_lm(reflection_responder)
    program = build_program("self-rag", FixedRetriever([SHIRLEY, RADIO]), k=2, critics="reflection-tokens")
    with dspy.context(lm=lm):
        pred = program(question=QUESTION)
    check_reflection_run(pred)
    # The retrieval decision first; then the two candidates, written at once (in either order).
    prompts = [call.prompt for call in lm.engine.calls]
    assert prompts[0] == BASE_PROMPT
    assert sorted(prompts[1:]) == sorted([BASE_PROMPT + paragraph(SHIRLEY), BASE_PROMPT + paragraph(RADIO)])


def test_reflection_tokens_over_a_loopback_completions_server_get_the_exact_prompt():
    with OpenAICompatibleServer(reflection_responder) as server:
        lm = build_lm(f"openai/selfrag-{uuid.uuid4().hex[:8]}", api_base=server.url)
        program = build_program("self-rag", FixedRetriever([SHIRLEY, RADIO]), k=2, critics="reflection-tokens")
        with dspy.context(lm=lm):
            pred = program(question=QUESTION)
    check_reflection_run(pred)
    assert [r["path"] for r in server.requests] == ["/v1/completions"] * 3
    bodies = [r["body"] for r in server.requests]
    # The candidates are written at once: their requests arrive in either order.
    assert bodies[0]["prompt"] == BASE_PROMPT
    written_from = [BASE_PROMPT + paragraph(SHIRLEY), BASE_PROMPT + paragraph(RADIO)]
    assert sorted(b["prompt"] for b in bodies[1:]) == sorted(written_from)
    assert all(b["logprobs"] == 20 and b["skip_special_tokens"] is False for b in bodies)
    assert bodies[0]["max_tokens"] == 1 and bodies[0]["model"] == lm.model.partition("/")[2]


def test_a_model_without_reflection_tokens_is_refused_clearly():
    lm = scripted_lm(lambda call: "Chief of Protocol")
    program = build_program("self-rag", FixedRetriever([SHIRLEY]), k=1, critics="reflection-tokens")
    with dspy.context(lm=lm), pytest.raises(QuestionFailed, match="LMError.*Self-RAG-trained model"):
        program(question=QUESTION)


def test_reflection_segments_decide_the_next_retrieval_from_their_own_retrieval_token():
    first = [("[Relevant]", -0.1, {"[Irrelevant]": -2.0}), ("Temple was an actress.", -0.2),
             ("[Fully supported]", -0.1, {"[Partially supported]": -2.5}),
             ("[Retrieval]", -0.3, {"[No Retrieval]": -1.5})]
    second = [("[Relevant]", -0.2, {"[Irrelevant]": -1.7}), (" She was Chief of Protocol.", -0.4),
              ("[Partially supported]", -0.3, {"[Fully supported]": -1.4}), ("[Utility:4]", -0.2)]
    after_first = BASE_PROMPT + paragraph(SHIRLEY) + "[Relevant]Temple was an actress.[Fully supported]"

    def respond(call):
        if call.prompt == BASE_PROMPT:
            return tokens([("[Retrieval]", -0.1, {"[No Retrieval]": -2.4})])
        if call.prompt == BASE_PROMPT + paragraph(SHIRLEY):
            return tokens(first)
        if call.prompt in (after_first + paragraph(SHIRLEY), after_first + "[No Retrieval]"):
            return tokens(second[1:] if call.prompt.endswith("[No Retrieval]") else second)
        raise AssertionError(f"unexpected prompt {call.prompt!r}")

    for delta, expected_second in ((0.2, after_first + paragraph(SHIRLEY)), (0.9, after_first + "[No Retrieval]")):
        lm = scripted_lm(respond)
        program = build_program("self-rag", FixedRetriever([SHIRLEY]), k=1, max_depth=3, critics="reflection-tokens",
                                delta=delta)
        with dspy.context(lm=lm):
            pred = program(question=QUESTION)
        # The second decision comes from the [Retrieval] token the model wrote after its first segment.
        assert [call.prompt for call in lm.engine.calls] == [BASE_PROMPT, BASE_PROMPT + paragraph(SHIRLEY),
                                                              expected_second]
        decisions = steps_of(pred, RetrievalDecision)
        assert decisions[1]["p_retrieve"] == pytest.approx(1 / (1 + math.exp(-1.5 + 0.3)), abs=1e-6)
        assert pred.answer == "Temple was an actress. She was Chief of Protocol."
        assert steps_of(pred, Chosen)[0]["path"] == ["1", "1.1"]
        assert pred.retrieval_calls == (2 if delta == 0.2 else 1)
