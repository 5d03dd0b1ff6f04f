"""keras-hub's `WordPieceTokenizer` rebuilt from core TensorFlow ops, so that a
SavedModel tokenizing strings loads and serves with TensorFlow alone (no
tensorflow-text: TensorFlow Serving's standard build does not carry its ops).

keras-hub's graph path (`pretokenize`, then tensorflow-text's
`FastWordpieceTokenizer` with `no_pretokenization=True`) runs, per string:

```
the string ends at its first NUL     (tensorflow-text's regex_split)
CJK characters spaced out            (split_on_cjk)
NFD, then \\p{Mn} removed             (strip_accents)
split on whitespace, \\p{Cc}, \\p{Cf}, punctuation (and CJK); punctuation
    and CJK kept as words
NFKC_Casefold of each word           (lowercase)
greedy longest-match-first WordPiece of each word; a word of more than
    100 UTF-8 bytes, or one with no full cover by the vocabulary, is the
    oov token
```

Here the regular expressions are the same RE2 patterns (`tf.strings`); the
Unicode normalizations, which core TensorFlow lacks, are tables computed at
export time with Python's `unicodedata` (each code point -> its full
decomposition, and its canonical combining class; pairs -> their
canonical composite) applied in the graph: decompose, put the marks in
canonical order, and for case folding compose again (`_compose`). WordPiece
looks up every (start, length) piece of a word up to the longest token in
one `StaticHashTable` call and walks the longest matches.

What can differ from keras-hub: the Unicode version. tensorflow-text's ICU
knows characters that Python's `unicodedata` (Unicode 14.0 in Python 3.11)
does not yet: those get no case folding or decomposition here (in the Basic
Multilingual Plane, five letters of Unicode 16: U+1C89, U+A7CB, U+A7CC,
U+A7DA, U+A7DC); the tests compare every other code point of that plane.
Invalid UTF-8 is replaced by U+FFFD first (keras-hub leaves it to each op).
keras-hub's eager Python path splits at a NUL where its graph path, and this
one, end the string. Settings refused (`check_reproducible`):
`special_tokens_in_strings=True`, `split=False` (the graph takes raw
strings), a string output dtype, an empty suffix indicator.
"""

import functools
import itertools
import unicodedata

# The RE2 patterns of keras-hub's `pretokenize` (RE2's `\s` is ASCII only).
_WHITESPACE = r"\s|\p{Cc}|\p{Cf}"
_PUNCTUATION = r"[!-/]|[:-@]|[\[-`]|[{-~]|[\p{P}]"
_CJK = "|".join(
    rf"[\x{{{low:X}}}-\x{{{high:X}}}]" for low, high in (
        (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)))
# tensorflow-text's FastWordpieceTokenizer default, which keras-hub keeps.
MAX_BYTES_PER_WORD = 100
# Separates words while splitting: a control character, so a delimiter itself
# and never part of a word.
_SEPARATOR = "\x00"
# Default ignorable code points (DerivedCoreProperties.txt), which
# NFKC_Casefold deletes; Python's unicodedata does not expose the property.
_DEFAULT_IGNORABLE = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160),
    (0x17B4, 0x17B5), (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E),
    (0x2060, 0x206F), (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)


_IGNORABLE = frozenset(c for low, high in _DEFAULT_IGNORABLE for c in range(low, high + 1))


def _nfkc_casefold(char):
    """NFKC_Casefold of one character (Unicode's NFKC_CF property)."""
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", char).casefold())
    return "".join(c for c in folded if ord(c) not in _IGNORABLE)


@functools.lru_cache(maxsize=None)
def unicode_tables():
    """The tables the graph applies, from every assigned code point (~0.7 s).

    Returns:
        A dict: `"nfd"` code point -> its canonical decomposition,
        `"casefold"` code point -> the decomposition (NFD) of its
        NFKC_Casefold, each only where it is not the character itself;
        `"ccc"` code point -> canonical combining class (non-zero only);
        `"compose"` `(first, second)` -> their primary composite (Hangul
        syllables included).
    """
    nfd, casefold, ccc, compose = {}, {}, {}, {}
    for code_point in range(0x110000):
        if 0xD800 <= code_point < 0xE000:
            continue  # surrogates: not characters
        char = chr(code_point)
        if unicodedata.category(char) in ("Cn", "Co") and code_point not in _IGNORABLE:
            continue  # unassigned or private use: no mapping
        decomposed = unicodedata.normalize("NFD", char)
        if decomposed != char:
            nfd[code_point] = decomposed
        folded = unicodedata.normalize("NFD", _nfkc_casefold(char))
        if folded != char:
            casefold[code_point] = folded
        if unicodedata.combining(char):
            ccc[code_point] = unicodedata.combining(char)
        decomposition = unicodedata.decomposition(char).split()
        if len(decomposition) == 2 and not decomposition[0].startswith("<"):
            first, second = (chr(int(x, 16)) for x in decomposition)
            if unicodedata.normalize("NFC", first + second) == char:  # not excluded
                compose[ord(first), ord(second)] = code_point
    # Hangul: L + V -> LV, LV + T -> LVT (the Unicode Standard, section 3.12).
    for lead in range(19):
        for vowel in range(21):
            syllable = 0xAC00 + (lead * 21 + vowel) * 28
            compose[0x1100 + lead, 0x1161 + vowel] = syllable
            for trail in range(1, 28):
                compose[syllable, 0x11A7 + trail] = syllable + trail
    return {"nfd": nfd, "casefold": casefold, "ccc": ccc, "compose": compose}


def check_reproducible(tokenizer):
    """Raises `ValueError` naming a `WordPieceTokenizer` setting that
    `WordPieceGraph` cannot reproduce."""
    import keras_hub

    if not isinstance(tokenizer, keras_hub.tokenizers.WordPieceTokenizer):
        raise ValueError(
            "Invalid value for argument `tokenizer`: a "
            "keras_hub.tokenizers.WordPieceTokenizer is expected. "
            f"Received: tokenizer={tokenizer!r}"
        )
    if tokenizer.special_tokens_in_strings:
        raise ValueError(
            "Invalid value for argument `tokenizer`: special tokens written in the "
            "strings are not reproduced in the exported graph; build the tokenizer "
            "with special_tokens_in_strings=False. Received: "
            "tokenizer.special_tokens_in_strings=True"
        )
    if not tokenizer.split:
        raise ValueError(
            "Invalid value for argument `tokenizer`: the exported graph takes raw "
            "strings, which a tokenizer built with split=False does not split into "
            "words. Received: tokenizer.split=False"
        )
    if "int" not in str(tokenizer.compute_dtype):
        raise ValueError(
            "Invalid value for argument `tokenizer`: the classifier needs token ids; "
            "build the tokenizer with an integer dtype. Received: "
            f"tokenizer.dtype={tokenizer.compute_dtype!r}"
        )
    if not tokenizer.suffix_indicator:
        raise ValueError(
            "Invalid value for argument `tokenizer`: an empty suffix indicator is not "
            "reproduced. Received: tokenizer.suffix_indicator="
            f"{tokenizer.suffix_indicator!r}"
        )


@functools.lru_cache(maxsize=None)
def _make_tf_module():
    import tensorflow as tf

    class WordPieceGraph(tf.Module):
        """The tokenizer's strings -> ids in core TensorFlow ops: call it
        with a `(B,)` string tensor for a `(B, None)` int32 `RaggedTensor`,
        the ids keras-hub's tokenizer gives (`sequence_length` set: dense,
        padded with 0 and truncated, as keras-hub's)."""

        def __init__(self, tokenizer):
            super().__init__(name="wordpiece_graph")
            check_reproducible(tokenizer)
            self.lowercase = bool(tokenizer.lowercase)
            self.strip_accents = bool(tokenizer.strip_accents)
            self.split_on_cjk = bool(tokenizer.split_on_cjk)
            self.suffix_indicator = tokenizer.suffix_indicator
            self.sequence_length = tokenizer.sequence_length
            vocabulary = list(tokenizer.get_vocabulary())
            ids = {}  # a token listed twice keeps its first id (a table takes a key once)
            for index, token in enumerate(vocabulary):
                ids.setdefault(token, index)
            self.oov_id = ids[tokenizer.oov_token]
            self.vocabulary = _string_table(ids)
            self.id_radix = len(vocabulary) + 1  # packs (length, id) in one int64
            # The longest piece worth looking up, in characters.
            self.max_piece = min(max(len(token) for token in vocabulary), MAX_BYTES_PER_WORD)
            tables = unicode_tables()
            if self.strip_accents:
                self.nfd = _Expansion(tables["nfd"])
            if self.strip_accents or self.lowercase:
                self.ccc = _int_table(tables["ccc"], default=0)
            if self.lowercase:
                self.casefold = _Expansion(tables["casefold"])
                self.compose = _int_table({(a << 21) | b: c
                                           for (a, b), c in tables["compose"].items()},
                                          key_dtype=tf.int64)
                self.second = _int_table({b: 1 for (_, b) in tables["compose"]}, default=0)

        def __call__(self, text):
            words = self.words(text)  # (B, None)
            tokens = words.with_flat_values(self._wordpiece(words.flat_values))
            tokens = tokens.merge_dims(-2, -1)
            if self.sequence_length:
                dense = tokens.to_tensor(0, shape=[None, self.sequence_length])
                tokens = tf.RaggedTensor.from_tensor(dense)
            return tokens

        def words(self, text):
            """The words WordPiece takes, `(B, None)` strings: keras-hub's
            `pretokenize`."""
            text = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace")
            # tensorflow-text's regex_split ends a string at its first NUL.
            text = tf.strings.regex_replace(text, r"(?s)\x00.*", "")
            if self.split_on_cjk:
                text = tf.strings.regex_replace(text, _CJK, r" \0 ")
            if self.strip_accents:
                code_points = self._canonical_order(self.nfd(_decode(text)))
                text = tf.strings.unicode_encode(code_points, "UTF-8")
                text = tf.strings.regex_replace(text, r"\p{Mn}", "")
            words = self._split(text)
            if self.lowercase:
                code_points = self._canonical_order(self.casefold(_decode(words.flat_values)))
                words = words.with_flat_values(
                    tf.strings.unicode_encode(self._compose(code_points), "UTF-8"))
            return words

        def _split(self, text):
            """keras-hub's `regex_split`: delimiters removed, punctuation
            (and CJK) kept as words of their own; every delimiter is one
            character, so each becomes a separator."""
            keep = _PUNCTUATION + ("|" + _CJK if self.split_on_cjk else "")
            text = tf.strings.regex_replace(text, f"({keep})",
                                            _SEPARATOR + r"\1" + _SEPARATOR)
            text = tf.strings.regex_replace(text, _WHITESPACE, _SEPARATOR)
            words = tf.strings.split(text, sep=_SEPARATOR)
            return tf.ragged.boolean_mask(words, words != "")

        def _canonical_order(self, code_points):
            """Marks (non-zero combining class) sorted by class, stably,
            between starters: NFD's canonical ordering."""
            flat = code_points.flat_values
            classes = self.ccc.lookup(flat)
            first = tf.range(tf.shape(flat, tf.int64)[0]) == tf.gather(
                code_points.row_starts(), code_points.value_rowids())  # first of its row
            runs = tf.cumsum(tf.cast((classes == 0) | first, tf.int64))
            order = tf.argsort(runs * 256 + tf.cast(classes, tf.int64), stable=True)
            return code_points.with_flat_values(tf.gather(flat, order))

        def _compose(self, code_points):
            """NFC's canonical composition of each row, for the rows that
            hold a code point that can be a composition's second; a loop
            over the positions of those rows."""
            needs = tf.reduce_any(self.second.lookup(code_points) > 0, axis=1)
            needed = tf.where(needs)[:, 0]
            others = tf.where(~needs)[:, 0]
            composed = self._compose_rows(tf.gather(code_points, needed))
            merged = tf.concat([tf.gather(code_points, others), composed], axis=0)
            position = tf.math.invert_permutation(tf.concat([others, needed], axis=0))
            return tf.gather(merged, position)

        def _compose_rows(self, code_points):
            dense = code_points.to_tensor(-1)  # (W, T), -1 after each row
            classes = self.ccc.lookup(dense)
            rows = tf.range(tf.shape(dense)[0])

            def step(i, out, kept, starter, starter_code, blocking):
                code, cls = dense[:, i], classes[:, i]
                # Blocked when a mark kept since the starter has a class >=
                # this one's (after canonical ordering: the same class).
                free = (starter >= 0) & ((blocking == 0) | (cls > blocking))
                key = tf.bitwise.bitwise_or(
                    tf.bitwise.left_shift(tf.cast(starter_code, tf.int64), 21),
                    tf.cast(code, tf.int64))
                composite = self.compose.lookup(key)
                joins = (code >= 0) & free & (composite >= 0)
                at_starter = tf.boolean_mask(tf.stack([rows, starter], axis=1), joins)
                out = tf.tensor_scatter_nd_update(out, at_starter,
                                                  tf.boolean_mask(composite, joins))
                kept = tf.tensor_scatter_nd_update(
                    kept, tf.boolean_mask(tf.stack([rows, tf.fill(tf.shape(rows), i)], 1),
                                          joins),
                    tf.zeros(tf.reduce_sum(tf.cast(joins, tf.int32)), tf.bool))
                starter_code = tf.where(joins, composite, starter_code)
                stays = (code >= 0) & ~joins
                new_starter = stays & (cls == 0)
                starter = tf.where(new_starter, i, starter)
                starter_code = tf.where(new_starter, code, starter_code)
                blocking = tf.where(new_starter, 0,
                                    tf.where(stays, tf.maximum(blocking, cls), blocking))
                return i + 1, out, kept, starter, starter_code, blocking

            minus_one = tf.fill(tf.shape(rows), -1)
            _, out, kept, _, _, _ = tf.while_loop(
                lambda i, *_: i < tf.shape(dense)[1], step,
                (0, dense, dense >= 0, minus_one, minus_one, tf.zeros_like(minus_one)))
            return tf.ragged.boolean_mask(out, kept)

        def _wordpiece(self, words):
            """Greedy longest-match-first WordPiece of each word `(W,)`."""
            too_long = tf.strings.length(words) > MAX_BYTES_PER_WORD
            chars = tf.where(too_long, 0, tf.strings.length(words, unit="UTF8_CHAR"))
            starts = tf.ragged.range(chars)  # (W, None): every start of a piece
            left = tf.gather(chars, starts.value_rowids()) - starts.flat_values
            lengths = tf.ragged.range(1, tf.minimum(self.max_piece, left) + 1)
            # Every (start, length) candidate, flat: word[start:start + length].
            start_of = tf.repeat(starts.flat_values, lengths.row_lengths())
            word_of = tf.repeat(starts.value_rowids(), lengths.row_lengths())
            piece = tf.strings.substr(tf.gather(words, word_of), start_of,
                                      lengths.flat_values, unit="UTF8_CHAR")
            piece = tf.where(start_of > 0, self.suffix_indicator + piece, piece)
            ids = tf.cast(self.vocabulary.lookup(piece), tf.int64)
            # The longest known piece at each start: (length, id) packed in
            # one int64, so that one segment max finds both.
            size = self.id_radix
            scored = tf.where(ids >= 0, tf.cast(lengths.flat_values, tf.int64) * size + ids, -1)
            best = tf.math.unsorted_segment_max(scored, lengths.value_rowids(),
                                                tf.shape(starts.flat_values, tf.int64)[0])
            best = starts.with_flat_values(best).to_tensor(-1)  # (W, C)
            best_length = tf.cast(tf.where(best >= 0, best // size, 0), tf.int32)
            rows = tf.range(tf.shape(words)[0])

            def step(position, done, failed, visited):
                at = tf.stack([rows, position], axis=1)
                live = tf.boolean_mask(at, ~done)
                length = tf.scatter_nd(tf.where(~done)[:, :1], tf.gather_nd(best_length, live),
                                       tf.shape(position, tf.int64))
                emits = ~done & (length > 0)
                failed = failed | (~done & (length == 0))
                visited = tf.tensor_scatter_nd_update(
                    visited, tf.boolean_mask(at, emits),
                    tf.ones(tf.reduce_sum(tf.cast(emits, tf.int32)), tf.bool))
                position = position + length
                return position, done | ~emits | (position >= chars), failed, visited

            _, _, failed, visited = tf.while_loop(
                lambda position, done, *_: ~tf.reduce_all(done), step,
                (tf.zeros_like(chars), chars == 0, tf.zeros_like(too_long),
                 tf.zeros(tf.shape(best_length), tf.bool)))
            # A word with no full cover, or too long, is the oov token alone.
            unknown = failed | too_long
            keep = tf.concat([visited & ~unknown[:, None], unknown[:, None]], axis=1)
            token_ids = tf.concat([tf.cast(best % size, tf.int32),
                                   tf.fill([tf.shape(words)[0], 1], self.oov_id)], axis=1)
            return tf.ragged.boolean_mask(token_ids, keep)

    class _Expansion(tf.Module):
        """Each code point -> its code points in `mapping` (itself if absent)."""

        def __init__(self, mapping):
            super().__init__()
            keys = sorted(mapping)
            self.index = _int_table({key: i for i, key in enumerate(keys)})
            self.values = tf.constant([ord(c) for key in keys for c in mapping[key]], tf.int32)
            self.lengths = tf.constant([len(mapping[key]) for key in keys], tf.int32)
            self.offsets = tf.constant(
                [0, *itertools.accumulate(len(mapping[key]) for key in keys)][:-1], tf.int32)

        def __call__(self, code_points):
            flat = code_points.flat_values
            index = self.index.lookup(flat)
            found = index >= 0
            safe = tf.maximum(index, 0)
            counts = tf.where(found, tf.gather(self.lengths, safe), 1)
            owner = tf.repeat(tf.range(tf.shape(flat)[0]), counts)
            offset = tf.ragged.range(counts).flat_values
            value = tf.where(tf.gather(found, owner),
                             tf.gather(self.values, tf.gather(tf.gather(self.offsets, safe),
                                                              owner) + offset),
                             tf.gather(flat, owner))
            expanded = tf.RaggedTensor.from_row_lengths(value, tf.cast(counts, tf.int64))
            return code_points.with_flat_values(expanded).merge_dims(-2, -1)

    def _int_table(mapping, default=-1, key_dtype=tf.int32):
        return tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(tf.constant(list(mapping), key_dtype),
                                                tf.constant(list(mapping.values()), tf.int32)),
            default_value=default)

    def _string_table(ids):
        return tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(tf.constant(list(ids), tf.string),
                                                tf.constant(list(ids.values()), tf.int32)),
            default_value=-1)

    def _decode(text):
        return tf.strings.unicode_decode(text, "UTF-8")

    return WordPieceGraph


def WordPieceGraph(tokenizer):  # noqa: N802  (a class, made where TensorFlow is imported)
    """The tokenizer's in-graph twin (see the module docstring): a
    `tf.Module` called with `(B,)` strings, returning `(B, None)` int32
    ids as `tokenizer` gives them. Raises `ValueError` for a setting it
    cannot reproduce (`check_reproducible`)."""
    return _make_tf_module()(tokenizer)
