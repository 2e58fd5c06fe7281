"""Tuning with Optuna: finding a known optimum, pruning, Pareto fronts, resuming, cache-aware cost."""

import csv
import json
import warnings
from pathlib import Path

import dspy
import optuna
import pytest
import ujson
from click.testing import CliRunner

from arag.cli import main
from arag.cli_optimize import compile_command, tune_command
from arag.cli_options import searched_space
from arag.data import load_corpus, load_examples
from arag.errors import AragError, ConfigError
from arag.optimizers.compile import compile
from arag.optimizers.saving import save_program
from arag.optimizers.tuning import SearchSpace, TuningConfig, search_space, tune
from arag.programs import build_program
from arag.retrievers import BM25Retriever
from arag.testing import Faults, OpenAICompatibleServer, scripted_lm

for command in (compile_command, tune_command):
    if command.name not in main.commands:
        main.add_command(command)

WRITTEN_SAMPLE = Path(__file__).parents[1] / "fixtures_data" / "written_sample"  # small, famous facts
QUESTIONS, CORPUS = WRITTEN_SAMPLE / "questions.jsonl", WRITTEN_SAMPLE / "corpus.jsonl"
EXAMPLES = load_examples(QUESTIONS)
BY_QUESTION = {e.question: e for e in EXAMPLES}
MOST_PASSAGES_READ = 6
SPACE = SearchSpace(ranges={"k": (1, 12)}, fixed={"reasoning": "direct"})


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    return BM25Retriever.build(load_corpus(CORPUS), tmp_path_factory.mktemp("idx") / "bm25")


def answers_when_the_evidence_fits(call):
    """Right when every supporting passage is among those given and there are at most 6 of them
    (more distract it): accuracy rises with k while evidence arrives, then falls to 0 past 6."""
    example = BY_QUESTION[call.inputs["question"]]
    passages = json.loads(call.inputs["passages"])
    titles = {p.split("] ", 1)[1].split(" | ")[0] for p in passages}
    right = set(example.supporting_titles) <= titles and len(passages) <= MOST_PASSAGES_READ
    return {f: (example.answers[0] if right else "unknown") if f == "answer" else "." for f in call.output_fields}


def expected_em(retriever, examples, k):
    """The same rule computed from the retriever's ranking, without the program or the LM."""
    hits = [set(e.supporting_titles) <= {p.title for p in retriever.retrieve(e.question, k)} and k <= MOST_PASSAGES_READ
            for e in examples]
    return sum(hits) / len(examples)


def trial_rows(out):
    with open(out / "trials.csv") as handle:
        return list(csv.DictReader(handle))


def test_arag_tune_finds_the_known_best_k_within_its_trial_budget(retriever, tmp_path, monkeypatch):
    monkeypatch.setenv("ARAG_HOME", str(tmp_path / "home"))
    curve = {k: expected_em(retriever, EXAMPLES, k) for k in range(1, 13)}
    best_em = max(curve.values())
    best_region = {k for k, em in curve.items() if em == best_em}
    assert best_region == {5, 6} and curve[7] == 0.0  # the shape this test relies on
    out = tmp_path / "tune"
    with OpenAICompatibleServer(answers_when_the_evidence_fits) as server:
        common = ["--corpus", str(CORPUS), "--lm", "openai/loopback-tune", "--api-base", server.url]
        result = CliRunner().invoke(main, [
            "tune", "--program", "single-rag", "--devset", str(QUESTIONS), *common, "--objective", "em",
            "--param", "reasoning=direct", "--range", "k=1:12", "--trials", "14", "--seed", "0", "--no-plots",
            "--out", str(out)])
        assert result.exit_code == 0, result.output
        best = ujson.loads((out / "best_params.json").read_text())
        assert best["params"]["k"] in best_region and best["values"]["em"] == pytest.approx(best_em)
        assert f"no trial scored better than the defaults (trial 0: em {best_em:.4g})" in result.output  # k=5
        rows = trial_rows(out)
        assert len(rows) == 14 and {r["state"] for r in rows} <= {"complete", "pruned"}
        for row in rows:
            if row["state"] == "complete":
                assert float(row["em"]) == pytest.approx(curve[int(row["k"])])

        checked = CliRunner().invoke(main, [
            "eval", "--program", "single-rag", "--dataset", str(QUESTIONS), *common,
            "--params-file", str(out / "best_params.json"), "--out", str(tmp_path / "eval")])
        assert checked.exit_code == 0, checked.output
    summary = ujson.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["params"] == best["params"] and summary["metrics"]["em"] == pytest.approx(best_em)


def test_the_median_pruner_stops_bad_trials_after_their_first_chunk(retriever, tmp_path):
    devset = EXAMPLES[:12]
    lm = scripted_lm(answers_when_the_evidence_fits)
    config = TuningConfig(trials=12, out_dir=tmp_path, objectives=("em",), space=SPACE, chunk_size=4, seed=3,
                          plots=False)
    result = tune("single-rag", devset, retriever, config, lm=lm)
    rows = trial_rows(tmp_path)
    pruned = [r for r in rows if r["state"] == "pruned"]
    assert pruned, "no trial was pruned"
    for row in pruned:
        assert int(row["examples"]) < len(devset) and int(row["lm_calls_spent"]) < len(devset)
        trial = result.study.trials[int(row["trial"])]
        assert max(trial.intermediate_values) < len(devset)
    assert sum(int(r["lm_calls_spent"]) for r in rows) == lm.engine.count


def test_two_objectives_give_the_pareto_front_of_quality_against_tokens(retriever, tmp_path):
    devset = EXAMPLES[:12]
    config = TuningConfig(trials=12, out_dir=tmp_path, objectives=("em", "tokens"), space=SPACE, seed=2, plots=False)
    result = tune("single-rag", devset, retriever, config, lm=scripted_lm(answers_when_the_evidence_fits))
    states = {t.state for t in result.study.trials}
    assert states == {optuna.trial.TrialState.COMPLETE}, "multi-objective trials are never pruned"
    front = result.pareto
    assert front and [p["values"]["em"] for p in front] == sorted((p["values"]["em"] for p in front), reverse=True)
    ks = [p["params"]["k"] for p in front]
    assert ks == sorted(ks, reverse=True) and max(ks) <= 5, "k=6 and above are dominated by a smaller k"
    for point in front:
        assert point["values"]["em"] == pytest.approx(expected_em(retriever, devset, point["params"]["k"]))
        file = tmp_path / "pareto" / f"trial-{point.get('same_point_as', point['trial'])}.json"
        saved = ujson.loads(file.read_text())
        assert saved["params"] == point["params"]
    assert ujson.loads((tmp_path / "best_params.json").read_text()) == front[0]


def test_members_that_tie_on_every_objective_share_one_parameter_file(retriever, tmp_path):
    (tmp_path / "pareto").mkdir()
    stale = tmp_path / "pareto" / "trial-99.json"  # a member of an earlier front of this study
    stale.write_text(ujson.dumps({"study": "single-rag-em-lm_calls", "trial": 99, "params": {}}))
    foreign = tmp_path / "pareto" / "trial-98.json"  # a file the study did not write: left alone
    foreign.write_text("{}")
    target = tmp_path / "kept.json"
    target.write_text(stale.read_text())
    (tmp_path / "pareto" / "trial-97.json").symlink_to(target)  # a link is never followed nor removed
    space = SearchSpace(ranges={"k": (3, 4)}, fixed={"reasoning": "direct"})  # every trial: one LM call a question
    config = TuningConfig(trials=6, out_dir=tmp_path, objectives=("em", "lm_calls"), space=space, seed=3, plots=False)
    front = tune("single-rag", EXAMPLES[:8], retriever, config, lm=scripted_lm(answers_when_the_evidence_fits)).pareto
    assert len(front) > len({tuple(p["values"].values()) for p in front}), "the front should hold tied members"
    first = {}
    for point in front:
        first.setdefault(tuple(point["values"].values()), point["trial"])
    written = {p.name for p in (tmp_path / "pareto").iterdir()} - {"trial-98.json", "trial-97.json"}
    assert written == {f"trial-{t}.json" for t in first.values()}
    assert foreign.read_text() == "{}" and target.exists() and (tmp_path / "pareto" / "trial-97.json").is_symlink()
    for point in front:
        same = first[tuple(point["values"].values())]
        assert point.get("same_point_as", point["trial"]) == same and same <= point["trial"]
    assert ujson.loads((tmp_path / "pareto.json").read_text()) == front


def test_cached_calls_are_not_spent_again_and_still_count_as_cost(retriever, tmp_path):
    devset = EXAMPLES[:8]
    lm = scripted_lm(answers_when_the_evidence_fits)
    space = SearchSpace(ranges={"k": (3, 4)}, fixed={"reasoning": "direct"})
    config = TuningConfig(trials=6, out_dir=tmp_path, objectives=("em", "lm_calls", "tokens"), space=space, seed=3,
                          plots=False)
    result = tune("single-rag", devset, retriever, config, lm=lm)
    rows = trial_rows(tmp_path)
    distinct_k = {r["k"] for r in rows}
    assert len(rows) == 6 and len(distinct_k) == 2
    assert lm.engine.count == len(distinct_k) * len(devset)
    assert sum(int(r["lm_calls_spent"]) for r in rows) == lm.engine.count
    for k in distinct_k:
        same = [r for r in rows if r["k"] == k]
        assert max(int(r["lm_calls_spent"]) for r in same) == len(devset)
        assert {r["tokens"] for r in same} == {same[0]["tokens"]} and {r["lm_calls"] for r in same} == {"1.0"}
        assert {r["total_lm_calls"] for r in same} == {str(len(devset))}
    cost = result.cost
    assert cost["trials"] == 6 and cost["one_pass_lm_calls"] == len(devset)
    assert cost["lm_calls_spent"] == lm.engine.count and cost["passes_spent"] == 2.0
    assert cost["spent_over_trials_x_one_pass"] == pytest.approx(2 / 6)


def test_a_rerun_continues_the_study_to_its_total_and_refuses_other_settings(retriever, tmp_path):
    devset = EXAMPLES[:4]
    lm = scripted_lm(answers_when_the_evidence_fits)
    common = {"out_dir": tmp_path, "objectives": ("em",), "plots": False, "space": SPACE}
    first = tune("single-rag", devset, retriever, TuningConfig(trials=3, seed=4, **common), lm=lm)
    second = tune("single-rag", devset, retriever, TuningConfig(trials=5, seed=5, **common), lm=lm)
    third = tune("single-rag", devset, retriever, TuningConfig(trials=5, seed=6, **common), lm=lm)
    assert (first.ran, second.ran, third.ran) == ([0, 1, 2], [3, 4], [])
    assert len(third.study.get_trials(states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED))) == 5
    with pytest.raises(ConfigError, match=r"other settings \(devset\)"):
        tune("single-rag", EXAMPLES[:5], retriever, TuningConfig(trials=6, study_name="single-rag-em", **common),
             lm=lm)
    wider = SearchSpace(ranges={"k": (2, 12)}, fixed={"reasoning": "direct"})
    with pytest.raises(ConfigError, match=r"other settings \(space\)"):
        tune("single-rag", devset, retriever,
             TuningConfig(trials=6, study_name="single-rag-em", **{**common, "space": wider}), lm=lm)


def test_a_study_continued_by_another_run_proposes_what_an_uninterrupted_one_did(retriever, tmp_path):
    devset = EXAMPLES[:4]
    lm = scripted_lm(answers_when_the_evidence_fits)
    common = {"objectives": ("em",), "plots": False, "seed": 3, "pruner": "none", "space": SPACE}
    whole = tune("single-rag", devset, retriever, TuningConfig(trials=8, out_dir=tmp_path / "whole", **common), lm=lm)
    tune("single-rag", devset, retriever, TuningConfig(trials=3, out_dir=tmp_path / "parts", **common), lm=lm)
    parts = tune("single-rag", devset, retriever, TuningConfig(trials=8, out_dir=tmp_path / "parts", **common), lm=lm)
    proposed = [[(t.params["k"], t.values) for t in r.study.get_trials()] for r in (whole, parts)]
    assert proposed[0] == proposed[1] and len({k for k, _ in proposed[0]}) > 2


def test_a_trial_asked_for_after_other_workers_took_the_studys_trials_is_never_run(retriever, tmp_path):
    lm = scripted_lm(answers_when_the_evidence_fits)
    common = {"out_dir": tmp_path, "objectives": ("em",), "plots": False, "space": SPACE}
    first = tune("single-rag", EXAMPLES[:4], retriever, TuningConfig(trials=2, seed=9, **common), lm=lm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        elsewhere = first.study.ask()  # another worker's trial, still running
    calls = lm.engine.count
    late = tune("single-rag", EXAMPLES[:4], retriever, TuningConfig(trials=3, seed=10, **common), lm=lm)
    assert late.ran == [] and lm.engine.count == calls
    surplus = late.study.trials[-1]
    assert surplus.number > elsewhere.number and surplus.state == optuna.trial.TrialState.FAIL
    assert surplus.user_attrs["arag"]["note"] == "study full: not run"
    assert trial_rows(tmp_path)[-1]["note"] == "study full: not run"


def test_a_trial_whose_every_question_fails_stops_the_study(retriever, tmp_path):
    lm = scripted_lm(answers_when_the_evidence_fits, faults=Faults(unparseable=1.0))
    with pytest.raises(AragError, match="trial 0: every question failed .* the last error: AdapterParseError"):
        tune("single-rag", EXAMPLES[:3], retriever,
             TuningConfig(trials=4, out_dir=tmp_path, objectives=("em",), space=SPACE, plots=False), lm=lm)
    study = optuna.load_study(study_name="single-rag-em", storage=f"sqlite:///{tmp_path / 'study.db'}")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.FAIL]


def test_worker_threads_share_one_study_and_stop_at_its_total(retriever, tmp_path):
    lm = scripted_lm(answers_when_the_evidence_fits, latency=0.002)
    config = TuningConfig(trials=8, out_dir=tmp_path, objectives=("f1",), space=SPACE, seed=7, pruner="none",
                          n_jobs=3, threads=2, plots=False)
    result = tune("single-rag", EXAMPLES[:6], retriever, config, lm=lm)
    finished = result.study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(finished) == 8 == len(result.ran)
    assert sorted(t.number for t in finished) == result.ran
    assert result.cost["lm_calls_spent"] == lm.engine.count


def test_a_failed_attempt_asked_again_in_a_later_chunk_is_spent_though_its_row_is_replaced(retriever, tmp_path):
    lm = scripted_lm(answers_when_the_evidence_fits, faults=Faults(unparseable=0.3, seed=1))
    config = TuningConfig(trials=2, out_dir=tmp_path, objectives=("em",), space=SPACE, seed=3, pruner="none",
                          chunk_size=2, plots=False)
    result = tune("single-rag", EXAMPLES[:8], retriever, config, lm=lm)
    facts = [t.user_attrs["arag"] for t in result.study.trials]
    from_rows = sum(f["lm_calls"] - f["cache_hits"] for f in facts)
    assert from_rows < lm.engine.count, "the rows keep each question's last attempt only"
    assert result.cost["lm_calls_spent"] == lm.engine.count


def test_trials_of_a_compiled_program_keep_its_prompts(retriever, tmp_path):
    with dspy.context(lm=scripted_lm(answers_when_the_evidence_fits)):
        compiled = compile(build_program("single-rag", retriever, reasoning="direct"), EXAMPLES[:4],
                           max_bootstrapped_demos=0, max_labeled_demos=2)
    path = save_program(compiled, tmp_path / "compiled.json")
    demo_questions = {demo["question"] for demo in compiled.generate_answer.demos}
    lm = scripted_lm(answers_when_the_evidence_fits)
    config = TuningConfig(trials=3, out_dir=tmp_path / "tune", objectives=("em",),
                          space=SearchSpace(ranges={"k": (2, 6)}), compiled=path, seed=11, plots=False)
    result = tune("single-rag", EXAMPLES[4:8], retriever, config, lm=lm)
    assert len(result.ran) == 3 and len(demo_questions) == 2
    assert all(all(q in call.prompt for q in demo_questions) for call in lm.engine.calls)
    assert result.best["params"]["reasoning"] == "direct"
    with pytest.raises(ConfigError, match="holds a compiled 'single-rag' program, not 'adaptive-note'"):
        tune("adaptive-note", EXAMPLES[4:8], retriever,
             TuningConfig(trials=1, out_dir=tmp_path / "other", compiled=path), lm=lm)


def test_plots_are_written_as_html_and_png(retriever, tmp_path):
    pytest.importorskip("plotly")
    pytest.importorskip("matplotlib")
    config = TuningConfig(trials=4, out_dir=tmp_path, objectives=("em", "lm_calls"), space=SPACE, seed=8)
    result = tune("single-rag", EXAMPLES[:4], retriever, config, lm=scripted_lm(answers_when_the_evidence_fits))
    for name in ("history-em", "importances-em", "slice-em", "retrieval-rate-em", "history-lm_calls", "pareto"):
        assert (tmp_path / "plots" / f"{name}.png").read_bytes().startswith(b"\x89PNG"), name
        assert "plotly" in (tmp_path / "plots" / f"{name}.html").read_text(), name
    assert "retrieval-rate-lm_calls" not in result.files and not result.skipped_plots
    pareto = (tmp_path / "plots" / "pareto.html").read_text()
    assert "em (mean over questions)" in pareto and "LM calls per question" in pareto


@pytest.mark.parametrize("settings, message", [
    ({"objectives": ("accuracy",)}, "unknown objective 'accuracy'"),
    ({"objectives": ("em", "em")}, "objectives must differ"),
    ({"space": {"names": ["k"], "fixed": {"k": 3}}}, r"parameter\(s\) k are both searched and fixed"),
    ({"space": {"ranges": {"k": (0, 5)}}}, "parameter 'k' must be in"),
    ({"space": {"ranges": {"reasoning": ("cot", "direct")}}}, "--range reasoning: the parameter is not searched"),
    ({"space": {"names": ["reasoning"], "ranges": {"reasoning": ("cot", "direct")}}},
     "only numeric parameters take a range"),
    ({"space": {"ranges": {"k": (1, 5, 9)}}}, "--range k: give a low and a high bound"),
    ({"space": {"names": ["k"], "every_tunable": True}}, "search the named parameters or every tunable one"),
    ({"space": {"fixed": {"k": 3}}}, "single-rag has no parameter left to tune"),
    ({"storage": "not a url"}, "is not a database URL"),
    ({"pruner": "percentile"}, "unknown pruner"),
    ({"trials": 0}, "trials must be a positive integer"),
    ({"cost_ceiling": 0.5}, "cost_ceiling must be above 1"),
])
def test_bad_tune_requests_raise_clear_errors(retriever, tmp_path, settings, message):
    with pytest.raises(ConfigError, match=message):
        space = SearchSpace(**settings.pop("space", {}))
        config = TuningConfig(**{"trials": 2, "out_dir": tmp_path, "space": space, **settings})
        tune("single-rag", EXAMPLES[:2], retriever, config, lm=scripted_lm(answers_when_the_evidence_fits))


@pytest.mark.parametrize("arguments, message", [
    (["--program", "no-retrieval"], "no-retrieval has no parameter left to tune"),
    (["--objective", "recall"], "unknown objective 'recall'"),
    (["--range", "k=9"], "--range k: give LOW:HIGH"),
    (["--cost-ceiling", "1"], "--cost-ceiling must be above 1"),
    (["--lm", ""], "no LM configured"),
])
def test_arag_tune_reports_bad_input_in_one_line(tmp_path, arguments, message):
    argv = ["tune", "--program", "single-rag", "--devset", str(QUESTIONS), "--corpus", str(CORPUS), "--trials", "2",
            "--lm", "openai/unused", "--api-base", "http://127.0.0.1:9/v1", "--out", str(tmp_path), *arguments]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2 and f"error: {message}" in result.output
    assert not (tmp_path / "study.db").exists()


def test_the_default_search_space_is_the_methods_thresholds_over_their_search_ranges():
    space = search_space("adaptive-note")
    assert [(p.name, p.low, p.high) for p in space] == [("t_iu", 1, 3), ("t_ci", 1, 5), ("t_rp", 5, 30)]
    assert [p.name for p in search_space("flare")] == ["theta", "beta"]
    assert [p.name for p in search_space("crag")] == ["upper", "lower"]
    assert [p.name for p in search_space("self-rag")] == ["delta", "w_rel", "w_sup", "w_use"]
    assert [(p.name, p.high) for p in search_space("single-rag")] == [("k", 20)]
    everything = search_space("adaptive-note", SearchSpace(every_tunable=True))
    assert [(p.name, p.high) for p in everything][:4] == [("t_iu", 10), ("t_ci", 10), ("t_rp", 100), ("k", 100)]
    genground = search_space("genground", SearchSpace(every_tunable=True, fixed={"k": 5}))
    assert [p.name for p in genground] == ["batch_size", "max_hops"]
    narrowed = search_space("adaptive-note", SearchSpace(names=("t_ci",), ranges={"t_ci": ("2", "4")}))
    assert [(p.name, p.low, p.high) for p in narrowed] == [("t_ci", 2, 4)]
    with pytest.raises(ConfigError, match="no-retrieval has no parameter left to tune"):
        search_space("no-retrieval")


def test_the_command_line_reads_search_and_range_options_into_a_search_space():
    inline = searched_space(("k=1:10", "query_mode"), ("theta=0.5:0.9",), {"beta": "0.4"})
    assert inline == SearchSpace(names=("k", "query_mode"), ranges={"theta": ("0.5", "0.9"), "k": ("1", "10")},
                                 fixed={"beta": "0.4"})
    assert [(p.name, p.low, p.high) for p in search_space("flare", SearchSpace(inline.names, ranges={"k": ("1", "10")}))
            ] == [("k", 1, 10), ("query_mode", None, None)]
    assert searched_space(("all",), (), {}) == SearchSpace(every_tunable=True)
    with pytest.raises(ConfigError, match="--search k: give LOW:HIGH, got '1:2:3'"):
        searched_space(("k=1:2:3",), (), {})


def endless_asker(call):
    """Self-Ask that always wants one more follow-up: a question costs 2 LM calls per follow-up allowed, plus one."""
    if "needs_follow_up" in call.output_fields:
        asked = call.inputs["follow_ups"].count("Follow up:")
        return {"needs_follow_up": True, "follow_up": f"sub-question {asked}"}
    return {"answer": "unknown"}


def test_the_defaults_run_first_and_a_trial_far_costlier_is_pruned_early(retriever, tmp_path):
    devset = EXAMPLES[:6]
    space = SearchSpace(names=("max_follow_ups",), ranges={"max_follow_ups": (1, 20)})
    config = TuningConfig(trials=8, out_dir=tmp_path, objectives=("em",), space=space, seed=1, pruner="none",
                          chunk_size=2, cost_ceiling=1.5, plots=False)
    result = tune("self-ask", devset, retriever, config, lm=scripted_lm(endless_asker))
    first = result.study.trials[0]
    assert first.params == {"max_follow_ups": 5} and first.user_attrs["arag_role"] == "defaults"
    rows = trial_rows(tmp_path)
    assert float(rows[0]["total_lm_calls"]) == len(devset) * (2 * 5 + 1)
    costly = [r for r in rows if r["note"].startswith("cost:")]
    assert costly, "no trial ran over the ceiling"
    for row in rows[1:]:
        calls_per_question = 2 * int(row["max_follow_ups"]) + 1
        if calls_per_question > 1.5 * 11:
            assert row in costly and row["state"] == "pruned" and int(row["examples"]) == 2
            assert "over 1.5 x the default configuration's 11.0" in row["note"]
        else:
            assert row["state"] == "complete" and int(row["examples"]) == len(devset)


def test_no_defaults_trial_when_a_default_lies_outside_the_searched_range_or_the_ceiling_is_off(retriever, tmp_path):
    lm = scripted_lm(answers_when_the_evidence_fits)
    common = {"trials": 2, "objectives": ("em",), "seed": 0, "plots": False}
    narrow = SearchSpace(names=("k",), ranges={"k": (6, 8)}, fixed={"reasoning": "direct"})
    outside = tune("single-rag", EXAMPLES[:2], retriever,
                   TuningConfig(out_dir=tmp_path / "outside", space=narrow, **common), lm=lm)
    off = tune("single-rag", EXAMPLES[:2], retriever,
               TuningConfig(out_dir=tmp_path / "off", space=SPACE, cost_ceiling=None, **common), lm=lm)
    for result in (outside, off):
        assert all("arag_role" not in t.user_attrs for t in result.study.trials)


def test_a_defaults_trial_that_failed_is_queued_again_and_a_queued_one_only_once():
    from arag.optimizers.tuning import Objective, TuneResult, defaults_trial, defaults_unbeaten
    from arag.optimizers.tuning.run import _enqueue_defaults

    study = optuna.create_study(direction="maximize")
    space, defaults = search_space("flare"), {"theta": 0.8, "beta": 0.4}
    _enqueue_defaults(study, space, defaults)
    _enqueue_defaults(study, space, defaults)
    assert [(t.state, t.params) for t in study.trials] == [(optuna.trial.TrialState.WAITING, {})]
    killed = study.ask()
    assert killed.user_attrs["arag_role"] == "defaults"
    study.tell(killed, state=optuna.trial.TrialState.FAIL)
    _enqueue_defaults(study, space, defaults)
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert len(waiting) == 1 and waiting[0].user_attrs["arag_role"] == "defaults"
    assert defaults_trial(study) is None  # the killed one does not count
    rerun = study.ask()
    study.tell(rerun, 0.25)
    assert defaults_trial(study).number == rerun.number and defaults_trial(study).value == 0.25

    def result(best_em):
        return TuneResult(study=study, storage="memory", objectives=[Objective("em")], best={"values": {"em": best_em}},
                          pareto=[], cost={}, files={}, skipped_plots={})

    assert defaults_unbeaten(result(0.25)).number == rerun.number  # a tie is no gain
    assert defaults_unbeaten(result(0.5)) is None


def test_crag_thresholds_are_drawn_in_order_so_no_trial_is_infeasible():
    space = search_space("crag")
    assert [p.name for p in space] == ["upper", "lower"] and space[1].at_most == "upper"
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    drawn = []
    for _ in range(40):
        trial = study.ask()
        chosen: dict = {}
        for param in space:
            chosen[param.name] = param.suggest(trial, chosen)
        study.tell(trial, 0.0)
        drawn.append(chosen)
    assert all(d["lower"] <= d["upper"] for d in drawn)
    assert min(d["upper"] for d in drawn) < -0.5 and max(d["lower"] for d in drawn) > 0.0  # the whole triangle


def test_a_trial_folder_arag_did_not_make_is_refused_and_kept(retriever, tmp_path):
    from arag.scratch import ForeignFolder

    theirs = tmp_path / "trials" / "single-rag-em" / "0000"
    theirs.mkdir(parents=True)
    (theirs / "notes.txt").write_text("my notes\n")
    lm = scripted_lm(answers_when_the_evidence_fits)
    with pytest.raises(ForeignFolder, match=f"{theirs} is a folder that arag did not create"):
        tune("single-rag", EXAMPLES[:2], retriever,
             TuningConfig(trials=1, out_dir=tmp_path, objectives=("em",), space=SPACE, plots=False), lm=lm)
    assert sorted(p.name for p in theirs.iterdir()) == ["notes.txt"]
