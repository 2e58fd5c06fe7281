"""CRAG: the three actions, refinement and knowledge searching inside the program, its parameters,
and `arag eval --program crag` over a loopback OpenAI-compatible server on HotpotQA."""

import json
import re
import uuid

import dspy
import pytest
import ujson
from click.testing import CliRunner

from arag.cli import main
from arag.errors import ConfigError, QuestionFailed
from arag.passages import Passage
from arag.programs.crag.evaluator import trigger
from arag.programs.crag.steps import Action, AnswerFromQuestion, Evaluate, Refine, Rewrite, Search
from arag.programs.frame.registry import build_program
from arag.retrievers import BM25Retriever
from arag.testing import FixedRetriever, Tokens, no_logprobs_lm, scripted_lm
from arag.trace import Retrieve, is_step, steps_of

QUESTION = "When was the Eiffel Tower completed?"
PASSAGES = [
    Passage("eiffel", "Eiffel Tower", "The Eiffel Tower is in Paris. It was completed in 1889. It is made of iron. "
                                      "Gustave Eiffel's company built it."),
    Passage("louvre", "Louvre", "The Louvre is a museum in Paris."),
    Passage("brie", "Brie", "Brie is a soft cheese."),
]
# p(yes) by the first word of the table the judged text contains.
P_YES = {"1889": 0.9, "Gustave": 0.3, "Louvre": 0.6, "Statue": 0.95}
SECOND_INDEX = [
    Passage("liberty", "Statue of Liberty", "The Statue of Liberty has an iron frame. Gustave Eiffel designed it."),
    Passage("garnier", "Palais Garnier", "The Palais Garnier is an opera house in Paris."),
]
LIBERTY_STRIP = "Statue of Liberty | The Statue of Liberty has an iron frame. Gustave Eiffel designed it."


def judged(p_yes):
    if p_yes >= 0.5:
        return {"relevant": Tokens([("yes", p_yes, {"no": 1 - p_yes})])}
    return {"relevant": Tokens([("no", 1 - p_yes, {"yes": p_yes})])}


def responder(call):
    if call.output_fields == ["relevant"]:
        return judged(next((p for word, p in P_YES.items() if word in call.inputs["passage"]), 0.1))
    if call.output_fields == ["keywords"]:
        return {"keywords": ["Gustave Eiffel", "iron", "frame", "extra keyword"]}
    if "knowledge" in call.inputs:
        return {"answer": json.loads(call.inputs["knowledge"])[0].split(" | ")[0]}
    return {"answer": "closed book"}


@pytest.fixture
def second_index(tmp_path):
    BM25Retriever.build(SECOND_INDEX, tmp_path / "second")
    return f"local:{tmp_path / 'second'}"


def run(lm=None, **params):
    lm = lm or scripted_lm(responder)
    program = build_program("crag", FixedRetriever(PASSAGES), k=3, reasoning="direct", **params)
    with dspy.context(lm=lm):
        return program(question=QUESTION), lm


def test_correct_refines_the_retrieved_passages_only():
    prediction, lm = run(strips_top_k=2)
    assert prediction.action == "correct"
    (evaluate,) = steps_of(prediction, Evaluate)
    assert [s["score"] for s in evaluate["scores"]] == pytest.approx([0.8, 0.2, -0.8])
    assert steps_of(prediction, Action)[0]["max_score"] == pytest.approx(0.8)
    # Strips: Eiffel's first three sentences (0.8), its fourth (Gustave: -0.4), the Louvre (0.2), Brie (-0.8).
    (refine,) = steps_of(prediction, Refine)
    assert refine["strip_scores"] == pytest.approx([0.8, -0.4, 0.2, -0.8])
    assert prediction.knowledge == [
        "Eiffel Tower | The Eiffel Tower is in Paris. It was completed in 1889. It is made of iron.",
        "Louvre | The Louvre is a museum in Paris.",
    ]
    assert not steps_of(prediction, Rewrite) and prediction.retrieval_calls == 1
    # Judge each passage, each new strip (the one-sentence passages' strips repeat their passage's
    # judgement and come from DSPy's cache), then answer.
    assert lm.engine.count == 3 + 2 + 1
    assert prediction.answer == "Eiffel Tower"


def test_ambiguous_joins_refined_retrieval_and_searched_knowledge(second_index):
    prediction, lm = run(upper=0.9, web=second_index)
    assert prediction.action == "ambiguous"
    # strips_top_k=5 keeps the three strips above -0.5 (in reading order), then the searched ones.
    assert prediction.knowledge == [
        "Eiffel Tower | The Eiffel Tower is in Paris. It was completed in 1889. It is made of iron.",
        "Eiffel Tower | Gustave Eiffel's company built it.",
        "Louvre | The Louvre is a museum in Paris.",
        LIBERTY_STRIP,
    ]
    (rewrite,) = steps_of(prediction, Rewrite)
    assert rewrite["query"] == "Gustave Eiffel, iron, frame"  # at most three keywords
    search = steps_of(prediction, Retrieve)[1]
    assert search["why"] == f"knowledge search ({second_index})" and search["query"] == rewrite["query"]
    assert [d["url"] for d in search["documents"]] == ["liberty"]
    assert [r["source"] for r in steps_of(prediction, Refine)] == ["retrieved", second_index]
    keyword_call = next(call for call in lm.engine.calls if call.output_fields == ["keywords"])
    assert keyword_call.inputs == {"question": QUESTION}
    assert "Vienna Philharmonic" in keyword_call.prompt  # the few-shot demonstrations
    assert prediction.retrieval_calls == 2 and prediction.distinct_passages == 4


def test_incorrect_discards_retrieval_and_answers_from_the_search(second_index):
    prediction, lm = run(upper=0.95, lower=0.9, web=second_index)
    assert prediction.action == "incorrect"
    assert prediction.knowledge == [LIBERTY_STRIP]
    assert [r["source"] for r in steps_of(prediction, Refine)] == [second_index]
    assert prediction.answer == "Statue of Liberty"
    assert lm.engine.count == 3 + 1 + 1 + 1  # judge passages, rewrite, judge the one found strip, answer


def test_incorrect_without_knowledge_search_answers_from_the_question_and_says_so():
    prediction, lm = run(upper=0.95, lower=0.9)
    assert prediction.action == "incorrect" and prediction.answer == "closed book" and prediction.knowledge == []
    (search,) = steps_of(prediction, Search)
    assert search["skipped"] and "web=none" in search["reason"]
    assert steps_of(prediction, AnswerFromQuestion)[0]["reason"] == "no knowledge after the incorrect action"
    assert not steps_of(prediction, Rewrite) and lm.engine.count == 3 + 1
    assert "knowledge" not in lm.engine.calls[-1].inputs


def test_ambiguous_without_knowledge_search_keeps_the_retrieved_strips():
    prediction, _ = run(upper=0.9)
    assert prediction.action == "ambiguous" and len(prediction.knowledge) == 3
    assert steps_of(prediction, Search)[0]["skipped"]


def test_chain_of_thought_generator_reads_the_knowledge():
    def reasoned(call):
        answer = responder(call)
        return answer if call.output_fields != ["reasoning", "answer"] else {"reasoning": "From the strips.", **answer}

    program = build_program("crag", FixedRetriever(PASSAGES), k=3, strips_top_k=1)
    with dspy.context(lm=scripted_lm(reasoned)):
        prediction = program(question=QUESTION)
    assert prediction.answer == "Eiffel Tower" and len(prediction.knowledge) == 1


def test_lm_scorer_needs_logprobs_unless_the_fallback_is_chosen():
    with pytest.raises(QuestionFailed, match="LMError in .*log-probabilities"):
        run(lm=no_logprobs_lm(responder))
    prediction, _ = run(lm=no_logprobs_lm(responder), label_fallback="true")
    # yes -> +1 (Eiffel, Louvre), no -> -1 (Brie)
    assert [s["score"] for s in steps_of(prediction, Evaluate)[0]["scores"]] == [1.0, 1.0, -1.0]
    assert prediction.action == "correct"


def test_embedding_scorer_needs_no_lm_calls_to_judge():
    pytest.importorskip("sentence_transformers")
    lm = scripted_lm(responder)
    prediction, _ = run(lm=lm, scorer="embedding", upper=0.2, lower=-0.2)
    scores = [s["score"] for s in steps_of(prediction, Evaluate)[0]["scores"]]
    assert scores[0] == max(scores) and all(-1 <= s <= 1 for s in scores)
    assert prediction.action == trigger(scores, 0.2, -0.2)
    assert lm.engine.count == 1


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"upper": 0.2, "lower": 0.3}, "'lower'"),
        ({"upper": "1.5"}, "'upper'"),
        ({"lower": -2}, "'lower'"),
        ({"scorer": "bm25"}, "'scorer'"),
        ({"scorer": "t5:/no/such/model"}, "'scorer'"),
        ({"web": "altavista"}, "'web'"),
        ({"web": "local:/no/such/index"}, "'web'"),
        ({"strip_mode": "paragraphs"}, "'strip_mode'"),
        ({"strips_top_k": 0}, "'strips_top_k'"),
        ({"strip_threshold": "high"}, "'strip_threshold'"),
        ({"k": 0}, "'k'"),
    ],
)
def test_bad_parameters_name_themselves(params, named):
    with pytest.raises(ConfigError, match=named):
        build_program("crag", FixedRetriever(PASSAGES), **params)


def test_parameters_have_the_papers_defaults_and_accept_cli_strings(monkeypatch):
    monkeypatch.setenv("TAVILY_API_KEY", "tvly-test")
    program = build_program("crag", FixedRetriever(PASSAGES))
    defaults = {"k": 10, "upper": 0.5, "lower": -0.9, "strips_top_k": 5, "strip_threshold": -0.5, "web_k": 5,
                "web": "none", "scorer": "lm", "strip_mode": "sentences"}
    assert {name: program.config[name] for name in defaults} == defaults
    program = build_program("crag", FixedRetriever(PASSAGES), upper="0.3", lower="0.3", k="4", web="tavily")
    assert (program.upper, program.lower, program.k, str(program.corrector.knowledge_search)) == (0.3, 0.3, 4, "tavily")


# --- the CLI over a loopback server on HotpotQA ------------------------------------------------------

N_QUESTIONS = 6
PROFILE_ACTION = ("correct", "ambiguous", "incorrect")


def hotpot_responder(examples):
    """A scripted judge whose confidence depends on the question: for question i, profile i % 3 gives
    supporting paragraphs p(yes) 0.97 (-> Correct), every paragraph 0.5 (-> Ambiguous), or every
    paragraph 0.02 (-> Incorrect); pages from the second index ("web: " titles) get 0.9."""
    profile = {ex.question: i % 3 for i, ex in enumerate(examples)}
    supporting = {ex.question: set(ex.supporting_titles) for ex in examples}

    def respond(call):
        question = call.inputs.get("question", "")
        if call.output_fields == ["relevant"]:
            title = call.inputs["passage"].split(" | ")[0]
            if title.startswith("web: "):
                return judged(0.9)
            p_yes = {0: 0.97 if title in supporting[question] else 0.3, 1: 0.5, 2: 0.02}[profile[question]]
            return judged(p_yes)
        if call.output_fields == ["keywords"]:
            return {"keywords": re.findall(r"\b[A-Z][a-z]+", question)[:4] or ["unknown"]}
        if "knowledge" in call.inputs:
            return {"answer": json.loads(call.inputs["knowledge"])[0].split(" | ")[0]}
        return {"answer": "unknown"}

    return respond


def test_arag_eval_runs_crag_over_a_loopback_server_and_all_three_actions_occur(shared_dataset, tmp_path,
                                                                                  monkeypatch):
    from arag.data import load_examples
    from arag.testing import OpenAICompatibleServer

    hotpot = shared_dataset("hotpotqa")
    monkeypatch.setenv("ARAG_HOME", str(tmp_path / "arag-home"))
    examples = load_examples(hotpot / "public.jsonl", limit=N_QUESTIONS)
    web_copies = [Passage(f"web-{p['id']}", f"web: {p['title']}", p["text"])
                  for ex in examples for p in ex.passages if p["is_supporting"]]
    BM25Retriever.build(web_copies, tmp_path / "second")
    out = tmp_path / "run"
    with OpenAICompatibleServer(hotpot_responder(examples)) as server:
        result = CliRunner().invoke(main, [
            "eval", "--program", "crag", "--dataset", str(hotpot / "public.jsonl"),
            "--corpus", str(hotpot / "corpus.jsonl"), "--lm", f"openai/crag-{uuid.uuid4().hex[:8]}",
            "--api-base", server.url, "--limit", str(N_QUESTIONS), "--out", str(out),
            "--param", "upper=0.5", "--param", "lower=-0.9", "--param", f"web=local:{tmp_path / 'second'}",
            "--param", "reasoning=direct",
        ], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        judge_requests = [r for r in server.requests
                          if "Judge whether the passage" in json.dumps(r["body"]["messages"])]
    assert judge_requests and all(r["body"]["logprobs"] is True and r["body"]["top_logprobs"] == 5
                                  for r in judge_requests)

    rows = {row["id"]: row for row in map(ujson.loads, (out / "predictions.jsonl").read_text().splitlines())}
    assert len(rows) == N_QUESTIONS and not any("error" in row for row in rows.values())
    actions = []
    for i, example in enumerate(examples):
        row = rows[example.id]
        (evaluated,), (acted,) = steps_of(row, Evaluate), steps_of(row, Action)
        scores = [s["score"] for s in evaluated["scores"]]
        action = acted["action"]
        assert action == row["outputs"]["action"] == trigger(scores, 0.5, -0.9) == PROFILE_ACTION[i % 3]
        searched = [s for s in row["trace"] if is_step(s, Retrieve) and s["why"].startswith("knowledge search")]
        assert bool(searched) == (action != "correct") == bool(steps_of(row, Rewrite))
        if action == "incorrect":
            assert all(k.startswith("web: ") for k in row["outputs"]["knowledge"])
        actions.append(action)
    assert set(actions) == {"correct", "ambiguous", "incorrect"}
    summary = ujson.loads((out / "summary.json").read_text())
    assert summary["params"]["web"].startswith("local:") and summary["n"] == N_QUESTIONS


def test_presets_set_the_official_thresholds_and_named_parameters_win():
    assert build_program("crag", FixedRetriever([]), preset="official-popqa").config["upper"] == 0.592
    program = build_program("crag", FixedRetriever([]), preset="official-pubhealth", upper=0.7)
    assert (program.upper, program.lower) == (0.7, -0.915)
    with pytest.raises(ConfigError, match="no preset 'popqa'"):
        build_program("crag", FixedRetriever([]), preset="popqa")


def test_the_official_refinement_keeps_the_best_five_strips_of_a_search_in_score_order(tmp_path):
    # One-sentence pages, judged by the word they hold: Statue 0.9, 1889 0.8, Louvre 0.2, Gustave -0.4, Brie -0.8;
    # the last two are under 4 words, -1.
    texts = [f"The {word} page has an iron frame." for word in ["Brie", "Statue", "Louvre", "1889", "Gustave"]]
    pages = [Passage(f"w{i}", f"Page {i}", text) for i, text in enumerate([*texts, "Iron frame.", "An iron frame."])]
    BM25Retriever.build(pages, tmp_path / "pages")
    prediction, _ = run(upper=0.95, lower=0.9, refinement="official", web=f"local:{tmp_path / 'pages'}", web_k=7)
    assert prediction.action == "incorrect"
    (refine,) = steps_of(prediction, Refine)
    assert [kept["source"] for kept in refine["kept"]] == ["w1", "w3", "w2", "w4", "w0"]  # 5 of 7, best first
    assert [kept["score"] for kept in refine["kept"]] == pytest.approx([0.9, 0.8, 0.2, -0.4, -0.8])


def test_the_official_refinement_keeps_the_best_three_documents_whole_in_score_order():
    prediction, _ = run(refinement="official")
    (refine,) = steps_of(prediction, Refine)
    assert refine["mode"] == "passage" and refine["refinement"] == "official"
    # Whole passages, best first, the third kept although it scores below the paper's -0.5.
    assert [kept["source"] for kept in refine["kept"]] == ["eiffel", "louvre", "brie"]
    assert prediction.knowledge[0].startswith("Eiffel Tower | The Eiffel Tower is in Paris.") and \
        prediction.knowledge[0].endswith("Gustave Eiffel's company built it.")
