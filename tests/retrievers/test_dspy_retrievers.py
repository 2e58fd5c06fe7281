"""DSPy's retrievers and plain search functions in every program: dspy.ColBERTv2 against `arag serve`,
dspy.retrievers.Embeddings, functions of every result shape, and refusals at build time."""

import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import ThreadingHTTPServer
from pathlib import Path

import dspy
import pytest
from dspy.dsp.utils import dotdict
from test_colbert_http import ColBERTAIHandler  # answers like the public servers: pids, `Title | text`

from arag.errors import ConfigError, RetrieverError
from arag.passages import text_id
from arag.programs import build_program
from arag.retrievers import (
    BM25Retriever,
    CallableRetriever,
    ColBERTv2Retriever,
    DenseRetriever,
    Passage,
    SearchServer,
    as_retriever,
    open_retriever,
)
from arag.retrievers.base import passages_from
from arag.retrievers.dense import load_sentence_model
from arag.testing import isolated_cache, scripted_lm
from arag.trace import Retrieve, is_step, recording

PASSAGES = [
    Passage("0", "Lighthouse", "A lighthouse guides ships at night with a rotating beam of light."),
    Passage("1", "Beekeeping", "Beekeepers harvest honey and wax from hives of honeybees."),
    Passage("2", "Glacier", "A glacier is a slowly moving mass of ice formed from compacted snow."),
    Passage("3", "", "An untitled note about ships, light and the sea."),
    Passage("4", "Harbour", "Ships shelter in a harbour from storms, guided in by its light."),
    Passage("5", "Volcano", "Molten rock rises through the crust and erupts as lava and ash."),
]
QUESTIONS = ["Which light guides ships?", "Who harvests honey from hives?", "How does snow become ice?"]


def any_answer(call):
    return {field: "x" for field in call.output_fields}


@pytest.fixture(scope="module", autouse=True)
def fresh_dspy_cache():
    """dspy.ColBERTv2 caches answers by URL and query: a cache of this module's own keeps other runs' out."""
    with isolated_cache():
        yield


@pytest.fixture(scope="module")
def bm25(tmp_path_factory):
    return BM25Retriever.build(PASSAGES, tmp_path_factory.mktemp("bm25") / "index")


@pytest.fixture(scope="module")
def server(bm25):
    with SearchServer(bm25, port=0) as running:
        yield running


def run_program(retriever, question, *, name="single-rag", k=3):
    """The prediction and the passages the LM was shown, for one question under a scripted LM."""
    lm = scripted_lm(any_answer)
    program = build_program(name, retriever, k=k)
    with dspy.context(lm=lm):
        prediction = program(question=question)
    return prediction, [call.inputs.get("passages") for call in lm.engine.calls]


def retrieved(prediction):
    return [step["passages"] for step in prediction.trace if is_step(step, Retrieve)]


@pytest.mark.parametrize("post", [False, True])
def test_a_program_over_dspy_colbertv2_sees_the_passages_of_the_direct_retriever(server, bm25, post):
    for name in ("single-rag", "adaptive-note"):  # one retrieval; several, with passages seen again
        for question in QUESTIONS:
            direct, direct_prompts = run_program(bm25, question, name=name)
            served, served_prompts = run_program(dspy.ColBERTv2(url=server.url, post_requests=post), question,
                                                 name=name)
            assert retrieved(served) == retrieved(direct) and served_prompts == direct_prompts
            assert (served.retrieval_calls, served.distinct_passages) == (
                direct.retrieval_calls, direct.distinct_passages)
    program = build_program("single-rag", dspy.ColBERTv2(url=server.url, post_requests=post), k=3)
    for question in QUESTIONS:
        for k in (1, 4, len(PASSAGES)):
            assert program.retriever.retrieve(question, k) == bm25.retrieve(question, k)


def test_dspy_colbertv2_over_a_public_style_server_gets_pid_ids_and_split_titles():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), ColBERTAIHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/wiki17/api/search"
    try:
        passages = as_retriever(dspy.ColBERTv2(url=url)).retrieve("q", 2)
        arag_client = ColBERTv2Retriever(url).retrieve("q", 2)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert passages == arag_client == [
        Passage("3", "Lighthouse", "A lighthouse guides ships.", 21.5),
        Passage("8", "", "No title here", 20.0),
    ]


@pytest.fixture(scope="module")
def minilm():
    return load_sentence_model()


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return DenseRetriever.build(PASSAGES, tmp_path_factory.mktemp("dense") / "index")


def embeddings_over(passages, model, *, k, with_scores=False):
    embedder = dspy.Embedder(model.encode, caching=False)
    kind = dspy.retrievers.EmbeddingsWithScores if with_scores else dspy.retrievers.Embeddings
    return kind(corpus=[p.long_text for p in passages], embedder=embedder, k=k)


def without_scores(passages):
    return [(p.id, p.title, p.text) for p in passages]


def test_a_program_over_dspy_embeddings_sees_the_passages_of_the_direct_dense_retriever(dense, minilm):
    search = embeddings_over(PASSAGES, minilm, k=2)
    for question in QUESTIONS:
        searched, searched_prompts = run_program(search, question, k=4)  # more than the 2 it was built with
        direct, direct_prompts = run_program(dense, question, k=4)
        assert searched_prompts == direct_prompts
        assert [[(p["id"], p["title"]) for p in step] for step in retrieved(searched)] == [
            [(p["id"], p["title"]) for p in step] for step in retrieved(direct)
        ]
    assert search.k == 2
    scored = as_retriever(embeddings_over(PASSAGES, minilm, k=3, with_scores=True))
    for question in QUESTIONS:
        for k in (1, 3, 5):
            direct = dense.retrieve(question, k)
            adapted = scored.retrieve(question, k)
            assert without_scores(adapted) == without_scores(direct)
            assert [p.score for p in adapted] == pytest.approx([p.score for p in direct], abs=1e-5)


def test_a_program_over_a_plain_function_sees_the_passages_of_the_direct_retriever(bm25):
    calls = []

    def search(query, k):
        calls.append((query, k))
        return [p.long_text for p in bm25.retrieve(query, k)]

    for question in QUESTIONS:
        direct, direct_prompts = run_program(bm25, question)
        searched, searched_prompts = run_program(search, question)
        assert searched_prompts == direct_prompts
        assert [[(p["title"], p["id"]) for p in step] for step in retrieved(searched)] == [
            [(p.title, text_id(p.long_text)) for p in bm25.retrieve(question, 3)]
        ]
    assert calls == [(question, 3) for question in QUESTIONS]
    returning_passages = run_program(bm25.retrieve, QUESTIONS[0])[0]  # a function returning arag Passages
    assert retrieved(returning_passages) == retrieved(run_program(bm25, QUESTIONS[0])[0])


def test_text_ids_are_stable_so_repeated_passages_count_once(bm25):
    program = build_program("single-rag", lambda query, k: [p.long_text for p in bm25.retrieve(query, k)], k=3)
    direct = build_program("single-rag", bm25, k=3)
    counts = []
    for candidate in (program, direct):
        with dspy.context(lm=scripted_lm(any_answer)), recording() as trace:
            candidate(question=QUESTIONS[0])
            candidate(question=QUESTIONS[0] + " Again?")
            candidate(question=QUESTIONS[1])
        counts.append(trace.counts())
    assert counts[0]["distinct_passages"] == counts[1]["distinct_passages"]
    assert counts[0]["retrieval_calls"] == counts[1]["retrieval_calls"] == 3


@pytest.mark.parametrize(
    "results, expected",
    [
        (["Lighthouse | Guides ships.", " | no title before the bar", "Plain text"],
         [Passage(text_id("Lighthouse | Guides ships."), "Lighthouse", "Guides ships."),
          Passage(text_id(" | no title before the bar"), "", " | no title before the bar"),
          Passage(text_id("Plain text"), "", "Plain text")]),
        ([{"long_text": "A | b", "pid": 7, "score": 2}, {"text": "C | d", "id": "x"}, dotdict(text="e", score=0.5)],
         [Passage("7", "A", "b", 2.0), Passage("x", "C", "d"), Passage(text_id("e"), "", "e", 0.5)]),
        ([{"text": "A | B | text", "title": "A | B", "id": "ab"}, {"text": "two\nlines | x"}],
         [Passage("ab", "A | B", "text"), Passage(text_id("two\nlines | x"), "", "two\nlines | x")]),
        (dspy.Prediction(passages=["A | b", "c"], indices=[4, 0], scores=[0.9, 0.1]),
         [Passage("4", "A", "b", 0.9), Passage("0", "", "c", 0.1)]),
        ({"docs": ["d1", "d2"], "doc_ids": ["a", "b"]}, [Passage("a", "", "d1"), Passage("b", "", "d2")]),
        ([dspy.Prediction(long_text="T | u", pid=1), Passage("p", "P", "q", 3.0)],
         [Passage("1", "T", "u"), Passage("p", "P", "q", 3.0)]),
        (iter(["a", "b"]), [Passage(text_id("a"), "", "a"), Passage(text_id("b"), "", "b")]),
    ],
)
def test_results_of_every_shape_become_passages(results, expected):
    assert passages_from(results) == expected


def test_results_of_every_shape_keep_at_most_k():
    assert passages_from(["a", "b", "c"], k=2) == [Passage(text_id("a"), "", "a"), Passage(text_id("b"), "", "b")]
    assert passages_from(dspy.Prediction(passages=["a", "b", "c"], indices=[5, 6, 7]), k=1) == [Passage("5", "", "a")]


@pytest.mark.parametrize(
    "results, message",
    [
        (42, "must be a list of passages"),
        ("a single string", "must be a list of passages"),
        (dspy.Prediction(answer="x"), "no passages under 'passages'"),
        ([{"title": "no text"}], "cannot read a passage"),
        ([3.5], "cannot read a passage"),
        ([{"text": "t", "score": "high"}], "not a number"),
    ],
)
def test_unreadable_results_are_retriever_errors(results, message):
    retriever = as_retriever(lambda query, k: results)
    with pytest.raises(RetrieverError, match=message):
        retriever.retrieve("q", 3)


class FixedK:
    """A source that, like dspy.retrievers.Embeddings, takes k only when built."""

    def __init__(self, corpus, k):
        self.corpus, self.k = corpus, k

    def __call__(self, query):
        time.sleep(0.001)
        return dspy.Prediction(passages=self.corpus[:self.k], indices=list(range(self.k)))


def test_k_reaches_each_kind_of_source():
    corpus = [f"passage {i}" for i in range(10)]
    seen = []

    def keyword(query, *, k):
        seen.append(("keyword", k))
        return corpus

    def positional(query, count):
        seen.append(("positional", count))
        return corpus

    def query_only(query):
        return corpus

    for source in (keyword, positional, query_only, lambda query, k=10, simplify=False: corpus[:k]):
        assert len(as_retriever(source).retrieve("q", 4)) == 4
    assert seen == [("keyword", 4), ("positional", 4)]
    fixed = FixedK(corpus, 3)
    assert [len(as_retriever(fixed).retrieve("q", k)) for k in (1, 3, 7)] == [1, 3, 7] and fixed.k == 3


def test_k_set_on_a_shared_source_holds_under_concurrent_calls():
    corpus = [f"passage {i}" for i in range(12)]
    fixed = FixedK(corpus, 3)
    first, second = as_retriever(fixed), as_retriever(fixed)  # two programs over one source
    ks = [1 + (i * 7) % 12 for i in range(120)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        lengths = list(pool.map(lambda i: len((first if i % 2 else second).retrieve("q", ks[i])), range(len(ks))))
    assert lengths == ks and fixed.k == 3


def test_dspy_retrieve_uses_the_configured_rm(bm25):
    def rm(query, k):
        return [dotdict(long_text=p.long_text) for p in bm25.retrieve(query, k)]

    with dspy.context(rm=rm):
        passages = as_retriever(dspy.Retrieve(k=1)).retrieve(QUESTIONS[1], 3)
    assert [(p.title, p.text) for p in passages] == [(p.title, p.text) for p in bm25.retrieve(QUESTIONS[1], 3)]


def test_arag_retrievers_pass_through_and_adapters_survive_deep_copies(bm25, server):
    assert as_retriever(bm25) is bm25
    program = build_program("single-rag", dspy.ColBERTv2(url=server.url), k=2)
    assert isinstance(program.retriever, CallableRetriever)
    assert copy.deepcopy(program).retriever is program.retriever
    assert build_program("no-retrieval").retriever is None


def search_with_three_arguments(query, k, filters):
    return []


@pytest.mark.parametrize(
    "not_a_retriever, message",
    [
        (object(), "object <object object at .*> is not a retriever"),
        (42, "int 42 is not a retriever"),
        (PASSAGES, r"list \[Passage\(.*\.\.\. is not a retriever"),
        ("bm25:idx", "retriever spec, not a retriever"),
        (Path("idx"), "retriever spec, not a retriever"),
        (dspy.ColBERTv2, "ColBERTv2 is a class"),
        (BM25Retriever, "BM25Retriever is a class"),
        (lambda: [], "cannot be called with a query"),
        (dspy.Predict("question -> answer"), "cannot be called with a query"),
        (search_with_three_arguments, r"needs more than a query and k \(k, filters\)"),
    ],
)
def test_what_cannot_retrieve_is_refused_when_the_program_is_built(not_a_retriever, message):
    for name in ("single-rag", "flare"):
        with pytest.raises(ConfigError, match=message) as refused:
            build_program(name, not_a_retriever)
        if "spec" not in message:
            assert "dspy.ColBERTv2" in str(refused.value) and "(query, k)" in str(refused.value)


def test_open_retriever_takes_retriever_objects_too(server, bm25):
    assert open_retriever(bm25) is bm25
    opened = open_retriever(dspy.ColBERTv2(url=server.url))
    assert opened.retrieve(QUESTIONS[0], 3) == bm25.retrieve(QUESTIONS[0], 3)
    assert open_retriever(bm25.index_dir).retrieve(QUESTIONS[0], 3) == bm25.retrieve(QUESTIONS[0], 3)
    with pytest.raises(ConfigError, match="not a retriever"):
        open_retriever(object())
