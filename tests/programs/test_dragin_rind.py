"""DRAGIN's RIND and QFS (programs/dragin/rind.py) against values worked out by hand: words merged from subwords,
a_max from later tokens only, S = H × a × s with stopwords zeroed and attention rescaled per sentence, the trigger
strictly above the threshold, and QFS's top-n attended content words in their original order."""

import numpy as np
import pytest

from arag.programs.dragin.rind import (
    first_trigger,
    focused_query,
    max_later_attention,
    merge_words,
    rind,
)


def causal(rows: list[list[float]]) -> np.ndarray:
    """One head's attention from rows written out in full (query by key)."""
    return np.array([rows], dtype=float)


def test_subwords_merge_into_words_at_spaces_line_breaks_and_special_tokens():
    pieces = [" Tim", " Bur", "ton", ".", " He", "\n", "was", "[EOS]", "born"]
    words = merge_words(pieces, special={7})
    assert [w.text for w in words] == [" Tim", " Burton.", " He", "\n", "was", "[EOS]", "born"]
    assert [list(w.tokens) for w in words] == [[0], [1, 2, 3], [4], [5], [6], [7], [8]]
    assert [w.start for w in words] == [0, 4, 12, 15, 16, 19, 24]
    assert words[1].bare == "Burton"


def test_a_max_is_the_most_attention_from_a_later_token_averaged_over_heads():
    first = [[1.0, 0, 0], [0.6, 0.4, 0], [0.2, 0.5, 0.3]]
    second = [[1.0, 0, 0], [0.9, 0.1, 0], [0.1, 0.1, 0.8]]
    a = max_later_attention(np.array([first, second]))
    # token 0: later rows give 0.6, 0.2 (head 1) and 0.9, 0.1 (head 2): mean of maxima (0.6 + 0.9) / 2;
    # its attention to itself (1.0) does not count. Token 1: 0.5 and 0.1. The last token: no later token.
    assert a == pytest.approx([0.75, 0.3, 0.0])


def test_s_is_entropy_times_rescaled_attention_and_zero_for_stopwords():
    pieces = [" Ed", " Wood", " was", " by", " Bur", "ton", "."]
    entropies = [1.0, 2.0, 3.0, 4.0, 0.5, 1.5, 2.5]
    attention = causal([
        [1.0, 0, 0, 0, 0, 0, 0],
        [0.5, 0.5, 0, 0, 0, 0, 0],
        [0.2, 0.4, 0.4, 0, 0, 0, 0],
        [0.1, 0.1, 0.6, 0.2, 0, 0, 0],
        [0.1, 0.1, 0.1, 0.3, 0.4, 0, 0],
        [0.2, 0.1, 0.1, 0.1, 0.2, 0.3, 0],
        [0.1, 0.1, 0.1, 0.1, 0.1, 0.2, 0.3],
    ])
    scored = rind(pieces, entropies, attention)
    # a_max per token: column maxima below the diagonal: 0.5, 0.4, 0.6, 0.3, 0.2, 0.2, 0
    # words: Ed 0.5, Wood 0.4, was 0.6, by 0.3, Burton. 0.2 + 0.2 + 0 = 0.4; mean over the 5 words 2.2 / 5 = 0.44
    assert [s.word.text.strip() for s in scored] == ["Ed", "Wood", "was", "by", "Burton."]
    assert [s.attention for s in scored] == pytest.approx([0.5, 0.4, 0.6, 0.3, 0.4])
    rescaled = [0.5 / 0.44, 0.4 / 0.44, 0.6 / 0.44, 0.3 / 0.44, 0.4 / 0.44]
    assert [s.rescaled for s in scored] == pytest.approx(rescaled)
    assert [s.entropy for s in scored] == pytest.approx([1.0, 2.0, 3.0, 4.0, 1.5])  # Burton.: mean of 0.5, 1.5, 2.5
    assert [s.content for s in scored] == [True, True, False, False, True]
    assert [s.score for s in scored] == pytest.approx([1.0 * rescaled[0], 2.0 * rescaled[1], 0.0, 0.0,
                                                       1.5 * rescaled[4]])


def test_attention_is_rescaled_within_each_sentence():
    pieces = [" Paris", ".", " Lyon", " Rhone", "."]
    attention = causal([
        [1.0, 0, 0, 0, 0],
        [0.9, 0.1, 0, 0, 0],
        [0.3, 0.3, 0.4, 0, 0],
        [0.1, 0.1, 0.2, 0.6, 0],
        [0.1, 0.1, 0.2, 0.3, 0.3],
    ])
    scored = rind(pieces, [1.0] * 5, attention)
    # sentence 1: "Paris." alone (0.9 + 0.3): rescaled to 1; sentence 2: Lyon 0.2, Rhone. 0.3 + 0: mean 0.25
    assert [s.word.text for s in scored] == [" Paris.", " Lyon", " Rhone."]
    assert [s.rescaled for s in scored] == pytest.approx([1.0, 0.8, 1.2])


def test_a_sentence_no_later_token_attends_to_scores_zero():
    scored = rind([" Paris"], [3.0], causal([[1.0]]))
    assert scored[0].rescaled == 0.0 and scored[0].score == 0.0


def test_the_trigger_is_the_first_word_strictly_above_the_threshold():
    pieces = [" Ed", " Wood", " Burton"]
    attention = causal([[1.0, 0, 0], [0.5, 0.5, 0], [0.5, 0.5, 0.0]])
    scored = rind(pieces, [2.0, 4.0, 1.0], attention)
    scores = [s.score for s in scored]  # a: 0.5, 0.5, 0 (mean 1/3): rescaled 1.5, 1.5, 0
    assert scores == pytest.approx([3.0, 6.0, 0.0])
    assert first_trigger(scored, 2.9) == 0
    assert first_trigger(scored, scores[0]) == 1  # at the threshold: no trigger there
    assert first_trigger(scored, scores[1]) is None
    assert first_trigger(scored, 0.0) == 0


def test_qfs_keeps_the_top_n_attended_content_words_in_their_order():
    # [BOS] Who directed Ed Wood ? Tim Bur|ton   (the trigger: "Burton", two tokens)
    pieces = ["[BOS]", " Who", " directed", " Ed", " Wood", "?", " Tim", " Bur", "ton"]
    rows = np.zeros((9, 9))
    rows[7, :7] = [0.30, 0.02, 0.10, 0.20, 0.08, 0.05, 0.25]
    rows[8, :7] = [0.10, 0.30, 0.00, 0.10, 0.32, 0.08, 0.10]
    rows[8, 7], rows[7, 7] = 0.5, 0.0
    attention = np.array([rows, rows])
    query = focused_query(pieces, special={0}, attention=attention, top_n=3)
    # received: each row over the 7 tokens before the trigger, renormalised (row 8 sums to 1.0 there), averaged:
    # Who 0.16 (a stopword), directed 0.05, Ed 0.15, Wood? (0.08 + 0.32) / 2 + (0.05 + 0.08) / 2 = 0.265 (the "?"
    # merges into "Wood?"),
    # Tim 0.175; [BOS] is special
    assert query.words == ["Ed", "Wood", "Tim"] and query.candidates == 4
    assert query.weights == pytest.approx([0.15, 0.265, 0.175])
    assert focused_query(pieces, {0}, attention, top_n=1).words == ["Wood"]
    assert focused_query(pieces, {0}, attention, top_n=10).words == ["directed", "Ed", "Wood", "Tim"]
