"""QA metrics against values worked out by hand."""

import dspy
import pytest

from arag.data import (
    METRICS,
    choice_accuracy,
    default_metrics,
    exact_match_score,
    f1_score,
    get_metric,
    match_score,
    normalize_answer,
    prediction_text,
    score_all,
    str_em,
    str_hit,
    yes_no_accuracy,
)
from arag.errors import ConfigError

ARC = dspy.Example(
    question="Which gas do plants take in for photosynthesis?",
    choices=[
        {"label": "A", "text": "oxygen"},
        {"label": "B", "text": "carbon dioxide"},
        {"label": "C", "text": "nitrogen"},
    ],
    answer_label="B",
    answers=["carbon dioxide"],
    dataset="arc",
).with_inputs("question")

QA_PAIRS = [
    {"question": "men's winner?", "short_answers": ["Team A"]},
    {"question": "women's winner?", "short_answers": ["Team B", "B Club"]},
    {"question": "junior winner?", "short_answers": ["Team C"]},
]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The  Eiffel-Tower!", "eiffeltower"),  # punctuation is deleted, not replaced by a space
        ("An apple, a day", "apple day"),
        ("  THE   Theatre ", "theatre"),  # articles only as whole words
        ("", ""),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match_takes_the_best_alias():
    assert exact_match_score("Weil der Stadt.", ["Stuttgart", "weil der stadt"]) == 1.0
    assert exact_match_score("Weil", ["Weil der Stadt"]) == 0.0
    assert exact_match_score("the Danube", "Danube") == 1.0


def test_f1_by_hand():
    # "the cat sat" -> [cat, sat]; "cat sat on mat" -> [cat, sat, on, mat]
    # common 2: precision 2/2 = 1, recall 2/4 = 1/2, F1 = 2 * 1 * 1/2 / (3/2) = 2/3
    assert f1_score("the cat sat", ["cat sat on mat"]) == pytest.approx(2 / 3)
    # [barack, obama, was, president] vs [obama]: precision 1/4, recall 1, F1 = 2 * 1/4 / (5/4) = 0.4
    assert f1_score("Barack Obama was president", ["Obama"]) == pytest.approx(0.4)
    # repeated tokens count by multiplicity: [cat, cat, cat] vs [cat, cat, dog] share 2 -> P = R = 2/3
    assert f1_score("the cat cat cat", ["cat cat dog"]) == pytest.approx(2 / 3)
    # max over aliases: 0.4 against "Obama", 1.0 against the full phrase
    assert f1_score("Barack Obama was president", ["Obama", "Barack Obama was president"]) == 1.0
    assert f1_score("Paris", ["London"]) == 0.0
    assert f1_score("anything", []) == 0.0


def test_f1_yes_no_rule():
    # HotpotQA: a yes/no/noanswer on either side scores 0 unless both sides are equal after normalisation
    assert f1_score("yes it is", ["yes"]) == 0.0
    assert f1_score("no", ["no"]) == 1.0
    assert f1_score("yes", ["no"]) == 0.0
    assert f1_score("Yes.", ["yes"]) == 1.0


def test_f1_when_normalisation_leaves_nothing():
    assert f1_score("a", ["the"]) == 1.0
    assert f1_score("Paris", ["A+"]) == 0.0


def test_match_is_substring_of_the_normalised_prediction():
    assert match_score("It was Mount Everest, in Nepal.", ["Everest"]) == 1.0
    assert match_score("K2", ["Everest", "Mount Everest"]) == 0.0
    assert match_score("", ["Everest"]) == 0.0
    assert match_score("whatever", ["the"]) == 0.0  # a gold that normalises to nothing never matches


def test_str_em_and_str_hit():
    prediction = "Team A won the men's final and B Club the women's."
    # pairs 1 and 2 hit, pair 3 does not: 2/3
    assert str_em(prediction, QA_PAIRS) == pytest.approx(2 / 3)
    assert str_hit(prediction, QA_PAIRS) == 0.0
    assert str_hit(prediction + " Team C took the junior title.", QA_PAIRS) == 1.0
    assert str_em(prediction, []) == 0.0 and str_hit(prediction, []) == 0.0


@pytest.mark.parametrize(
    "prediction",
    ["B", "(B)", "B)", "B.", "b)", "[B]", "B: carbon dioxide", "B) carbon dioxide", "Answer: B", "The answer is (B)",
     "Carbon dioxide."],
)
def test_choice_accuracy_right(prediction):
    assert choice_accuracy(prediction, ARC) == 1.0


@pytest.mark.parametrize("prediction", ["A", "A plant needs light", "C) carbon dioxide", "oxygen", "", "Both B and C"])
def test_choice_accuracy_wrong(prediction):
    assert choice_accuracy(prediction, ARC) == 0.0


def test_choice_accuracy_on_a_plain_dict_with_numeric_labels():
    example = {"choices": [{"label": "1", "text": "the Sun"}, {"label": "2", "text": "the Moon"}], "answer_label": "1"}
    assert choice_accuracy("1", example) == 1.0
    assert choice_accuracy("sun", example) == 1.0
    assert choice_accuracy("2.", example) == 0.0


@pytest.mark.parametrize(
    "prediction, answers, expected",
    [
        ("Yes, both were English.", ["yes"], 1.0),
        ("No.", ["yes"], 0.0),
        ("True", ["yes"], 1.0),
        ("It is false that penguins live there.", ["no"], 1.0),
        ("yes", ["true"], 1.0),
        ("maybe", ["maybe"], 1.0),
        ("Maybe; the data are mixed.", ["yes"], 0.0),
        ("The claim is a mixture of facts.", ["mixture"], 1.0),
        ("I think so", ["yes"], 0.0),
        ("Nothing to say", ["no"], 0.0),  # "nothing" is not the word "no"
    ],
)
def test_yes_no_accuracy(prediction, answers, expected):
    assert yes_no_accuracy(prediction, answers) == expected


def test_dspy_adapters_read_pred_answer_and_example_answers():
    example = dspy.Example(question="q?", answers=["cat sat on mat"]).with_inputs("question")
    prediction = dspy.Prediction(answer="the cat sat")
    assert get_metric("f1")(example, prediction) == pytest.approx(2 / 3)
    assert get_metric("em")(example, prediction, trace=[]) == 0.0
    assert get_metric("match")(example, "he said cat sat on mat") == 1.0
    assert get_metric("f1")(example, dspy.Prediction(reasoning="no answer field")) == 0.0
    assert get_metric("choice_acc")(ARC, dspy.Prediction(answer="(B)")) == 1.0
    asqa = dspy.Example(question="q?", answers=["Team A"], qa_pairs=QA_PAIRS)
    assert get_metric("str_em")(asqa, dspy.Prediction(answer="Team A and Team C")) == pytest.approx(2 / 3)
    assert get_metric("str_hit")(asqa, dspy.Prediction(answer="Team A and Team C")) == 0.0
    assert get_metric("yes_no_acc")({"answers": ["no"]}, dspy.Prediction(answer="No way")) == 1.0


def test_str_metrics_without_qa_pairs_use_the_answers_as_one_pair():
    example = dspy.Example(question="q?", answers=["Team A", "A Team"])
    assert get_metric("str_em")(example, "the A Team") == 1.0


def test_prediction_text():
    assert prediction_text(dspy.Prediction(answer=42)) == "42"
    assert prediction_text("plain") == "plain"
    assert prediction_text(None) == ""


def test_unknown_metric_lists_the_known_ones():
    with pytest.raises(ConfigError) as error:
        get_metric("bleu")
    assert all(name in str(error.value) for name in METRICS)


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"dataset": "hotpotqa"}, ["em", "f1"]),
        ({"dataset": "2wiki"}, ["em", "f1"]),
        ({"dataset": "musique"}, ["em", "f1"]),
        ({"dataset": "popqa"}, ["match", "em", "f1"]),
        ({"dataset": "triviaqa"}, ["match", "em", "f1"]),
        ({"dataset": "nq"}, ["match", "em", "f1"]),
        ({"dataset": "arc"}, ["choice_acc"]),
        ({"dataset": "strategyqa"}, ["yes_no_acc"]),
        ({"dataset": "pubmedqa"}, ["yes_no_acc"]),
        ({"dataset": "pubhealth"}, ["yes_no_acc"]),
        ({"dataset": "asqa"}, ["str_em", "str_hit"]),
        ({"dataset": "jsonl", "choices": [{"label": "A", "text": "x"}]}, ["choice_acc"]),
        ({"dataset": "jsonl", "qa_pairs": QA_PAIRS}, ["str_em", "str_hit"]),
        ({"dataset": "jsonl", "answers": ["yes"]}, ["match", "em", "f1"]),
        ({}, ["match", "em", "f1"]),
    ],
)
def test_default_metrics(fields, expected):
    assert default_metrics(dspy.Example(**fields)) == expected
    assert set(expected) <= set(METRICS)


def test_score_all_uses_the_default_metrics():
    example = dspy.Example(question="q?", answers=["cat sat on mat"], dataset="hotpotqa")
    assert score_all(example, "the cat sat") == {"em": 0.0, "f1": pytest.approx(2 / 3)}
    popqa = dspy.Example(question="q?", answers=["politician", "political leader"], dataset="popqa")
    # [he, was, politician] vs [politician]: precision 1/3, recall 1, F1 = 2 * 1/3 / (4/3) = 0.5
    assert score_all(popqa, "He was a politician.") == {"match": 1.0, "em": 0.0, "f1": pytest.approx(0.5)}
    pubmed = {"answers": ["maybe"], "dataset": "pubmedqa"}
    assert score_all(pubmed, "Maybe.") == {"yes_no_acc": 1.0}


def test_score_all_with_chosen_names():
    example = dspy.Example(question="q?", answers=["Everest"], dataset="hotpotqa")
    assert score_all(example, "Mount Everest", ["match", "em"]) == {"match": 1.0, "em": 0.0}
    assert score_all(example, None) == {"em": 0.0, "f1": 0.0}
    with pytest.raises(ConfigError, match="unknown metric 'rouge'"):
        score_all(example, "x", ["rouge"])
