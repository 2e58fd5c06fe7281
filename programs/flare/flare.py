"""FLARE, forward-looking active retrieval (Jiang et al., 2023): retrieve only when the model is unsure
of the sentence it is about to write, with a query formed from that sentence.

`flare` (FLARE-direct). The loop is `ActiveGeneration.run` (programs/frame/active_generation.py, shared with the
previous-window and previous-sentence baselines); FLARE is its `review` hook (step 3) and the queries below:
  1. Retrieve with the question; the first sentence is drafted from those passages.
  2. Each step, draft the next sentence without new retrieval (`lookahead_tokens` tokens, first
     sentence kept), with the probability of each of its tokens.
  3. Every token above theta: keep the draft. Otherwise form queries from it and retrieve:
     `masked`, the draft without its tokens at or below beta; or `questions`, one question written by
     the LM per unsure term (tokens at or below beta fewer than 5 tokens apart, joined and widened to
     whole words), a question that does not end in "?" dropped, the draft itself when none is left.
     Then write the sentence again from the new passages. A masked query left empty (every token at or
     below beta) searches nothing, and the draft is kept.

Where this follows the official code (jzbjyb/FLARE, src/templates.py, src/openai_api.py) rather than the
paper's text: a token at exactly theta triggers retrieval and one at exactly beta is masked (`<=` both);
unsure tokens fewer than 5 apart form one term; an empty masked query is not sent (`ret_prompt` drops it).
The official code widens a term to its phrase with an extra LM call; here it is widened to whole words, with
no call. Where this departs from it: the official retriever keeps only the last 64 tokens of every query but
the first (src/retriever.py, `max_query_length` 64 in both configs); here a query is sent whole. A masked
look-ahead of at most `lookahead_tokens` = 64 tokens stays within that; a longer look-ahead, or the question
that `query_with_question` puts first, would lose its first terms there.
  4. Stop when the model ends its answer or `max_tokens` are spent; `answer` is read from the
     long answer's "So the answer is X.", which stays in `long_answer`.

`flare-instruct` (FLARE-instruct): the LM, taught by the signature's instructions (and demos once
compiled), writes [Search(query)] inline; generation stops there, the passages for that query
replace the ones before the input, and generation continues, up to `max_searches` searches. Past
the cap the model is told no search is left; a marker it still writes is dropped and writing goes on
until the answer ends (at most WRITES_PAST_THE_CAP such calls). With `forbid_after_search=N` and the
ids of the marker's tokens, the N tokens after each search are written with those tokens forbidden
(logit bias -100; one extra call per search), as the paper and the official `forbid_generate_step`
do; off by default, since token ids belong to one tokenizer.
"""

from __future__ import annotations

import re
from typing import Sequence

import dspy

from arag.concurrency import fan_out
from arag.errors import ConfigError
from arag.lm import TokenLogprob
from arag.passages import format_passages
from arag.programs.frame.active_generation import (
    LOOKAHEAD_TOKENS,
    MARKUP_TOKENS,
    MAX_TOKENS,
    PROMPT_STYLE,
    ActiveGeneration,
    LongAnswer,
    Piece,
    shown_tokens,
)
from arag.programs.frame.base import RAGProgram
from arag.programs.frame.params import FLARE_SETTING_K, Param
from arag.programs.frame.registry import register
from arag.programs.frame.sentences import ends_with_final_answer
from arag.signatures.generation import ContinueAnswerWithSearch
from arag.signatures.queries import QuestionForSpan
from arag.trace import Sentence, Stop, StopReason, Write, shown_probability, steps_of

THETA = Param("theta", 0.8, "retrieve when a drafted token's probability is at most theta "
              "(0: only at the start, 1: for every sentence)", low=0.0, high=1.0, searched=True)
BETA = Param("beta", 0.4, "tokens at or below beta are masked out of the query (masked) or asked about (questions)",
             low=0.0, high=1.0, searched=True)
QUERY_MODE = Param("query_mode", "masked", "masked: the draft without its unsure tokens; questions: one "
                   "LM-written question per unsure span", choices=("masked", "questions"))
QUERY_WITH_QUESTION = Param("query_with_question", False, "prepend the user's question to every query")

MAX_SEARCHES = Param("max_searches", 3, "cap on the searches per answer", low=0, high=20, searched=True,
                     search_range=(0, 5))
SEARCH_LOGIT_BIAS = Param(
    "search_logit_bias", "",
    "TOKEN_ID:BIAS[,TOKEN_ID:BIAS...] sent as the endpoint's logit_bias, e.g. to make the search marker's "
    "'[' token likelier (the paper used +2); token ids are specific to the model's tokenizer",
    tunable=False,
)
CALL_TOKENS = Param("max_tokens", 256, "tokens per generation call, between two searches", low=8, high=8192)
FORBID_AFTER_SEARCH = Param(
    "forbid_after_search", 0,
    "after each search, generate this many tokens with search_token_ids forbidden (logit bias -100), so the "
    "model writes before it may search again, as the paper does (0: off)", low=0, high=64)
SEARCH_TOKEN_IDS = Param(
    "search_token_ids", "", "TOKEN_ID[,TOKEN_ID...]: the tokens that open a search marker ('[' and its variants "
    "in the model's tokenizer), forbidden by forbid_after_search", tunable=False)

TERM_GAP = 5  # unsure tokens fewer than this many tokens apart make one term (the official code's min_gap)

SEARCH_MARKER = re.compile(r"\[Search\((.*?)(?:\)\]|$)", re.DOTALL)  # the query runs to ")]": titles hold "(...)"
SEARCH_END = ")]"
WRITES_PAST_THE_CAP = 3  # calls that may still write a search marker once the cap is reached


@register
class FLARE(ActiveGeneration):
    """FLARE-direct: draft each sentence, and retrieve to rewrite it only when a token is unsure.

    With prompt_style="raw" the sentences go to a completion model as plain prompts, while the
    questions of query_mode="questions" are still written through a signature: give that predictor
    a chat LM (`program.write_question.set_lm(chat_lm)`).
    """

    name = "flare"
    lm_calls_formula = "look-aheads (+1 ending) + rewrites + span questions"
    follows = ("the paper (Jiang et al., 2023); where it is silent, the official code (jzbjyb/FLARE, src/templates.py, "
               "src/openai_api.py): ties at theta and beta, unsure terms of tokens fewer than 5 apart, no search "
               "for an empty masked query")
    departures = ("a query is sent whole; the official retriever keeps the last 64 tokens of each query after the "
                  "first (src/retriever.py, max_query_length 64), which a masked look-ahead of at most "
                  "lookahead_tokens=64 tokens stays within",)
    params = (THETA, BETA, QUERY_MODE, QUERY_WITH_QUESTION, FLARE_SETTING_K, LOOKAHEAD_TOKENS, MAX_TOKENS, PROMPT_STYLE)

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        self.write_question = dspy.Predict(QuestionForSpan)

    def review(self, answer: LongAnswer, lookahead: Piece, step: dict) -> Piece:
        """Keep a confident look-ahead; else retrieve with queries formed from it and write the sentence again
        (a look-ahead masked whole leaves nothing to search for, and is kept)."""
        step.update(lookahead=lookahead.text, min_prob=shown_probability(lookahead.min_prob),
                    lookahead_tokens=shown_tokens(lookahead.tokens))
        if self.confident(lookahead):
            return lookahead
        queries = self.queries(answer, lookahead, step)
        if not queries:
            step.update(queries=[], skipped="every token is masked: nothing to search for")
            return lookahead
        answer.passages = self.search(queries, step, why="unsure look-ahead")
        rewritten = self.draft(answer)
        if not rewritten.text:  # the model wrote nothing from the new passages: the look-ahead stands
            step["rewrite"] = "empty"
            return lookahead
        return rewritten

    def confident(self, lookahead: Piece) -> bool:
        """Every token above theta; a token at exactly theta triggers retrieval, as in the official
        code, so that theta=1 retrieves for every sentence."""
        return all(token.prob > self.theta for token in lookahead.tokens)

    def queries(self, answer: LongAnswer, lookahead: Piece, step: dict) -> list[str]:
        """What to retrieve: the masked look-ahead, or a question per unsure span (the look-ahead itself
        when no token is below beta). A query left empty (every token masked) is dropped."""
        if self.query_mode == "masked":
            queries = [masked_query(lookahead.tokens, self.beta)]
        else:
            spans = low_confidence_spans(lookahead.tokens, self.beta)
            step["spans"] = spans
            context = f"{answer.text} {lookahead.text}".strip()
            asked = fan_out(lambda span: self.write_question(text=context, span=span).question.strip(), spans)
            queries = [question for question in asked if question.endswith("?")] or [lookahead.text]
            dropped = [question for question in asked if not question.endswith("?")]
            if dropped:
                step["dropped_questions"] = dropped
        if self.query_with_question:
            queries = [f"{answer.question} {query}" for query in queries]
        return [query.strip() for query in queries if query.strip()]

    def required_lm_calls(self, trace: list[dict]) -> int:
        """Look-aheads (+1 ending), a rewrite per retrieval, a question per unsure span."""
        sentences = steps_of(trace, Sentence)
        rewrites = sum(step["retrieved"] for step in sentences)
        questions = sum(len(step.get("spans", ())) for step in sentences if step["retrieved"])
        return super().required_lm_calls(trace) + rewrites + questions


@register
class FLAREInstruct(RAGProgram):
    """FLARE-instruct: the LM writes [Search(query)] inline; each search is retrieved, and writing goes on.

    Generation stops at the marker (the stop sequence ")]", so the adapter must parse a cut-off output,
    as ChatAdapter does); the passages for the query replace those before the input.
    """

    name = "flare-instruct"
    lm_calls_formula = "one generation per search, +1"
    follows = ("the paper (Jiang et al., 2023); forbid_after_search as the official forbid_generate_step; past the "
               "search cap, writing goes on")
    params = (FLARE_SETTING_K, MAX_SEARCHES, CALL_TOKENS, SEARCH_LOGIT_BIAS, FORBID_AFTER_SEARCH, SEARCH_TOKEN_IDS)

    def __init__(self, retriever=None, **params):
        super().__init__(retriever, **params)
        self.logit_bias = parse_logit_bias(self.search_logit_bias)
        self.forbidden = parse_token_ids(self.search_token_ids)
        self.continue_with_search = dspy.Predict(ContinueAnswerWithSearch)

    def check_params(self, config: dict) -> None:
        parse_logit_bias(config["search_logit_bias"])
        if config["forbid_after_search"] and not parse_token_ids(config["search_token_ids"]):
            raise ConfigError("flare-instruct: parameter 'forbid_after_search' needs parameter 'search_token_ids' "
                              "(the ids of the tokens that open a search marker in the model's tokenizer)")

    def required_lm_calls(self, trace: list[dict]) -> int:
        return len(steps_of(trace, Write))

    def run(self, question: str) -> dict:
        answer = LongAnswer(question, self.retrieve(question, why="question"))
        searches = past_the_cap = 0
        while True:
            text, query = self.write(answer, searches_left=self.max_searches - searches)
            self.note(Write(index=len(answer.pieces), text=text, search=query))
            if text:
                answer.add(Piece(text))
            if query is None:
                stop = StopReason.MODEL_ENDED
                break
            if searches == self.max_searches:
                # At the cap the marker is dropped and writing goes on, without searching, until the answer ends.
                past_the_cap += 1
                if ends_with_final_answer(answer.text):
                    stop = StopReason.FINAL_ANSWER
                    break
                if past_the_cap > WRITES_PAST_THE_CAP:
                    stop = StopReason.SEARCH_CAP
                    break
                continue
            answer.passages = self.retrieve(query or question, why="search marker")
            searches += 1
            if self.forbid_after_search:
                self.write_without_searching(answer, searches_left=self.max_searches - searches)
        self.note(Stop(reason=stop, searches=searches))
        return answer.finish(self)

    def write_without_searching(self, answer: LongAnswer, searches_left: int) -> None:
        """The first `forbid_after_search` tokens after a search, with the search marker's tokens forbidden;
        a word cut by the budget is left for the next call."""
        bias = {**self.logit_bias, **dict.fromkeys(self.forbidden, -100.0)}
        text, _ = self.write(answer, searches_left, max_tokens=self.forbid_after_search + MARKUP_TOKENS,
                             logit_bias=bias)
        cut = text.rpartition(" ")[0] if " " in text else text
        self.note(Write(index=len(answer.pieces), text=cut, search=None, forbidden=sorted(self.forbidden)))
        if cut:
            answer.add(Piece(cut))

    def write(self, answer: LongAnswer, searches_left: int, *, max_tokens: int | None = None,
              logit_bias: dict[str, float] | None = None) -> tuple[str, str | None]:
        """Generate until the model searches or ends; the text before the search marker and its query."""
        config = {"max_tokens": max_tokens or self.max_tokens, "stop": [SEARCH_END]}
        if logit_bias or self.logit_bias:
            config["logit_bias"] = logit_bias or self.logit_bias
        prediction = self.continue_with_search(
            passages=format_passages(answer.passages),
            question=answer.question,
            answer_so_far=answer.text,
            searches_left=searches_left,
            config=config,
        )
        return split_at_search(prediction.continuation)


def masked_query(tokens: Sequence[TokenLogprob], beta: float) -> str:
    """The tokens with probability above beta, in order; each masked token (p <= beta) leaves a space."""
    return " ".join("".join(token.token if token.prob > beta else " " for token in tokens).split())


def low_confidence_spans(tokens: Sequence[TokenLogprob], beta: float) -> list[str]:
    """The terms to ask about: tokens at or below beta, joined with the tokens between them when fewer than
    TERM_GAP tokens apart, widened to whole words; terms without a letter or digit are dropped."""
    groups: list[list[int]] = []
    last_low = None
    for index, token in enumerate(tokens):
        if token.prob <= beta:
            if last_low is not None and index - last_low < TERM_GAP:
                groups[-1][1] = index + 1
            else:
                groups.append([index, index + 1])
            last_low = index
    terms = []
    for start, end in groups:
        while start > 0 and _inside_word(tokens[start - 1].token, tokens[start].token):
            start -= 1
        while end < len(tokens) and _inside_word(tokens[end - 1].token, tokens[end].token):
            end += 1
        terms.append("".join(token.token for token in tokens[start:end]).strip())
    return [term for term in terms if any(char.isalnum() for char in term)]


def _inside_word(left: str, right: str) -> bool:
    """Whether two adjacent tokens join inside one word ("Penn" + "sylvania")."""
    return bool(left) and bool(right) and left[-1].isalnum() and right[0].isalnum()


def split_at_search(text: str) -> tuple[str, str | None]:
    """The text before the first [Search(query)] marker and the query, read up to the closing ")]" or the end
    of the text, where generation stopped (None when there is no marker)."""
    marker = SEARCH_MARKER.search(text)
    if marker is None:
        return text.strip(), None
    return text[: marker.start()].strip(), marker.group(1).strip()


def parse_token_ids(spec: str) -> list[str]:
    """`TOKEN_ID,...` as a list of id strings; a ConfigError naming the parameter if malformed."""
    ids = [item.strip() for item in spec.split(",") if item.strip()]
    if not all(item.isdigit() for item in ids):
        raise ConfigError(f"flare-instruct: parameter 'search_token_ids' must be TOKEN_ID[,TOKEN_ID...] with integer "
                          f"token ids, got {spec!r}")
    return ids


def parse_logit_bias(spec: str) -> dict[str, float]:
    """`TOKEN_ID:BIAS,...` as the OpenAI `logit_bias` mapping; a ConfigError naming the parameter if malformed."""
    bias = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        token_id, sep, value = item.partition(":")
        try:
            if not sep or not token_id.strip().isdigit() or not -100 <= float(value) <= 100:
                raise ValueError(item)
        except ValueError:
            raise ConfigError(
                f"flare-instruct: parameter 'search_logit_bias' must be TOKEN_ID:BIAS[,TOKEN_ID:BIAS...] with "
                f"integer token ids and biases in [-100, 100], got {spec!r}"
            ) from None
        bias[token_id.strip()] = float(value)
    return bias
