"""Adaptive-RAG: routing by complexity to no retrieval, one retrieval or IRCoT; the trained router and its training."""

import json
import sys

import dspy
import pytest
from click.testing import CliRunner

from arag.cli import main
from arag.errors import ConfigError
from arag.optimizers.router_training import (
    dataset_hops,
    label_runs,
    parse_hops,
    questions_needing_multi_step,
    silver_label,
    train_router,
)
from arag.optimizers.saving import load_program, save_program
from arag.programs.adaptive_rag.router import learned_questions
from arag.programs.adaptive_rag.steps import Route
from arag.programs.frame.registry import build_program
from arag.testing import TemplateRetriever, Tokens, scripted_lm
from arag.trace import Retrieve, Unreadable, is_step, kinds_of

QUESTION = "Which city is the capital of the country where the Danube ends?"


def responder(label, answer="Paris"):
    """Labels the question `label` (with its alternatives' probabilities), writes a one-sentence chain that gives
    its answer, and answers `answer`."""
    others = {other: 0.1 for other in "ABC" if other != label}

    def respond(call):
        fields = {}
        for name in call.output_fields:
            if name == "complexity":
                fields[name] = Tokens([(label, 0.8, others)])
            elif name == "continuation":
                written = call.inputs.get("answer_so_far", "")
                fields[name] = "" if written else f"So the answer is {answer}."
            elif name == "reasoning":
                fields[name] = "Step by step."
            elif name == "answer":
                fields[name] = answer
        return fields

    return respond


def run(respond, question=QUESTION, **params):
    retriever = TemplateRetriever()
    lm = scripted_lm(respond, logprobs=True, top_logprobs=5)
    with dspy.context(lm=lm):
        prediction = build_program("adaptive-rag", retriever, **params)(question=question)
    return prediction, lm.engine.count, retriever


def route(prediction):
    [step] = [step for step in prediction.trace if is_step(step, Route)]
    return step


def test_label_a_answers_without_retrieval():
    prediction, calls, retriever = run(responder("A"))
    assert route(prediction)["strategy"] == "no-retrieval"
    assert retriever.queries == [] and prediction.retrieval_calls == 0
    assert calls == prediction.lm_calls == 2  # the label, then the closed-book answer
    assert prediction.answer == "Paris"


def test_label_b_retrieves_once_with_the_programs_k():
    prediction, calls, retriever = run(responder("B"), k=3)
    assert route(prediction)["strategy"] == "single-rag"
    assert retriever.queries == [QUESTION]
    assert prediction.distinct_passages == 3
    assert calls == 2


def test_passages_per_retrieval_default_to_the_official_flan_t5_setting_and_a_preset_gives_gpts():
    program = build_program("adaptive-rag", TemplateRetriever())
    assert (program.k, program.ircot_k, program.single_step.k, program.multi_step.k) == (15, 6, 15, 6)
    prediction, _, _ = run(responder("B"))
    assert prediction.distinct_passages == 15
    prediction, _, retriever = run(responder("C"), preset="official-gpt")
    assert [s["k"] for s in prediction.trace if is_step(s, Retrieve)] == [3] * len(retriever.queries)
    assert build_program("adaptive-rag", TemplateRetriever(), preset="official-gpt").single_step.k == 6
    for bad in ({"ircot_k": 0}, {"ircot_k": 16}, {"k": 0}):
        with pytest.raises(ConfigError, match=f"parameter '{next(iter(bad))}'"):
            build_program("adaptive-rag", TemplateRetriever(), **bad)


def test_label_c_runs_ircot_exactly_as_ircot_alone():
    prediction, calls, retriever = run(responder("C"))
    alone_lm, alone_retriever = scripted_lm(responder("C")), TemplateRetriever()
    with dspy.context(lm=alone_lm):
        alone = build_program("ircot", alone_retriever)(question=QUESTION)
    assert route(prediction)["strategy"] == "ircot"
    assert calls == 1 + alone_lm.engine.count
    assert retriever.queries == alone_retriever.queries
    assert prediction.answer == alone.answer
    assert kinds_of(prediction)[1:] == kinds_of(alone)


def test_the_route_records_each_labels_probability():
    step = route(run(responder("B"))[0])
    assert step["label"] == "B" and step["classifier"] == "lm"
    assert step["probabilities"] == pytest.approx({"A": 0.1, "B": 0.8, "C": 0.1})


def test_an_unreadable_label_routes_to_multi_step():
    prediction, _, _ = run(responder("D"))
    assert route(prediction)["label"] == "C"
    [unreadable] = [s for s in prediction.trace if is_step(s, Unreadable)]
    assert unreadable["signature"] == "ClassifyComplexity"


def test_the_strategies_are_sub_modules_whose_prompts_a_saved_program_keeps(tmp_path):
    program = build_program("adaptive-rag", TemplateRetriever())
    modules = {name for name, _ in program.named_sub_modules()}
    assert {"self.no_retrieval", "self.single_step", "self.multi_step"} <= modules
    program.single_step.generate_answer.predict.demos = [dspy.Example(question="Q?", passages="[]", answer="A")]
    loaded = load_program(save_program(program, tmp_path / "adaptive-rag.json"), TemplateRetriever())
    assert [dict(demo) for demo in loaded.single_step.generate_answer.predict.demos] == [
        {"question": "Q?", "passages": "[]", "answer": "A"}]
    assert loaded.multi_step.k == 6 and not loaded.no_retrieval.generate_answer.predict.demos


@pytest.mark.parametrize("content, problem", [
    (None, "is not a router file"),
    ("{not json", "is not JSON"),
    ('{"format": "other"}', "format arag-router/1"),
    ('{"format": "arag-router/1", "encoder": "x", "labels": ["A", "C"], "coef": [[1, 2], [3, 4]], '
     '"intercept": [0]}', "do not fit together"),
])
def test_a_bad_router_file_is_named(tmp_path, content, problem):
    path = tmp_path / "router.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=problem):
        build_program("adaptive-rag", TemplateRetriever(), classifier=str(path))


# --- training the router from runs --------------------------------------------------------------------------

FRUITS = ["apple", "banana", "cherry", "grape", "lemon", "lime", "mango", "orange", "peach", "pear", "plum",
          "kiwi", "melon", "papaya", "apricot", "fig", "guava", "date", "coconut", "pineapple"]
FILMS = ["Blind Shaft", "The Mask of Fu Manchu", "Kiss and Tell", "Wearing Velvet Slippers", "The Third Man",
         "Night Train", "Red River", "Stagecoach", "Rebecca", "Laura", "Gilda", "Notorious", "Vertigo", "Psycho",
         "Casablanca", "Metropolis", "Nosferatu", "Sunrise", "Greed", "Wings"]
LM_CALLS = {"no-retrieval": 1, "single-rag": 1, "ircot": 6}


def write_run(folder, program, dataset, rows):
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"program": program, "dataset": dataset}))
    with open(folder / "predictions.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps({"answers": ["x"], "trace": [], "lm_calls": LM_CALLS[program], **row}) + "\n")
    return folder


def strategy_runs(tmp_path, questions, correct, dataset="/data/hotpotqa/public.jsonl", name="hotpotqa"):
    """One run per strategy over `questions` (id -> text); `correct[program]` holds the ids it answered."""
    return [write_run(tmp_path / name / program, program, dataset,
                      [{"id": qid, "question": text, "metrics": {"em": float(qid in correct.get(program, ())),
                                                                 "f1": 0.5}}
                       for qid, text in questions.items()])
            for program in LM_CALLS]


def test_labels_are_the_simplest_strategy_that_answered_else_the_datasets_nature(tmp_path):
    questions = {"q1": "Who?", "q2": "When?", "q3": "Where?", "q4": "Why?"}
    correct = {"no-retrieval": {"q1"}, "single-rag": {"q1", "q2"}, "ircot": {"q1", "q2", "q3"}}
    multi = label_runs(strategy_runs(tmp_path, questions, correct))
    assert {q.id: (q.label, q.by) for q in multi} == {"q1": ("A", "answer"), "q2": ("B", "answer"),
                                                      "q3": ("C", "answer"), "q4": ("C", "dataset")}
    single = label_runs(strategy_runs(tmp_path, questions, correct, "/data/nq_open/public.jsonl", "nq"))
    assert {q.id: q.label for q in single}["q4"] == "B"
    assert {q.id: q.lm_calls["C"] for q in single} == dict.fromkeys(questions, 6)
    lenient = label_runs(strategy_runs(tmp_path / "f1", questions, correct), metric="f1", correct_at=0.5)
    assert {q.label for q in lenient} == {"A"}  # every strategy scored f1 0.5: the simplest one answered
    assert {q.label for q in label_runs(strategy_runs(tmp_path / "f1+", questions, correct), metric="f1",
                                        correct_at=0.6)} == {"C"}


def test_only_questions_every_strategy_answered_are_labelled(tmp_path):
    runs = strategy_runs(tmp_path, {"q1": "Who?", "q2": "When?"}, {})
    rows = (runs[1] / "predictions.jsonl").read_text().splitlines()
    (runs[1] / "predictions.jsonl").write_text(rows[0] + "\n")
    assert [q.id for q in label_runs(runs)] == ["q1"]


def test_the_multi_step_run_is_needed_only_where_it_decides_a_label(tmp_path):
    questions = {"q1": "Who?", "q2": "When?", "q3": "Where?"}
    correct = {"no-retrieval": {"q1"}, "single-rag": {"q2"}, "ircot": {"q3"}}
    multi_hop = strategy_runs(tmp_path, questions, correct)
    assert questions_needing_multi_step(multi_hop) == set()  # a question both missed is C whatever ircot does
    assert {q.id: q.label for q in label_runs(multi_hop[:2])} == {"q1": "A", "q2": "B", "q3": "C"}
    single_hop = strategy_runs(tmp_path, questions, correct, "/data/popqa/public.jsonl", "popqa")
    assert questions_needing_multi_step(single_hop) == {"q3"}
    assert [q.id for q in label_runs(single_hop[:2])] == ["q1", "q2"]  # q3 waits on ircot's answer
    assert {q.id: q.label for q in label_runs(single_hop)} == {"q1": "A", "q2": "B", "q3": "C"}
    assert silver_label({"A": 0.0, "B": 0.0}, "single") is None
    assert silver_label({"A": 0.0, "B": 0.0, "C": 0.0}, "single") == ("B", "dataset")


def test_routing_cost_is_compared_on_the_questions_the_multi_step_run_answered(tmp_path):
    runs = fruit_and_film_runs(tmp_path)
    report = train_router(label_runs(runs[:2]), tmp_path / "router.json", held_out=0.25, seed=1)
    assert report.accuracy == 1.0 and report.compared == 0
    assert report.lines()[-1] == "no held-apart question has a multi-step answer to compare routing's cost with"


def test_bad_run_sets_are_named(tmp_path):
    runs = strategy_runs(tmp_path, {"q1": "Who?"}, {})
    with pytest.raises(ConfigError, match="no run of single-rag"):
        label_runs([runs[0], runs[2]])
    single_hop = strategy_runs(tmp_path, {"q1": "Who?"}, {}, "/data/popqa/public.jsonl", "popqa")
    with pytest.raises(ConfigError, match="waits on a multi-step answer"):
        label_runs(single_hop[:2])
    with pytest.raises(ConfigError, match="a second no-retrieval run"):
        label_runs([runs[0], *strategy_runs(tmp_path / "again", {"q1": "Who?"}, {})])
    with pytest.raises(ConfigError, match="no 'match' score"):
        label_runs(runs, metric="match")
    unknown = strategy_runs(tmp_path, {"q1": "Who?"}, {}, "/data/mine/questions.jsonl", "mine")
    with pytest.raises(ConfigError, match="--hops mine=single"):
        label_runs(unknown)
    assert label_runs(unknown, hops=parse_hops(["mine=single"]))[0].label == "B"
    with pytest.raises(ConfigError, match="DATASET=single"):
        parse_hops(["mine=triple"])
    assert dataset_hops("2wikimultihopqa_dev1000", {}) == "multi"


def fruit_and_film_runs(tmp_path):
    """Closed-book answers right on fruit questions, every strategy wrong on film questions (multi-hop: C)."""
    questions = {f"fruit-{i}": f"What colour is a ripe {fruit}?" for i, fruit in enumerate(FRUITS)}
    questions |= {f"film-{i}": f"Who directed the film that was released the year after {film}?"
                  for i, film in enumerate(FILMS)}
    correct = {"no-retrieval": {qid for qid in questions if qid.startswith("fruit")}}
    return strategy_runs(tmp_path, questions, correct)


def test_the_trained_router_learns_the_labels_and_saves_calls(tmp_path):
    out = tmp_path / "router.json"
    report = train_router(label_runs(fruit_and_film_runs(tmp_path)), out, held_out=0.25, seed=1)
    assert (report.questions, report.trained_on, report.held_out) == (40, 30, 10)
    assert report.labels == {"A": 20, "C": 20} and report.labelled_by == {"answer": 20, "dataset": 20}
    assert report.accuracy == 1.0 > report.majority_accuracy
    assert report.lm_calls_routed < report.lm_calls_multi_step == 6
    assert report.score_routed > report.score_multi_step == 0.0
    trained_on = json.loads(out.read_text())["trained_on"]
    assert trained_on["questions"] == 30
    learned = learned_questions(out)  # the 30 it learned from, not the 10 it was measured on
    assert learned.keys() == {"hotpotqa"} and len(learned["hotpotqa"]) == 30
    assert learned["hotpotqa"] < {f"fruit-{i}" for i in range(20)} | {f"film-{i}" for i in range(20)}
    del trained_on["ids"]
    out.write_text(json.dumps({**json.loads(out.read_text()), "trained_on": trained_on}))
    with pytest.raises(ConfigError, match="does not name the questions it learned from: train it again"):
        learned_questions(out)

    lm = scripted_lm(responder("C", answer="red"))
    with dspy.context(lm=lm):
        prediction = build_program("adaptive-rag", TemplateRetriever(), classifier=str(out))(
            question="What colour is a ripe strawberry?")
    step = route(prediction)
    assert step["label"] == "A" and step["classifier"] == str(out)
    assert step["probabilities"]["A"] > 0.5
    assert lm.engine.count == 1  # the router makes no LM call: only the closed-book answer


def test_a_missing_scikit_learn_names_the_extra_before_any_work(tmp_path, monkeypatch):
    out = tmp_path / "router.json"
    train_router(label_runs(fruit_and_film_runs(tmp_path)), out, held_out=0.25, seed=1)
    for module in ("sklearn", "sklearn.linear_model"):  # as in an environment without the `router` extra
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ConfigError, match=r"needs scikit-learn .*dspy-arag\[router\]"):
        build_program("adaptive-rag", TemplateRetriever(), classifier=str(out))
    with pytest.raises(ConfigError, match=r"dspy-arag\[router\]"):
        train_router(label_runs(fruit_and_film_runs(tmp_path / "again")), tmp_path / "other.json")
    assert not (tmp_path / "other.json").exists()


def test_one_label_only_cannot_train_a_router(tmp_path):
    runs = strategy_runs(tmp_path, {f"q{i}": f"Question {i}?" for i in range(10)}, {})
    with pytest.raises(ConfigError, match="every training question is labelled C"):
        train_router(label_runs(runs), tmp_path / "router.json")


def test_train_router_command(tmp_path):
    out = tmp_path / "router.json"
    result = CliRunner().invoke(main, ["train-router", *map(str, fruit_and_film_runs(tmp_path)), "--out", str(out),
                                       "--held-out", "0.25"])
    assert result.exit_code == 0, result.output
    assert "router accuracy on the held-apart questions: 1.000" in result.output
    assert "labelled 40 questions: A 20, B 0, C 20" in result.output
    assert out.is_file()
    bad = CliRunner().invoke(main, ["train-router", str(tmp_path / "nowhere"), "--out", str(out)])
    assert bad.exit_code == 2 and "is not a run folder" in bad.output
