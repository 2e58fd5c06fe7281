"""IRCoT: each sentence of the chain is the next query, K passages a step up to the cap, a stop at "answer is" or
the step limit, then one reader call over every passage; prev-sentence is the same program with other settings."""

import json

import dspy
import pytest

from arag.errors import ConfigError
from arag.passages import Passage
from arag.programs.baselines.multi_time import PreviousSentence
from arag.programs.frame.registry import get_program
from arag.programs.ircot import IRCoT
from arag.testing import FOUND_FOR, FixedRetriever, TemplateRetriever, scripted_lm
from arag.trace import Answer, Read, Retrieve, Sentence, Stop, StopReason, kinds_of, steps_of

QUESTION = "What government position was held by the woman who portrayed Corliss Archer in the film Kiss and Tell?"
READ = "Chief of Protocol"
CHAIN = ["Corliss Archer was played by Shirley Temple.", "Shirley Temple was an actress.",
         "She later became a diplomat.", "She served the United States abroad.",
         "So the answer is Shirley Temple."]


class Writer:
    """A scripted LM that writes `sentences` one after another, from wherever the answer so far stops (signature
    or raw prompt), and answers READ when asked for an answer. It keeps the passages each draft was shown
    (`drafts`) and each reader call (`readers`)."""

    def __init__(self, sentences):
        self.text = " ".join(sentences)
        self.drafts, self.readers = [], []

    def __call__(self, call):
        if call.raw or "continuation" in call.output_fields:
            written = call.prompt.rpartition("Answer:")[2].strip() if call.raw else call.inputs["answer_so_far"]
            assert self.text.startswith(written), f"the sentences {written!r} do not rebuild the chain"
            rest = self.text[len(written):].strip()
            self.drafts.append(call.prompt if call.raw else call.inputs["passages"])
            if call.raw:
                return rest + "\n\nQuestion: cut off by the stop sequence" if rest else ""
            return {"continuation": rest}
        self.readers.append(call)
        return {field: "The passages name her post." if field == "reasoning" else READ for field in call.output_fields}


def run(program_class, sentences, **params):
    writer = Writer(sentences)
    lm, retriever = scripted_lm(writer), TemplateRetriever(FOUND_FOR)
    with dspy.context(lm=lm):
        prediction = program_class(retriever, **params)(question=QUESTION)
    return prediction, writer, lm.engine, retriever


def stop_reason(prediction):
    return steps_of(prediction, Stop)[-1]["reason"]


def found(query, ranks):
    return [f"Passage {rank} found for: {query}" for rank in ranks]


@pytest.mark.parametrize("prompt_style", ["signature", "raw"])
def test_each_sentence_is_the_next_query_and_k_passages_a_step_accumulate_up_to_the_cap(prompt_style):
    prediction, writer, engine, retriever = run(IRCoT, CHAIN, k=4, max_passages=10, prompt_style=prompt_style)
    written = [step["text"] for step in steps_of(prediction, Sentence)]
    assert written == CHAIN and prediction.long_answer == " ".join(CHAIN)
    assert retriever.queries == [QUESTION, CHAIN[0], CHAIN[1]]  # 4 + 4 + 2 of 4: the cap of 10 is full
    assert [draft.count("found for:") for draft in writer.drafts] == [4, 8, 10, 10, 10]
    assert [step["retrieved"] for step in steps_of(prediction, Sentence)] == [False, True, True, False, False]
    assert [step.get("skipped") for step in steps_of(prediction, Sentence)][3:] == ["the passage cap is reached"] * 2
    assert stop_reason(prediction) == StopReason.ANSWER_IS

    # one reader call, after the chain, over every passage held and none beyond the cap
    assert len(writer.readers) == 1
    shown = writer.readers[0].inputs["passages"]
    held = found(QUESTION, range(4)) + found(CHAIN[0], range(4)) + found(CHAIN[1], range(2))
    assert all(text in shown for text in held) and shown.count("found for:") == 10
    assert found(CHAIN[1], [2])[0] not in shown
    assert steps_of(prediction, Read)[0]["passage_ids"] == [
        f"{query}#{rank}" for query, ranks in [(QUESTION, range(4)), (CHAIN[0], range(4)), (CHAIN[1], range(2))]
        for rank in ranks]
    assert kinds_of(prediction)[-3:] == [Stop, Read, Answer]
    assert prediction.answer == READ  # the reader's, not the chain's "Shirley Temple"
    assert engine.count == prediction.lm_calls == len(CHAIN) + 1


def test_a_sentence_that_says_answer_is_anywhere_ends_the_chain():
    chain = ["Corliss Archer was played by Shirley Temple.",
             "Her answer is Chief of Protocol, a post she held from 1976.", "She also served as an ambassador."]
    prediction, writer, engine, retriever = run(IRCoT, chain)
    assert [step["text"] for step in steps_of(prediction, Sentence)] == chain[:2]
    assert retriever.queries == [QUESTION, chain[0]]
    assert engine.count == 2 + 1 and stop_reason(prediction) == StopReason.ANSWER_IS

    # prev-sentence's rule waits for a final "So the answer is X." sentence: all three, then the empty draft
    prediction, writer, engine, retriever = run(PreviousSentence, chain)
    assert len(steps_of(prediction, Sentence)) == 3 and stop_reason(prediction) == StopReason.MODEL_ENDED
    assert engine.count == 3 + 1 and not writer.readers

    prediction, writer, engine, _ = run(IRCoT, chain, stop_rule="final-answer")
    assert len(steps_of(prediction, Sentence)) == 3 and engine.count == 3 + 1 + 1 and len(writer.readers) == 1


@pytest.mark.parametrize("max_steps", [3, None])
def test_the_chain_stops_at_the_step_limit_without_retrieving_for_the_last_sentence(max_steps):
    endless = [f"Fact number {n} about the film is recorded." for n in range(12)]
    params = {} if max_steps is None else {"max_steps": max_steps}
    prediction, writer, engine, retriever = run(IRCoT, endless, k=2, **params)
    limit = max_steps or 8
    assert IRCoT(TemplateRetriever(FOUND_FOR), **params).max_steps == limit
    assert [step["text"] for step in steps_of(prediction, Sentence)] == endless[:limit]
    assert retriever.queries == [QUESTION, *endless[: limit - 1]]
    assert stop_reason(prediction) == StopReason.STEP_LIMIT
    assert engine.count == prediction.lm_calls == limit + 1 and len(writer.readers) == 1


def test_a_chain_the_model_ends_costs_its_empty_draft_then_the_reader_answers():
    prediction, writer, engine, retriever = run(IRCoT, CHAIN[:2])
    assert [step["text"] for step in steps_of(prediction, Sentence)] == CHAIN[:2]
    assert stop_reason(prediction) == StopReason.MODEL_ENDED
    assert retriever.queries == [QUESTION, CHAIN[0], CHAIN[1]]  # the empty draft was written after CHAIN[1]'s
    assert engine.count == prediction.lm_calls == 2 + 1 + 1
    assert prediction.answer == READ


@pytest.mark.parametrize("reader, fields", [("cot", ["reasoning", "answer"]), ("direct", ["answer"]), ("none", None)])
def test_the_reader_reasons_first_answers_directly_or_is_left_out(reader, fields):
    prediction, writer, engine, _ = run(IRCoT, CHAIN, reader=reader)
    if fields is None:
        assert not writer.readers and not steps_of(prediction, Read)
        assert prediction.answer == "Shirley Temple" and engine.count == len(CHAIN)
    else:
        assert [call.output_fields for call in writer.readers] == [fields]
        assert prediction.answer == READ and engine.count == len(CHAIN) + 1
        assert steps_of(prediction, Read)[0]["reader"] == reader
    assert [step["answer"] for step in steps_of(prediction, Answer)] == [prediction.answer]


def test_prev_sentence_is_ircot_with_other_settings():
    settings = {"k": 2, "max_tokens": 256, "max_steps": 0, "stop_rule": "final-answer", "reader": "none",
                "max_passage_words": 0}
    baseline, _, baseline_engine, baseline_retriever = run(PreviousSentence, CHAIN)
    same, _, same_engine, same_retriever = run(IRCoT, CHAIN, **settings)
    retriever = TemplateRetriever(FOUND_FOR)
    assert PreviousSentence(retriever).config == IRCoT(retriever, **settings).config
    assert baseline_retriever.queries == same_retriever.queries
    assert [(s["step"], s.get("text"), s.get("query")) for s in baseline.trace] == [
        (s["step"], s.get("text"), s.get("query")) for s in same.trace]
    assert (baseline.answer, baseline.lm_calls) == (same.answer, same.lm_calls) == ("Shirley Temple", len(CHAIN))
    assert baseline_engine.count == same_engine.count


def test_defaults_the_searched_k_and_a_class_with_no_logic_of_its_own():
    assert get_program("ircot") is IRCoT and issubclass(IRCoT, PreviousSentence)
    assert not [name for name, value in vars(IRCoT).items() if callable(value)]
    program = IRCoT(TemplateRetriever(FOUND_FOR))
    assert {key: program.config[key] for key in ("k", "max_passages", "max_steps", "stop_rule", "reader",
                                                 "max_passage_words")} == {
        "k": 6, "max_passages": 15, "max_steps": 8, "stop_rule": "answer-is", "reader": "cot", "max_passage_words": 350}
    assert program.max_tokens >= program.max_steps * program.lookahead_tokens  # the step limit binds first
    assert {p.name: p.search_range for p in IRCoT.params if p.searched} == {"k": (2, 8)}
    assert program.default_max_lm_calls() >= program.max_steps + 2  # sentences, an empty draft, the reader
    assert PreviousSentence(TemplateRetriever(FOUND_FOR)).config == {
        "max_passages": 15, "k": 2, "lookahead_tokens": 64, "max_tokens": 256, "prompt_style": "signature",
        "max_steps": 0, "stop_rule": "final-answer", "reader": "none", "max_passage_words": 0}
    assert not hasattr(PreviousSentence(TemplateRetriever(FOUND_FOR)), "generate_answer")


@pytest.mark.parametrize("words, shown", [(None, 350), (0, 400), (500, 400)])
def test_each_paragraph_is_read_cut_to_its_first_350_words_as_the_official_code_shows_it(words, shown):
    text = " ".join(f"w{i}" for i in range(400))
    writer = Writer(CHAIN[-1:])
    lm = scripted_lm(writer)
    params = {} if words is None else {"max_passage_words": words}
    with dspy.context(lm=lm):
        prediction = IRCoT(FixedRetriever([Passage("long", "Long", text)]), k=1, **params)(question=QUESTION)
    expected = ["[1] Long | " + " ".join(f"w{i}" for i in range(shown))]
    assert json.loads(writer.drafts[0]) == expected  # the chain's draft
    assert json.loads(writer.readers[0].inputs["passages"]) == expected  # the reader
    assert steps_of(prediction, Retrieve)[0]["passages"][0]["id"] == "long"


@pytest.mark.parametrize("params, name", [
    ({"reader": "maybe"}, "reader"), ({"stop_rule": "never"}, "stop_rule"), ({"max_steps": -1}, "max_steps"),
    ({"max_passage_words": -1}, "max_passage_words"),
    ({"k": 0}, "k"), ({"k": 8, "max_passages": 7}, "max_passages"), ({"max_steps": "many"}, "max_steps"),
])
def test_bad_parameters_are_refused(params, name):
    with pytest.raises(ConfigError, match=f"^ircot: .*'{name}'"):
        IRCoT(TemplateRetriever(FOUND_FOR), **params)
