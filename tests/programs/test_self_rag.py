"""Self-RAG with prompted critics: critique scores reproduced by hand from chosen log-probabilities, the retrieval
decision (the long-form rule too), an LM without log-probabilities, parameters, the retrieval rate against delta on
HotpotQA, and `arag eval` over a loopback server in both critic modes. (Reflection tokens and decoding: the files
test_self_rag_reflection.py and test_self_rag_decoding.py.)"""

import hashlib
import json
import math
from pathlib import Path

import dspy
import pytest
from click.testing import CliRunner

from arag.cli import main
from arag.data import load_corpus, load_examples
from arag.errors import ConfigError, QuestionFailed
from arag.passages import Passage
from arag.programs import build_program
from arag.programs.self_rag.steps import Candidate, Chosen, RetrievalDecision
from arag.retrievers import BM25Retriever
from arag.testing import FixedRetriever, OpenAICompatibleServer, Scripted, Tokens, no_logprobs_lm, scripted_lm
from arag.trace import Answer, Retrieve, kinds_of, steps_of

QUESTION = "What government position was held by the woman who portrayed Corliss Archer in Kiss and Tell?"
SHIRLEY = Passage("p1", "Shirley Temple", "Shirley Temple served as Chief of Protocol of the United States.")
RADIO = Passage("p2", "Meet Corliss Archer", "Meet Corliss Archer was a radio program from 1943 to 1956.")
UTILITY_WEIGHTS = {"1": -1.0, "2": -0.5, "3": 0.0, "4": 0.5, "5": 1.0}


def tokens(pieces):
    """Tokens given by log-probabilities: (token, logprob) or (token, logprob, {alternative: logprob})."""
    return Tokens([(p[0], math.exp(p[1]), *([{a: math.exp(lp) for a, lp in p[2].items()}] if len(p) == 3 else []))
                   for p in pieces])


def normalised(logprobs):
    """Probabilities from log-probabilities, normalised over the group (the official definition)."""
    total = sum(math.exp(lp) for lp in logprobs.values())
    return {label: math.exp(lp) / total for label, lp in logprobs.items()}


def candidate(pred, cid):
    return next(step for step in steps_of(pred, Candidate) if step["id"] == cid)


# --- prompted critics: the score by hand -------------------------------------------------------

DECIDE = {"yes": -0.4, "no": -1.5, "continue": -3.0}
SHIRLEY_LOGPROBS = {
    "relevant": {"yes": -0.1, "no": -2.4},
    "support": {"fully": -0.2, "partially": -1.8, "no": -3.0},
    "utility": {"5": -0.3, "4": -1.6, "3": -2.9, "2": -4.0, "1": -4.5},
    "continuation": [-0.1, -0.7, -0.2],
}
RADIO_LOGPROBS = {
    "relevant": {"no": -0.3, "yes": -1.4},
    "support": {"no": -0.2, "partially": -2.0, "fully": -3.5},
    "utility": {"2": -0.5, "1": -1.0, "3": -1.7},
    "continuation": [-1.2, -0.9],
}
SUPPORT_WORDS = {"fully": " supported", "partially": " supported", "no": " support"}


def label_tokens(logprobs, suffix=None):
    """The first token is the most probable label, the others its alternatives."""
    chosen = max(logprobs, key=logprobs.get)
    alternatives = {label: lp for label, lp in logprobs.items() if label != chosen}
    pieces = [(chosen, logprobs[chosen], alternatives)]
    return tokens(pieces + ([(suffix[chosen], 0.0)] if suffix else []))


def prompted_responder(answers=None, decide=DECIDE):
    """Chat answers for every prompted critic; the passage decides which log-probabilities are used."""
    answers = answers or {"Shirley": ("Chief of Protocol", SHIRLEY_LOGPROBS),
                          "Meet Corliss": ("Radio host", RADIO_LOGPROBS)}

    def respond(call):
        field = call.output_fields[-1]
        if field == "retrieve":
            return {"retrieve": label_tokens(decide)}
        passage = call.inputs.get("passage", "")
        text, logprobs = next(((t, lp) for key, (t, lp) in answers.items() if key in passage), ("I do not know.", None))
        if field == "continuation":
            probs = [math.exp(lp) for lp in logprobs["continuation"]] if logprobs else 1.0
            return {"continuation": Scripted(text, probs)}
        if field == "relevant":
            return {"relevant": label_tokens(logprobs["relevant"])}
        if field == "support":
            return {"support": label_tokens(logprobs["support"], SUPPORT_WORDS)}
        if field == "utility":
            key = next((k for k, (t, _) in answers.items() if call.inputs["response"].startswith(t)), None)
            return {"utility": label_tokens(answers[key][1]["utility"] if key else {"3": 0.0})}
        raise AssertionError(f"unexpected call for {call.output_fields}")

    return respond


def expected_prompted_score(logprobs, w_rel=1.0, w_sup=1.0, w_use=0.5):
    relevance = normalised(logprobs["relevant"])["yes"]
    support_p = normalised(logprobs["support"])
    support = support_p["fully"] + 0.5 * support_p["partially"]
    utility = sum(UTILITY_WEIGHTS[g] * p for g, p in normalised(logprobs["utility"]).items())
    sequence = sum(logprobs["continuation"]) / len(logprobs["continuation"])
    return (math.exp(sequence) + w_rel * relevance + w_sup * support + w_use * utility,
            (relevance, support, utility, sequence))


def test_prompted_scores_match_the_hand_computation():
    lm = scripted_lm(prompted_responder())
    program = build_program("self-rag", FixedRetriever([SHIRLEY, RADIO]), k=2)
    with dspy.context(lm=lm):
        pred = program(question=QUESTION)

    (decision,) = steps_of(pred, RetrievalDecision)
    p_yes = math.exp(DECIDE["yes"]) / (math.exp(DECIDE["yes"]) + math.exp(DECIDE["no"]))
    assert decision["p_retrieve"] == pytest.approx(p_yes, abs=1e-6) and decision["decision"] == "retrieve"
    for cid, logprobs in (("1", SHIRLEY_LOGPROBS), ("2", RADIO_LOGPROBS)):
        step = candidate(pred, cid)
        score, (relevance, support, utility, sequence) = expected_prompted_score(logprobs)
        assert step["relevance"] == pytest.approx(relevance, abs=1e-6)
        assert step["support"] == pytest.approx(support, abs=1e-6)
        assert step["utility"] == pytest.approx(utility, abs=1e-6)
        assert step["sequence_score"] == pytest.approx(sequence, abs=1e-6)
        assert step["score"] == pytest.approx(score, abs=1e-5)
    assert candidate(pred, "1")["passage"] == "p1" and candidate(pred, "2")["passage"] == "p2"
    assert pred.answer == "Chief of Protocol"
    assert steps_of(pred, Chosen)[0]["path"] == ["1"]
    assert lm.engine.count == 1 + 2 * 4  # decide, then write + relevance + support + utility per passage
    assert pred.retrieval_calls == 1 and pred.distinct_passages == 2


def test_an_unsure_but_supported_candidate_beats_a_fluent_irrelevant_one():
    """S is a probability, as in the paper and the official code: tokens at p = 0.02 cost at most 1 point, where
    their mean log-probability (-3.9) would outweigh every critique and pick the irrelevant candidate."""
    unsure_shirley = {**SHIRLEY_LOGPROBS, "continuation": [math.log(0.02)] * 3}
    fluent_radio = {**RADIO_LOGPROBS, "continuation": [-0.01, -0.01]}
    answers = {"Shirley": ("Chief of Protocol", unsure_shirley), "Meet Corliss": ("Radio host", fluent_radio)}
    program = build_program("self-rag", FixedRetriever([SHIRLEY, RADIO]), k=2)
    with dspy.context(lm=scripted_lm(prompted_responder(answers))):
        pred = program(question=QUESTION)
    assert candidate(pred, "1")["sequence_prob"] == pytest.approx(0.02, abs=1e-4)
    assert pred.answer == "Chief of Protocol"


def test_weights_change_the_choice():
    # A radio answer that is more fluent than the Shirley one wins once the critiques weigh nothing.
    fluent_radio = {**RADIO_LOGPROBS, "continuation": [-0.01, -0.01]}
    answers = {"Shirley": ("Chief of Protocol", SHIRLEY_LOGPROBS), "Meet Corliss": ("Radio host", fluent_radio)}
    program = build_program("self-rag", FixedRetriever([SHIRLEY, RADIO]), k=2, w_rel=0.0, w_sup=0.0, w_use=0.0)
    with dspy.context(lm=scripted_lm(prompted_responder(answers))):
        pred = program(question=QUESTION)
    assert pred.answer == "Radio host"
    assert candidate(pred, "2")["score"] == pytest.approx(math.exp(-0.01), abs=1e-6)


@pytest.mark.parametrize(
    "params, retrievals, lm_calls",
    [
        ({"delta": 0.2}, 1, 9),
        ({"delta": 0.9}, 0, 3),  # p(retrieve) = 0.75 < 0.9: decide, write, rate utility
        ({"mode": "always", "delta": 0.9}, 1, 8),  # no decision call
        ({"mode": "never", "delta": 0.0}, 0, 2),
    ],
)
def test_modes_and_delta_decide_retrieval(params, retrievals, lm_calls):
    lm = scripted_lm(prompted_responder())
    program = build_program("self-rag", FixedRetriever([SHIRLEY, RADIO]), k=2, **params)
    with dspy.context(lm=lm):
        pred = program(question=QUESTION)
    assert pred.retrieval_calls == retrievals and lm.engine.count == lm_calls
    (decision,) = steps_of(pred, RetrievalDecision)
    assert decision["decision"] == ("retrieve" if retrievals else "no")
    if not retrievals:
        assert pred.answer == "I do not know." and candidate(pred, "1")["passage"] is None
        assert set(candidate(pred, "1")["critiques"]) == {"utility"}


# --- LMs without log-probabilities, parameters --------------------------------------------------


def chosen_labels(call):
    field = call.output_fields[-1]
    return {"retrieve": "yes", "continuation": "Chief of Protocol", "relevant": "yes",
            "support": "partially supported", "utility": "4"}[field]


def test_an_lm_without_logprobs_fails_clearly_unless_the_chosen_label_is_assumed():
    program = build_program("self-rag", FixedRetriever([SHIRLEY]), k=1)
    with dspy.context(lm=no_logprobs_lm(lambda call: {call.output_fields[-1]: chosen_labels(call)})):
        with pytest.raises(QuestionFailed, match="LMError in .*log-probabilities"):
            program(question=QUESTION)
    lm = no_logprobs_lm(lambda call: {call.output_fields[-1]: chosen_labels(call)})
    program = build_program("self-rag", FixedRetriever([SHIRLEY]), k=1, assume_chosen_label=True)
    with dspy.context(lm=lm):
        pred = program(question=QUESTION)
    step = candidate(pred, "1")
    assert step["critiques"]["support"] == {"fully": 0.0, "partially": 1.0, "no": 0.0}
    assert (step["relevance"], step["support"], step["utility"], step["sequence_score"]) == (1.0, 0.5, 0.5, 0.0)
    assert step["score"] == pytest.approx(1.0 + 1.0 + 0.5 + 0.5 * 0.5)  # S = p = 1
    assert steps_of(pred, RetrievalDecision)[0]["p_retrieve"] == 1.0


@pytest.mark.parametrize(
    "params, fragment",
    [
        ({"mode": "sometimes"}, "'mode' must be one of"),
        ({"delta": 1.5}, "'delta' must be in [0.0, 1.0]"),
        ({"critics": "gpt"}, "'critics' must be one of"),
        ({"beam_width": 0}, "'beam_width' must be in"),
        ({"max_depth": "deep"}, "'max_depth' must be int"),
        ({"critics": "reflection-tokens", "assume_chosen_label": True}, "'assume_chosen_label' applies to"),
    ],
)
def test_bad_parameters_name_the_parameter(params, fragment):
    with pytest.raises(ConfigError, match="self-rag: ") as err:
        build_program("self-rag", FixedRetriever([SHIRLEY]), **params)
    assert fragment in str(err.value)


# --- HotpotQA: fewer retrievals as delta grows -------------------------------------------------


@pytest.fixture(scope="module")
def hotpot(tmp_path_factory):
    folder = Path(__file__).resolve().parents[2].parent / "shared" / "datasets" / "hotpotqa"
    if not folder.exists():
        pytest.skip(f"{folder} is not present")
    retriever = BM25Retriever.build(load_corpus(folder / "corpus.jsonl"), tmp_path_factory.mktemp("hotpot") / "bm25")
    return load_examples(folder / "public.jsonl", limit=30), retriever


def hashed_probability(text):
    return (int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % 98 + 1) / 100


def hotpot_responder(call):
    field = call.output_fields[-1]
    if field == "retrieve":
        p = hashed_probability(call.inputs["question"])
        return {"retrieve": Tokens([("yes", p, {"no": 1 - p})] if p >= 0.5 else [("no", 1 - p, {"yes": p})])}
    if field == "continuation":
        return {"continuation": Scripted(call.inputs.get("passage", "unknown").split(" | ")[0] or "unknown", 0.8)}
    return {field: {"relevant": "yes", "support": "partially supported", "utility": "3"}[field]}


def test_the_retrieval_rate_never_increases_as_delta_grows_on_hotpotqa(hotpot):
    examples, retriever = hotpot
    lm = scripted_lm(hotpot_responder)
    rates = []
    for delta in (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0):
        program = build_program("self-rag", retriever, k=2, delta=delta)
        with dspy.context(lm=lm):
            retrieved = [program(question=ex.question).retrieval_calls > 0 for ex in examples]
        rates.append(sum(retrieved) / len(retrieved))
    assert all(later <= earlier for earlier, later in zip(rates, rates[1:])), rates
    assert rates[0] == 1.0 and rates[-1] == 0.0 and len(set(rates)) >= 4, rates


# --- arag eval over a loopback chat server -----------------------------------------------------


def chat_and_raw_responder(call):
    if call.raw:  # reflection-token prompts on /v1/completions
        if call.prompt.endswith("### Response:\n"):
            return tokens([("[Retrieval]", -0.1, {"[No Retrieval]": -2.3})])
        return tokens([("[Relevant]", -0.2, {"[Irrelevant]": -1.8}), ("Somebody", -0.5),
                       ("[Partially supported]", -0.4, {"[Fully supported]": -1.1}), ("[Utility:3]", -0.3)])
    return hotpot_responder(call)


@pytest.mark.parametrize("critics", ["prompted", "reflection-tokens"])
def test_arag_eval_runs_self_rag_over_a_loopback_server(critics, shared_dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("ARAG_HOME", str(tmp_path / "home"))
    folder = shared_dataset("hotpotqa")
    with OpenAICompatibleServer(chat_and_raw_responder) as server:
        result = CliRunner().invoke(main, [
            "eval", "--program", "self-rag", "--dataset", str(folder / "public.jsonl"),
            "--corpus", str(folder / "corpus.jsonl"), "--lm", f"openai/selfrag-{critics}", "--api-base", server.url,
            "--param", "k=2", "--param", f"critics={critics}", "--param", "delta=0.0",
            "--limit", "3", "--out", str(tmp_path / "out"),
        ])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and not any("error" in row for row in rows)
    for row in rows:
        kinds = kinds_of(row)
        assert kinds[:2] == [RetrievalDecision, Retrieve] and kinds.count(Candidate) == 2
        assert kinds[-2:] == [Chosen, Answer] and row["retrieval_calls"] == 1
    paths = {request["path"] for request in server.requests}
    assert paths == ({"/v1/chat/completions"} if critics == "prompted" else {"/v1/completions"})
    if critics == "prompted":
        assert all(r["body"]["logprobs"] is True and r["body"]["top_logprobs"] == 5 for r in server.requests)
        for row in rows:  # equal critiques: the first passage's candidate wins, and it answers with its title
            assert row["prediction"] == row["trace"][1]["passages"][0]["title"]
    else:
        assert {row["prediction"] for row in rows} == {"Somebody"}


def test_the_long_form_retrieval_ratio_counts_continue_for_retrieval():
    from arag.programs.self_rag.self_rag import retrieve_probability

    probabilities = {"yes": 0.2, "no": 0.5, "continue": 0.3}
    assert retrieve_probability(probabilities) == pytest.approx(0.2 / 0.7)
    assert retrieve_probability(probabilities, "long-form") == pytest.approx(0.5 / 0.7)


@pytest.mark.parametrize("later, delta, decisions", [
    # The model writes [No Retrieval]: the long-form code overrules it, (0.2 + 0.3) / 0.7 > 0.5.
    ({"yes": 0.2, "no": 0.5, "continue": 0.3}, 0.5, {"normalised": ["no", "no"], "long-form": ["no", "retrieve"]}),
    # The model writes [Retrieval]: the long-form code retrieves, though no ratio passes 0.9.
    ({"yes": 0.5, "no": 0.4, "continue": 0.1}, 0.9, {"normalised": ["no", "no"], "long-form": ["no", "retrieve"]}),
])
def test_the_long_form_rule_decides_the_first_segment_by_the_ratio_then_by_the_written_token(later, delta,
                                                                                            decisions):
    first = {"yes": 0.2, "no": 0.5, "continue": 0.3}  # 0.29 by the ratio, 0.71 with continue: no retrieval first

    def respond(call):
        field = call.output_fields[-1]
        if field == "retrieve":
            chosen = later if call.inputs["answer_so_far"] else first
            return {"retrieve": label_tokens({label: math.log(p) for label, p in chosen.items()})}
        if field == "continuation":
            return {"continuation": "She was an actress. She served as Chief of Protocol."}
        return prompted_responder()(call)

    for rule, expected in decisions.items():
        program = build_program("self-rag", FixedRetriever([SHIRLEY]), k=1, max_depth=2, delta=delta,
                                retrieve_rule=rule)
        with dspy.context(lm=scripted_lm(respond)):
            pred = program(question=QUESTION)
        made = steps_of(pred, RetrievalDecision)
        assert [d["decision"] for d in made] == expected, rule
        assert [d["rule"] for d in made] == ["normalised", rule]
        assert pred.retrieval_calls == expected.count("retrieve")
