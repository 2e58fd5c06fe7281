"""DRAGIN (programs/dragin/): the loop on a scripted attention model (truncation by sentence and by word, the
continuation's first sentence, the stop rules, the answer's completion, the costs), the threshold's two ends and the
recorded S against values computed here from a tiny random Llama's own forward passes, and the refusal without an
attention model."""

import re

import dspy
import numpy as np
import pytest

from arag.errors import ConfigError
from arag.lm.attention import Generation
from arag.passages import Passage
from arag.programs import build_program
from arag.programs.dragin import prompts
from arag.programs.dragin.dragin import NEVER
from arag.programs.dragin.rind import rind
from arag.programs.dragin.steps import AnswerCompletion, Continuation, FocusedQuery, RindCheck
from arag.testing import FixedRetriever, isolated_cache, scripted_lm
from arag.trace import Answer, Retrieve, Stop, steps_of

QUESTION = "Where was the director of Ed Wood born?"
PASSAGES = [Passage("p1", "Tim Burton", "Tim Burton was born in Burbank, California."),
            Passage("p2", "Ed Wood", "Ed Wood is a 1994 film directed by Tim Burton."),
            Passage("p3", "Burbank", "Burbank is a city in California.")]
UNSURE = 30.0  # the entropy of a token the scripted model is unsure of (marked *); every other token's is 0.01


class ScriptedAttentionModel:
    """An attention model whose generations are given in advance, a token marked * written unsure (entropy
    UNSURE). Tokens: words (with the space before them) and punctuation; attention: uniform over the tokens at or
    before each query."""

    def __init__(self, *texts: str):
        self.texts = list(texts)
        self.prompts: list[str] = []
        self.vocabulary = ["[BOS]"]

    def tokens(self, text: str) -> list[str]:
        return re.findall(r"\s*[^\s.,?]+|\s*[.,?]|\s+$", text)

    def encode(self, text: str, special: bool = True) -> list[int]:
        ids = []
        for token in self.tokens(text):
            if token not in self.vocabulary:
                self.vocabulary.append(token)
            ids.append(self.vocabulary.index(token))
        return [0, *ids] if special else ids

    def pieces(self, token_ids):
        return [self.vocabulary[i] for i in token_ids]

    def special_ids(self):
        return frozenset({0})

    def generate(self, prompt: str, max_new_tokens: int, stop: str | None = None) -> Generation:
        self.prompts.append(prompt)
        marked = self.tokens(self.texts.pop(0))[:max_new_tokens]
        ids = self.encode("".join(token.replace("*", "") for token in marked), special=False)
        entropies = [UNSURE if token.endswith("*") else 0.01 for token in marked]
        return Generation(len(self.encode(prompt)), tuple(ids), tuple(self.pieces(ids)), tuple(entropies), "stop")

    def last_layer_attention(self, token_ids) -> np.ndarray:
        n = len(token_ids)
        return (np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None])[None]  # one head


class Carrying:
    """A responder whose engine carries an attention model (as `StandInModel` carries its tiny one)."""

    def __init__(self, model):
        self.attention_model = model

    def __call__(self, call):
        return ""


def run(model, **params):
    lm = scripted_lm(Carrying(model))
    program = build_program("dragin", FixedRetriever(PASSAGES), **params)
    with isolated_cache(enabled=False), dspy.context(lm=lm):
        return program, program(question=QUESTION)


BURTON = " Ed Wood was directed by Tim Burton. He was born in Burbank*."
REWRITTEN = " He was born in Burbank, California. Then more."


@pytest.mark.parametrize("truncate, kept, long_answer", [
    ("sentence", "Ed Wood was directed by Tim Burton.",
     "Ed Wood was directed by Tim Burton. He was born in Burbank, California. So the answer is Burbank."),
    ("word", "Ed Wood was directed by Tim Burton. He was born in",
     "Ed Wood was directed by Tim Burton. He was born in He was born in Burbank, California. So the answer is "
     "Burbank."),
])
def test_a_trigger_truncates_retrieves_with_qfs_and_keeps_the_continuations_first_sentence(truncate, kept,
                                                                                          long_answer):
    model = ScriptedAttentionModel(BURTON, REWRITTEN, " So the answer is Burbank.")
    program, out = run(model, threshold=1.0, truncate=truncate, top_n=4)
    rind, continuation = steps_of(out.trace, RindCheck), steps_of(out.trace, Continuation)[0]
    assert [r["triggered"] for r in rind] == [True, False]
    assert rind[0]["trigger"] == "Burbank." and rind[0]["kept"] == kept
    assert rind[0]["dropped"] == BURTON.replace("*", "").strip()[len(kept):].strip()
    assert model.prompts[1].endswith(f"Answer: {kept}") and "Context:\n[1] Tim Burton | " in model.prompts[1]
    assert continuation["kept"] == "He was born in Burbank, California."
    assert continuation["passage_ids"] == ["p1", "p2", "p3"]
    query = steps_of(out.trace, FocusedQuery)[0]
    # uniform attention: each token before the trigger receives as much; "born?" and "Burton." have two tokens each,
    # and among the words of one token the earlier ones are kept first; four, in their order
    assert query["query"] == "director Ed born Burton" and query["trigger"] == "Burbank."
    assert steps_of(out.trace, Retrieve)[0]["query"] == query["query"]
    assert out.long_answer == long_answer and out.answer == "Burbank"
    assert steps_of(out.trace, Stop)[0]["reason"] == "answer_is"
    assert out.lm_calls == program.required_lm_calls(out.trace) == 3 and out.retrieval_calls == 1
    assert out.completion_tokens > 0 and out.prompt_tokens > sum(len(model.encode(p)) for p in model.prompts)


def test_no_word_above_the_threshold_keeps_the_whole_generation():
    model = ScriptedAttentionModel(BURTON, " So the answer is Burbank.")
    program, out = run(model, threshold=NEVER)
    assert [r["triggered"] for r in steps_of(out.trace, RindCheck)] == [False, False]
    assert not steps_of(out.trace, Retrieve) and out.retrieval_calls == 0
    written = BURTON.replace("*", "").strip()
    assert out.long_answer == f"{written} So the answer is Burbank."
    assert model.prompts[1].endswith(f"Answer: {written}") and "Context:" not in model.prompts[1]


def test_s_at_the_threshold_does_not_trigger_and_just_below_it_does():
    model = ScriptedAttentionModel(BURTON)
    generation = model.generate("", 100)
    scored = rind(generation.pieces, generation.entropies, model.last_layer_attention(generation.token_ids))
    top = max(scored, key=lambda word: word.score)
    assert top.word.text == " Burbank." and top.score > 1
    for threshold, triggered in ((top.score, False), (top.score - 1e-9, True)):
        model = ScriptedAttentionModel(BURTON, REWRITTEN, " So the answer is Burbank.")
        _, out = run(model, threshold=threshold)
        assert steps_of(out.trace, RindCheck)[0]["triggered"] is triggered


def test_stopwords_never_trigger_however_unsure():
    model = ScriptedAttentionModel(" It was in* the* of* Burbank.", " Burbank is a city.", " So the answer is Burbank.",
                                   " So the answer is Burbank.")
    _, out = run(model, threshold=0.0)
    reading = steps_of(out.trace, RindCheck)[0]
    assert reading["entropies"][2:5] == [UNSURE] * 3 and reading["scores"][:5] == [0.0] * 5
    assert reading["trigger"] == "Burbank." and reading["trigger_score"] > 0  # the first content word
    assert [r["trigger"] for r in steps_of(out.trace, RindCheck)] == ["Burbank.", "answer"]  # threshold 0: always


def test_writing_stops_past_max_length_tokens_and_the_answer_is_completed():
    model = ScriptedAttentionModel(" Ed Wood was directed by Tim Burton in Burbank", " California", "Burbank.")
    program, out = run(model, threshold=NEVER, max_length=8)
    reading = steps_of(out.trace, RindCheck)[0]
    assert reading["text"] == " Ed Wood was directed by Tim Burton in"  # max_length tokens per generation
    assert steps_of(out.trace, Stop)[0] == {"step": "stop", "reason": "token_budget", "pieces": 2, "tokens": 9}
    completion = steps_of(out.trace, AnswerCompletion)[0]
    assert completion["text"] == "Burbank." and model.prompts[2].endswith("in California So the answer is")
    assert out.answer == "Burbank" and steps_of(out.trace, Answer)[0]["answer"] == "Burbank"
    assert out.lm_calls == program.required_lm_calls(out.trace) == 3


def test_writing_stops_when_the_answer_stops_growing():
    model = ScriptedAttentionModel(" Ed Wood was directed by Tim Burton.", "", "Tim Burton.")
    _, out = run(model, threshold=NEVER)
    assert steps_of(out.trace, Stop)[0]["reason"] == "model_ended" and out.answer == "Tim Burton"
    assert out.long_answer == "Ed Wood was directed by Tim Burton. So the answer is Tim Burton."
    # a trigger at the first word whose continuation adds nothing: the answer stops growing too
    model = ScriptedAttentionModel(" Burbank* is it.", "", "Burbank.")
    _, out = run(model, threshold=1.0)
    assert steps_of(out.trace, RindCheck)[0]["kept"] == "" and steps_of(out.trace, Continuation)[0]["kept"] == ""
    assert steps_of(out.trace, Stop)[0]["reason"] == "model_ended"


def test_dragin_refuses_without_an_attention_model():
    program = build_program("dragin", FixedRetriever(PASSAGES))
    with isolated_cache(enabled=False), dspy.context(lm=scripted_lm(lambda call: "")):
        with pytest.raises(ConfigError, match=r"^dragin: needs a model's attention weights and full-vocabulary "
                                              r"distributions, which the LM \(scripted/\w+\) does not give"):
            program(question=QUESTION)
    with pytest.raises(ConfigError, match="attention_model '/nowhere/model.gguf' is no file, folder or model"):
        build_program("dragin", FixedRetriever(PASSAGES), attention_model="/nowhere/model.gguf")


def test_the_prompts_carry_the_examples_the_question_and_the_answer_so_far():
    closed = prompts.closed_book(QUESTION, "Ed Wood was directed by Tim Burton.")
    assert closed.count("\nAnswer: ") == len(prompts.EXAMPLES) + 1 and "Context:" not in closed
    assert closed.endswith(f"Question: {QUESTION}\nAnswer: Ed Wood was directed by Tim Burton.")
    opened = prompts.with_documents(QUESTION, "", PASSAGES[:2])
    assert "Context:\n[1] Tim Burton | Tim Burton was born in Burbank, California.\n[2] Ed Wood | " in opened
    assert opened.endswith(f"Question: {QUESTION}\nAnswer:")


# --- on a tiny random Llama: the recorded S against its own forward passes, the threshold's two ends ----------


def tiny_model():
    pytest.importorskip("transformers", reason="the attention model needs the `attention` extra")
    from arag.testing.attention import tiny_attention_model

    return tiny_attention_model()


def independent_reading(model, prompt: str, max_tokens: int):
    """Words, H, rescaled a and S of a greedy generation (ended by a special token other than the unknown one), from
    plain forward passes without a cache: a token continues a word when it is a `##` piece or closing punctuation;
    stopwords are NLTK's, as bm25s ships them."""
    import torch
    from bm25s.stopwords import STOPWORDS_EN_PLUS

    from arag.programs.frame.sentences import split_sentences

    ids, entropies = model.encode(prompt), []
    ends = set(model.tokenizer.all_special_ids) - {model.tokenizer.unk_token_id}
    with torch.inference_mode():
        for _ in range(max_tokens):
            logits = model.model(torch.tensor([ids])).logits[0, -1].double()
            if int(logits.argmax()) in ends:
                break
            p = torch.softmax(logits, dim=-1)
            entropies.append(float(-(p * torch.log(p)).sum()))
            ids.append(int(logits.argmax()))
        generated = ids[len(model.encode(prompt)):]
        attention = model.model(torch.tensor([generated]), output_attentions=True).attentions[-1][0].double()
    heads, n = attention.shape[0], len(generated)
    a_max = [sum(max((float(attention[h, j, i]) for j in range(i + 1, n)), default=0.0) for h in range(heads)) / heads
             for i in range(n)]
    names = model.tokenizer.convert_ids_to_tokens(generated)
    special = set(model.tokenizer.all_special_ids)
    groups: list[list[int]] = []
    for i, name in enumerate(names):
        joins = i > 0 and (name.startswith("##") or name in {".", ",", "?", "!"}) and generated[i] not in special \
            and generated[i - 1] not in special
        groups[-1].append(i) if joins else groups.append([i])
    texts = [model.tokenizer.decode([generated[i] for i in group]) for group in groups]
    text = model.tokenizer.decode(generated)
    ends = list(np.cumsum([len(s) for s in split_sentences(text)]))
    starts = [text.find(texts[0])]
    for word in texts[1:]:
        starts.append(text.find(word, starts[-1] + 1))
    sentence = [next(k for k, end in enumerate(ends) if start < end) for start in starts]
    attention_of = [sum(a_max[i] for i in group) for group in groups]
    rows = []
    for w, group in enumerate(groups):
        same = [attention_of[v] for v in range(len(groups)) if sentence[v] == sentence[w]]
        rescaled = attention_of[w] / np.mean(same)
        bare = texts[w].strip(".,?!").lower()
        content = generated[group[0]] not in special and bare.isalnum() and bare not in STOPWORDS_EN_PLUS
        entropy = float(np.mean([entropies[i] for i in group]))
        rows.append((texts[w], entropy, rescaled, entropy * rescaled * content))
    return rows


def test_the_recorded_s_is_h_times_a_times_s_from_the_models_own_passes():
    model = tiny_model()
    _, out = run(model, threshold=NEVER, max_length=24)
    reading = steps_of(out.trace, RindCheck)[0]
    expected = independent_reading(model, prompts.closed_book(QUESTION, ""), 24)
    assert len(expected) > 5 and any(row[3] > 0 for row in expected) and any(row[3] == 0 for row in expected)
    assert reading["words"] == [row[0] for row in expected]
    assert reading["entropies"] == pytest.approx([row[1] for row in expected], abs=2e-4)
    assert reading["attention"] == pytest.approx([row[2] for row in expected], abs=2e-4)
    assert reading["scores"] == pytest.approx([row[3] for row in expected], abs=2e-4)


def test_threshold_never_retrieves_and_zero_retrieves_at_the_first_content_word():
    model = tiny_model()
    _, never = run(model, threshold=NEVER, max_length=24)
    assert not any(r["triggered"] for r in steps_of(never.trace, RindCheck)) and never.retrieval_calls == 0
    program, always = run(model, threshold=0.0, max_length=24)
    first = steps_of(always.trace, RindCheck)[0]
    assert first["triggered"] and first["trigger_score"] > 0
    assert all(score <= 1e-4 for score in first["scores"][: first["trigger_index"]])
    query = steps_of(always.trace, FocusedQuery)[0]
    assert 0 < len(query["query"].split()) <= program.top_n and steps_of(always.trace, Retrieve)
    assert always.lm_calls == program.required_lm_calls(always.trace) >= 2
