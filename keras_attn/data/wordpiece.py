"""WordPiece vocabularies and tokenizers (keras-hub), shared by the BERT text
data and the translation data.

keras-hub learns the vocabulary (`compute_word_piece_vocabulary`) and
tokenizes (`WordPieceTokenizer`); this module only fixes the choices the two
tasks share: the reserved tokens first and in a known order (their ids are
constants of the data pipelines), lower-casing, and CJK characters split
apart. TensorFlow only: imported lazily, never by `import keras_attn`.
"""

from keras_attn._base.quiet_tensorflow import tensorflow_module

tf = tensorflow_module()  # import tensorflow, its start-up notices held back


def train_wordpiece_vocabulary(texts, vocabulary_size, reserved_tokens, lowercase=True,
                               strip_accents=None):
    """Learns a WordPiece vocabulary from `texts`.

    Args:
        texts: an iterable of strings.
        vocabulary_size: size of the vocabulary, reserved tokens included.
        reserved_tokens: tokens placed first, in this order (ids 0, 1, ...).
        lowercase: lower-case the text first.
        strip_accents: strip accents too; None follows `lowercase` (uncased
            BERT). Leave it False for text whose marks are letters (Japanese
            kana with dakuten would lose them).

    Returns:
        The vocabulary, a list of strings.
    """
    import keras_hub

    dataset = tf.data.Dataset.from_tensor_slices(list(texts)).batch(1000)
    return keras_hub.tokenizers.compute_word_piece_vocabulary(
        dataset,
        vocabulary_size,
        lowercase=lowercase,
        strip_accents=lowercase if strip_accents is None else strip_accents,
        reserved_tokens=list(reserved_tokens),
    )


def make_wordpiece_tokenizer(vocabulary, reserved_tokens, lowercase=True, strip_accents=None):
    """A `keras_hub.tokenizers.WordPieceTokenizer` over `vocabulary`, whose
    first entries must be `reserved_tokens` (a `ValueError` otherwise: the
    pipelines' special ids would point at other tokens). Out-of-vocabulary
    words become `[UNK]`; CJK characters are split apart."""
    import keras_hub

    vocabulary = list(vocabulary)
    reserved = list(reserved_tokens)
    if vocabulary[: len(reserved)] != reserved:
        raise ValueError(
            f"The vocabulary must start with {reserved}. "
            f"Received: vocabulary[:{len(reserved)}]={vocabulary[: len(reserved)]}"
        )
    return keras_hub.tokenizers.WordPieceTokenizer(
        vocabulary=vocabulary,
        lowercase=lowercase,
        strip_accents=lowercase if strip_accents is None else strip_accents,
        split_on_cjk=True,
        oov_token="[UNK]",
        dtype="int32",
    )
