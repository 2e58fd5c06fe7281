"""Fake retrievers: no index, passages known in advance, every query recorded.

`FixedRetriever` gives the same passages to every query; `TemplateRetriever` writes k passages for any query from a
`PassageTemplate`, so that a test can tell from a passage which query (and rank) brought it. Both are arag
retrievers (`BaseRetriever`): k is checked, a blank query gets no passages and is not recorded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from arag.passages import Passage
from arag.retrievers import BaseRetriever


class FixedRetriever(BaseRetriever):
    """The first k of `passages`, best first, whatever the query. `queries` records the queries asked."""

    def __init__(self, passages):
        self.passages = list(passages)
        self.queries = []

    def _search(self, query, k):
        self.queries.append(query)
        return self.passages[:k]


@dataclass(frozen=True)
class PassageTemplate:
    """How `TemplateRetriever` writes a passage: `id` is a format string of `{query}` and `{rank}`; `title`
    and `text` may also use `{id}`. Ranks count from `first_rank`."""

    id: str = "{query} #{rank}"
    title: str = "Doc {rank}"
    text: str = "Passage {rank} on {query}."
    first_rank: int = 1


RANKED = PassageTemplate()
"""`<query> #1` ... `<query> #k`, titled "Doc 1" ..., text "Passage 1 on <query>." ... (the default)."""

FOUND_FOR = PassageTemplate(id="{query}#{rank}", title="About {query}", text="Passage {rank} found for: {query}",
                            first_rank=0)
"""`<query>#0` ... `<query>#k-1`, titled "About <query>", text "Passage 0 found for: <query>" ...: a prompt
shows which query's passages it holds."""

NUMBERED = PassageTemplate(id="d{rank}", text="Passage {rank} says the answer is Budapest.")
"""The same k passages, `d1` ... `dk` ("Doc 1" ...), for every query; each says the answer is Budapest."""


class TemplateRetriever(BaseRetriever):
    """k passages for any query, written from `template` (default RANKED), best first: the score falls from k
    to 1 down the list.

    `pages` maps chosen queries to the ids they get instead (the first k of them; `{rank}` is then the position,
    counted from the template's `first_rank`). `delay` seconds of sleep before each answer play a slow index.
    `queries` records the queries asked, in order.
    """

    def __init__(self, template: PassageTemplate = RANKED, *, pages=None, delay: float = 0.0):
        self.template = template
        self.pages = dict(pages or {})
        self.delay = delay
        self.queries = []

    def _search(self, query, k):
        self.queries.append(query)
        if self.delay:
            time.sleep(self.delay)
        t = self.template
        ranks = range(t.first_rank, t.first_rank + k)
        ids = self.pages.get(query, [t.id.format(query=query, rank=rank) for rank in ranks])[:k]
        passages = []
        for position, (rank, pid) in enumerate(zip(ranks, ids)):
            fields = {"query": query, "rank": rank, "id": pid}
            passages.append(Passage(pid, t.title.format(**fields), t.text.format(**fields), float(k - position)))
        return passages
