"""Translation data: the offline English -> Japanese numbers task, any
tensorflow-datasets translation set, length-bucketed batches for
`Transformer.fit`, and BLEU / exact-match evaluation.

The embedded task needs no download: `num2words` writes a number in English
words and in Japanese numerals (345 -> "three hundred and forty-five" ->
"三百四十五"); the numbers are split at random into a training set and a
held-out set, so the test measures generalisation to numbers never seen.

Tokenizer: one WordPiece vocabulary (keras-hub, trained on the training
text) shared by both languages, as the Transformer's tied embeddings
expect. keras-hub's WordPiece splits CJK characters apart
(`split_on_cjk=True`), so the Japanese side is character-level (a Japanese
numeral is a sequence of the 14 characters 一..九 十 百 千 万 零) and the
English side is word-level (the vocabulary is small enough to hold every
number word; rarer strings fall back to word pieces).

Batches are `((source_ids, target_in_ids), target_out_ids)`: the source
ends with `[END]`, the decoder input starts with `[START]`, the label ends
with `[END]`; padded with id 0 to the longest sequence of a length bucket.

TensorFlow only: imported lazily, never by `import keras_attn`.
"""

import dataclasses

import numpy as np

from keras_attn._epochs import bucket_batch_count
from keras_attn._epochs import epoch_permutation
from keras_attn._epochs import epoch_seed
from keras_attn.data._zoo_extra import import_zoo_package
from keras_attn.data import wordpiece
# The special ids are defined with the TensorFlow-free decoding; this module
# offers them and evaluate_translations as before.
from keras_attn.data.scoring import END_ID  # noqa: F401
from keras_attn.data.scoring import PAD_ID  # noqa: F401
from keras_attn.data.scoring import START_ID  # noqa: F401
from keras_attn.data.scoring import evaluate_translations  # noqa: F401
from keras_attn._base.quiet_tensorflow import tensorflow_module
from keras_attn._base.quiet_tensorflow import traced_as_written

tf = tensorflow_module()  # import tensorflow, its start-up notices held back

SPECIAL_TOKENS = ("[PAD]", "[START]", "[END]", "[UNK]")
UNK_ID = 3


# === The offline numbers task ===


def number_pairs(numbers):
    """`[(english words, Japanese numerals)]` for the given integers."""
    num2words = import_zoo_package("num2words").num2words

    return [(num2words(int(n), lang="en"), num2words(int(n), lang="ja")) for n in numbers]


def split_numbers(num_train, num_test, max_number=99_999, seed=0):
    """Disjoint random train / held-out sets drawn from 1..max_number."""
    if num_train < 1 or num_test < 0 or num_train + num_test > max_number:
        raise ValueError(
            "Need 1 <= num_train and num_train + num_test <= max_number. "
            f"Received: num_train={num_train}, num_test={num_test}, max_number={max_number}"
        )
    numbers = np.random.default_rng(seed).permutation(np.arange(1, max_number + 1))
    return numbers[:num_train], numbers[num_train : num_train + num_test]


# === Tokenizer ===


def train_vocabulary(texts, vocabulary_size=1000):
    """A WordPiece vocabulary (the 4 special tokens first) from `texts`,
    lower-cased with accents kept (`keras_attn.data.wordpiece`)."""
    return wordpiece.train_wordpiece_vocabulary(texts, vocabulary_size, SPECIAL_TOKENS,
                                                strip_accents=False)


def make_tokenizer(vocabulary):
    """keras-hub WordPiece over `vocabulary` (which must start with the 4
    special tokens), CJK characters split apart."""
    return wordpiece.make_wordpiece_tokenizer(vocabulary, SPECIAL_TOKENS, strip_accents=False)


def encode_sources(tokenizer, sentences):
    """Source strings -> `(N, S)` int32 ids ending with `[END]`, padded with
    `[PAD]` to the longest (the encoder input of `make_translation_dataset`
    batches, for decoding)."""
    rows = [list(np.asarray(tokenizer(s))) + [END_ID] for s in sentences]
    width = max(len(r) for r in rows)
    return np.array([r + [PAD_ID] * (width - len(r)) for r in rows], "int32")


def detokenize(tokenizer, ids, join_characters=False):
    """Token ids `(B, L)` -> strings: cut at `[END]`, padding and `[START]`
    dropped. `join_characters` removes the spaces WordPiece puts between
    characters (for Japanese)."""
    texts = []
    for row in np.asarray(ids):
        row = [int(t) for t in row]
        if END_ID in row:
            row = row[: row.index(END_ID)]
        row = [t for t in row if t not in (PAD_ID, START_ID)]
        if not row:
            texts.append("")
            continue
        text = tokenizer.detokenize(tf.constant([row], tf.int32))
        text = text.numpy()[0].decode("utf-8") if hasattr(text, "numpy") else str(text[0])
        texts.append(text.replace(" ", "") if join_characters else text)
    return texts


# === Batches ===


def make_translation_dataset(
    sources,
    targets,
    tokenizer,
    batch_size=64,
    shuffle=False,
    seed=0,
    bucket_boundaries=None,
    epoch=None,
):
    """Length-bucketed `((source_ids, target_in_ids), target_out_ids)`
    batches from strings (lists or a `tf.data.Dataset` of pairs).

    Args:
        sources, targets: lists of strings, or `sources` a dataset of
            `(source, target)` string pairs and `targets` None.
        tokenizer: from `make_tokenizer`.
        batch_size: sentences per batch.
        shuffle: shuffle the examples (each epoch) before bucketing.
        seed: shuffle seed.
        bucket_boundaries: lengths where buckets split (each bucket is padded
            to its own longest sequence, so short sentences are not padded to
            the longest of the corpus); default `[8, 16, 32, 64]`.
        epoch: with `shuffle`, None reshuffles at every pass; an int makes
            the order a function of `(seed, epoch)` only, the same at every
            pass (for resumable training): a permutation of lists, a seeded
            10,000-pair buffer for a dataset.
    """
    if targets is None:
        dataset = sources
        if shuffle and epoch is not None:
            dataset = dataset.shuffle(10_000, seed=epoch_seed(seed, epoch),
                                      reshuffle_each_iteration=False)
    else:
        sources, targets = list(sources), list(targets)
        if shuffle and epoch is not None:
            order = epoch_permutation(len(sources), seed, epoch)
            sources, targets = [sources[i] for i in order], [targets[i] for i in order]
        dataset = tf.data.Dataset.from_tensor_slices((sources, targets))
    if shuffle and epoch is None:
        dataset = dataset.shuffle(10_000, seed=seed, reshuffle_each_iteration=True)

    def encode(source, target):
        source_ids = tf.cast(tokenizer(source), tf.int32)
        target_ids = tf.cast(tokenizer(target), tf.int32)
        end, start = tf.constant([END_ID], tf.int32), tf.constant([START_ID], tf.int32)
        return (
            tf.concat([source_ids, end], 0),
            tf.concat([start, target_ids], 0),
            tf.concat([target_ids, end], 0),
        )

    @traced_as_written
    def length(s, t_in, t_out):
        return tf.maximum(tf.shape(s)[0], tf.shape(t_in)[0])

    dataset = dataset.map(traced_as_written(encode), num_parallel_calls=tf.data.AUTOTUNE)
    boundaries = list(bucket_boundaries or [8, 16, 32, 64])
    batches = None
    if targets is not None:
        # Lists: count the batches, so that Keras knows the epoch's length
        # (a progress bar with its total, and no "Your input ran out of
        # data" at the end of the first epoch of a dataset of unknown size).
        lengths = np.concatenate([np.zeros([0], np.int32)] + list(
            dataset.map(length).batch(4096).as_numpy_iterator()))
        batches = bucket_batch_count(lengths, boundaries, batch_size)
    dataset = dataset.bucket_by_sequence_length(
        element_length_func=length,
        bucket_boundaries=boundaries,
        bucket_batch_sizes=[batch_size] * (len(boundaries) + 1),
        padding_values=(PAD_ID, PAD_ID, PAD_ID),
    )
    dataset = dataset.map(traced_as_written(lambda s, t_in, t_out: ((s, t_in), t_out)))
    if batches is not None:
        # Checked as the data is read: a wrong count is an error, not a silently short epoch.
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(batches))
    return dataset.prefetch(tf.data.AUTOTUNE)



def bucket_batches(lengths, boundaries, batch_size):
    """The batches that `Dataset.bucket_by_sequence_length` makes of
    elements of these lengths, read in this order: index arrays into
    `lengths`, in the order it gives them. An element joins its bucket
    (`boundaries[i-1] <= length < boundaries[i]`); a bucket that reaches
    `batch_size` elements is a batch; at the end of the input the partial
    buckets follow, the lowest bucket first (`group_by_window` flushes its
    groups in the order of their keys)."""
    buckets = np.searchsorted(np.asarray(boundaries), np.asarray(lengths), side="right")
    open_buckets, batches = {}, []
    for index, bucket in enumerate(buckets.tolist()):
        group = open_buckets.setdefault(bucket, [])
        group.append(index)
        if len(group) == batch_size:
            batches.append(np.asarray(open_buckets.pop(bucket), np.int64))
    batches.extend(np.asarray(open_buckets[bucket], np.int64) for bucket in sorted(open_buckets))
    return batches


def translation_rows_dataset(sources, targets, token_lengths, tokenizer, rows, weightless,
                             batch_size=64, seed=0, bucket_boundaries=None, epoch=0):
    """Some rows of every batch of `make_translation_dataset(sources,
    targets, tokenizer, batch_size, shuffle=True, seed=seed,
    bucket_boundaries=..., epoch=epoch)`, as one process of a data-parallel
    job feeds them, the other examples not encoded: the batches are found
    from the token lengths alone (`bucket_batches` over the epoch's order),
    then each batch's rows are encoded and padded to the whole batch's
    longest source and target.

    Args:
        token_lengths: `(source_lengths, target_lengths)`, each example's
            tokens (without `[END]` / `[START]`), as `tokenizer` gives them.
        rows: `size -> positions` (NumPy ints) of the rows to make in the
            batch filled up to `positions`' extent (position p is row
            p % size, as `even_batches` fills it).
        weightless: `(batch, keep) -> batch` for the filler rows (p >= size).
    """
    source_lengths, target_lengths = (np.asarray(side, np.int64) + 1 for side in token_lengths)
    order = epoch_permutation(len(sources), seed, epoch)
    lengths = np.maximum(source_lengths, target_lengths)[order]
    indices, keeps, source_widths, target_widths = [], [], [], []
    for batch in bucket_batches(lengths, list(bucket_boundaries or [8, 16, 32, 64]),
                                batch_size):
        batch = order[batch]
        positions = np.asarray(rows(len(batch)))
        indices.append(batch[positions % len(batch)])
        keeps.append(positions < len(batch))
        source_widths.append(source_lengths[batch].max())
        target_widths.append(target_lengths[batch].max())
    columns = (tf.ragged.constant(indices, tf.int64), tf.ragged.constant(keeps, tf.bool),
               np.asarray(source_widths, np.int64), np.asarray(target_widths, np.int64))
    sources, targets = tf.constant(list(sources)), tf.constant(list(targets))
    end, start = tf.constant([[END_ID]], tf.int32), tf.constant([[START_ID]], tf.int32)

    def encode(index, keep, source_width, target_width):
        count = tf.shape(index, out_type=tf.int64)[:1]
        source_ids = tf.cast(tokenizer(tf.gather(sources, index)), tf.int32)
        target_ids = tf.cast(tokenizer(tf.gather(targets, index)), tf.int32)

        def padded(ragged, width):
            return ragged.to_tensor(PAD_ID, shape=tf.concat([count, [width]], 0))

        ends, starts = (tf.RaggedTensor.from_tensor(tf.tile(token, [count[0], 1]))
                        for token in (end, start))
        batch = ((padded(tf.concat([source_ids, ends], 1), source_width),
                  padded(tf.concat([starts, target_ids], 1), target_width)),
                 padded(tf.concat([target_ids, ends], 1), target_width))
        return weightless(batch, keep)

    dataset = tf.data.Dataset.from_tensor_slices(columns)
    return dataset.map(traced_as_written(encode), num_parallel_calls=tf.data.AUTOTUNE).prefetch(
        tf.data.AUTOTUNE)


@dataclasses.dataclass
class TranslationData:
    """What `load_number_translation` returns."""

    train: tf.data.Dataset
    test: tf.data.Dataset
    tokenizer: object
    vocabulary: list
    train_pairs: list
    test_pairs: list


def load_number_translation(
    num_train=20_000,
    num_test=500,
    max_number=99_999,
    batch_size=64,
    vocabulary_size=1000,
    seed=0,
):
    """The offline English -> Japanese numbers task.

    Returns:
        A `TranslationData`: shuffled training batches, test batches in
        order, the tokenizer, its vocabulary (trained on the training pairs
        only), and the `(english, japanese)` string pairs.
    """
    train_numbers, test_numbers = split_numbers(num_train, num_test, max_number, seed)
    train_pairs, test_pairs = number_pairs(train_numbers), number_pairs(test_numbers)
    vocabulary = train_vocabulary(
        [en for en, _ in train_pairs] + [ja for _, ja in train_pairs], vocabulary_size
    )
    tokenizer = make_tokenizer(vocabulary)

    def batches(pairs, shuffle):
        sources, targets = zip(*pairs) if pairs else ((), ())
        return make_translation_dataset(
            sources, targets, tokenizer, batch_size, shuffle=shuffle, seed=seed
        )

    return TranslationData(
        train=batches(train_pairs, True),
        test=batches(test_pairs, False) if test_pairs else None,
        tokenizer=tokenizer,
        vocabulary=list(vocabulary),
        train_pairs=train_pairs,
        test_pairs=test_pairs,
    )


def load_tfds_translation(
    name,
    data_dir=None,
    split="train",
    source_language="en",
    target_language=None,
    tokenizer=None,
    vocabulary_size=8000,
    vocabulary_examples=10_000,
    batch_size=64,
    shuffle=False,
    download=False,
    seed=0,
    epoch=None,
):
    """A tensorflow-datasets translation set by name, as batches.

    Args:
        name: a tfds translation dataset, e.g. `"wmt14_translate/de-en"` or
            `"ted_hrlr_translate/pt_to_en"`.
        data_dir: where the prepared dataset lies.
        split: tfds split string.
        source_language: feature key of the source side.
        target_language: feature key of the target side; default the other
            of the two languages.
        tokenizer: a tokenizer; None trains a shared WordPiece vocabulary of
            `vocabulary_size` on the first `vocabulary_examples` pairs.
        batch_size, shuffle, seed, epoch: as `make_translation_dataset`.
        download: let tfds download and prepare the data (off by default: the
            data must already be in `data_dir`).

    Returns:
        `(dataset, tokenizer)`.
    """
    import tensorflow_datasets as tfds

    raw = tfds.load(name, split=split, data_dir=data_dir, download=download)
    keys = sorted(raw.element_spec)
    if source_language not in keys:
        raise ValueError(
            f"`source_language` must be one of the dataset's languages {keys}. "
            f"Received: source_language={source_language!r}"
        )
    if target_language is None:
        others = [k for k in keys if k != source_language]
        target_language = others[0]
    elif target_language not in keys or target_language == source_language:
        raise ValueError(
            f"`target_language` must be another of the dataset's languages {keys}. "
            f"Received: target_language={target_language!r}"
        )
    pairs = raw.map(traced_as_written(
        lambda example: (example[source_language], example[target_language])))
    if tokenizer is None:
        texts = []
        for source, target in pairs.take(vocabulary_examples).as_numpy_iterator():
            texts += [source.decode("utf-8"), target.decode("utf-8")]
        tokenizer = make_tokenizer(train_vocabulary(texts, vocabulary_size))
    dataset = make_translation_dataset(pairs, None, tokenizer, batch_size, shuffle=shuffle,
                                       seed=seed, epoch=epoch)
    return dataset, tokenizer


# === Evaluation ===


# evaluate_translations lives in keras_attn.data.scoring (no TensorFlow there),
# imported above so that this module keeps offering it.
