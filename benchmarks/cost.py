"""Cost per question of every program on HotpotQA with a scripted LM, next to what its algorithm requires.

    python benchmarks/cost.py [--limit N] [--programs flare,crag,...] [--dataset DIR] [--quick]

Every registered program runs with its default parameters over BM25 on the HotpotQA corpus in
../shared/datasets/hotpotqa, one question at a time, against `StandInModel`: a scripted LM that
answers every arag signature in a fixed way shaped by the question and the passages it is shown
(a three-sentence answer whose second sentence has an unsure year, two sub-questions, notes that
grow with new passages, relevance judged by word overlap, and so on). Its answers are not a model's:
the figures are the programs' costs, never their quality. DSPy's cache is off, so every call reaches
the engine.

For each question the number of LM calls the method's algorithm requires is derived from the
program's own trace by the program itself (`required_lm_calls`; `lm_calls_formula` in words): FLARE =
look-aheads + rewrites + span questions (+ the empty look-ahead that ends the answer), Adaptive-Note =
1 + query proposals (retries included) + updates + reviews + 1, GenGround = deductions + grounding
batches (+ a closing call), Self-RAG = retrieval decisions + per candidate one write and one call per
critique, CRAG (scorer=lm) = k judgements + one per strip + keyword rewrite + answer, Iter-RetGen = one
generation per iteration, SuRe = 1 + a summary and a validity judgement per distinct candidate + both
orders of each pair, Adaptive-RAG = its label + the chosen strategy's. The engine's request count beyond
that is flagged as extra (a retry, a parse fallback, or a bug). Tokens are the scripted engine's
word-and-punctuation tokens.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402

from arag.data import load_corpus, load_examples  # noqa: E402
from arag.programs import PROGRAMS, build_program  # noqa: E402
from arag.retrievers import BM25Retriever  # noqa: E402
from arag.testing import Scripted, ScriptedCall, Tokens, isolated_cache, scripted_lm, tokenize  # noqa: E402

HOTPOTQA = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "hotpotqa"
QUICK_QUESTIONS = 3

# prev-window drafts are cut at their window's token budget on purpose; DSPy warns about every cut.
logging.getLogger("dspy.clients.lm").setLevel(logging.ERROR)

# ------------------------------------------------------------------------------------------------
# The stand-in model


SURE, UNSURE = 0.92, 0.3
QUESTION_WORDS = {"what", "which", "who", "whom", "whose", "when", "where", "why", "how", "is", "are", "was",
                  "were", "did", "do", "does", "the", "in", "of", "a", "an", "and", "or", "for", "to", "on"}
ENTITY = re.compile(r"(?:[A-Z][\w'’.-]*|\d{3,4})(?:\s+(?:of|the|de|and|[A-Z][\w'’.-]*|\d+))*")
PASSAGE_TITLE = re.compile(r"\[\d+\] ([^|\"\\]+?) \|")
HISTORY_HOP = re.compile(r'"sub_question"')
OBSERVATION = re.compile(r"\[\[ ## observation_\d+ ## \]\]")
HOPS = 2
FOLLOW_UPS = 2
REACT_SEARCHES = 2


def entities(question: str) -> list[str]:
    """The question's capitalised phrases (without a leading question word), else its longer words: the
    names a stand-in answer talks about."""
    found = []
    for match in ENTITY.finditer(question):
        phrase = match.group(0).strip(" .?'’")
        if match.start() == 0 and phrase.split()[0].lower() in QUESTION_WORDS:
            phrase = phrase.partition(" ")[2]
        if phrase and phrase.lower() not in QUESTION_WORDS and phrase not in found:
            found.append(phrase)
    words = [w for w in re.findall(r"[A-Za-z]{5,}", question) if w.lower() not in QUESTION_WORDS]
    return found or words[:3] or ["it"]


def content_words(text: str) -> set[str]:
    return {w.lower() for w in re.findall(r"[A-Za-z]{4,}", text)} - QUESTION_WORDS


def long_answer(question: str) -> list[str]:
    """The stand-in's three-sentence answer; the year in the second sentence is the unsure part."""
    names = entities(question)
    first, second = names[0], names[1 % len(names)]
    return [f"The question is about {first}.",
            f"Records about {second} go back to 1900.",
            f"So the answer is {first}."]


def continuation(question: str, so_far: str) -> Scripted:
    """The part of the long answer after `so_far` (its last sentence when `so_far` is not a prefix of it),
    with the year's tokens unsure."""
    sentences = long_answer(question)
    words, written = " ".join(sentences).split(), so_far.split()
    text = " ".join(words[len(written):]) if words[: len(written)] == written else sentences[-1]
    return Scripted(text, [UNSURE if token.strip() == "1900" else SURE for token in tokenize(text)])


def json_list(text: str) -> list:
    try:
        value = json.loads(text or "[]")
    except json.JSONDecodeError:
        return []
    return value if isinstance(value, list) else []


def label(chosen: str, prob: float, alternatives: dict[str, float]) -> Tokens:
    return Tokens([(chosen, prob, alternatives)])


class StandInModel:
    """A responder for `arag.testing.scripted_lm` that answers every arag signature (and dspy.ReAct's)."""

    def __call__(self, call: ScriptedCall) -> dict[str, Any]:
        inputs, fields = call.inputs, call.output_fields
        question = inputs.get("question", "")
        names = entities(question)
        answer: dict[str, Any] = {}
        for name in fields:
            answer[name] = self.field(name, call, question, names)
        if "finished" in fields:
            answer.update(self.deduction(inputs, names))
        if "next_tool_name" in fields:
            answer.update(self.react_step(call, names))
        return answer

    def field(self, name: str, call: ScriptedCall, question: str, names: list[str]) -> Any:
        inputs = call.inputs
        if name == "reasoning":
            return "Reading the material step by step."
        if name == "answer":
            return names[0]
        if name == "continuation":
            if "searches_left" in inputs:
                return self.with_search(inputs, names)
            return continuation(question, inputs.get("answer_so_far", ""))
        if name == "note":
            titles = PASSAGE_TITLE.findall(inputs.get("passages", ""))
            return "Note: " + "; ".join(titles[:3]) + "."
        if name == "updated_note":
            titles = PASSAGE_TITLE.findall(inputs.get("passages", ""))
            note = inputs.get("note", "")
            return f"{note}\nAlso: {'; '.join(titles[:2])}." if titles else note
        if name == "better":
            better = len(inputs.get("new_note", "")) > len(inputs.get("best_note", ""))
            return label("True" if better else "False", 0.8, {"False" if better else "True": 0.2})
        if name == "query":
            asked = json_list(inputs.get("asked_queries", ""))
            if len(asked) == 1 and not inputs.get("rejected_query"):
                return asked[0]  # a repeat, refused and asked again: Adaptive-Note's documented retry
            return f"{names[len(asked) % len(names)]} background {len(asked) + 1}"
        if name == "needs_follow_up":
            return len(json_list(inputs.get("follow_ups", ""))) < FOLLOW_UPS
        if name == "follow_up":
            asked = len(json_list(inputs.get("follow_ups", "")))
            return f"What is {names[asked % len(names)]}?" if asked < FOLLOW_UPS else ""
        if name == "question":
            return f"What does {inputs.get('span', 'it')} refer to?"
        if name == "keywords":
            return names[:3]
        if name == "relevant":
            overlap = len(content_words(question) & content_words(inputs.get("passage", "")))
            p_yes = 0.9 if overlap >= 2 else 0.15
            return label("yes", p_yes, {"no": 1 - p_yes}) if p_yes > 0.5 else label("no", 1 - p_yes, {"yes": p_yes})
        if name == "support":
            return Tokens([("fully", 0.6, {"partially": 0.3, "no": 0.1}), (" supported", 1.0)])
        if name == "utility":
            return label("4", 0.6, {"5": 0.2, "3": 0.2})
        if name == "retrieve":
            return label("yes", 0.7, {"no": 0.2, "continue": 0.1})
        if name == "complexity":  # one named thing: one retrieval; more: several
            return label("C", 0.6, {"B": 0.3, "A": 0.1}) if len(names) > 1 else label("B", 0.6, {"C": 0.3, "A": 0.1})
        if name == "evidence":
            return self.evidence(inputs)
        if name == "revised_answer":
            return inputs.get("candidate_answer", names[0])
        if name.startswith("candidate_") and name.removeprefix("candidate_").isdigit():
            options = [names[0], *PASSAGE_TITLE.findall(inputs.get("passages", ""))]
            return options[(int(name.removeprefix("candidate_")) - 1) % len(options)]
        if name == "supporting_summary":
            return f"The passages about {inputs.get('chosen_candidate', names[0])} bear on the question."
        if name == "supports_candidate":
            named = inputs.get("candidate", "") in names
            return label("True", 0.7, {"False": 0.3}) if named else label("False", 0.6, {"True": 0.4})
        if name == "more_informative":
            return "1" if len(inputs.get("summary_1", "")) >= len(inputs.get("summary_2", "")) else "2"
        return ""

    @staticmethod
    def with_search(inputs: dict[str, str], names: list[str]) -> str:
        if not inputs.get("answer_so_far", "").strip():
            return f"First, what is {names[0]}? [Search({names[0]} history)]"
        return f"It is described in the passages. So the answer is {names[0]}."

    @staticmethod
    def deduction(inputs: dict[str, str], names: list[str]) -> dict[str, Any]:
        hops = len(HISTORY_HOP.findall(inputs.get("history", "")))
        if hops >= HOPS:
            return {"finished": True, "sub_question": "", "answer": names[0]}
        name = names[hops % len(names)]
        return {"finished": False, "sub_question": f"What is {name} known for?", "answer": name}

    @staticmethod
    def evidence(inputs: dict[str, str]) -> list[str]:
        """A quote from the first passage naming the sub-question's subject, else the paper's "Empty"."""
        subject = content_words(inputs.get("sub_question", ""))
        for passage in json_list(inputs.get("passages", "")):
            if isinstance(passage, str) and subject & content_words(passage):
                return [" ".join(passage.split("|", 1)[-1].split()[:12])]
        return ["Empty"]

    @staticmethod
    def react_step(call: ScriptedCall, names: list[str]) -> dict[str, Any]:
        searches = len(OBSERVATION.findall(call.prompt))
        if searches < REACT_SEARCHES:
            return {"next_thought": "I should search.", "next_tool_name": "search",
                    "next_tool_args": {"query": names[searches % len(names)]}}
        return {"next_thought": "I know enough.", "next_tool_name": "finish", "next_tool_args": {}}


# ------------------------------------------------------------------------------------------------
# Measuring


@dataclass
class Cost:
    program: str
    formula: str
    lm_calls: list[int] = field(default_factory=list)
    requests: list[int] = field(default_factory=list)
    required: list[int] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    completion_tokens: list[int] = field(default_factory=list)
    retrievals: list[int] = field(default_factory=list)
    passages: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def extra(self) -> int:
        return sum(r - q for r, q in zip(self.requests, self.required))

    @property
    def questions_with_extra(self) -> int:
        return sum(r != q for r, q in zip(self.requests, self.required))


def hotpotqa_retriever(dataset: Path, work: Path) -> BM25Retriever:
    return BM25Retriever.build(load_corpus(dataset / "corpus.jsonl"), work / "bm25")


def measure(program_name: str, retriever, questions: list[dspy.Example]) -> Cost:
    """Run one program over the questions, one at a time, on a fresh stand-in LM."""
    lm = scripted_lm(StandInModel())
    program = build_program(program_name, retriever)
    cost = Cost(program_name, program.lm_calls_formula)
    started = time.perf_counter()
    with dspy.context(lm=lm):
        for example in questions:
            before = lm.engine.count
            try:
                prediction = program(question=example.question)
            except Exception as exc:  # noqa: BLE001 — a failure is a finding, reported in the table
                cost.failures.append(f"{example.id}: {type(exc).__name__}: {exc}"[:300])
                continue
            cost.requests.append(lm.engine.count - before)
            cost.required.append(program.required_lm_calls(prediction.trace))
            cost.lm_calls.append(prediction.lm_calls)
            cost.prompt_tokens.append(prediction.prompt_tokens)
            cost.completion_tokens.append(prediction.completion_tokens)
            cost.retrievals.append(prediction.retrieval_calls)
            cost.passages.append(prediction.distinct_passages)
    cost.seconds = time.perf_counter() - started
    return cost


def mean(values: list[int]) -> float:
    return statistics.fmean(values) if values else 0.0


def spread(values: list[int]) -> str:
    return f"{mean(values):.2f} ({min(values)}–{max(values)})" if values else "—"


def table(costs: list[Cost]) -> str:
    lines = [
        "| program | questions | LM calls / q (min–max) | required / q | extra calls | tokens in / q | "
        "tokens out / q | retrievals / q | distinct passages / q | required = |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cost in costs:
        lines.append(
            f"| {cost.program} | {len(cost.requests)}{f' ({len(cost.failures)} failed)' if cost.failures else ''} "
            f"| {spread(cost.requests)} | {mean(cost.required):.2f} | {cost.extra} "
            f"| {mean(cost.prompt_tokens):,.0f} | {mean(cost.completion_tokens):,.0f} | {mean(cost.retrievals):.2f} "
            f"| {mean(cost.passages):.2f} | {cost.formula} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=HOTPOTQA, help="folder with public.jsonl and corpus.jsonl")
    parser.add_argument("--limit", type=int, help="only the first N questions (default: all)")
    parser.add_argument("--programs", help="comma-separated program names (default: every registered program)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_QUESTIONS} questions: a smoke run")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = args.programs.split(",") if args.programs else sorted(PROGRAMS)
    unknown = sorted(set(names) - set(PROGRAMS))
    if unknown:
        sys.exit(f"unknown programs {', '.join(unknown)}; known: {', '.join(sorted(PROGRAMS))}")
    limit = QUICK_QUESTIONS if args.quick else args.limit
    questions = load_examples(args.dataset / "public.jsonl", limit=limit)
    costs = []
    with tempfile.TemporaryDirectory(prefix="arag-cost-") as work, isolated_cache(enabled=False):
        retriever = hotpotqa_retriever(args.dataset, Path(work))
        for name in names:
            costs.append(measure(name, retriever, questions))
            print(f"{name}: {len(questions)} questions in {costs[-1].seconds:.1f} s", file=sys.stderr, flush=True)
    print(f"HotpotQA ({args.dataset}): {len(questions)} questions, BM25 over its corpus, stand-in scripted LM, "
          "default parameters, DSPy cache off\n")
    print(table(costs))
    print()
    for cost in costs:
        ratio = sum(cost.requests) / sum(cost.required) if sum(cost.required) else float("nan")
        verdict = "ok" if cost.extra == 0 and not cost.failures else "CHECK"
        print(f"ratio {cost.program}: LM calls / required = {ratio:.3f} "
              f"({cost.extra} extra over {cost.questions_with_extra} questions, {len(cost.failures)} failed) {verdict}")
        for failure in cost.failures[:3]:
            print(f"    failed {failure}")
    return 0 if all(c.extra == 0 and not c.failures for c in costs) else 1


if __name__ == "__main__":
    sys.exit(main())
