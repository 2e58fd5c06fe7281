"""Scripted readers of the bundled sample, shared by tests in several folders (tests/ is on the import path)."""

import json

from arag.data import load_examples, sample_paths

SAMPLE_BY_QUESTION = {example.question: example for example in load_examples(sample_paths()[0])}


def evidence_reader(call):
    """Right when both supporting passages are among at most three given, else "unknown": em peaks at a middle k."""
    example = SAMPLE_BY_QUESTION[call.inputs["question"]]
    titles = {passage.split("] ", 1)[1].split(" | ")[0] for passage in json.loads(call.inputs["passages"])}
    right = set(example.supporting_titles) <= titles and len(titles) <= 3
    answer = example.answers[0] if right else "unknown"
    return {field: answer if field == "answer" else "." for field in call.output_fields}
