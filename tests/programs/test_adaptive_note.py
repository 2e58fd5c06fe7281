"""Adaptive-Note: the note loop, its three stop rules and the repeated-query stop, LM-call counts, the trace,
fair top-k, compiling, and `arag eval` over a loopback OpenAI-compatible server."""

import json
import math

import dspy
import pytest
from click.testing import CliRunner

from arag.cli import main
from arag.errors import ConfigError
from arag.evaluate import fair_top_k
from arag.programs import build_program
from arag.programs.adaptive_note.adaptive_note import AdaptiveNote, query_key
from arag.programs.adaptive_note.steps import Note, Query, Review
from arag.signatures.notes import AnswerFromNote, WriteLongAnswerFromNote
from arag.testing import OpenAICompatibleServer, PassageTemplate, TemplateRetriever, Tokens, scripted_lm
from arag.trace import Answer, Retrieve, Stop, StopReason, is_step, kinds_of, steps_of

QUESTION = "Which city hosts the headquarters of the company that makes the Zephyr kettle?"


NOTE_PASSAGES = PassageTemplate(id="{query}#{rank}", title="T {id}", text="text of {id}", first_rank=0)


def paged_retriever(pages=None):
    """Each query gets its own k passages (ids `<query>#<i>`), unless `pages` maps it to chosen ids."""
    return TemplateRetriever(NOTE_PASSAGES, pages=pages)


class NoteScript:
    """A responder playing the LM for every Adaptive-Note signature.

    `verdicts`: the reviewer's answers in order (True: the new note is better). `queries`: the proposer's
    answers in order (default q1, q2, ...). Notes are numbered so that every request differs.
    """

    def __init__(self, verdicts=(), queries=None, verdict_token=None):
        self.verdicts = list(verdicts)
        self.queries = list(queries) if queries is not None else None
        self.verdict_token = verdict_token
        self.calls = {"note": [], "query": [], "queries": [], "updated_note": [], "better": [], "answer": []}

    def __call__(self, call):
        (kind, *_) = call.output_fields
        self.calls[kind].append(call.inputs)
        if kind == "note":
            return {"note": "N0"}
        if kind == "query":
            index = len(self.calls["query"]) - 1
            return {"query": self.queries[index] if self.queries is not None else f"q{index + 1}"}
        if kind == "updated_note":
            return {"updated_note": f"N{len(self.calls['updated_note'])}"}
        if kind == "better":
            verdict = self.verdicts[len(self.calls["better"]) - 1]
            return {"better": self.verdict_token(verdict) if self.verdict_token else verdict}
        return {"answer": "Lyon"}


class OfficialScript(NoteScript):
    """The official style's proposer writes `per_call` questions at a time: q1, q2, ... ."""

    def __init__(self, verdicts, per_call=2):
        super().__init__(verdicts)
        self.per_call = per_call

    def __call__(self, call):
        if call.output_fields[0] != "queries":
            return super().__call__(call)
        self.calls["queries"].append(call.inputs)
        first = self.per_call * (len(self.calls["queries"]) - 1) + 1
        return {"queries": [f"q{i}" for i in range(first, first + self.per_call)]}


def run(script, retriever=None, lm_kwargs=None, **params):
    lm = scripted_lm(script, **(lm_kwargs or {}))
    program = AdaptiveNote(retriever or paged_retriever(), **params)
    with dspy.context(lm=lm):
        prediction = program(question=QUESTION)
    return prediction, lm


def expected_calls(iterations, retries=0):
    return 1 + 3 * iterations + retries + 1


# --- the stop rules ---------------------------------------------------------------------------------


def test_invalid_updates_stop_at_t_iu():
    script = NoteScript(verdicts=[True, False])
    prediction, lm = run(script, t_iu=1, t_ci=5, t_rp=100, k=2)
    (stop,) = steps_of(prediction, Stop)
    assert stop == Stop(reason=StopReason.T_IU, invalid_updates=1, iterations=2, distinct_passages=6).as_json()
    assert prediction.stop_reason == StopReason.T_IU
    assert lm.engine.count == prediction.lm_calls == expected_calls(iterations=2) == 8
    assert [s["better"] for s in steps_of(prediction, Review)] == [True, False]
    # N1 won and became the memory; N2 lost, so the answer is written from N1.
    assert script.calls["answer"] == [{"question": QUESTION, "note": "N1"}]
    assert prediction.note == "N1" and prediction.answer == "Lyon"


def test_a_losing_note_leaves_the_memory_unchanged():
    script = NoteScript(verdicts=[False, True, False])
    prediction, lm = run(script, t_iu=2, t_ci=5, t_rp=100, k=2)
    assert prediction.stop_reason == StopReason.T_IU
    assert [inputs["note"] for inputs in script.calls["query"]] == ["N0", "N0", "N2"]
    assert [inputs["note"] for inputs in script.calls["updated_note"]] == ["N0", "N0", "N2"]
    compared = [(c["best_note"], c["new_note"]) for c in script.calls["better"]]
    assert compared == [("N0", "N1"), ("N0", "N2"), ("N2", "N3")]
    assert prediction.note == "N2"
    assert lm.engine.count == prediction.lm_calls == expected_calls(iterations=3)


def test_collection_iterations_stop_at_t_ci():
    script = NoteScript(verdicts=[True] * 10)
    prediction, lm = run(script, t_iu=1, t_ci=3, t_rp=100, k=2)
    assert steps_of(prediction, Stop)[0]["reason"] == StopReason.T_CI
    assert steps_of(prediction, Stop)[0]["iterations"] == 3
    assert len(script.calls["query"]) == len(script.calls["updated_note"]) == len(script.calls["better"]) == 3
    assert lm.engine.count == prediction.lm_calls == expected_calls(iterations=3) == 11
    assert prediction.note == "N3"


def test_distinct_passages_stop_at_t_rp_with_the_paper_defaults():
    script = NoteScript(verdicts=[True] * 10)
    prediction, lm = run(script)  # k 5, T_RP 15: 5 passages from the question, 5 new per iteration
    (stop,) = steps_of(prediction, Stop)
    assert stop["reason"] == StopReason.T_RP and stop["distinct_passages"] == 15 and stop["iterations"] == 2
    assert prediction.distinct_passages == 15 and prediction.retrieval_calls == 3
    assert lm.engine.count == prediction.lm_calls == expected_calls(iterations=2) == 8


def test_passages_are_deduplicated_across_steps():
    pages = {
        QUESTION: ["a", "b", "c"],
        "q1": ["b", "d", "a"],  # one new passage
        "q2": ["a", "b", "d"],  # none new
        "q3": ["e", "f", "c"],
    }
    script = NoteScript(verdicts=[True, True, True])
    prediction, lm = run(script, paged_retriever(pages), t_iu=1, t_ci=3, t_rp=6, k=3)
    notes = steps_of(prediction, Note)
    assert [(n["new_ids"], n["seen_ids"]) for n in notes] == [
        (["a", "b", "c"], []), (["d"], ["b", "a"]), ([], ["a", "b", "d"]), (["e", "f"], ["c"])
    ]
    # Each update sees only the passages it has not seen before.
    assert [json.loads(c["passages"]) for c in script.calls["updated_note"]] == [
        ["[1] T d | text of d"], [], ["[1] T e | text of e", "[2] T f | text of f"]
    ]
    (stop,) = steps_of(prediction, Stop)
    assert stop["reason"] == StopReason.T_CI and stop["distinct_passages"] == 6 == prediction.distinct_passages
    assert [s["query"] for s in steps_of(prediction, Retrieve)] == [QUESTION, "q1", "q2", "q3"]


def test_the_question_alone_can_stop_collection_before_any_iteration():
    script = NoteScript()
    prediction, lm = run(script, k=5, t_rp=5)
    assert prediction.stop_reason == StopReason.T_RP and lm.engine.count == prediction.lm_calls == expected_calls(0)


# --- repeated queries ------------------------------------------------------------------------------


def test_a_repeated_query_is_asked_again_once_telling_the_lm():
    queries = ["Zephyr kettle maker", "zephyr  KETTLE maker?", "Acme headquarters"]
    script = NoteScript(verdicts=[True] * 5, queries=queries)
    prediction, lm = run(script, t_iu=1, t_ci=2, t_rp=100, k=2)
    assert prediction.stop_reason == StopReason.T_CI
    assert [(s["query"], s["repeated"]) for s in steps_of(prediction, Query)] == [
        ("Zephyr kettle maker", False), ("zephyr  KETTLE maker?", True), ("Acme headquarters", False)
    ]
    assert [(c["asked_queries"], c["rejected_query"]) for c in script.calls["query"]] == [
        ("[]", ""), ('["Zephyr kettle maker"]', ""), ('["Zephyr kettle maker"]', "zephyr  KETTLE maker?")
    ]
    assert [s["query"] for s in steps_of(prediction, Retrieve)][1:] == ["Zephyr kettle maker", "Acme headquarters"]
    assert lm.engine.count == prediction.lm_calls == expected_calls(iterations=2, retries=1) == 9


def test_a_second_repeat_stops_the_loop():
    queries = ["Zephyr kettle maker", "Zephyr kettle maker", "zephyr kettle maker."]
    script = NoteScript(verdicts=[True] * 5, queries=queries)
    prediction, lm = run(script, t_iu=1, t_ci=3, t_rp=100, k=2)
    (stop,) = steps_of(prediction, Stop)
    assert stop["reason"] == StopReason.REPEATED_QUERY and stop["iterations"] == 1
    assert [s["repeated"] for s in steps_of(prediction, Query)] == [False, True, True]
    assert prediction.retrieval_calls == 2
    # one full iteration, then two query calls and no update or comparison
    assert lm.engine.count == prediction.lm_calls == expected_calls(iterations=1, retries=1) + 1 == 7


def test_query_key_ignores_case_punctuation_and_spacing():
    assert query_key("  Who founded ACME, Inc.? ") == query_key("who founded acme inc") == "who founded acme inc"
    assert query_key("Who founded Acme?") != query_key("Who founded Zephyr?")


# --- the trace, the retrieval query, the answer style -------------------------------------------------


def test_the_trace_records_queries_passages_notes_verdicts_and_the_stop_reason():
    script = NoteScript(verdicts=[True, False])
    prediction, _ = run(script, t_iu=1, t_ci=5, t_rp=100, k=2)
    kinds = kinds_of(prediction)
    assert kinds == [Retrieve, Note, *[Query, Retrieve, Note, Review] * 2, Stop,
                     Answer]
    first_note = steps_of(prediction, Note)[0]
    assert first_note == {"step": Note.kind, "iteration": 0, "new_ids": [f"{QUESTION}#0", f"{QUESTION}#1"],
                          "seen_ids": [], "note": "N0"}
    second = steps_of(prediction, Note)[2]
    assert second == {"step": Note.kind, "iteration": 2, "query": "q2", "new_ids": ["q2#0", "q2#1"], "seen_ids": [],
                      "note": "N2"}
    assert steps_of(prediction, Review)[1] == {"step": Review.kind, "iteration": 2, "better": False}
    json.dumps(prediction.trace)


@pytest.mark.parametrize("p_true", [0.8, 0.3])
def test_the_verdict_probability_comes_from_log_probabilities(p_true):
    def token(verdict):
        chosen, other = ("True", "False") if verdict else ("False", "True")
        return Tokens([(chosen, p_true if verdict else 1 - p_true, {other: 1 - p_true if verdict else p_true})])

    script = NoteScript(verdicts=[p_true >= 0.5, False], verdict_token=token)
    prediction, _ = run(script, lm_kwargs={"logprobs": True, "top_logprobs": 5}, t_iu=1, t_ci=5, t_rp=100, k=2)
    reviews = steps_of(prediction, Review)
    assert reviews[0]["better"] is (p_true >= 0.5)
    assert reviews[0]["p_better"] == pytest.approx(p_true, abs=1e-4)


@pytest.mark.parametrize("lm_kwargs", [{}, {"logprobs": True}], ids=["none", "no-top-candidates"])
def test_without_top_log_probabilities_the_verdict_is_recorded_alone(lm_kwargs):
    prediction, _ = run(NoteScript(verdicts=[False]), lm_kwargs=lm_kwargs, t_iu=1, k=2)
    (review,) = steps_of(prediction, Review)
    assert "p_better" not in review and review["better"] is False


@pytest.mark.parametrize("with_question", [False, True])
def test_the_retrieval_query_is_selectable(with_question):
    retriever = paged_retriever()
    run(NoteScript(verdicts=[False]), retriever, t_iu=1, k=2, query_with_question=with_question)
    assert retriever.queries == [QUESTION, f"q1\n{QUESTION}" if with_question else "q1"]


@pytest.mark.parametrize("style, signature", [("short", AnswerFromNote), ("long", WriteLongAnswerFromNote)])
def test_the_answer_style_picks_the_generator(style, signature):
    lm = scripted_lm(NoteScript(verdicts=[False]))
    with dspy.context(lm=lm):
        AdaptiveNote(paged_retriever(), answer_style=style, t_iu=1, k=2)(question=QUESTION)
    assert lm.engine.calls[-1].instructions == signature.instructions


# --- parameters, compiling -------------------------------------------------------------------------


def test_the_default_stops_collecting_at_t_rp():
    script = NoteScript(verdicts=[True] * 5)
    prediction, _ = run(script, k=3, t_rp=10, t_ci=5)
    assert [len(n["new_ids"]) for n in steps_of(prediction, Note)] == [3, 3, 3, 1]  # the last retrieval cut to 1
    (stop,) = steps_of(prediction, Stop)
    assert stop["reason"] == StopReason.T_RP and stop["distinct_passages"] == 10 == prediction.distinct_passages
    assert [len(json.loads(c["passages"])) for c in script.calls["updated_note"]] == [3, 3, 1]
    assert steps_of(prediction, Note)[3]["seen_ids"] == []
    last = steps_of(prediction, Retrieve)[-1]  # the two passages cut were never read, and do not count
    assert [p["id"] for p in last["passages"]] == ["q3#0"] and last["cut_ids"] == ["q3#1", "q3#2"]


def test_the_official_style_retrieves_once_per_iteration_with_two_questions_and_the_question():
    retriever = paged_retriever()
    prediction, lm = run(OfficialScript([True] * 5, per_call=3), retriever, query_style="official", k=3, t_rp=100,
                         t_ci=2)
    # At most two questions are kept, and one retrieval searches them and the question together.
    assert retriever.queries == [QUESTION, f"q1\nq2\n{QUESTION}", f"q4\nq5\n{QUESTION}"]
    assert [s["query"] for s in steps_of(prediction, Note)[1:]] == ["q1 | q2", "q4 | q5"]
    assert prediction.retrieval_calls == 3
    assert lm.engine.count == prediction.lm_calls == expected_calls(iterations=2)


def test_the_official_update_reads_every_passage_retrieved_until_t_rp_is_near():
    pages = {
        QUESTION: ["a", "b", "c", "d"],
        f"q1\nq2\n{QUESTION}": ["b", "e", "f", "g"],  # 4 + 4 <= T_RP: all four are read, b again
        f"q3\nq4\n{QUESTION}": ["h", "a", "i", "j"],  # 7 + 4 > T_RP: only unseen ones, cut to T_RP - RP = 1
    }
    script = OfficialScript([True] * 5)
    prediction, _ = run(script, paged_retriever(pages), query_style="official", k=4, t_rp=8, t_ci=5)
    assert [json.loads(c["passages"]) for c in script.calls["updated_note"]] == [
        ["[1] T b | text of b", "[2] T e | text of e", "[3] T f | text of f", "[4] T g | text of g"],
        ["[1] T h | text of h"],
    ]
    notes = steps_of(prediction, Note)
    assert [(n["new_ids"], n["seen_ids"]) for n in notes[1:]] == [(["e", "f", "g"], ["b"]), (["h"], ["a"])]
    (stop,) = steps_of(prediction, Stop)
    assert stop["reason"] == StopReason.T_RP and stop["distinct_passages"] == 8 == prediction.distinct_passages


def test_the_official_search_text_is_cut_to_500_characters():
    retriever = paged_retriever()
    question = "Which " + "very " * 120 + "long question?"
    lm = scripted_lm(OfficialScript([False]))
    with dspy.context(lm=lm):
        AdaptiveNote(retriever, query_style="official", k=2, t_iu=1)(question=question)
    assert retriever.queries[1] == f"q1\nq2\n{question}"[:500] and len(retriever.queries[1]) == 500


def test_parameters_default_to_the_paper_and_are_validated():
    program = build_program("adaptive-note", paged_retriever())
    assert program.config == {"t_iu": 1, "t_ci": 3, "t_rp": 15, "k": 5, "query_with_question": False,
                              "query_style": "paper", "answer_style": "short"}
    from_cli = build_program("adaptive-note", paged_retriever(), t_iu="2", t_rp="20", query_with_question="yes")
    assert (from_cli.t_iu, from_cli.t_rp, from_cli.query_with_question) == (2, 20, True)
    for bad, name in [({"t_iu": 0}, "t_iu"), ({"t_ci": "many"}, "t_ci"), ({"t_rp": 0}, "t_rp"), ({"k": 0}, "k"),
                      ({"answer_style": "medium"}, "answer_style"), ({"query_with_question": "maybe"},
                                                                      "query_with_question")]:
        with pytest.raises(ConfigError, match=f"adaptive-note: parameter '{name}'"):
            build_program("adaptive-note", paged_retriever(), **bad)


def test_every_signature_can_be_compiled():
    program = AdaptiveNote(paged_retriever(), t_iu=1, k=2)
    names = {name for name, _ in program.named_predictors()}
    assert names == {"write_note", "propose_query", "update_note", "compare_notes", "generate_answer"}
    trainset = [dspy.Example(question=f"Question {i}?", answers=["Lyon"]).with_inputs("question") for i in range(2)]
    lm = scripted_lm(NoteScript(verdicts=[False] * 4))
    with dspy.context(lm=lm):
        compiled = dspy.BootstrapFewShot(
            metric=lambda example, prediction, trace=None: prediction.answer in example.answers,
            max_bootstrapped_demos=1, max_labeled_demos=0,
        ).compile(program, trainset=trainset)
    assert all(len(predictor.demos) == 1 for _, predictor in compiled.named_predictors())
    assert compiled.named_predictors()[0][1].demos[0]["note"] == "N0"


# --- fair top-k ------------------------------------------------------------------------------------


def summary(n, total, n_failed=0):
    return json.dumps({"n": n, "n_failed": n_failed, "totals": {"distinct_passages": total},
                       "per_question": {"distinct_passages": total / n if n else 0.0}})


@pytest.mark.parametrize("n, total, n_failed, k", [(2, 23, 0, 12), (100, 1149, 0, 11), (3, 21, 0, 7), (5, 6, 0, 1),
                                                   (4, 30, 1, 10)])
def test_fair_top_k_rounds_the_mean_distinct_passages_of_answered_questions(tmp_path, n, total, n_failed, k):
    (tmp_path / "summary.json").write_text(summary(n, total, n_failed))
    assert fair_top_k(tmp_path / "summary.json") == fair_top_k(tmp_path) == k


@pytest.mark.parametrize("content, fragment", [
    (None, "no run summary"),
    ("{", "not valid JSON"),
    (json.dumps({"n": 2, "per_question": {"distinct_passages": 3.0}}), "totals.distinct_passages"),
    (summary(0, 0), "answered questions"),
    (summary(2, 7, n_failed=2), "answered questions"),
    (summary(3, 1), "at least 1"),
])
def test_fair_top_k_explains_what_is_wrong(tmp_path, content, fragment):
    if content is not None:
        (tmp_path / "summary.json").write_text(content)
    with pytest.raises(ConfigError, match=fragment):
        fair_top_k(tmp_path)


# --- arag eval over a loopback OpenAI-compatible server ------------------------------------------------


def test_arag_eval_over_a_loopback_server_on_hotpotqa(shared_dataset, tmp_path, monkeypatch):
    dataset = shared_dataset("hotpotqa")
    monkeypatch.setenv("ARAG_HOME", str(tmp_path / "home"))

    def responder(call):
        kind = call.output_fields[0]
        if kind == "query":  # the question's second half of words, then its first half
            words, asked = call.inputs["question"].split(), len(json.loads(call.inputs["asked_queries"]))
            half = len(words) // 2
            return {"query": " ".join(words[half:] if asked == 0 else words[:half])}
        if kind == "better":
            return {"better": True}
        if kind == "answer":
            return {"answer": "Chief of Protocol"}
        return {kind: f"note from {call.inputs.get('passages', '')[:80]}"}

    with OpenAICompatibleServer(responder) as server:
        result = CliRunner().invoke(main, [
            "eval", "--program", "adaptive-note", "--dataset", str(dataset / "public.jsonl"),
            "--corpus", str(dataset / "corpus.jsonl"), "--lm", "openai/scripted-note", "--api-base", server.url,
            "--param", "t_ci=2", "--limit", "2", "--out", str(tmp_path / "run"),
        ])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["program"] == "adaptive-note" and summary["n"] == 2 and summary["n_failed"] == 0
    distinct = [len({p["id"] for s in row["trace"] if is_step(s, Retrieve) for p in s["passages"]}) for row in rows]
    assert all(5 < d < 15 for d in distinct)  # some passages the new queries found were seen before
    assert summary["per_question"]["distinct_passages"] == pytest.approx(sum(distinct) / 2)
    assert '"distinct_passages"' in result.output
    for row in rows:
        stop = next(s for s in row["trace"] if is_step(s, Stop))
        assert stop["reason"] == StopReason.T_CI and stop["iterations"] == 2
        assert row["lm_calls"] == expected_calls(iterations=2) and row["outputs"]["stop_reason"] == StopReason.T_CI
    assert server.engine.count == 2 * expected_calls(iterations=2)
    assert fair_top_k(tmp_path / "run") == math.floor(summary["per_question"]["distinct_passages"] + 0.5)
