"""Self-RAG's decoding: long-form beam search keeping the best paths by their mean segment score, an early finish,
[Continue to Use Evidence], hard constraints dropping irrelevant candidates, and closed-set aggregation."""

import dspy
import pytest
from test_self_rag import (
    DECIDE,
    QUESTION,
    RADIO,
    SHIRLEY,
    SHIRLEY_LOGPROBS,
    candidate,
    label_tokens,
    prompted_responder,
)

from arag.passages import Passage
from arag.programs import build_program
from arag.programs.self_rag.steps import Beam, Candidate, Chosen, ClosedSet, Dropped, NoEvidence, RetrievalDecision
from arag.testing import FixedRetriever, Scripted, Tokens, scripted_lm
from arag.trace import steps_of


def beam_responder(relevance):
    """Every passage gives a two-sentence continuation; relevance differs by passage title."""

    def respond(call):
        field = call.output_fields[-1]
        passage = call.inputs.get("passage", "")
        title = passage.split(" | ")[0]
        if field == "continuation":
            return {"continuation": Scripted(f"From {title}. And more.", 0.9)}
        if field == "relevant":
            p = relevance[title]
            return {"relevant": Tokens([("yes", p, {"no": 1 - p})] if p >= 0.5 else [("no", 1 - p, {"yes": p})])}
        if field == "support":
            return {"support": Tokens([("fully", 0.7, {"partially": 0.2, "no": 0.1}), (" supported", 1.0)])}
        if field == "utility":
            return {"utility": Tokens([("4", 0.6, {"5": 0.3, "3": 0.1})])}
        raise AssertionError(call.output_fields)

    return respond


def test_long_form_beam_keeps_the_best_paths_by_their_mean_segment_score():
    passages = [Passage(f"p{i}", title, f"{title} text.") for i, title in enumerate(("Alpha", "Beta", "Gamma"), 1)]
    lm = scripted_lm(beam_responder({"Alpha": 0.9, "Beta": 0.6, "Gamma": 0.2}))
    retriever = FixedRetriever(passages)
    program = build_program("self-rag", retriever, k=3, mode="always", max_depth=3, beam_width=2)
    with dspy.context(lm=lm):
        pred = program(question="Tell me about the letters.")
    # Later segments retrieve with the question and the path's last segment (x, y_{t-1}).
    assert retriever.queries[:3] == ["Tell me about the letters.", "Tell me about the letters. From Alpha.",
                                     "Tell me about the letters. From Beta."]
    candidates = steps_of(pred, Candidate)
    assert [sum(1 for c in candidates if c["depth"] == d) for d in (1, 2, 3)] == [3, 6, 6]
    for beam in steps_of(pred, Beam):
        layer = [c for c in candidates if c["depth"] == beam["depth"]]
        open_layer = sorted((c for c in layer if not c["done"]), key=lambda c: -c["path_score"])
        assert beam["kept"] == [c["id"] for c in open_layer[:2]]
        assert all(c["id"].count(".") == beam["depth"] - 1 for c in layer)
    for step in candidates:  # a path's score is the mean of its segments' scores
        ids = [".".join(step["id"].split(".")[: n + 1]) for n in range(step["depth"])]
        scores = [next(c["score"] for c in candidates if c["id"] == i) for i in ids]
        assert step["path_score"] == pytest.approx(sum(scores) / len(scores), abs=1e-5)
    finished = [c for c in candidates if c["done"]]
    assert {c["depth"] for c in finished} == {3}
    best = max(finished, key=lambda c: c["path_score"])
    assert steps_of(pred, Chosen)[0]["path"][-1] == best["id"] == "1.1.1"
    assert pred.answer == "From Alpha. From Alpha. From Alpha. And more."
    assert pred.lm_calls == (3 + 6 + 6) * 4 and pred.retrieval_calls == 1 + 2 + 2
    assert lm.engine.count < pred.lm_calls  # repeated judgements (same passage, same statement) come from the cache


def test_a_single_sentence_continuation_finishes_the_answer_early():
    lm = scripted_lm(lambda call: {"continuation": "Paris."} if "continuation" in call.output_fields
                     else {"utility": Tokens([("5", 0.8, {"4": 0.2})])})
    program = build_program("self-rag", FixedRetriever([SHIRLEY]), mode="never", max_depth=4)
    with dspy.context(lm=lm):
        pred = program(question="Capital of France?")
    assert pred.answer == "Paris." and lm.engine.count == 2
    assert [b["depth"] for b in steps_of(pred, Beam)] == [1]


def test_continue_keeps_writing_from_the_last_passage_without_retrieving():
    def respond(call):
        field = call.output_fields[-1]
        if field == "retrieve":
            first = not call.inputs["answer_so_far"]
            decide = DECIDE if first else {"continue": -0.2, "no": -1.9, "yes": -3.5}
            assert call.inputs["evidence"] == ("" if first else f"{SHIRLEY.title} | {SHIRLEY.text}")
            return {"retrieve": label_tokens(decide)}
        if field == "continuation":
            return {"continuation": "She was an actress. She served as Chief of Protocol."}
        return prompted_responder()(call)

    lm = scripted_lm(respond)
    program = build_program("self-rag", FixedRetriever([SHIRLEY]), k=1, max_depth=2)
    with dspy.context(lm=lm):
        pred = program(question=QUESTION)
    assert [d["decision"] for d in steps_of(pred, RetrievalDecision)] == ["retrieve", "continue"]
    first, second = candidate(pred, "1"), candidate(pred, "1.1")
    assert second["continued"] and second["passage"] == "p1" and pred.retrieval_calls == 1
    assert second["critiques"]["relevance"] == first["critiques"]["relevance"]  # judged once, carried over
    assert first["text"] == "She was an actress." and not first["done"]
    assert pred.answer == "She was an actress. She was an actress. She served as Chief of Protocol."
    relevance_calls = [call for call in lm.engine.calls if call.output_fields == ["relevant"]]
    assert len(relevance_calls) == 1


def test_hard_constraints_drop_irrelevant_candidates_and_fall_back_to_no_evidence():
    lm = scripted_lm(prompted_responder())
    program = build_program("self-rag", FixedRetriever([SHIRLEY, RADIO]), k=2, hard_constraints=True)
    with dspy.context(lm=lm):
        pred = program(question=QUESTION)
    assert steps_of(pred, Dropped)[0]["ids"] == ["2"] and pred.answer == "Chief of Protocol"

    lm = scripted_lm(prompted_responder())
    program = build_program("self-rag", FixedRetriever([RADIO]), k=1, hard_constraints=True)
    with dspy.context(lm=lm):
        pred = program(question=QUESTION)
    assert steps_of(pred, Dropped)[0]["ids"] == ["1"]
    assert steps_of(pred, NoEvidence)[0]["reason"] == "every candidate was dropped"
    assert pred.answer == "I do not know." and steps_of(pred, Chosen)[0] == {
        "step": Chosen.kind, "path": ["2"], "passages": [None], "score": candidate(pred, "2")["score"]}


def test_closed_set_sums_the_scores_of_agreeing_answers():
    high = {**SHIRLEY_LOGPROBS, "continuation": [-0.1]}
    low = {**SHIRLEY_LOGPROBS, "relevant": {"yes": -0.2, "no": -1.7}, "continuation": [-0.3]}
    passages = [SHIRLEY, RADIO, Passage("p3", "Kiss and Tell", "Kiss and Tell is a 1945 film.")]
    answers = {"Shirley": ("A", high), "Meet Corliss": ("B", low), "Kiss and": ("b", low)}
    picks = {}
    for closed_set in (False, True):
        program = build_program("self-rag", FixedRetriever(passages), k=3, closed_set=closed_set)
        with dspy.context(lm=scripted_lm(prompted_responder(answers))):
            pred = program(question=QUESTION)
        picks[closed_set] = pred.answer
        scores = {c["id"]: c["score"] for c in steps_of(pred, Candidate)}
    assert scores["1"] > scores["2"] == scores["3"] and scores["2"] + scores["3"] > scores["1"]
    assert picks == {False: "A", True: "B"}
    assert steps_of(pred, ClosedSet)[0]["totals"]["b"] == pytest.approx(scores["2"] + scores["3"], abs=1e-5)
