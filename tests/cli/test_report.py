"""`arag report`: the comparison of runs, the Pareto front, the questions' disagreement, errors for bad input,
and the page itself, drawn by a headless Chromium."""

import base64
import gzip
import json
import shutil
from dataclasses import replace

import dspy
import pytest
import ujson
from click.testing import CliRunner

import arag
from arag.cli import main
from arag.errors import ConfigError, DataError
from arag.evaluate import evaluate
from arag.passages import Passage
from arag.programs import build_program
from arag.programs.frame.sentences import split_sentences
from arag.report import comparison, disagree, pareto_front, question_table, render_html, report_data
from arag.runs import Row, load_runs
from arag.testing import (
    FOUND_FOR,
    NUMBERED,
    FixedRetriever,
    Scripted,
    TemplateRetriever,
    Tokens,
    isolated_cache,
    scripted_lm,
)
from arag.trace import Sentence, is_step


@pytest.fixture(autouse=True)
def fresh_cache():
    with isolated_cache():
        yield


def examples(ids, answer="Budapest"):
    return [dspy.Example(id=f"q{i}", question=f"Question {i}?", answers=[answer]).with_inputs("question")
            for i in ids]


def answering(answer_for):
    """A responder that answers `answer_for(question number)` and fills any other field."""
    def respond(call):
        number = int(call.inputs["question"].rstrip("?").split()[-1])
        return {field: answer_for(number) if field == "answer" else "Because." for field in call.output_fields}

    return respond


def run_folder(path, responder, ids=range(4), program="no-retrieval", **params):
    """A run of `program` over questions `ids`, written by the harness to `path`."""
    built = build_program(program, TemplateRetriever(NUMBERED), **params)
    with dspy.context(lm=scripted_lm(responder)):
        evaluate(built, examples(ids), out_dir=path, progress=False, max_errors=None,
                 run_info={"program": program, "params": built.config, "lm": "scripted"})
    return path


def fail_odd_questions(call):
    if "answer" in call.output_fields and int(call.inputs["question"].rstrip("?").split()[-1]) % 2:
        return "no JSON here"
    return answering(lambda number: "Budapest")(call)


# --- the comparison ----------------------------------------------------------------------------------


def test_one_comparison_row_per_run_with_its_metrics_failures_and_costs(tmp_path):
    right = run_folder(tmp_path / "right", answering(lambda n: "Budapest"))
    half = run_folder(tmp_path / "half", answering(lambda n: "Budapest" if n < 2 else "Vienna"), k=3,
                      program="single-rag")
    failing = run_folder(tmp_path / "failing", fail_odd_questions)
    rows = comparison(load_runs([right, half, failing]))
    assert [row["run"] for row in rows] == ["right", "half", "failing"]
    assert [row["program"] for row in rows] == ["no-retrieval", "single-rag", "no-retrieval"]
    assert [row["metrics"]["em"] for row in rows] == [1.0, 0.5, 0.5]
    assert [row["n"] for row in rows] == [4, 4, 4]
    assert rows[2]["n_failed"] == 2 and rows[2]["failures"] == {"AdapterParseError": 2}
    assert rows[0]["lm_calls"] == 1.0 and rows[1]["retrieval_calls"] == 1.0 and rows[0]["retrieval_calls"] == 0
    assert rows[1]["tokens"] == rows[1]["prompt_tokens"] + rows[1]["completion_tokens"] > 0
    assert rows[1]["changed_params"] == {"k": 3}  # the parameters that differ from single-rag's defaults
    assert rows[1]["params"]["k"] == 3


def test_the_pareto_front_keeps_the_runs_no_other_beats_on_quality_and_cost():
    # (quality, cost): the second is beaten by the first (better and cheaper); the fourth ties the third.
    points = [(0.8, 2.0), (0.7, 3.0), (0.9, 5.0), (0.9, 5.0), (0.5, 1.0), (0.5, 1.5)]
    assert pareto_front(points) == [True, False, True, True, True, False]
    assert pareto_front([(0.1, 1.0)]) == [True]


def test_the_fronts_of_runs_per_metric_and_cost_axis(tmp_path):
    right = run_folder(tmp_path / "right", answering(lambda n: "Budapest"))
    wrong = run_folder(tmp_path / "wrong", answering(lambda n: "Vienna"))
    costly = run_folder(tmp_path / "costly", answering(lambda n: "Budapest"), program="single-rag", k=2)
    data = report_data(load_runs([right, wrong, costly]))
    assert data["metrics"] == ["em", "f1", "match"]
    # Same quality as `right` but a retrieval per question: beaten on that axis, tied on LM calls.
    assert data["fronts"]["em"]["retrieval_calls"] == ["right"]
    assert data["fronts"]["em"]["lm_calls"] == ["right", "costly"]
    figure = data["figures"]["f1"]["lm_calls"]
    assert figure["layout"]["xaxis"]["title"]["text"] == "LM calls per question"
    assert [trace["name"] for trace in figure["data"]] == ["Pareto front", "runs (★ on the front)"]


# --- the questions -----------------------------------------------------------------------------------


def test_questions_where_the_runs_disagree_or_fail(tmp_path):
    first = run_folder(tmp_path / "first", answering(lambda n: "Budapest" if n != 1 else "Vienna"))
    second = run_folder(tmp_path / "second", answering(lambda n: "the Budapest." if n != 2 else "Vienna"))
    failing = run_folder(tmp_path / "failing", fail_odd_questions)
    questions = sorted(question_table(load_runs([first, second, failing])), key=lambda q: q["id"])
    assert [q["id"] for q in questions] == ["q0", "q1", "q2", "q3"]
    # q0: the same answer once normalised; q1, q2: different answers; q3: failed in the third run.
    assert [q["disagree"] for q in questions] == [False, True, True, True]
    assert [q["failed"] for q in questions] == [False, True, False, True]
    failed = questions[3]["rows"][2]
    assert failed["error_kind"] == "AdapterParseError" and failed["error_step"] == "generate_answer"
    assert "question" not in failed and questions[3]["answers"] == ["Budapest"]


def test_disagreement_counts_metrics_as_well_as_answers():
    row = Row(id="q0", question="?", answers=["Paris"], trace=[], prediction="Paris", metrics={"em": 1.0, "f1": 1.0})
    assert not disagree([row, replace(row)])
    assert disagree([row, replace(row, metrics={"em": 1.0, "f1": 0.5})])
    assert disagree([row, replace(row, prediction=None, error="LMError: down")])
    assert not disagree([row])


def test_runs_of_different_questions_say_which_each_holds(tmp_path):
    first = run_folder(tmp_path / "a" / "run", answering(lambda n: "Budapest"), ids=range(0, 4))
    second = run_folder(tmp_path / "b" / "run", answering(lambda n: "Budapest"), ids=range(2, 6))
    data = report_data(load_runs([first, second]))
    assert data["coverage"] == {"questions": 6, "in_every_run": 2, "per_run": {"a/run": 4, "b/run": 4}}
    by_id = {q["id"]: q for q in data["questions"]}
    assert by_id["q0"]["rows"][1] is None and by_id["q5"]["rows"][0] is None and by_id["q3"]["in_every_run"]
    result = CliRunner().invoke(main, ["report", str(first), str(second), "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert "2 are in every run (a/run 4, b/run 4)" in result.output


def test_the_last_row_of_a_question_counts_and_an_unfinished_last_line_is_left_out(tmp_path):
    run = run_folder(tmp_path / "run", fail_odd_questions)
    run_folder(run, answering(lambda n: "Budapest"))  # the failed questions answered on the second try
    with open(run / "predictions.jsonl", "a") as f:
        f.write('{"id": "q9", "question": "Quest')  # a row still being written
    (loaded,) = load_runs([run])
    assert sorted(row.id for row in loaded.rows) == ["q0", "q1", "q2", "q3"]
    assert loaded.summary["n_failed"] == 0 and loaded.summary["metrics"]["em"] == 1.0


# --- bad input ---------------------------------------------------------------------------------------


def cli_error(*args):
    result = CliRunner().invoke(main, ["report", *map(str, args)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_bad_input_gets_one_error_line_naming_the_problem(tmp_path):
    run = run_folder(tmp_path / "run", answering(lambda n: "Budapest"))
    out = tmp_path / "report.html"
    assert "no runs given" in cli_error("--out", out)
    assert "does not exist" in cli_error(tmp_path / "missing", "--out", out)
    (tmp_path / "empty").mkdir()
    assert "is not a run folder: it has no run.json and no predictions.jsonl" in cli_error(tmp_path / "empty",
                                                                                          "--out", out)
    (tmp_path / "starting").mkdir()
    (tmp_path / "starting" / "run.json").write_text('{"program": "crag"}')  # no question finished yet
    assert "holds no rows: the run has not finished a question yet" in cli_error(tmp_path / "starting", "--out", out)
    assert "given twice" in cli_error(run, tmp_path / "." / "run", "--out", out)
    assert f"folder {tmp_path / 'nowhere'} does not exist" in cli_error(run, "--out", tmp_path / "nowhere" / "r.html")
    assert "is a folder" in cli_error(run, "--out", tmp_path)
    assert not out.exists()


@pytest.mark.parametrize("line, problem", [
    ("not json", "predictions.jsonl:3: not a JSON row"),
    ("[1, 2]", "predictions.jsonl:3: not a row of arag's: a row is a JSON object, not list"),
    ('{"id": "x", "question": "Q?", "answers": []}', "predictions.jsonl:3: not a row of arag's: it has no "
                                                     "metrics, trace"),
    ('{"id": "x", "question": "Q?", "answers": [], "metrics": {"em": "yes"}, "trace": []}',
     "metrics should map metric names to numbers"),
    ('{"id": "x", "question": "Q?", "answers": [], "metrics": {"em": NaN}, "trace": []}',
     "metrics should map metric names to numbers"),
    ('{"id": "x", "question": "Q?", "answers": [], "metrics": {}, "trace": [{"query": "q"}]}',
     "trace should be a list of steps"),
])
def test_a_malformed_row_is_named_by_file_and_line(tmp_path, line, problem):
    run = run_folder(tmp_path / "run", answering(lambda n: "Budapest"), ids=range(2))
    with open(run / "predictions.jsonl", "a") as f:
        f.write(line + "\n")
    with pytest.raises(DataError) as caught:
        arag.report([run], tmp_path / "report.html")
    assert problem in str(caught.value) and str(run) in str(caught.value)
    assert problem in cli_error(run, "--out", tmp_path / "report.html")


def test_the_python_entry_point_raises_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no runs given"):
        arag.report([], tmp_path / "report.html")


# --- the page ----------------------------------------------------------------------------------------


def embedded_data(html):
    packed = html.split('<script id="report-data" type="application/octet-stream">')[1].split("</script>")[0]
    return json.loads(gzip.decompress(base64.b64decode(packed)))


def test_the_page_is_self_contained_and_embeds_the_data_once(tmp_path):
    run = run_folder(tmp_path / "run", answering(lambda n: "Budapest"))
    written = arag.report([run], tmp_path / "report.html")
    assert (written.runs, written.questions, written.in_every_run) == (1, 4, 4)
    html = written.path.read_text()
    assert "<script src" not in html and "<link" not in html  # nothing fetched at view time
    assert html.count('id="report-data"') == 1 and html.count("Plotly.react") == 1
    data = embedded_data(html)
    by_id = {q["id"]: q for q in data["questions"]}
    assert sorted(by_id) == ["q0", "q1", "q2", "q3"] and by_id["q0"]["rows"][0]["prediction"] == "Budapest"
    assert html == render_html(report_data(load_runs([run])))  # the same runs give the same page


# --- in a browser ------------------------------------------------------------------------------------

QUESTION_PASSAGES = [
    Passage("eiffel", "Eiffel Tower", "The Eiffel Tower is in Paris. It was completed in 1889."),
    Passage("brie", "Brie", "Brie is a soft cheese."),
]


DRAFT_PROBS = [0.9, 0.8, 0.3, 0.9, 0.95, 0.9]  # "The tower stands in Paris."
REWRITE_PROBS = [0.95, 0.6, 0.9, 0.85, 0.99, 0.97, 0.9]  # "The Eiffel Tower stands in Paris."


def flare_responder(call):
    """Two sentences: an unsure first one (FLARE retrieves and writes it again), a sure final one."""
    done = len(split_sentences(call.inputs["answer_so_far"]))
    if done == 0 and "found for: " + call.inputs["question"] not in call.inputs["passages"]:
        return {"continuation": Scripted("The Eiffel Tower stands in Paris.", REWRITE_PROBS)}
    if done == 0:
        return {"continuation": Scripted("The tower stands in Paris.", DRAFT_PROBS)}
    if done == 1:
        return {"continuation": Scripted("So the answer is Paris.", 0.95)}
    return {"continuation": ""}


def crag_responder(call):
    """Judges a passage on Paris relevant (p(yes) 0.9) and any other not (0.2); answers from the knowledge."""
    if call.output_fields == ["relevant"]:
        p_yes = 0.9 if "Paris" in call.inputs["passage"] else 0.2
        label = ("yes", p_yes, {"no": 1 - p_yes}) if p_yes >= 0.5 else ("no", 1 - p_yes, {"yes": p_yes})
        return {"relevant": Tokens([label])}
    return {field: "Paris" if field == "answer" else "Because." for field in call.output_fields}


def browser_runs(tmp_path):
    questions = examples(range(3), answer="Paris")
    runs = []
    for name, program, retriever, responder, params in [
        ("flare", "flare", TemplateRetriever(FOUND_FOR), flare_responder, {"k": 2}),
        ("crag", "crag", FixedRetriever(QUESTION_PASSAGES), crag_responder, {"k": 2, "reasoning": "direct"}),
        ("no-retrieval", "no-retrieval", None, fail_odd_questions, {}),
    ]:
        built = build_program(program, retriever, **params)
        with dspy.context(lm=scripted_lm(responder)):
            evaluate(built, questions, out_dir=tmp_path / name, progress=False, max_errors=None,
                     run_info={"program": program, "params": built.config, "lm": "scripted"})
        runs.append(tmp_path / name)
    return runs


def test_the_page_in_a_headless_browser(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="the browser test drives Chromium with playwright")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium)")
    runs = browser_runs(tmp_path)
    rows = [ujson.loads(line) for line in (tmp_path / "flare" / "predictions.jsonl").read_text().splitlines()]
    assert any(is_step(step, Sentence) and step["retrieved"] for step in rows[0]["trace"])
    page_path = arag.report(runs, tmp_path / "report.html").path

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            errors = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.goto(page_path.as_uri())
            page.wait_for_selector("body[data-ready]", timeout=30_000)

            assert page.locator("#runs-table tbody tr").count() == 3
            assert page.locator("#scatter .main-svg").count() > 0
            assert page.locator("#scatter .point").count() == 3  # one marker per run (the front's line has none)
            page.select_option("#cost", "seconds")
            assert "seconds per question" in page.locator("#scatter").inner_text()

            first = page.locator("details.question").first
            assert first.locator(".run-column").count() == 0  # drawn only when opened
            first.locator("summary").click()
            columns = first.locator(".run-column")
            sync_api.expect(columns).to_have_count(3)
            flare = columns.nth(0)
            assert flare.locator("li.step-sentence").count() == 2
            assert flare.locator(".written .search-mark").count() == 1  # the unsure first sentence's retrieval
            assert "least sure token 0.3" in flare.locator("li.step-sentence").first.inner_text()
            # each token drawn on its own, shaded by its probability, which its title gives
            tokens = flare.locator(".written .token")
            assert tokens.count() == 7 + 6  # the rewritten first sentence, then "So the answer is Paris."
            assert [float(p) for p in tokens.evaluate_all("spans => spans.map(s => s.dataset.p)")] == \
                REWRITE_PROBS + [0.95] * 6
            assert tokens.nth(1).get_attribute("title") == '" Eiffel" p = 0.6'
            assert tokens.nth(1).inner_text() == "Eiffel" and "background" in tokens.nth(1).get_attribute("style")
            assert flare.locator(".written").inner_text().count("The Eiffel Tower stands in Paris.") == 1
            assert flare.locator(".written .legend .swatch").count() == 6
            draft = flare.locator("li.step-sentence").first.locator(".muted", has_text="draft:").locator(".token")
            assert [float(p) for p in draft.evaluate_all("spans => spans.map(s => s.dataset.p)")] == DRAFT_PROBS
            crag = columns.nth(1)
            assert crag.locator("li.step-action .badge").inner_text() == "correct"
            assert crag.locator("li.step-evaluate .score-row").count() == 2
            assert crag.locator("li.step-refine .strip").count() >= 1
            passages = crag.locator("li.step-retrieve details.more")
            assert not passages.locator("ol.passages").is_visible()  # passages open on demand
            passages.locator("summary").click()
            assert "Eiffel Tower" in passages.locator("ol.passages").inner_text()

            page.check("#f-failed")
            assert page.locator("#shown-count").inner_text() == "1 of 3 questions shown"
            failed = page.locator("details.question:not([hidden])")
            failed.locator("summary").click()
            sync_api.expect(failed.locator(".error-box")).to_contain_text("AdapterParseError")
            page.uncheck("#f-failed")
            page.select_option("#f-metric", "em")
            page.fill("#f-below", "0.5")
            assert page.locator("#shown-count").inner_text() == "3 of 3 questions shown"  # no-retrieval: Budapest
            page.select_option("#f-run", "1")  # crag: Paris every time
            assert page.locator("#shown-count").inner_text() == "0 of 3 questions shown"
            page.fill("#f-below", "")

            page.locator("#runs-table th", has_text="Failed").click()
            page.locator("#runs-table th", has_text="Failed").click()
            assert page.locator("#runs-table tbody tr").first.locator("td").first.inner_text() == "no-retrieval"

            first.scroll_into_view_if_needed()
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
            flare.screenshot(path=str(tmp_path / "report-tokens.png"))

            old = older_flare_run(runs[0], tmp_path / "flare-untokened")
            page.goto(arag.report([old], tmp_path / "untokened.html").path.as_uri())
            page.wait_for_selector("body[data-ready]", timeout=30_000)
            page.locator("details.question summary").first.click()
            written = page.locator(".written")
            sync_api.expect(written.locator(".piece[style*='background']")).to_have_count(1)  # the final sentence
            assert written.locator(".token").count() == 0 and written.locator(".legend").count() == 0
            assert "shaded by the least sure token" in written.inner_text()
        finally:
            browser.close()
    assert errors == []
    shutil.copy(tmp_path / "report.png", "/tmp/report-screenshot.png")
    shutil.copy(tmp_path / "report-tokens.png", "/tmp/report-tokens.png")


def older_flare_run(run, out):
    """A copy of a FLARE run with the traces of a version that recorded no tokens."""
    shutil.copytree(run, out)
    rows = [ujson.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    for row in rows:
        for step in row["trace"]:
            step.pop("lookahead_tokens", None)
            step.pop("tokens", None)
    (out / "predictions.jsonl").write_text("".join(ujson.dumps(row) + "\n" for row in rows))
    return out
