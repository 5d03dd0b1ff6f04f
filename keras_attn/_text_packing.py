"""The packing of texts with a tokenizer's own special tokens, shared by
the text loaders (`keras_attn.data.text`, which re-exports `text_form` and
`pack_pairs`) and the text classifier export (`keras_attn.export`), which
must pack exactly as training did. On the lowest floor so that both import
it (neither package may import the other: tests/test_imports.py).

TensorFlow only (keras-hub's packers): imported lazily, never by `import
keras_attn`.
"""

from keras_attn._base.quiet_tensorflow import tensorflow_module

tf = tensorflow_module()  # import tensorflow, its start-up notices held back


def _token_id(tokenizer, token):
    return int(tokenizer.token_to_id(token))


def _check_ids(token_ids, vocabulary_size):
    """The data-path token id check, then the cast to int32: a failing
    assertion, not a clamp. The range is checked in the ids' own dtype (a
    tokenizer's int64 id 2**32 + 3 cast first would wrap to a valid 3)."""
    check = tf.debugging.assert_less(
        token_ids,
        tf.cast(vocabulary_size, token_ids.dtype),
        message=f"token ids must be < vocabulary_size={vocabulary_size}",
    )
    with tf.control_dependencies([check]):
        return tf.cast(token_ids, "int32")


def text_form(tokenizer):
    """`(start, end, pad, pair separator ids, second segment id)` of a
    tokenizer: its own `start_token_id`, `end_token_id`, `pad_token_id`
    (and `pair_separator_ids`, `second_segment_id`, which
    `keras_attn.convert.load_hf_tokenizer` sets from the directory) where
    it has them (keras-hub's model tokenizers have the first three), else
    BERT's `[CLS]` `[SEP]` `[PAD]` or RoBERTa's `<s>` `</s>` `<pad>` from its
    vocabulary. A pair is BERT's `[CLS] A [SEP] B [SEP]` (B's segment id 1)
    or RoBERTa's and XLM-R's `<s> A </s></s> B </s>` (segment ids 0), as
    transformers packs them."""
    names = ("start_token_id", "end_token_id", "pad_token_id")
    ids = [getattr(tokenizer, name, None) for name in names]
    if any(i is None for i in ids):
        vocabulary = set(tokenizer.get_vocabulary())
        for tokens in (("[CLS]", "[SEP]", "[PAD]"), ("<s>", "</s>", "<pad>")):
            if set(tokens) <= vocabulary:
                ids = [_token_id(tokenizer, token) for token in tokens]
                break
        else:
            raise ValueError(
                "Invalid value for argument `tokenizer`: the text packer needs its start, end "
                "and padding tokens: attributes start_token_id, end_token_id and pad_token_id "
                "(keras_attn.convert.load_hf_tokenizer sets them), or [CLS] [SEP] [PAD] or "
                "<s> </s> <pad> in its vocabulary. Received: tokenizer="
                f"{type(tokenizer).__name__} without them")
    start, end, pad = (int(i) for i in ids)
    separator = getattr(tokenizer, "pair_separator_ids", None)
    second = getattr(tokenizer, "second_segment_id", None)
    if separator is None or second is None:
        roberta = tokenizer.id_to_token(start) == "<s>"
        separator, second = ((end, end), 0) if roberta else ((end,), 1)
    return start, end, pad, tuple(int(i) for i in separator), int(second)


def _longest_first(first, second, budget):
    """transformers' (the tokenizers library's) `truncation=True` of a pair
    to `budget` tokens, per row: nothing when both fit; else the shorter
    kept whole and the longer cut to the rest if the shorter takes at most
    half; else both cut to half (the odd token to the longer, to the second
    when they are as long). Returns the two kept lengths."""
    shorter = tf.minimum(first, second)
    kept_longer = tf.where(shorter > budget, shorter, tf.maximum(shorter, budget - shorter))
    kept_shorter = shorter
    both = kept_shorter + kept_longer > budget
    half = tf.cast(budget // 2, shorter.dtype)
    kept_shorter = tf.where(both, half, kept_shorter)
    kept_longer = tf.where(both, half + budget % 2, kept_longer)
    swap = first > second
    fits = first + second <= budget
    kept_first = tf.where(fits, first, tf.where(swap, kept_longer, kept_shorter))
    kept_second = tf.where(fits, second, tf.where(swap, kept_shorter, kept_longer))
    return tf.minimum(first, kept_first), tf.minimum(second, kept_second)


def _head(pieces, lengths):
    """The first `lengths[i]` pieces of each row of a ragged `pieces`."""
    starts = pieces.row_starts()
    index = tf.ragged.range(starts, starts + tf.cast(lengths, starts.dtype)).flat_values
    return tf.RaggedTensor.from_row_lengths(tf.gather(pieces.flat_values, index),
                                            tf.cast(lengths, starts.dtype))


def _column(values, rows, dtype):
    """`values` as the same ragged columns of each of `rows` rows."""
    return tf.RaggedTensor.from_tensor(tf.tile(tf.constant([values], dtype), [rows, 1]))


def pack_pairs(tokenizer, sequence_length, truncate="round_robin"):
    """A function `(first, second) -> (token_ids, segment_ids, padding_mask)`
    that tokenizes a batch of string pairs (or single texts) and packs them
    with the tokenizer's own special tokens (`text_form`): `[CLS] A [SEP] B
    [SEP]`, or RoBERTa's `<s> A </s></s> B </s>`, padded with its padding id
    to `sequence_length`.

    `truncate`: `"longest_first"` cuts a pair as transformers'
    `truncation=True, max_length=sequence_length` does (`_longest_first`),
    so the ids equal its tokenizer's; `"round_robin"` (keras-hub's
    `MultiSegmentPacker`, BERT pretraining's) takes a token of each in turn.
    A single text keeps its first tokens either way."""
    import keras_hub

    start, end, pad, separator, second_segment = text_form(tokenizer)
    vocabulary_size = int(tokenizer.vocabulary_size())
    if truncate not in ("round_robin", "longest_first"):
        raise ValueError("Invalid value for argument `truncate`: 'round_robin' or "
                         f"'longest_first'. Received: truncate={truncate!r}")
    packer = keras_hub.layers.MultiSegmentPacker(
        sequence_length=sequence_length, start_value=start, end_value=end,
        sep_value=list(separator), pad_value=pad, truncate="round_robin")

    def finish(token_ids, segment_ids, padding_mask):
        token_ids = _check_ids(token_ids, vocabulary_size)
        if second_segment == 0:
            segment_ids = tf.zeros_like(segment_ids)
        return token_ids, tf.cast(segment_ids, "int32"), tf.cast(padding_mask, "int32")

    def ragged(pieces):
        # keras-hub's eager calls give Python lists of ids, tf.data ragged tensors.
        if isinstance(pieces, (list, tuple)):
            return tf.ragged.constant(pieces, dtype="int32", ragged_rank=1)
        return pieces if isinstance(pieces, tf.RaggedTensor) else \
            tf.RaggedTensor.from_tensor(pieces)

    def pack(first, second=None):
        segments = [ragged(tokenizer(first))]
        if second is not None:
            segments.append(ragged(tokenizer(second)))
        if truncate == "round_robin" or second is None:
            token_ids, segment_ids = packer(tuple(segments))
            padding_mask = tf.sequence_mask(
                _packed_lengths(segments, len(separator), sequence_length), sequence_length)
            return finish(token_ids, segment_ids, padding_mask)
        a, b = segments
        specials = 2 + len(separator)
        kept_a, kept_b = _longest_first(a.row_lengths(), b.row_lengths(),
                                        sequence_length - specials)
        a, b = _head(a, kept_a), _head(b, kept_b)
        rows = a.nrows()
        dtype = a.dtype
        token_ids = tf.concat([_column([start], rows, dtype), a,
                               _column(list(separator), rows, dtype), b,
                               _column([end], rows, dtype)], axis=1)
        first_length = 1 + kept_a + len(separator)
        segment_ids = tf.concat([
            tf.zeros_like(tf.ragged.range(first_length)),
            tf.ones_like(tf.ragged.range(kept_b + 1))], axis=1)
        shape = [None, sequence_length]
        return finish(token_ids.to_tensor(pad, shape=shape), segment_ids.to_tensor(0, shape=shape),
                      tf.sequence_mask(first_length + kept_b + 1, sequence_length))

    return pack


def _packed_lengths(segments, separator, sequence_length):
    """The length of each packed row (`MultiSegmentPacker`'s): the segments
    cut to fit, with a start, the separators and an end."""
    specials = 2 + separator * (len(segments) - 1)
    total = sum(s.row_lengths() for s in segments) + specials
    return tf.minimum(total, sequence_length)
