"""The in-graph WordPiece tokenizer (core TensorFlow ops only) against
keras-hub's `WordPieceTokenizer`: the same ids, string for string."""

import unicodedata

import numpy as np
import pytest

from keras_attn.data import text
from keras_attn.data import wordpiece
from keras_attn.export._wordpiece_graph import MAX_BYTES_PER_WORD
from keras_attn.export._wordpiece_graph import WordPieceGraph

pytestmark = pytest.mark.tf_only

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "A café in Zürich serves naïve crème brûlée; Ångström measured it.",
    "Numbers: 12345, 3.14159 and 2,718 -- or 1e-9!",
    "東京と北京は大きい都市です。中文字符也要分开。",
    "Émile and ÉMILE visit the CAFÉ, then the Café.",
]
CORPUS = PROSE + [
    "THE QUICK BROWN FOX", "The Quick brown FOX",
    "...!!!???", "a--b__c((d))[[e]]{{f}}", "$100 ^ `x` | ~y", "«quoted» “smart” ‘quotes’ — dash…",
    "0 007 1234567890 3.14 1,000,000",
    "café naïve Ångström façade coöperate résumé", "CAFÉ NAÏVE ÅNGSTRÖM",
    "e\u0301 decomposed e\u0316\u0301 marks", "Straße İstanbul ΣΊΣΥΦΟΣ ﬁne ｆｕｌｌ ① ²",
    "中文 日本語 한국어 텍스트", "emoji 😀👍🏽 ok 🇫🇷 ❤️",
    "x" * MAX_BYTES_PER_WORD, "x" * (MAX_BYTES_PER_WORD + 1),  # the oov token past 100 bytes
    "é" * (MAX_BYTES_PER_WORD // 2), "é" * (MAX_BYTES_PER_WORD // 2 + 1),
    "quick" * 30, "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "", " ", "   \t\n  ", "\u00a0\u2003", "zero\u200bwidth soft\u00adhyphen",
    "qzxv wjkq zzzyyy quux",  # not in the vocabulary
    "the", "THE", "a b c",
]
# keras-hub's two paths (tf.function: tensorflow-text; eager: Python) agree on
# CORPUS; on NUL they do not (tensorflow-text ends the string there, as the
# graph does; the Python path splits on it).


@pytest.fixture(scope="module")
def vocabularies():
    sentences = PROSE * 3 + text.split_sentences(_pydoc_sample())[:120]
    return {
        "uncased": text.train_wordpiece_vocabulary(sentences, 400, lowercase=True),
        "cased": text.train_wordpiece_vocabulary(sentences, 400, lowercase=False),
    }


def _pydoc_sample():
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics)[:6])


def _keras_hub_ids(tokenizer, strings):
    import tensorflow as tf

    graph_path = tf.function(tokenizer)(tf.constant(strings)).to_list()  # tensorflow-text
    python_path = [list(map(int, row)) for row in tokenizer(list(strings))]
    assert graph_path == python_path  # keras-hub's own two paths agree here
    return graph_path


@pytest.mark.parametrize("vocabulary, lowercase, strip_accents", [
    ("uncased", True, True),
    ("cased", False, False),
    ("uncased", True, False),
    ("cased", False, True),
])
def test_same_ids_as_keras_hub(vocabularies, vocabulary, lowercase, strip_accents):
    import tensorflow as tf

    words = vocabularies[vocabulary]
    tokenizer = wordpiece.make_wordpiece_tokenizer(words, text.SPECIAL_TOKENS,
                                                   lowercase=lowercase,
                                                   strip_accents=strip_accents)
    expected = _keras_hub_ids(tokenizer, CORPUS)
    got = WordPieceGraph(tokenizer)(tf.constant(CORPUS)).to_list()
    for string, want, have in zip(CORPUS, expected, got):
        assert have == want, string
    # The corpus reaches each branch: pieces, the oov token, empty rows.
    unk = words.index("[UNK]")
    flat = [i for row in expected for i in row]
    assert any(words[i].startswith("##") for i in flat) and unk in flat
    assert expected[CORPUS.index("")] == [] and expected[CORPUS.index("   \t\n  ")] == []
    assert expected[CORPUS.index("x" * (MAX_BYTES_PER_WORD + 1))] == [unk]


@pytest.mark.large
def test_same_ids_for_every_character_of_the_basic_multilingual_plane():
    """Every code point Python's `unicodedata` knows, between letters and
    before a combining mark, with a vocabulary of every character (and its
    `##` form), so that the ids spell out the words character for
    character: splitting, accent stripping, case folding and recomposition
    as tensorflow-text's ICU does them."""
    import keras_hub
    import tensorflow as tf

    known = [chr(c) for c in range(0x10000) if not 0xD800 <= c < 0xE000
             and (unicodedata.category(chr(c)) != "Cn" or 0x2060 <= c <= 0x206F
                  or 0xFFF0 <= c <= 0xFFF8)]  # unassigned but default ignorable
    characters = known[1:]  # no NUL: tensorflow-text's vocabulary builder refuses it
    vocabulary = ["[UNK]"] + characters + ["##" + c for c in characters]
    strings = ["A" + c + "b" for c in known] + [c + "\u0301" for c in known] + [
        "e" + c for c in known]
    for lowercase, strip_accents in ((True, True), (False, False), (True, False)):
        tokenizer = keras_hub.tokenizers.WordPieceTokenizer(
            vocabulary=vocabulary, lowercase=lowercase, strip_accents=strip_accents)
        expected = tf.function(tokenizer)(tf.constant(strings))
        got = WordPieceGraph(tokenizer)(tf.constant(strings))
        same = np.array([a == b for a, b in zip(expected.to_list(), got.to_list())])
        assert same.all(), [strings[i] for i in np.flatnonzero(~same)[:10]]


def test_a_sequence_length_pads_and_truncates_as_keras_hub():
    import tensorflow as tf

    vocabulary = list(text.SPECIAL_TOKENS) + ["the", "cat", "##s", "."]
    tokenizer = wordpiece.make_wordpiece_tokenizer(vocabulary, text.SPECIAL_TOKENS)
    tokenizer.sequence_length = 4
    strings = ["the cats . the cats", "cat", ""]
    expected = tf.function(tokenizer)(tf.constant(strings)).numpy()
    got = WordPieceGraph(tokenizer)(tf.constant(strings)).to_tensor().numpy()
    np.testing.assert_array_equal(got, expected)
    assert expected.shape == (3, 4)


def test_refuses_what_it_cannot_reproduce():
    import keras_hub

    vocabulary = ["[UNK]", "a"]
    cases = [
        (dict(special_tokens_in_strings=True, special_tokens=["[UNK]"]),
         "Received: tokenizer.special_tokens_in_strings=True"),
        (dict(split=False), "Received: tokenizer.split=False"),
        (dict(dtype="string"), "Received: tokenizer.dtype='string'"),
    ]
    for kwargs, message in cases:
        tokenizer = keras_hub.tokenizers.WordPieceTokenizer(vocabulary=vocabulary, **kwargs)
        with pytest.raises(ValueError, match=message):
            WordPieceGraph(tokenizer)
    with pytest.raises(ValueError, match="Received: tokenizer="):
        WordPieceGraph(object())
