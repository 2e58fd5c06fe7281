"""Self-CRAG: as CRAG's released code, Self-RAG writes a candidate from each of the internal, external and
combined knowledge and its critiques choose; with contexts=action, each CRAG action shapes the one knowledge
passage the candidate is written from and judged against; parameters; `arag eval --program self-crag` over a
loopback chat server."""

import json

import dspy
import pytest
from click.testing import CliRunner

from arag.cli import main
from arag.errors import ConfigError
from arag.passages import Passage
from arag.programs import build_program
from arag.programs.crag.steps import Action, Contexts, Evaluate, Refine, Search
from arag.programs.self_rag.steps import Candidate, Chosen, NoEvidence, RetrievalDecision
from arag.retrievers import BM25Retriever
from arag.testing import FixedRetriever, Scripted, Tokens, scripted_lm
from arag.trace import Answer, Retrieve, kinds_of, steps_of

QUESTION = "What government position was held by the woman who portrayed Corliss Archer in Kiss and Tell?"
SHIRLEY = Passage("p1", "Shirley Temple", "Shirley Temple served as Chief of Protocol of the United States.")
RADIO = Passage("p2", "Meet Corliss Archer", "Meet Corliss Archer was a radio program from 1943 to 1956.")
FILM = Passage("w1", "Kiss and Tell (1945 film)",
               "Kiss and Tell is a 1945 film starring Shirley Temple as Corliss Archer.")
P_RELEVANT = {"Shirley Temple |": 0.9, "Meet Corliss Archer |": 0.2, "Kiss and Tell (1945 film) |": 0.8}
FORMS = ("internal", "external", "combined")  # the contexts CRAG's released code gives Self-RAG, in its order


def relevance_tokens(p):
    return Tokens([("yes", p, {"no": 1 - p})] if p >= 0.5 else [("no", 1 - p, {"yes": p})])


def responder(call):
    field = call.output_fields[-1]
    if field == "relevant":  # the retrieval evaluator and the IsREL critic share JudgeRelevance
        passage = call.inputs["passage"]
        return {"relevant": relevance_tokens(next((p for start, p in P_RELEVANT.items() if start in passage), 0.5))}
    if field == "keywords":
        return {"keywords": ["Corliss Archer", "Kiss and Tell"]}
    if field == "retrieve":
        return {"retrieve": Tokens([("yes", 0.8, {"no": 0.2})])}
    if field == "continuation":
        knows = "Chief" in call.inputs.get("passage", "")
        return {"continuation": Scripted("Chief of Protocol" if knows else "Unknown", 0.9)}
    if field == "support":
        return {"support": Tokens([("fully", 0.6, {"partially": 0.3, "no": 0.1}), (" supported", 1.0)])}
    if field == "utility":
        return {"utility": Tokens([("4", 0.7, {"5": 0.2, "3": 0.1})])}
    raise AssertionError(call.output_fields)


@pytest.fixture(scope="module")
def local_web(tmp_path_factory):
    folder = tmp_path_factory.mktemp("web") / "bm25"
    BM25Retriever.build([FILM, Passage("w2", "Dracula", "Dracula is an 1897 novel by Bram Stoker.")], folder)
    return f"local:{folder}"


def written_from(lm):
    """The passage each candidate was written from (None: written without evidence)."""
    return [call.inputs.get("passage") for call in lm.engine.calls if call.output_fields == ["continuation"]]


def run(params, web="none"):
    lm = scripted_lm(responder, logprobs=True, top_logprobs=5)
    program = build_program("self-crag", FixedRetriever([SHIRLEY, RADIO]), k=2, scorer="lm", web=web, **params)
    with dspy.context(lm=lm):
        return program(question=QUESTION), lm


def strip(passage):
    return f"{passage.title} | {passage.text}"


@pytest.mark.parametrize(
    "thresholds, action, knowledge",
    [
        ({"upper": 0.5, "lower": -0.9}, "correct", [strip(SHIRLEY)]),
        ({"upper": 0.95, "lower": 0.9}, "incorrect", [strip(FILM)]),
        ({"upper": 0.9, "lower": -0.9}, "ambiguous", [strip(SHIRLEY), strip(FILM)]),
    ],
)
def test_each_action_shapes_the_knowledge_the_candidate_is_written_from(thresholds, action, knowledge, local_web):
    pred, lm = run({**thresholds, "contexts": "action"}, web=local_web)
    (evaluated,) = steps_of(pred, Evaluate)
    assert [s["score"] for s in evaluated["scores"]] == pytest.approx([2 * 0.9 - 1, 2 * 0.2 - 1], abs=1e-4)
    assert steps_of(pred, Action)[0]["action"] == action
    assert written_from(lm) == ["\n".join(knowledge)]
    (candidate,) = steps_of(pred, Candidate)
    assert candidate["passage"] == f"knowledge:{action}:1"
    searched = [s for s in steps_of(pred, Retrieve) if s["why"].startswith("knowledge search")]
    assert bool(searched) == (action != "correct")
    if searched:
        assert searched[0]["query"] == "Corliss Archer, Kiss and Tell"
    # The IsREL critic judges the corrected knowledge (scripted by the title it opens with).
    assert candidate["relevance"] == pytest.approx(P_RELEVANT[knowledge[0].split(" | ")[0] + " |"], abs=1e-6)
    assert pred.answer == ("Chief of Protocol" if action != "incorrect" else "Unknown")


def test_no_knowledge_left_means_writing_without_evidence():
    pred, lm = run({"upper": 0.95, "lower": 0.9, "contexts": "action"}, web="none")
    assert steps_of(pred, Action)[0]["action"] == "incorrect"
    assert steps_of(pred, Search)[0]["skipped"] is True
    assert steps_of(pred, NoEvidence)[0]["reason"] == "no passage was found"
    assert written_from(lm) == [None] and pred.answer == "Unknown"
    assert steps_of(pred, Chosen)[0]["passages"] == [None]


def test_self_rag_scores_the_corrected_candidate():
    pred, _ = run({"upper": 0.5, "lower": -0.9, "contexts": "action"})
    (candidate,) = steps_of(pred, Candidate)
    relevance = 0.9  # "Shirley Temple | ..." opens the knowledge passage
    support = 0.6 + 0.5 * 0.3
    utility = 0.5 * 0.7 + 1.0 * 0.2
    assert candidate["score"] == pytest.approx(0.9 + relevance + support + 0.5 * utility, abs=1e-5)


@pytest.mark.parametrize("thresholds", [{"upper": 0.5, "lower": -0.9}, {"upper": 0.95, "lower": 0.9}])
def test_released_contexts_give_internal_external_and_combined_knowledge_and_critiques_choose(thresholds, local_web):
    pred, lm = run(thresholds, web=local_web)
    # Nothing is graded and no action taken: thresholds that would make it Correct or Incorrect change nothing.
    assert not steps_of(pred, Evaluate) and not steps_of(pred, Action)
    assert [s["source"] for s in steps_of(pred, Refine)] == ["retrieved", local_web]
    assert steps_of(pred, Contexts) == [{"step": Contexts.kind, "depth": 1, "given": list(FORMS), "empty": []}]
    internal, external = strip(SHIRLEY), strip(FILM)
    # one candidate per form, written at once (the requests in any order, the trace in the forms' order)
    assert sorted(written_from(lm)) == sorted([internal, external, f"{internal}\n{external}"])
    candidates = steps_of(pred, Candidate)
    assert [c["passage"] for c in candidates] == [f"knowledge:{form}:1" for form in FORMS]
    assert [c["text"] for c in candidates] == ["Chief of Protocol", "Unknown", "Chief of Protocol"]
    # IsREL judges each context by the title it opens with: the retrieved strip outranks the web's.
    assert [c["relevance"] for c in candidates] == pytest.approx([0.9, 0.8, 0.9], abs=1e-6)
    assert steps_of(pred, Chosen)[0]["passages"] == ["knowledge:internal:1"]
    assert pred.answer == "Chief of Protocol"


def test_released_contexts_leave_out_empty_knowledge():
    pred, lm = run({"upper": 0.95, "lower": 0.9}, web="none")
    assert steps_of(pred, Search)[0]["skipped"] is True
    assert steps_of(pred, Contexts)[0]["given"] == ["internal"]
    assert steps_of(pred, Contexts)[0]["empty"] == ["external", "combined"]
    # The action would have been Incorrect, leaving nothing; the internal knowledge still reaches Self-RAG.
    assert written_from(lm) == [strip(SHIRLEY)] and pred.answer == "Chief of Protocol"

    pred, lm = run({"strip_threshold": 0.95}, web="none")
    assert steps_of(pred, Contexts)[0]["given"] == []
    assert steps_of(pred, NoEvidence)[0]["reason"] == "no passage was found"
    assert written_from(lm) == [None] and pred.answer == "Unknown"


def test_parameters():
    program = build_program("self-crag", FixedRetriever([SHIRLEY]), scorer="lm")
    assert program.k == 10 and program.delta == 0.2 and program.upper == 0.5 and program.lower == -0.9
    assert program.contexts == "released"
    with pytest.raises(ConfigError, match="parameter 'contexts' must be one of \\['released', 'action'\\]"):
        build_program("self-crag", FixedRetriever([SHIRLEY]), contexts="all")
    with pytest.raises(ConfigError, match="self-crag: parameter 'lower' .* must not exceed parameter 'upper'"):
        build_program("self-crag", FixedRetriever([SHIRLEY]), upper=0.1, lower=0.2)
    with pytest.raises(ConfigError, match="parameter 'scorer'"):
        build_program("self-crag", FixedRetriever([SHIRLEY]), scorer="bert")
    with pytest.raises(ConfigError, match="'assume_chosen_label' applies to"):
        build_program("self-crag", FixedRetriever([SHIRLEY]), critics="reflection-tokens", assume_chosen_label=True)


def test_arag_eval_runs_self_crag_over_a_loopback_server(shared_dataset, tmp_path, monkeypatch):
    from arag.testing import OpenAICompatibleServer

    monkeypatch.setenv("ARAG_HOME", str(tmp_path / "home"))
    folder = shared_dataset("hotpotqa")
    with OpenAICompatibleServer(responder) as server:
        result = CliRunner().invoke(main, [
            "eval", "--program", "self-crag", "--dataset", str(folder / "public.jsonl"),
            "--corpus", str(folder / "corpus.jsonl"), "--lm", "openai/self-crag-loopback", "--api-base", server.url,
            "--param", "k=3", "--param", "scorer=lm", "--param", "upper=0.0", "--param", "lower=-0.5",
            "--limit", "3", "--out", str(tmp_path / "out"),
        ])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and not any("error" in row for row in rows)
    for row in rows:
        kinds = kinds_of(row)
        assert kinds[:5] == [RetrievalDecision, Retrieve, Refine, Search, Contexts]
        assert Candidate in kinds and kinds[-2:] == [Chosen, Answer]
    assert {r["path"] for r in server.requests} == {"/v1/chat/completions"}
    assert all(r["body"].get("logprobs") is True for r in server.requests if "relevant" in json.dumps(r["body"]))
