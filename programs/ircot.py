"""IRCoT, interleaving retrieval with chain-of-thought reasoning (Trivedi et al., ACL 2023): each sentence of
the reasoning chain is the query for the next retrieval, and the passages it brings guide the next sentence.

    input: question q; K passages per retrieval; a cap of 15 passages; a limit of 8 reasoning steps
    1. P <- retrieve(q, K)                               passages collected
       T <- []                                           the chain of thought
    2. reason: t <- the first sentence the LM writes from [P, q, T]
               (an empty continuation ends the chain)
       T <- T + [t]
    3. stop when t says "answer is", or when T holds 8 sentences
    4. retrieve: while |P| < 15, P <- P + the passages of retrieve(t, K) not yet in P, the first 15 kept;
                 at the cap, no retrieval. Back to 2.
    5. read: the answer is a separate call from [P, q], with chain of thought (cot) or without (direct)

The loop is prev-sentence's (`PreviousSentence`, programs/baselines/multi_time.py, on the active-generation
frame): `ircot` is that program with the paper's settings, and holds no logic of its own. LM calls: one per
sentence of the chain (and the empty continuation, when the model ends the chain so), then one for the reader.

Where this follows the official code (StonyBrookNLP/ircot, commaqa/inference/ircot.py and
base_configs/ircot_qa_*.jsonnet), the paper leaving it open:
- K: the paper picks it per dataset and model on development data from {2, 4, 6, 8}; the default is 6, the
  value every official IRCoT-QA configuration holds before its grid search, and `arag tune` searches [2, 8].
- reader: cot by default, as the official configurations for GPT-3 (code-davinci-002) read; they read with
  direct prompting for Flan-T5 (`reader=direct`).
- The new passages go after the ones held, a passage already held is not added again (the official code
  compares titles and text; here passage ids), and the cap may cut the last retrieval short.
- "answer is" may stand anywhere in the sentence, as the official code's answer pattern allows.
- Each paragraph the LM reads, in the chain and in the reader, is cut to its first 350 words
  (`max_passage_words`; the official `max_para_num_words`).

Where this departs from the official code, following the paper:
- The step limit is the paper's 8; the official code stops at 10 sentences, a default its configurations keep.
- The query is the last sentence as written. The official code skips sentences that open like a conclusion
  ("So", "Thus", ...) or compute a sum, querying with the last other sentence, and drops wh-words.
- At the cap the official code still queries the retriever, to add nothing; here no retrieval is made.

Not the paper's: the prompts are DSPy signatures (`ContinueAnswer` for a step, `AnswerFromPassages` for the
reader; compile to give them demonstrations), where the paper writes few-shot prompts of gold and distractor
paragraphs; and, as for every program of the frame, the LM's token log-probabilities are read and recorded
(an LM without them fails). `max_tokens` bounds the chain's length in tokens; its default, 8 steps of
`lookahead_tokens` (64) each, lets the step limit bind first.
"""

from __future__ import annotations

from dataclasses import replace

from arag.programs.baselines.multi_time import (
    MAX_PASSAGE_WORDS,
    MAX_PASSAGES,
    MAX_STEPS,
    READER,
    STOP_RULE,
    PreviousSentence,
)
from arag.programs.frame.active_generation import LOOKAHEAD_TOKENS, MAX_TOKENS, PROMPT_STYLE
from arag.programs.frame.params import passages_per_retrieval
from arag.programs.frame.registry import register

PAPER_STEPS = 8
OFFICIAL_PARAGRAPH_WORDS = 350
K = passages_per_retrieval(6, "IRCoT's K, each step and for the question", searched=True, search_range=(2, 8))


@register
class IRCoT(PreviousSentence):
    """IRCoT: each chain-of-thought sentence is the next query; then a reader answers from every passage.

    K passages per retrieval, up to 15 in all; the chain stops at "answer is" or after 8 sentences."""

    name = "ircot"
    lm_calls_formula = "one draft per sentence (+1 ending) + 1 reader"
    follows = ("the paper (Trivedi et al., 2023): K per step, a cap of 15 passages, 8 steps, stop at \"answer is\", "
               "a separate reader; where it is silent, the official code (StonyBrookNLP/ircot): K=6, the cot "
               "reader of its GPT-3 configurations, paragraphs cut to 350 words")
    departures = ("the paper's step limit of 8; the official code stops at 10 sentences",
                  "the query is the last sentence as written; the official code skips concluding or arithmetic "
                  "sentences and drops wh-words (commaqa/inference/ircot.py)",
                  "at the passage cap no retrieval is made; the official code still queries, to add nothing")
    params = (
        replace(MAX_PASSAGES, searched=False),
        K,
        LOOKAHEAD_TOKENS,
        replace(MAX_TOKENS, default=PAPER_STEPS * LOOKAHEAD_TOKENS.default),
        PROMPT_STYLE,
        replace(MAX_STEPS, default=PAPER_STEPS),
        replace(STOP_RULE, default="answer-is"),
        replace(READER, default="cot"),
        replace(MAX_PASSAGE_WORDS, default=OFFICIAL_PARAGRAPH_WORDS),
    )
