"""A tiny causal LM with random weights, built offline in a second: an `AttentionModel` for tests and for the
stand-in model (DRAGIN reads its attention and entropies; its words are noise).

Its tokenizer is a WordPiece one over a small vocabulary (English function words, the sample questions' common
words, a few `##` suffixes so that words split into subwords, punctuation); its model a 2-layer Llama, hidden size
32, 4 heads, whose weights are drawn with a large spread so that its distributions and attention are far from
uniform. It runs on one thread: tests share the cores.
"""

from __future__ import annotations

import functools

from arag.lm.attention import AttentionModel

SPECIAL = ("[PAD]", "[UNK]", "[BOS]", "[EOS]")
WORDS = (
    "the a an of in on at to for from by with and or but not is was were are be been has had have it its this that "
    "which who whom whose what when where why how so as than then there their they he she his her him we our you "
    "answer question film director born city river country capital year war song album band team club novel author "
    "American British French German Paris London Berlin Rhine Seine first second larger older both same located "
    "released founded written directed played named called known part member state county university company "
    "Ed Wood Scott Derrickson Adam Clayton Allen Laleli Mosque Esma Sultan Mansion Gaza Strip Lyon"
).split()
SUFFIXES = ("##s", "##ed", "##ing", "##er", "##ly", "##ion", "##ia", "##on")
PUNCTUATION = tuple(".,?!:;()-")


@functools.lru_cache(maxsize=None)
def tiny_attention_model(seed: int = 0) -> AttentionModel:
    """The tiny model for `seed` (the same weights for the same seed), built once per process."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(dict.fromkeys((*SPECIAL, *WORDS, *SUFFIXES, *PUNCTUATION)))}
    wordpiece = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wordpiece.decoder = decoders.WordPiece(prefix="##")
    wordpiece.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", 2)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=wordpiece, pad_token="[PAD]", unk_token="[UNK]",
                                        bos_token="[BOS]", eos_token="[EOS]")
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
                         initializer_range=0.5, pad_token_id=0, bos_token_id=2, eos_token_id=3,
                         tie_word_embeddings=False)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    return AttentionModel(model, tokenizer, f"tiny-random-llama-{seed}", threads=1)
