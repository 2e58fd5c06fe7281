"""DRAGIN, dynamic retrieval by the LLM's real-time information needs (Su et al., ACL 2024, arXiv 2403.10081): the
model writes its answer step by step without documents; RIND reads, from the model's own entropies and attention,
whether a word it wrote needs retrieval, QFS forms the query from what that word attends to, and the model
continues from the documents.

    Input: question q; answer written T = ""
    loop:
        G = LM(examples, q, T): greedy, at most max_length tokens, to the end of the answer's line
        RIND over G's words (rind.py): S = H × a × s; no S > threshold: T += G
        else, at the first word w whose S > threshold:
            kept = G before w's sentence (truncate=sentence) or before w (truncate=word)
            query = QFS: the top_n content words before w (in q, T and G) that w attends to most, in their order
            D = ret(query, k); C = LM(examples, D, q, T + kept); T += kept + the first sentence of C
        stop when T says "the answer is", when T passes max_length tokens, or when T stops growing
    answer = what follows the last "the answer is" in T; none: T + " So the answer is", completed (20 tokens)

LM calls per question: one per RIND check and one per continuation, +1 when the answer must be completed.
Retrievals: one per trigger. The generations, RIND's forward pass over each generation's tokens and QFS's over
the text before the trigger run on an `AttentionModel` (arag/lm/attention.py: transformers, eager attention),
which reads the LM's own GGUF file with --lm local (or the file, folder or model `attention_model` names); without
one the program stops with a ConfigError, never approximating attention. `prompt_tokens` counts the tokens of those
forward passes too. Every generation is a raw prompt to that model, so the program has no DSPy predictor to compile.

Follows the official code (oneal2000/DRAGIN@4d71efc, src/generate.py) where the paper leaves it open: a second
forward pass over the generated tokens alone for the attention (94-97), the max over query positions then the mean
over heads, subwords merged into words (attention summed, entropy averaged; 86-148), the attention rescaled to mean
1 in each sentence (500-505), generation without documents between triggers and the documents used for the
continuation only, of which the first sentence is kept (674-690), the stop rules (701-704), and the completion of a
missing answer (src/eval.py:26-61). Follows the paper where the code differs: s zeroes stopwords inside S (§3.1),
the code filtering content words only after a trigger (507-518); a_max is the attention from *later* tokens (Eq. 3),
where the code's max includes a token's attention to itself; QFS reads the trigger's own attention row over the
text before it (§3.2), where the code reads the row before each flagged word and averages over every flagged word
of the sentence (527-605). Truncation is a choice (`truncate`): the code's (drop the triggering sentence) by default,
or the paper's (cut at the triggering word, §3.3).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dspy

from arag.concurrency import lm_slot
from arag.errors import ConfigError
from arag.lm.attention import AttentionModel, Generation, attention_model_for
from arag.lm.local_models import MODELS
from arag.programs.dragin import prompts
from arag.programs.dragin.rind import first_trigger, focused_query, rind, sentence_of
from arag.programs.dragin.steps import AnswerCompletion, Continuation, FocusedQuery, RindCheck
from arag.programs.frame.base import BASE_LM_CALLS, RAGProgram
from arag.programs.frame.params import Param, passages_per_retrieval
from arag.programs.frame.registry import register
from arag.programs.frame.sentences import final_answer, split_sentences
from arag.trace import Answer, Stop, StopReason, steps_of
from arag.trace.recorder import count_lm_work

THRESHOLD = Param("threshold", 1.2, "retrieve when a generated word's S = H × a × s exceeds it (the official configs: "
                  "0.6-1.5; 0: at the first content word a later word attends to; 10000: never)",
                  low=0.0, high=10000.0, searched=True, search_range=(0.0, 3.0))
TOP_N = Param("top_n", 35, "QFS: the words the query keeps, those the trigger attends to most (the official configs: "
              "25 or 35)", low=1, high=200)
MAX_LENGTH = Param("max_length", 100, "tokens per generation, and the answer's length past which writing stops (the "
                   "official configs: 64 2Wiki, 100 HotpotQA and StrategyQA, 128 IIRC)", low=8, high=512)
TRUNCATE = Param("truncate", "sentence", "what a trigger drops of the generation: the triggering sentence (the "
                 "official code) or the text from the triggering word on (the paper, §3.3)",
                 choices=("sentence", "word"))
ATTENTION_MODEL = Param("attention_model", "", "the model whose attention and entropies are read, and which writes: a "
                        "GGUF file, a Hugging Face model folder or a model of `arag models` (empty: the LM's own GGUF "
                        "file, with --lm local); it runs in float32 on transformers: on 2 shared cores SmolLM2-135M "
                        "takes 0.2 s a token and 9-30 s a HotpotQA question, the 1.5B model 1.2 s and about 3 "
                        "minutes, after 1 and 4 minutes of loading", tunable=False)
K = passages_per_retrieval(3, "the official configs' retrieve_topk")
ANSWER_TOKENS = 20  # the completion of a missing answer (src/eval.py:47)
ANSWER_IS = "the answer is"
NEVER = THRESHOLD.high  # S <= ln(vocabulary) × a sentence's words: below it for max_length <= 512, vocabularies < 2^18

OFFICIAL = {  # the official configs for Llama2-13b-chat (config/Llama2-13b-chat/<dataset>/DRAGIN.json)
    "official-2wiki": {"threshold": 0.8, "top_n": 25, "max_length": 64},
    "official-hotpotqa": {"threshold": 1.2, "top_n": 35, "max_length": 100},
    "official-iirc": {"threshold": 1.0, "top_n": 25, "max_length": 128},
    "official-strategyqa": {"threshold": 1.3, "top_n": 25, "max_length": 100},
}


@register
class Dragin(RAGProgram):
    """Write without documents; retrieve when RIND finds a word the model needs facts for, with QFS's query."""

    name = "dragin"
    lm_calls_formula = "1 per RIND check + 1 per continuation after a trigger, +1 to complete a missing answer"
    follows = ("Su et al., ACL 2024 (arXiv 2403.10081) and its official code oneal2000/DRAGIN@4d71efc "
               "(src/generate.py, src/eval.py, config/): RIND (S = H × a_max × s, any S > threshold) and QFS (the "
               "trigger's last-layer attention, top n words in order) as the paper defines them; the official code's "
               "word merging, per-sentence rescaling, second attention pass, continuation (first sentence kept), stop "
               "rules, answer completion and configs (k=3, top_n 25/35, max_length 64-128, threshold 0.8-1.3)")
    departures = (
        "s zeroes stopwords inside S before the threshold, as the paper's Eq. 5 does; the code compares H × a with the "
        "threshold and filters content words only after a trigger (src/generate.py:507-518)",
        "a_max is the most attention from later tokens (the paper's Eq. 3); the code's maximum includes each token's "
        "attention to itself, which gives the first generated token 1",
        "QFS reads the trigger's own attention row over the text before it (§3.2), with that text; the code reads the "
        "row before each flagged word, averages it over every flagged word of the sentence, and chooses from the "
        "whole sentence (527-605)",
        "truncate=sentence drops the triggering sentence, as the code does; the paper cuts at the triggering token "
        "(§3.3: truncate=word)",
        "stopwords are NLTK's English list as bm25s ships it, and words with no letter or digit: the paper uses "
        "spaCy's list, the code keeps spaCy's NOUN/ADJ/VERB/PROPN/NUM words (no tagger to install here)",
        "a generation ends at the end of the answer's line (the examples' format), where the code generates "
        "max_length tokens and RIND also reads what the model writes past its answer",
        "the query is sent whole: the official BM25 keeps its last 64 tokens (src/retriever.py:50-65); an empty query "
        "(no content word before the trigger) searches with the question",
        "the worked examples are our own, six for every dataset (the code: 6 for 2Wiki and StrategyQA, 8 for "
        "HotpotQA and IIRC); the thresholds were set for Llama2 and Vicuna: recalibrate them for another model",
    )
    params = (THRESHOLD, TOP_N, K, MAX_LENGTH, TRUNCATE, ATTENTION_MODEL)
    presets = OFFICIAL

    def check_params(self, config: dict[str, Any]) -> None:
        source = config["attention_model"]
        if source and source not in MODELS and not Path(source).expanduser().exists():
            raise ConfigError(f"dragin: attention_model {source!r} is no file, folder or model of `arag models` "
                              f"({', '.join(MODELS)})")

    def default_max_lm_calls(self) -> int:
        """Room for a round per token of the answer, each with a continuation."""
        return BASE_LM_CALLS + 2 * self.max_length

    def required_lm_calls(self, trace: list[dict]) -> int:
        return len(steps_of(trace, RindCheck, Continuation, AnswerCompletion))

    def attention(self) -> AttentionModel:
        try:
            return attention_model_for(dspy.settings.lm, self.attention_model)
        except ConfigError as exc:
            raise ConfigError(f"dragin: {exc}") from None

    def run(self, question: str) -> dict[str, Any]:
        model = self.attention()
        text, rounds = "", 0
        while True:
            before = text
            text = self.step(model, question, text, rounds)
            rounds += 1
            stop = self.stop_reason(model, text, before)
            if stop is not None:
                self.note(Stop(reason=stop, pieces=rounds, tokens=len(model.encode(text, special=False))))
                return self.finish(model, question, text)

    def step(self, model: AttentionModel, question: str, text: str, index: int) -> str:
        """One generation without documents and RIND's reading of it: the answer written, after it."""
        generation = self.generate(model, prompts.closed_book(question, text))
        special = special_positions(model, generation.token_ids)
        scored = rind(generation.pieces, generation.entropies, self.attention_over(model, generation.token_ids),
                      special) if generation.token_ids else []
        trigger = first_trigger(scored, self.threshold)
        reading = {"index": index, "text": generation.text, "words": [s.word.text.strip() for s in scored],
                   "entropies": [round(s.entropy, 4) for s in scored],
                   "attention": [round(s.rescaled, 4) for s in scored],
                   "scores": [round(s.score, 4) for s in scored], "threshold": self.threshold,
                   "stopped": generation.stopped}
        if trigger is None:
            self.note(RindCheck(**reading, triggered=False))
            return prompts.joined(text, generation.text)
        word = scored[trigger].word
        kept = generation.text[: self.cut_at(generation, scored, trigger)]
        self.note(RindCheck(**reading, triggered=True, trigger=word.text.strip(), trigger_index=trigger,
                            trigger_score=round(scored[trigger].score, 4), kept=kept.strip(),
                            dropped=generation.text[len(kept):].strip()))
        context = prompts.joined(question, text, generation.text[: word.start + len(word.text)])
        query = self.focused_query(model, context, word.text.strip())
        passages = self.retrieve(query or question, why="trigger")
        continuation = self.generate(model, prompts.with_documents(question, prompts.joined(text, kept), passages))
        sentence = (split_sentences(continuation.text.strip()) or [""])[0].strip()
        self.note(Continuation(index=index, text=continuation.text, kept=sentence,
                               passage_ids=[p.id for p in passages]))
        return prompts.joined(text, kept, sentence)

    def cut_at(self, generation: Generation, scored: list, trigger: int) -> int:
        """Where the kept text ends: the start of the triggering word's sentence, or of the word itself."""
        words = [s.word for s in scored]
        if self.truncate == "word":
            return words[trigger].start
        sentences = sentence_of(words, generation.text)
        first = next(i for i, sentence in enumerate(sentences) if sentence == sentences[trigger])
        return words[first].start

    def focused_query(self, model: AttentionModel, context: str, trigger: str) -> str:
        """QFS over `context`, which ends with the triggering word; recorded as a `qfs` step."""
        token_ids = model.encode(context)
        query = focused_query(model.pieces(token_ids), special_positions(model, token_ids),
                              self.attention_over(model, token_ids), self.top_n)
        self.note(FocusedQuery(trigger=trigger, candidates=query.candidates, query=query.text,
                               weights=[round(w, 4) for w in query.weights]))
        return query.text

    def generate(self, model: AttentionModel, prompt: str, max_tokens: int | None = None) -> Generation:
        """A greedy generation, counted as an LM call against the question's cap, cut at the answer line's end."""
        with lm_slot():
            generation = model.generate(prompt, max_tokens or self.max_length, stop=prompts.END_OF_ANSWER)
        count_lm_work(lm_calls=1, prompt_tokens=generation.prompt_tokens, completion_tokens=len(generation.token_ids),
                      reused_prompt_tokens=generation.reused_tokens)
        return generation.cut(prompts.END_OF_ANSWER)

    def attention_over(self, model: AttentionModel, token_ids) -> Any:
        """The last layer's attention over `token_ids` (one forward pass, its tokens counted as prompt tokens)."""
        count_lm_work(prompt_tokens=len(token_ids))
        return model.last_layer_attention(token_ids)

    def stop_reason(self, model: AttentionModel, text: str, before: str) -> StopReason | None:
        if ANSWER_IS in text.lower():
            return StopReason.ANSWER_IS
        if len(model.encode(text, special=False)) > self.max_length:
            return StopReason.TOKEN_BUDGET
        if len(text) <= len(before):
            return StopReason.MODEL_ENDED
        return None

    def finish(self, model: AttentionModel, question: str, text: str) -> dict[str, Any]:
        """The short answer after the last "the answer is"; without one, the model completes "So the answer is"."""
        if ANSWER_IS not in text.lower():
            cued = prompts.joined(text, prompts.ANSWER_CUE)
            completion = self.generate(model, prompts.closed_book(question, cued), ANSWER_TOKENS)
            self.note(AnswerCompletion(text=completion.text, tokens=len(completion.token_ids)))
            text = prompts.joined(cued, completion.text)
        answer = final_answer(text)
        self.note(Answer(answer=answer))
        return {"answer": answer, "long_answer": text}


def special_positions(model: AttentionModel, token_ids) -> set[int]:
    special = model.special_ids()
    return {position for position, token_id in enumerate(token_ids) if token_id in special}
