"""Compiling with DSPy teleprompters: the metric adapters each one calls, and `arag compile`."""

import json
import logging
from pathlib import Path

import dspy
import pytest
from click.testing import CliRunner

from arag.cli import main
from arag.cli_optimize import compile_command, tune_command
from arag.data import load_corpus, load_examples
from arag.errors import ConfigError, DataError
from arag.evaluate import evaluate
from arag.optimizers.compile import PROPOSAL_MAX_TOKENS, changes, compile, dspy_metric, feedback_metric, tried
from arag.optimizers.saving import load_program
from arag.programs import build_program
from arag.retrievers import BM25Retriever
from arag.testing import OpenAICompatibleServer, scripted_lm

for command in (compile_command, tune_command):
    if command.name not in main.commands:
        main.add_command(command)

WRITTEN_SAMPLE = Path(__file__).parents[1] / "fixtures_data" / "written_sample"  # small, famous facts
QUESTIONS, CORPUS = WRITTEN_SAMPLE / "questions.jsonl", WRITTEN_SAMPLE / "corpus.jsonl"
EXAMPLES = load_examples(QUESTIONS)
GOLD = {e.question: e.answers[0] for e in EXAMPLES}
GOOD_INSTRUCTION = "Answer in a few words, read from the passages."


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    return BM25Retriever.build(load_corpus(CORPUS), tmp_path_factory.mktemp("idx") / "bm25")


def fields(call, answer, other="From the passages."):
    return {f: answer if f == "answer" else other for f in call.output_fields}


def test_dspy_metric_scores_without_a_trace_and_decides_success_with_one():
    example = dspy.Example(question="q", answers=["Weil der Stadt"])
    partly = dspy.Prediction(answer="Weil")
    assert dspy_metric("f1")(example, partly) == pytest.approx(0.5)
    assert dspy_metric("f1", success_threshold=0.5)(example, partly, []) is True
    assert dspy_metric("f1", success_threshold=0.6)(example, partly, []) is False
    assert dspy_metric("em")(example, dspy.Prediction(answer="weil der stadt.")) == 1.0


def test_feedback_metric_takes_gepas_five_arguments_and_explains_the_score(retriever):
    example = EXAMPLES[1]  # supporting: Kepler's laws of planetary motion, Johannes Kepler
    lm = scripted_lm(lambda call: fields(call, "Stuttgart"))
    with dspy.context(lm=lm):
        pred = build_program("single-rag", retriever, k=2)(question=example.question)
    retrieved = {p["title"] for p in pred.trace[0]["passages"]}
    result = feedback_metric("em")(example, pred, None, "generate_answer.predict", None)
    assert result.score == 0.0
    assert "'Stuttgart'" in result.feedback and "'Weil der Stadt'" in result.feedback
    missing = [t for t in example.supporting_titles if t not in retrieved]
    found = [t for t in example.supporting_titles if t in retrieved]
    assert f"never retrieved: {', '.join(missing) or 'none'}" in result.feedback
    assert f"Supporting passages retrieved: {', '.join(found) or 'none'}" in result.feedback
    assert "'generate_answer.predict'" in result.feedback
    dspy.GEPA(metric=feedback_metric("em"), reflection_lm=lm, auto="light")


def test_bootstrap_keeps_demos_only_from_examples_that_reach_the_success_threshold(retriever):
    train = EXAMPLES[:6]
    right, partly = {e.question for e in train[:2]}, {e.question for e in train[2:4]}

    def responder(call):
        question = call.inputs["question"]
        if question in right:
            return fields(call, GOLD[question])
        return fields(call, f"{GOLD[question]} indeed" if question in partly else "no idea")

    def demo_questions(threshold):
        with dspy.context(lm=scripted_lm(responder)):
            compiled = compile(build_program("single-rag", retriever, k=2), train, metric="f1",
                               success_threshold=threshold, max_bootstrapped_demos=6, max_labeled_demos=0)
        return {demo["question"] for demo in compiled.generate_answer.predict.demos}

    assert demo_questions(1.0) == right
    assert demo_questions(0.5) == right | partly


def one_follow_up(call):
    """Self-Ask asking the question itself as its one follow-up, then answering it right."""
    if "needs_follow_up" in call.output_fields:
        first = not call.inputs["follow_ups"]
        return {"needs_follow_up": first, "follow_up": call.inputs["question"] if first else ""}
    return fields(call, GOLD[call.inputs["question"]])


def test_written_demos_are_replaced_unless_kept_first(retriever):
    train = EXAMPLES[:3]

    def demos(keep):
        with dspy.context(lm=scripted_lm(one_follow_up)):
            compiled = compile(build_program("self-ask", retriever), train, metric="em", keep_written_demos=keep,
                               max_bootstrapped_demos=2, max_labeled_demos=0)
        return [demo["question"] for demo in compiled.next_follow_up.demos]

    written = [demo["question"] for demo in build_program("self-ask", retriever).next_follow_up.demos]
    assert len(written) > len(set(written)) >= 3  # one demo per decision of each written chain
    bootstrapped = [e.question for e in train[:2]]
    assert demos(keep=False) == bootstrapped
    assert demos(keep=True) == written + bootstrapped


def test_arag_compile_keeps_the_written_demos_when_asked(retriever, tmp_path, monkeypatch):
    monkeypatch.setenv("ARAG_HOME", str(tmp_path / "home"))

    written = [demo["question"] for demo in build_program("self-ask", retriever).next_follow_up.demos]
    demos, costs, served = {}, {}, {}
    with OpenAICompatibleServer(one_follow_up) as server:
        for keep in (False, True):
            out = tmp_path / f"self-ask-{keep}.json"
            result = CliRunner().invoke(main, [
                "compile", "--program", "self-ask", "--trainset", str(QUESTIONS), "--corpus", str(CORPUS),
                "--lm", "openai/loopback-kept", "--api-base", server.url, "--limit", "3",
                "--option", "max_bootstrapped_demos=2", "--option", "max_labeled_demos=0", "--out", str(out),
                *(["--keep-written-demos"] if keep else [])])
            assert result.exit_code == 0, result.output
            document = json.loads(out.read_text())
            assert document["meta"]["keep_written_demos"] is keep
            demos[keep] = [d["question"] for d in document["state"]["next_follow_up"]["demos"]]
            costs[keep], served[keep] = document["meta"]["cost"]["lm_calls"], server.engine.count
            changed = document["meta"]["changed"]
            assert document["meta"]["tried"] == []  # BootstrapFewShot scores no candidates on a validation set
            assert changed["next_follow_up"] == {"instructions": None, "demos": len(demos[keep])}
    assert len(demos[False]) == 2 and demos[True] == written + demos[False]
    # The second compile's calls came from DSPy's cache: the server answered none, and they still count as cost.
    assert costs[False] == served[False] > 0 and served[True] == served[False] and costs[True] == costs[False]


@pytest.mark.parametrize("teleprompter, options", [
    ("mipro", {"num_candidates": 2, "num_trials": 3, "max_bootstrapped_demos": 0, "max_labeled_demos": 0,
               "minibatch": False}),
    ("gepa", {"max_metric_calls": 24, "reflection_minibatch_size": 2}),
    ("copro", {"breadth": 2, "depth": 1}),
])
def test_prompt_optimizers_adopt_the_prompt_lms_instruction_when_it_scores_better(retriever, teleprompter, options):
    def task(call):
        if call.raw:
            return "```\nBe verbose.\n```"
        return fields(call, GOLD.get(call.inputs.get("question"), "?") if "few words" in call.instructions
                      else "I am not sure.", other="Be verbose.")

    def proposer(call):
        return f"```\n{GOOD_INSTRUCTION}\n```" if call.raw else fields(call, GOOD_INSTRUCTION, other=GOOD_INSTRUCTION)

    lm, prompt_lm = scripted_lm(task), scripted_lm(proposer)
    program = build_program("single-rag", retriever, k=2, reasoning="direct")
    original = program.generate_answer.signature.instructions
    with dspy.context(lm=lm):
        compiled = compile(program, EXAMPLES[:6], EXAMPLES[6:10], teleprompter=teleprompter, metric="em",
                           prompt_lm=prompt_lm, **options)
        score = evaluate(compiled, EXAMPLES[10:14], progress=False).summary["metrics"]["em"]
    assert compiled.generate_answer.signature.instructions.startswith(GOOD_INSTRUCTION)
    assert prompt_lm.engine.count > 0 and score == 1.0
    (changed,) = changes(program, compiled).values()  # single-rag's one predictor
    assert changed["instructions"] == compiled.generate_answer.signature.instructions
    assert program.generate_answer.signature.instructions == original and compiled.config == program.config
    weighed = [(c["score"], *c["changed"].values()) for c in tried(program, compiled)]
    assert weighed[0] == (1.0, changed) and weighed[-1] == (0.0, {"instructions": None, "demos": 0})
    assert [score for score, _ in weighed] == sorted((score for score, _ in weighed), reverse=True)


def test_the_task_lm_reflecting_for_itself_is_capped_and_answers_questions_with_its_own_budget(retriever, caplog):
    def task(call):
        if "answer" not in call.output_fields:  # GEPA's reflection, proposing an instruction
            return f"```\n{GOOD_INSTRUCTION}\n```" if call.raw else fields(call, GOOD_INSTRUCTION)
        return fields(call, GOLD.get(call.inputs.get("question"), "?") if "few words" in call.instructions else "no")

    lm = scripted_lm(task)
    caps: dict[bool, set] = {True: set(), False: set()}  # by whether the call answers a question
    answer = lm.engine.answer

    def recorded(call, **settings):
        caps["answer" in call.output_fields].add(settings.get("max_tokens"))
        return answer(call, **settings)

    lm.engine.answer = recorded
    caplog.set_level(logging.INFO, logger="arag")
    with dspy.context(lm=lm):
        compile(build_program("single-rag", retriever, k=2, reasoning="direct"), EXAMPLES[:4], EXAMPLES[4:6],
                teleprompter="gepa", metric="em", max_metric_calls=8, reflection_minibatch_size=2)
    assert caps[False] == {PROPOSAL_MAX_TOKENS}
    assert "gepa writes new instructions with the task LM itself" in caplog.text  # the hint for a small model
    assert caps[True] and PROPOSAL_MAX_TOKENS not in caps[True]  # the program's calls keep their own budgets


def test_random_search_scores_candidates_on_the_devset_and_keeps_demos_that_help(retriever):
    dev = EXAMPLES[6:10]

    def answers_only_with_demos(call):
        with_demos = any(other in call.prompt for other in GOLD if other != call.inputs["question"])
        return fields(call, GOLD[call.inputs["question"]] if with_demos else "no idea")

    lm = scripted_lm(answers_only_with_demos)
    with dspy.context(lm=lm):
        compiled = compile(build_program("single-rag", retriever, k=2), EXAMPLES[:6], dev, teleprompter="bootstrap-rs",
                           num_candidate_programs=1, max_bootstrapped_demos=1, max_labeled_demos=2)
    assert compiled.generate_answer.predict.demos
    asked = {call.inputs["question"] for call in lm.engine.calls}
    assert {e.question for e in dev} <= asked


def test_simba_runs_on_a_trainset_smaller_than_its_default_batch_and_scores_with_the_metric(retriever):
    right = {e.question for e in EXAMPLES[:3]}
    lm = scripted_lm(lambda call: fields(call, GOLD[call.inputs["question"]] if call.inputs.get("question") in right
                                          else "no idea"))
    with dspy.context(lm=lm):
        compiled = compile(build_program("single-rag", retriever, k=2), EXAMPLES[:6], teleprompter="simba",
                           metric="em", num_candidates=2, max_steps=1, max_demos=1)
    assert compiled.candidate_programs and all(c["score"] == 0.5 for c in compiled.candidate_programs)


def test_bad_compile_requests_raise_clear_errors(retriever):
    program = build_program("single-rag", retriever)
    with dspy.context(lm=scripted_lm(lambda call: fields(call, "x"))):
        with pytest.raises(ConfigError, match="unknown teleprompter 'miprov3'"):
            compile(program, EXAMPLES[:2], teleprompter="miprov3")
        with pytest.raises(ConfigError, match=r"bootstrap: unknown option\(s\) max_demos; known: .*max_labeled"):
            compile(program, EXAMPLES[:2], max_demos=2)
        with pytest.raises(ConfigError, match=r"bootstrap-rs: option\(s\) valset are set from devset"):
            compile(program, EXAMPLES[:2], teleprompter="bootstrap-rs", valset=EXAMPLES[:2])
        with pytest.raises(ConfigError, match="mipro: without auto, give both num_candidates and num_trials"):
            compile(program, EXAMPLES[:2], teleprompter="mipro", num_candidates=3)
        with pytest.raises(ConfigError, match=r"simba: bsize 8 is larger than the trainset \(2 examples\)"):
            compile(program, EXAMPLES[:2], teleprompter="simba", bsize=8)
        with pytest.raises(ConfigError, match="copro: Breadth must be greater than 1"):
            compile(program, EXAMPLES[:2], teleprompter="copro", breadth=1)
        with pytest.raises(DataError, match="trainset is empty"):
            compile(program, [])
        with pytest.raises(ConfigError, match="unknown metric 'acc'"):
            compile(program, EXAMPLES[:2], metric="acc")
    with pytest.raises(ConfigError, match="no LM is configured"):
        compile(program, EXAMPLES[:2])


def test_arag_compile_over_a_loopback_server_saves_a_program_that_reloads(tmp_path, monkeypatch):
    monkeypatch.setenv("ARAG_HOME", str(tmp_path / "home"))
    out = tmp_path / "compiled.json"
    with OpenAICompatibleServer(lambda call: fields(call, GOLD.get(call.inputs.get("question"), "?"))) as server:
        args = ["compile", "--program", "single-rag", "--trainset", str(QUESTIONS), "--corpus", str(CORPUS),
                "--lm", "openai/loopback-compile", "--api-base", server.url, "--param", "k=2", "--limit", "6",
                "--option", "max_bootstrapped_demos=2", "--option", "max_labeled_demos=2", "--out", str(out)]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        bad = CliRunner().invoke(main, [*args[:-2], "--option", "max_demos=2", "--out", str(tmp_path / "bad.json")])
        # `arag eval --compiled` rebuilds the compiled program: its name, parameters and demos.
        run = tmp_path / "run"
        evaluated = CliRunner().invoke(main, ["eval", "--compiled", str(out), "--dataset", str(QUESTIONS),
                                              "--corpus", str(CORPUS), "--lm", "openai/loopback-compile",
                                              "--api-base", server.url, "--limit", "2", "--out", str(run)])
        assert evaluated.exit_code == 0, evaluated.output
        # system, two demos as user/assistant turns, then the question
        assert [len(r["body"]["messages"]) for r in server.requests[-2:]] == [6, 6]  # would be 2 uncompiled
        summary = json.loads((run / "summary.json").read_text())
        assert (summary["program"], summary["params"], summary["compiled"]) == (
            "single-rag", {"k": 2, "reasoning": "cot"}, str(out))
        wrong = CliRunner().invoke(main, ["eval", "--compiled", str(out), "--program", "flare", "--dataset",
                                          str(QUESTIONS), "--corpus", str(CORPUS), "--lm", "openai/x", "--out",
                                          str(tmp_path / "wrong")])
        assert wrong.exit_code == 2 and "holds a compiled 'single-rag' program, not 'flare'" in wrong.output
    assert bad.exit_code == 2 and "unknown option(s) max_demos" in bad.output
    clash = CliRunner().invoke(main, [*args, "--option", "metric=em"])
    assert clash.exit_code == 2 and "--option metric: use the command's own option" in clash.output
    kept = CliRunner().invoke(main, [*args, "--option", "keep_written_demos=true"])
    assert kept.exit_code == 2 and "own option (" in kept.output and "--keep-written-demos)" in kept.output
    assert not (tmp_path / "bad.json").exists()
    program = load_program(out, BM25Retriever.build(load_corpus(CORPUS), tmp_path / "idx"))
    assert program.config == {"k": 2, "reasoning": "cot"}
    assert len(program.generate_answer.predict.demos) == 2
    printed = json.loads(result.output[result.output.index("{"):result.output.rindex("}") + 1])
    assert printed["changed"] == {"generate_answer.predict": {"instructions": None, "demos": 2}}
    assert printed["cost"]["lm_calls"] > 0


def test_feedback_says_a_wrong_answer_is_too_long_and_whether_the_retrieved_passages_hold_the_gold(retriever):
    held, missed = EXAMPLES[20], EXAMPLES[17]  # gold in single-rag's 5 passages: Menlo Park yes, Sweden no
    for example, in_passages in ((held, True), (missed, False)):
        found = retriever.retrieve(example.question, 5)
        assert any(example.answers[0].lower() in p.long_text.lower() for p in found) is in_passages
    rambling = "It was somewhere in the eastern part of the country near a river and a large city"
    metric = feedback_metric("em", retriever)
    with dspy.context(lm=scripted_lm(lambda call: fields(call, rambling))):
        feedback = metric(held, build_program("single-rag", retriever, k=5)(question=held.question)).feedback
        assert f"The answer is {len(rambling.split())} words long where the gold answer has 2" in feedback
        assert "The gold answer is in the retrieved passages" in feedback
        feedback = metric(missed, build_program("single-rag", retriever, k=5)(question=missed.question)).feedback
        assert "The gold answer is in none of the retrieved passages: retrieve differently" in feedback
        closed_book = build_program("no-retrieval", retriever)(question=held.question)
        assert "(nothing was retrieved)" in metric(held, closed_book).feedback
        assert "gold answer is in" not in feedback_metric("em")(held, closed_book).feedback  # no retriever given
    with dspy.context(lm=scripted_lm(lambda call: fields(call, held.answers[0]))):
        feedback = metric(held, build_program("single-rag", retriever, k=5)(question=held.question)).feedback
    assert "words long" not in feedback and "gold answer is in" not in feedback
