"""Example loaders: every dataset format on small files, detection, bad input naming its file and line, the bundled
sample set and the shared real sets."""

import json
from pathlib import Path

import dspy
import pytest

from arag.data import (
    FORMATS,
    dataset_from_text,
    default_metrics,
    detect_format,
    load_corpus,
    load_examples,
    sample_paths,
    score_all,
)
from arag.errors import ConfigError, DataError

FIXTURES = Path(__file__).parents[1] / "fixtures_data"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def jsonl(path: Path, rows) -> Path:
    return write(path, "".join(json.dumps(row) + "\n" for row in rows))


# ---------------------------------------------------------------- examples: the project's JSON Lines shape


def test_jsonl_examples_have_the_common_fields(tmp_path):
    path = jsonl(
        tmp_path / "dev.jsonl",
        [
            {
                "id": "q1",
                "question": " Where was Kepler born? ",
                "answers": ["Weil der Stadt", "Weil der Stadt"],
                "supporting_titles": ["Johannes Kepler"],
                "passages": [
                    {"id": "p1", "title": "Johannes Kepler", "text": "Born in Weil der Stadt.", "is_supporting": True}
                ],
                "source": "somewhere:data/dev.jsonl",
            }
        ],
    )
    [example] = load_examples(path)
    assert isinstance(example, dspy.Example)
    assert list(example.inputs().keys()) == ["question"]
    assert example.question == "Where was Kepler born?"
    assert example.answers == ["Weil der Stadt"]
    assert example.dataset == "jsonl"
    assert example.meta == {"source": "somewhere:data/dev.jsonl"}
    assert example.supporting_titles == ["Johannes Kepler"]
    assert example.passages == [
        {"id": "p1", "title": "Johannes Kepler", "text": "Born in Weil der Stadt.", "is_supporting": True}
    ]


def test_jsonl_dataset_comes_from_meta_source_or_path(tmp_path):
    rows = [
        {"id": "a", "question": "q?", "answers": ["B text"],
         "meta": {"choices": [{"label": "A", "text": "A text"}, {"label": "B", "text": "B text"}],
                  "answer_label": "B"}},
        {"id": "b", "question": "q?", "answers": ["yes"], "meta": {"label_set": ["yes", "no", "maybe"]}},
        {"id": "c", "question": "q?", "answers": ["no"], "meta": {"decomposition": ["x"]}},
        {"id": "d", "question": "q?", "answers": ["x"], "meta": {"question_decomposition": []}},
        {"id": "e", "question": "q?", "answers": ["x"], "meta": {"s_pop": 3, "prop": "occupation"}},
        {"id": "f", "question": "q?", "answers": ["x"], "source": "o/r@c:data/eval/2wikimultihopqa/test.json"},
        {"id": "g", "question": "q?", "answers": ["x"], "dataset": "TriviaQA"},
        {"id": "h", "question": "q?", "answer": "single answer"},
    ]
    examples = load_examples(jsonl(tmp_path / "mixed.jsonl", rows))
    assert [e.dataset for e in examples] == [
        "arc", "pubmedqa", "strategyqa", "musique", "popqa", "2wiki", "triviaqa", "jsonl"
    ]
    assert examples[0].choices == [{"label": "A", "text": "A text"}, {"label": "B", "text": "B text"}]
    assert examples[0].answer_label == "B"
    assert examples[-1].answers == ["single answer"]
    folder = tmp_path / "nq_open"
    folder.mkdir()
    [nq] = load_examples(jsonl(folder / "public.jsonl", [{"id": 1, "question": "q?", "answers": ["a"]}]))
    assert nq.dataset == "nq" and nq.id == "1"


def test_limit_takes_the_first_records(tmp_path):
    path = jsonl(tmp_path / "d.jsonl", [{"id": i, "question": f"q{i}?", "answers": ["a"]} for i in range(5)])
    assert [e.id for e in load_examples(path, limit=2)] == ["0", "1"]
    assert load_examples(path, limit=0) == []
    with pytest.raises(ConfigError, match="limit"):
        load_examples(path, limit=-1)


def test_missing_ids_are_generated_from_the_file_name(tmp_path):
    path = jsonl(tmp_path / "dev.jsonl", [{"question": "q?", "answers": ["a"]}, {"question": "r?", "answers": ["b"]}])
    assert [e.id for e in load_examples(path)] == ["dev-0", "dev-1"]


# ---------------------------------------------------------------- examples: original formats


def test_hotpotqa_distractor_json():
    first, second = load_examples(FIXTURES / "hotpot_dev_distractor.json")
    assert first.dataset == "hotpotqa" and first.id == "hp-0001"
    assert first.answers == ["Danube"]
    assert first.supporting_titles == ["The Magic Flute", "Vienna"]
    assert [p["is_supporting"] for p in first.passages] == [True, True, False]
    assert first.passages[0]["text"] == (
        "The Magic Flute is an opera by Wolfgang Amadeus Mozart. It premiered in Vienna in 1791."
    )
    assert first.passages[0]["id"] == "The Magic Flute"
    assert first.meta["type"] == "bridge" and first.meta["level"] == "medium"
    assert second.answers == ["yes"]
    assert default_metrics(first) == ["em", "f1"]


def test_hotpotqa_test_file_without_answers():
    with pytest.raises(DataError, match=r"hotpot_test_fullwiki.json, record 0 \(0-based\): missing answers"):
        load_examples(FIXTURES / "hotpot_test_fullwiki.json")
    examples = load_examples(FIXTURES / "hotpot_test_fullwiki.json", require_answers=False)
    assert [e.answers for e in examples] == [[], []]
    assert examples[1].passages[0]["text"] == "Marie Curie was born in Warsaw."


def test_2wiki_json():
    [example] = load_examples(FIXTURES / "dev_2wiki.json")
    assert example.dataset == "2wiki"
    assert example.answers == ["Bergen"]
    assert example.passages[1]["text"] == "Anna Berg is a director. She was born in Bergen."
    assert example.meta["evidences"][1] == ["Anna Berg", "place of birth", "Bergen"]
    assert example.supporting_titles == ["Northern Lights (film)", "Anna Berg"]


def test_musique_jsonl():
    first, second = load_examples(FIXTURES / "musique_ans_dev.jsonl")
    assert first.dataset == "musique"
    assert first.answers == ["Tyrrhenian Sea", "the Tyrrhenian"]
    assert [p["id"] for p in first.passages] == ["2hop__1_2-0", "2hop__1_2-1", "2hop__1_2-2"]
    assert first.supporting_titles == ["Tiber", "Rome"]
    assert first.meta["question_decomposition"][0]["answer"] == "Tiber"
    assert first.meta["answerable"] is True
    assert second.answers == ["Australian dollar"]


def test_strategyqa_json():
    first, second = load_examples(FIXTURES / "strategyqa_train.json")
    assert (first.dataset, first.id, first.answers, second.answers) == ("strategyqa", "sq-1", ["yes"], ["no"])
    assert [p["text"] for p in first.passages] == ["Vienna lies on the Danube.", "The Danube flows into the Black Sea."]
    assert first.meta["decomposition"][0] == "Which river passes Vienna?"
    assert default_metrics(first) == ["yes_no_acc"]


def test_popqa_tsv():
    first, second = load_examples(FIXTURES / "popqa.tsv")
    assert first.dataset == "popqa" and first.id == "101"
    assert first.question == "What is Anna Berg's occupation?"
    assert first.answers == ["film director", "director", "filmmaker"]
    assert first.meta == {"subj": "Anna Berg", "prop": "occupation", "obj": "film director",
                          "s_wiki_title": "Anna Berg", "s_pop": 42, "o_pop": 9000}
    assert second.answers == ["Norway", "Kingdom of Norway"]


def test_popqa_selfrag_jsonl():
    first, second = load_examples(FIXTURES / "popqa_longtail_w_gs.jsonl")
    first_record = {"question": "q", "answers": [], "ctxs": []}
    assert detect_format(FIXTURES / "popqa_longtail_w_gs.jsonl", first_record) == "popqa-selfrag"
    assert first.dataset == "popqa" and first.id == "101"
    assert first.meta == {"prop": "occupation", "s_wiki_title": "Anna Berg", "s_pop": 42}
    assert [p["id"] for p in first.passages] == ["9001", "101-ctx-1"]
    assert first.passages[0]["text"] == "Anna Berg is a Norwegian film director."
    assert "passages" not in second
    assert default_metrics(first) == ["match", "em", "f1"]


@pytest.mark.parametrize("name", ["ARC-Challenge-Test.jsonl", "arc_challenge_processed.jsonl"])
def test_arc_both_shapes(name):
    example = load_examples(FIXTURES / name)[0]
    assert example.dataset == "arc"
    # Programs receive only the question, so the options are listed in it.
    stem, options = example.question.split("\nChoices:\n")
    assert stem == "Which gas do plants take in for photosynthesis?"
    assert options.splitlines()[1] == "B) carbon dioxide"
    assert len(options.splitlines()) == len(example.choices)
    assert example.choices[1] == {"label": "B", "text": "carbon dioxide"}
    assert (example.answer_label, example.answers, example.meta["answer_index"]) == ("B", ["carbon dioxide"], 1)
    assert default_metrics(example) == ["choice_acc"]
    assert score_all(example, "(B) carbon dioxide") == {"choice_acc": 1.0}


def test_arc_numeric_labels_and_selfrag_passages():
    numeric = load_examples(FIXTURES / "ARC-Challenge-Test.jsonl")[1]
    assert (numeric.answer_label, numeric.answers) == ("1", ["the Sun"])
    [selfrag] = load_examples(FIXTURES / "arc_challenge_processed.jsonl")
    assert selfrag.passages == [{"id": "77", "title": "Photosynthesis",
                                 "text": "Plants take in carbon dioxide and release oxygen.", "is_supporting": False}]


def test_asqa_alce_json():
    [example] = load_examples(FIXTURES / "asqa_eval_gtr_top100.json")
    assert example.dataset == "asqa" and example.id == "-123"
    assert example.answers == ["Team A", "A", "Team B"]
    assert example.qa_pairs == [
        {"question": "Who won the men's tournament?", "short_answers": ["Team A", "A"]},
        {"question": "Who won the women's tournament?", "short_answers": ["Team B"]},
    ]
    assert [p["id"] for p in example.passages] == ["555", "-123-doc-1"]
    assert example.meta["long_answers"] == ["Team A won the men's tournament and Team B the women's."]
    assert score_all(example, "Team A won one final.") == {"str_em": 0.5, "str_hit": 0.0}


def test_pubhealth_jsonl():
    first, second, third = load_examples(FIXTURES / "health_claims_processed.jsonl")
    assert first.dataset == "pubhealth"
    assert first.answers == ["true"] and first.passages[0]["title"] == "Water"
    assert second.question == "Vitamin C cures the common cold." and second.answers == ["false"]
    assert third.answers == ["unproven"]
    assert score_all(second, "False. There is no evidence.") == {"yes_no_acc": 1.0}


@pytest.mark.parametrize(
    "name, fmt",
    [
        ("hotpot_dev_distractor.json", "hotpotqa"),
        ("dev_2wiki.json", "2wiki"),
        ("musique_ans_dev.jsonl", "musique"),
        ("strategyqa_train.json", "strategyqa"),
        ("popqa.tsv", "popqa"),
        ("popqa_longtail_w_gs.jsonl", "popqa-selfrag"),
        ("ARC-Challenge-Test.jsonl", "arc"),
        ("asqa_eval_gtr_top100.json", "asqa"),
        ("health_claims_processed.jsonl", "pubhealth"),
    ],
)
def test_auto_detection_matches_the_explicit_format(name, fmt):
    auto = load_examples(FIXTURES / name)
    assert [dict(e) for e in load_examples(FIXTURES / name, fmt=fmt)] == [dict(e) for e in auto]


def test_explicit_format_overrides_detection(tmp_path):
    path = jsonl(tmp_path / "data.jsonl", [{"_id": "x", "question": "q?", "answer": "a", "context": []}])
    assert load_examples(path)[0].dataset == "hotpotqa"
    assert load_examples(path, fmt="2wiki")[0].dataset == "2wiki"


def test_dataset_from_text():
    assert dataset_from_text("data/arc_challenge.jsonl") == "arc"
    assert dataset_from_text("research/search_results.jsonl") is None
    assert dataset_from_text("NQ-open.dev.jsonl") == "nq"
    assert dataset_from_text("pubmed_qa_labeled.jsonl") == "pubmedqa"


# ---------------------------------------------------------------- examples: bad input


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        load_examples(tmp_path / "absent.jsonl")
    with pytest.raises(DataError, match="empty file"):
        load_examples(write(tmp_path / "empty.jsonl", "\n \n"))
    with pytest.raises(DataError, match="no records"):
        load_examples(write(tmp_path / "empty.json", "[]"))


def test_malformed_line_names_file_and_line(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"id": 1, "question": "q?", "answers": ["a"]}\n\n{"id": 2, "question": \n')
    with pytest.raises(DataError) as error:
        load_examples(path)
    assert f"{path}, line 3: invalid JSON" in str(error.value)


def test_malformed_json_array_names_the_line(tmp_path):
    path = write(tmp_path / "hotpot.json", '[\n  {"_id": "a",\n   "question": }\n]\n')
    with pytest.raises(DataError, match=r"hotpot.json, line 3: invalid JSON"):
        load_examples(path)


@pytest.mark.parametrize(
    "row, message",
    [
        ({"id": 1, "answers": ["a"]}, "line 2: missing or empty question"),
        ({"id": 1, "question": "   ", "answers": ["a"]}, "line 2: missing or empty question"),
        ({"id": 1, "question": "q?"}, "line 2: missing answers"),
        ({"id": 1, "question": "q?", "answers": []}, "line 2: missing answers"),
        ({"id": 1, "question": "q?", "answers": ["a", ""]}, "line 2: invalid answer ''"),
        ({"id": 1, "question": "q?", "answers": {"a": 1}}, "line 2: answers must be a string or a list"),
        ({"id": 0, "question": "q?", "answers": ["a"]}, "line 2: duplicate id '0' (first at"),
        ({"id": 1, "question": "q?", "answers": ["a"], "passages": [{"id": "p"}]}, "line 2: passage 'p' has no text"),
        ({"id": 1, "question": "q?", "answers": ["a"], "meta": [1]}, "line 2: 'meta' must be an object"),
        ([1, 2], "line 2: expected a JSON object"),
    ],
)
def test_bad_records_are_errors_not_skipped(tmp_path, row, message):
    path = jsonl(tmp_path / "d.jsonl", [{"id": 0, "question": "fine?", "answers": ["yes"]}, row])
    with pytest.raises(DataError) as error:
        load_examples(path, fmt="jsonl")
    assert str(path) in str(error.value)
    assert message in str(error.value)


def test_bad_records_in_original_formats(tmp_path):
    arc = jsonl(tmp_path / "arc.jsonl",
                [{"id": "a", "question": {"stem": "q?", "choices": [{"label": "A", "text": "x"}]}, "answerKey": "E"}])
    with pytest.raises(DataError, match=r"line 1: answer label 'E' is not among the choices \['A'\]"):
        load_examples(arc)
    popqa = write(tmp_path / "p.tsv", "id\tquestion\tpossible_answers\n1\tq?\tnot json\n")
    with pytest.raises(DataError, match=r"p.tsv, line 2: possible_answers is not a JSON list"):
        load_examples(popqa)
    ragged = write(tmp_path / "r.tsv", "id\tquestion\tpossible_answers\n1\tq?\n")
    with pytest.raises(DataError, match=r"line 2: expected 3 tab-separated columns, got 2"):
        load_examples(ragged)
    strategy = write(tmp_path / "s.json", json.dumps([{"qid": "s", "question": "q?", "answer": "perhaps"}]))
    with pytest.raises(DataError, match=r"record 0 \(0-based\): StrategyQA answer must be true/false"):
        load_examples(strategy)
    asqa = write(tmp_path / "a.json",
                 json.dumps([{"sample_id": "1", "question": "q?", "qa_pairs": [{"short_answers": []}]}]))
    with pytest.raises(DataError, match=r"qa_pairs\[0\] needs a non-empty 'short_answers' list"):
        load_examples(asqa)
    hotpot = write(tmp_path / "h.json",
                   json.dumps([{"_id": "1", "question": "q?", "answer": "a", "context": [["T", "not a list"]]}]))
    with pytest.raises(DataError, match=r"context\[0\] must be \[title, \[sentences\]\]"):
        load_examples(hotpot)


def test_non_utf8_bytes(tmp_path):
    lines = tmp_path / "d.jsonl"
    lines.write_bytes(b'{"id": 1, "question": "q?", "answers": ["a"]}\n'
                      b'{"id": 2, "question": "caf\xe9?", "answers": ["a"]}\n')
    with pytest.raises(DataError, match=r"d.jsonl, line 2: not valid UTF-8"):
        load_examples(lines)
    document = tmp_path / "d.json"
    document.write_bytes(b'[\n{"_id": "1",\n "question": "caf\xe9?"}]')
    with pytest.raises(DataError, match=r"d.json, line 3: not valid UTF-8"):
        load_examples(document)


def test_unknown_and_undetectable_formats(tmp_path):
    path = jsonl(tmp_path / "d.jsonl", [{"id": 1, "question": "q?", "answers": ["a"]}])
    with pytest.raises(DataError) as error:
        load_examples(path, fmt="squad")
    assert "unknown dataset format 'squad'" in str(error.value)
    assert all(name in str(error.value) for name in FORMATS)
    odd = jsonl(tmp_path / "odd.jsonl", [{"prompt": "q?", "completion": "a"}])
    with pytest.raises(DataError, match=r"cannot tell the dataset format from the keys \['completion', 'prompt'\]"):
        load_examples(odd)
    scalar = write(tmp_path / "scalar.json", '"just a string"')
    with pytest.raises(DataError, match="expected a JSON list of records or JSON Lines"):
        load_examples(scalar)


# ---------------------------------------------------------------- the bundled sample set


def test_sample_set_is_answerable_from_its_corpus():
    questions_path, corpus_path = sample_paths()
    questions = load_examples(questions_path)
    corpus = load_corpus(corpus_path)
    assert len(questions) == 24 and len(corpus) == 240
    titles = {p.title for p in corpus}
    for example in questions:
        assert len(example.supporting_titles) == 2
        assert set(example.supporting_titles) <= titles
        assert example.answers[0].lower() not in ("yes", "no")


# ---------------------------------------------------------------- the shared real sets


def test_shared_hotpotqa_counts(shared_dataset):
    folder = shared_dataset("hotpotqa")
    examples = load_examples(folder / "public.jsonl")
    assert len(examples) == 300
    assert {e.dataset for e in examples} == {"hotpotqa"}
    assert all(len(e.passages) >= 2 and e.supporting_titles for e in examples)
    corpus = load_corpus(folder / "corpus.jsonl")
    assert len(corpus) == 4858
    corpus_ids = {p.id for p in corpus}
    assert all(p["id"] in corpus_ids for e in examples for p in e.passages)


@pytest.mark.parametrize(
    "name, count, dataset, metrics",
    [
        ("arc_challenge", 690, "arc", ["choice_acc"]),
        ("strategyqa", 1402, "strategyqa", ["yes_no_acc"]),
        ("popqa_longtail", 834, "popqa", ["match", "em", "f1"]),
        ("pubmedqa", 597, "pubmedqa", ["yes_no_acc"]),
        ("musique_train100", 57, "musique", ["em", "f1"]),
        ("2wikimultihopqa_an500", 303, "2wiki", ["em", "f1"]),
        ("nq_open", 2152, "nq", ["match", "em", "f1"]),
    ],
)
def test_shared_sets_load_with_the_right_dataset(shared_dataset, name, count, dataset, metrics):
    examples = load_examples(shared_dataset(name) / "public.jsonl")
    assert len(examples) == count
    assert {e.dataset for e in examples} == {dataset}
    assert default_metrics(examples[0]) == metrics
    assert all(set(score_all(e, e.answers[0]).values()) == {1.0} for e in examples if e.dataset != "nq")
