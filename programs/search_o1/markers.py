"""The text protocol of Search-o1's reasoning: the search query between its markers, the results inserted back,
the previous steps Reason-in-Documents is shown, and the final \\boxed{} answer. Line numbers cite the official
code, sunnynexus/Search-o1@6ced48f, scripts/run_search_o1.py unless said otherwise."""

from __future__ import annotations

import re

from arag.signatures.reasoning import BEGIN_QUERY, BEGIN_RESULT, END_QUERY, END_RESULT

QUERY_PAIR = re.compile(re.escape(BEGIN_QUERY) + r"(.*?)" + re.escape(END_QUERY), re.DOTALL)
BOXED = "\\boxed{"
TEXT_COMMAND = re.compile(r"\\text\{([^{}]*)\}")
WHOLE_STEPS = 4  # reasoning of at most this many steps is shown whole (the code's `len(prev_steps) <= 5`)
LAST_STEPS = 3  # ... else the first step, the last 3 and every step holding a marker (`i >= len(prev_steps) - 4`)
ELIDED = "..."

LIMIT_NOTICE = "The search limit is reached: no more searches are allowed."
REPEAT_NOTICE = "This query was already searched: use the results above."


def closed_turn(text: str) -> str:
    """The turn's text with the end-query marker the stop sequence cut off put back: the generation stops at
    that marker and the official code keeps it (`include_stop_str_in_output`, 397-409). An endpoint leaves a stop
    sequence out of the text, so a turn whose last begin-query marker is still open stopped there."""
    opened, closed = text.rfind(BEGIN_QUERY), text.rfind(END_QUERY)
    return text + END_QUERY if opened >= 0 and opened > closed else text


def turn_query(text: str) -> str | None:
    """The query a turn ends on: its last query between markers (412-417, `extract_between`, stripped) when the
    turn ends with the end-query marker (529-533); None when it does not, or the query is empty, which ends the
    reasoning (610-613)."""
    queries = QUERY_PAIR.findall(text)
    if not queries or not text.rstrip().endswith(END_QUERY):
        return None
    return queries[-1].strip() or None


def result_block(result: str) -> str:
    """A condensed result as it is inserted into the reasoning (666-671)."""
    return f"\n\n{BEGIN_RESULT}{result}{END_RESULT}\n\n"


def notice_block(notice: str) -> str:
    """A notice given instead of a search (past the limit, or a repeated query; 596-608)."""
    return f"\n{BEGIN_RESULT}\n{notice}\n{END_RESULT}\n"


def previous_reasoning(reasoning: str) -> str:
    """The reasoning as Reason-in-Documents is shown it (565-583): every line a step, `Step i: line` (blank lines
    collapsed once); up to WHOLE_STEPS steps whole, else the first, the last LAST_STEPS and every step holding a
    begin-query or begin-result marker, each run of the others replaced by one `...`."""
    lines = reasoning.replace("\n\n", "\n").split("\n")
    steps = [f"Step {number}: {line}" for number, line in enumerate(lines, start=1)]
    if len(steps) <= WHOLE_STEPS:
        return "\n\n".join(steps).strip("\n")
    kept: list[str] = []
    for index, step in enumerate(steps):
        if index == 0 or index >= len(steps) - LAST_STEPS or BEGIN_QUERY in step or BEGIN_RESULT in step:
            kept.append(step)
        elif kept[-1] != ELIDED:
            kept.append(ELIDED)
    return "\n\n".join(kept).strip("\n")


def boxed_answer(reasoning: str) -> str | None:
    """The last closed \\boxed{...} in the reasoning (evaluate.py:31-42, mode qa), read to its matching brace;
    any \\text{...} inside unwrapped; parentheses stripped from both ends. None when there is none."""
    start = reasoning.rfind(BOXED)
    while start >= 0:
        depth, index = 1, start + len(BOXED)
        while index < len(reasoning) and depth:
            depth += {"{": 1, "}": -1}.get(reasoning[index], 0)
            index += 1
        if depth == 0:
            inner = reasoning[start + len(BOXED): index - 1]
            while TEXT_COMMAND.search(inner):
                inner = TEXT_COMMAND.sub(r"\1", inner)
            return inner.strip("()").strip()
        start = reasoning.rfind(BOXED, 0, start)
    return None
