"""`StandInModel`: a responder for `scripted_lm` that answers every arag signature (and dspy.ReAct's), for the
benchmarks that measure programs' costs rather than their quality.

It answers in a fixed way shaped by the question and the passages it is shown: a three-sentence answer whose
second sentence has an unsure year, two sub-questions, notes that grow with new passages, relevance judged by
word overlap, a search between markers and then a \\boxed{} answer, and so on. Its answers are not a model's.
"""

from __future__ import annotations

import json
import re
from typing import Any

from arag.signatures.reasoning import BEGIN_QUERY, BEGIN_RESULT, END_QUERY
from arag.testing.engines import Scripted, ScriptedCall, Tokens, tokenize

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
        if name == "needs_retrieval":  # several named things: search first
            return len(names) > 1
        if name == "next_reasoning":  # one search, then the answer
            if BEGIN_RESULT not in inputs.get("reasoning_so_far", ""):
                return f"I need facts about {names[0]}.\n{BEGIN_QUERY}{names[0]}{END_QUERY}"
            return f"The result names {names[0]}.\nSo the answer is \\boxed{{{names[0]}}}."
        if name == "final_information":
            titles = PASSAGE_TITLE.findall(inputs.get("documents", ""))
            return f"The documents are about {'; '.join(titles[:3])}." if titles else ""
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

