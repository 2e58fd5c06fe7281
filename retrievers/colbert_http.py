"""The ColBERTv2 HTTP search protocol (that of `dspy.ColBERTv2` and colbert-ai's server): its client and server.

Request: GET `<url>?query=...&k=...`, or POST `<url>` with the JSON object `{"query": ..., "k": ...}`.
Answer: `{"query": ..., "topk": [{"text", "long_text", "pid", "rank", "score", "prob"}, ...]}`, best
first, where `text` and `long_text` are `Title | text`, `rank` counts from 1 and `prob` is the
softmax of the scores over the answer. arag's server also sends each passage's arag `id` and
`title` (extra keys; clients of the protocol ignore them) so that arag clients get back exactly
the passages of a direct search. Errors come as `{"error": <kind>, "message": ...}` with a 4xx/5xx status.

The client is `arag.retrievers.colbert_client` (index specs open it, so it sits below `index`), the server
`arag.retrievers.colbert_server` (it opens index folders, so it sits above `index`); both are importable from here.
"""

from arag.retrievers.colbert_client import SEARCH_PATH, TITLE_SEPARATOR, ColBERTv2Retriever
from arag.retrievers.colbert_server import (
    DEFAULT_K,
    DEFAULT_PORT,
    MAX_BODY_BYTES,
    MAX_QUERY_CHARS,
    SearchServer,
    search_answer,
    serve,
)

__all__ = [
    "DEFAULT_K",
    "DEFAULT_PORT",
    "MAX_BODY_BYTES",
    "MAX_QUERY_CHARS",
    "SEARCH_PATH",
    "TITLE_SEPARATOR",
    "ColBERTv2Retriever",
    "SearchServer",
    "search_answer",
    "serve",
]
