"""The attention model (arag/lm/attention.py) on a tiny random Llama built offline: greedy tokens and full-vocabulary
entropies equal to one plain forward pass over the whole text, the stop and end-of-sequence rules, the last layer's
attention, loading a Hugging Face folder, and the refusal when no model gives attention."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the attention model needs the `attention` extra")
pytest.importorskip("transformers", reason="the attention model needs the `attention` extra")

from arag.errors import ConfigError  # noqa: E402
from arag.lm.attention import AttentionModel, Generation, attention_model_for  # noqa: E402
from arag.lm.local import LlamaEngine  # noqa: E402
from arag.testing import StandInModel, scripted_lm  # noqa: E402
from arag.testing.attention import tiny_attention_model  # noqa: E402

PROMPT = "Question: Who directed the film Ed Wood?\nAnswer:"


@pytest.fixture(scope="module")
def model():
    return tiny_attention_model()


def full_forward(model: AttentionModel, token_ids: list[int]) -> np.ndarray:
    """The logits at every position, in one forward pass without a cache."""
    with torch.inference_mode():
        return model.model(torch.tensor([token_ids])).logits[0].double().numpy()


def entropy(logits: np.ndarray) -> float:
    shifted = logits - logits.max()
    p = np.exp(shifted) / np.exp(shifted).sum()
    return float(-(p[p > 0] * np.log(p[p > 0])).sum())


def test_generation_is_greedy_and_its_entropies_are_the_full_vocabulary_ones(model):
    generation = model.generate(PROMPT, 12)
    prompt_ids = model.encode(PROMPT)
    assert generation.prompt_tokens == len(prompt_ids) and len(generation.token_ids) == len(generation.entropies) > 3
    logits = full_forward(model, prompt_ids + list(generation.token_ids))
    for step, token_id in enumerate(generation.token_ids):
        row = logits[len(prompt_ids) + step - 1]
        assert token_id == int(row.argmax())
        assert generation.entropies[step] == pytest.approx(entropy(row), abs=1e-5)
    assert 0 < min(generation.entropies) and max(generation.entropies) < np.log(len(model.tokenizer))
    assert generation.text == model.tokenizer.decode(list(generation.token_ids))
    # it ends at 12 tokens, or where the model's next token is special (the unknown token aside), which is dropped
    following = int(logits[-1].argmax())
    ends = set(model.tokenizer.all_special_ids) - {model.tokenizer.unk_token_id}
    assert (generation.stopped, len(generation.token_ids)) == ("length", 12) or \
        (generation.stopped == "eos" and following in ends)
    assert not ends & set(generation.token_ids)


def test_a_prompt_sharing_the_last_ones_prefix_reads_it_from_the_cache(model):
    model.kept = None
    first = model.generate(PROMPT, 5)
    longer = PROMPT + " Ed Wood"
    cached = model.generate(longer, 5)
    assert first.reused_tokens == 0 and cached.reused_tokens >= len(model.encode(PROMPT))
    model.kept = None
    fresh = model.generate(longer, 5)
    assert fresh.reused_tokens == 0 and fresh.token_ids == cached.token_ids
    assert fresh.entropies == pytest.approx(cached.entropies, abs=1e-5)
    unrelated = model.generate("Scott Derrickson", 3)  # nothing shared but what the tokenizer puts first
    assert unrelated.reused_tokens <= 1


def test_a_stop_text_ends_the_generation_and_cut_drops_it(model):
    free = model.generate(PROMPT, 12)
    stop = free.pieces[4]  # a word the model writes fifth
    stopped = model.generate(PROMPT, 12, stop=stop)
    assert stopped.stopped == "stop" and stop in stopped.text and len(stopped.token_ids) <= 5
    cut = stopped.cut(stop)
    assert cut.text == stopped.text[: stopped.text.find(stop)]
    assert len(cut.token_ids) == len(cut.pieces) == len(cut.entropies) < len(stopped.token_ids)


def test_cut_keeps_the_text_before_the_stop_inside_a_token():
    generation = Generation(3, (5, 6, 7), (" Paris", ".\n", "Question"), (1.0, 2.0, 3.0), "length")
    cut = generation.cut("\n")
    assert cut.pieces == (" Paris", ".") and cut.token_ids == (5, 6) and cut.entropies == (1.0, 2.0)
    assert generation.cut("\n\n") is generation  # no stop: unchanged
    blank = Generation(3, (5, 6), (" Paris", "\n"), (1.0, 2.0), "stop").cut("\n")
    assert blank.pieces == (" Paris",) and blank.token_ids == (5,)


def test_the_end_of_sequence_ends_the_generation_and_is_dropped():
    model = tiny_attention_model.__wrapped__(seed=0)  # a model of its own: its end token is changed below
    free = model.generate(PROMPT, 8)
    model.model.generation_config.eos_token_id = free.token_ids[3]
    ended = model.generate(PROMPT, 8)
    first = free.token_ids.index(free.token_ids[3])
    assert ended.stopped == "eos" and ended.token_ids == free.token_ids[:first]
    assert ended.entropies == pytest.approx(free.entropies[:first])


def test_the_last_layers_attention_is_per_head_causal_and_sums_to_one(model):
    ids = model.encode("Scott Derrickson directed the film Ed Wood.")
    attention = model.last_layer_attention(ids)
    heads = model.model.config.num_attention_heads
    assert attention.shape == (heads, len(ids), len(ids))
    assert np.allclose(attention.sum(axis=-1), 1.0)
    assert np.allclose(np.triu(attention, k=1), 0.0)
    with torch.inference_mode():
        expected = model.model(torch.tensor([ids]), output_attentions=True).attentions[-1][0].double().numpy()
    assert np.allclose(attention, expected)


def test_pieces_join_into_the_decoded_text(model):
    ids = model.encode("The Rhine flows through Paris and Lyon.", special=False)
    pieces = model.pieces(ids)
    assert "".join(pieces) == model.tokenizer.decode(ids) and len(pieces) == len(ids)
    assert pieces[:3] == ["[UNK]", " Rhine", " [UNK]"]  # words outside the tiny vocabulary are unknown


def test_a_hugging_face_folder_loads_as_the_same_model(model, tmp_path):
    model.model.save_pretrained(tmp_path)
    model.tokenizer.save_pretrained(tmp_path)
    loaded = AttentionModel.load(tmp_path, threads=1)
    assert loaded.threads == 1
    assert loaded.generate(PROMPT, 6).token_ids == model.generate(PROMPT, 6).token_ids
    unread = tmp_path.parent / "unread.gguf"  # a local LM's file, never loaded: the folder named wins, on its threads
    unread.write_bytes(b"GGUF")
    assert attention_model_for(LlamaEngine(unread, threads=3).lm(), str(tmp_path)) is loaded and loaded.threads == 3


def test_the_model_comes_from_the_source_named_or_the_lms_engine(model, tmp_path):
    lm = scripted_lm(lambda call: "")
    with pytest.raises(ConfigError, match=r"needs a model's attention weights and full-vocabulary distributions.*"
                                          r"--lm local.*attention_model"):
        attention_model_for(lm)
    with pytest.raises(ConfigError, match="no such file or folder"):
        attention_model_for(lm, str(tmp_path / "missing.gguf"))
    stand_in = StandInModel()  # a responder's attention model, as the scripted engine carries it
    assert stand_in.attention_generations == 0
    carried = attention_model_for(scripted_lm(stand_in))
    assert carried is stand_in.attention_model and carried.name == model.name
    carried.generate(PROMPT, 2)
    assert stand_in.attention_generations == 1
