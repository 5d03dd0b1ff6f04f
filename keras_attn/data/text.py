"""Text data for BERT: the embedded corpus, WordPiece vocabularies, sentence
pairs for next-sentence prediction, and `tf.data` pipelines that pack
`[CLS] A [SEP] B [SEP]` and mask tokens dynamically.

```
documents (lists of sentences)
 -> make_sentence_pairs: B follows A (label 1) half of the time, else a
    random sentence of another document (label 0)
 (or make_document_segments: a document's sentences in order, joined up to
    the length, one segment, no next-sentence label: RoBERTa's inputs)
 -> pretraining_dataset: WordPiece -> MultiSegmentPacker -> batch
    -> dynamic_masking (new masks every epoch, stateless draws)
    -> (x, y, sample_weight)
```

TensorFlow only (tf.data, keras_hub, tensorflow-text): imported lazily,
never by `import keras_attn`.
"""

import random
import re

import numpy as np

from keras_attn._epochs import epoch_permutation
from keras_attn.data import wordpiece
from keras_attn._base.quiet_tensorflow import tensorflow_module
from keras_attn._base.quiet_tensorflow import traced_as_written
from keras_attn._text_packing import _check_ids
from keras_attn._text_packing import _token_id
from keras_attn._text_packing import pack_pairs  # public here: the loaders' packing
from keras_attn._text_packing import text_form

tf = tensorflow_module()  # import tensorflow, its start-up notices held back

AUTOTUNE = tf.data.AUTOTUNE
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"(])")


def split_sentences(text, min_words=3):
    """Splits prose into sentences.

    Paragraphs (separated by blank lines) are joined into single lines, split
    after `.`, `!` or `?` followed by a capital, and kept when they have at
    least `min_words` words. Underlines (`*****`, `=====`) are dropped.
    """
    sentences = []
    for paragraph in re.split(r"\n\s*\n", text):
        lines = [line for line in paragraph.splitlines()
                 if not re.fullmatch(r"\s*[*=\-~^]{3,}\s*", line)]
        paragraph = " ".join(" ".join(lines).split())
        if not paragraph:
            continue
        for sentence in _SENTENCE_END.split(paragraph):
            if len(sentence.split()) >= min_words:
                sentences.append(sentence)
    return sentences


def load_pydoc_corpus(min_sentences=2):
    """The corpus that ships inside CPython: `pydoc_data.topics`.

    79 help topics of the Python reference (about 465k characters of English
    prose and code), always present, no download.

    Returns:
        A list of documents, each a list of sentence strings; documents with
        fewer than `min_sentences` sentences are left out.
    """
    from pydoc_data.topics import topics

    documents = [split_sentences(topics[key]) for key in sorted(topics)]
    return [doc for doc in documents if len(doc) >= min_sentences]


def load_tfds_documents(name, data_dir=None, split="train", text_key="text",
                        max_documents=None, download=False):
    """Documents from any tensorflow-datasets text dataset, already prepared
    in `data_dir` (nothing is downloaded unless `download`).

    Args:
        name: the dataset name (`"imdb_reviews"`, `"wikipedia/20230601.en"`).
        data_dir: where the prepared dataset lies.
        split: the split.
        text_key: the feature holding the text.
        max_documents: read at most this many examples.

    Returns:
        A list of documents (lists of sentences), as `load_pydoc_corpus`.
    """
    import tensorflow_datasets as tfds

    dataset = tfds.load(name, split=split, data_dir=data_dir, download=download)
    if max_documents is not None:
        dataset = dataset.take(max_documents)
    documents = []
    for example in dataset.as_numpy_iterator():
        text = example[text_key]
        text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
        sentences = split_sentences(text, min_words=1)
        if sentences:
            documents.append(sentences)
    return documents


def train_wordpiece_vocabulary(sentences, vocabulary_size, lowercase=True):
    """A BERT WordPiece vocabulary learned from `sentences`, `SPECIAL_TOKENS`
    first (`[PAD]` is 0); lower-cased and accents stripped, as uncased BERT
    (`keras_attn.data.wordpiece`)."""
    return wordpiece.train_wordpiece_vocabulary(sentences, vocabulary_size, SPECIAL_TOKENS,
                                                lowercase=lowercase)


def make_tokenizer(vocabulary, lowercase=True):
    """A `keras_hub.tokenizers.WordPieceTokenizer` for a BERT `vocabulary`
    (which must start with `SPECIAL_TOKENS`)."""
    return wordpiece.make_wordpiece_tokenizer(vocabulary, SPECIAL_TOKENS, lowercase=lowercase)


def make_sentence_pairs(documents, seed=0):
    """Sentence pairs for next-sentence prediction.

    For every sentence A that has a successor in its document: with
    probability 1/2, B is that successor (label 1, "IsNext"); otherwise B is a
    random sentence of a different document (label 0, "NotNext").

    Returns:
        `(first, second, labels)`: two lists of strings and an int32 array.
    """
    if len(documents) < 2:
        raise ValueError(
            "Random second sentences come from another document: at least two "
            f"documents are needed. Received: len(documents)={len(documents)}"
        )
    rng = random.Random(seed)
    first, second, labels = [], [], []
    for index, document in enumerate(documents):
        for i in range(len(document) - 1):
            first.append(document[i])
            if rng.random() < 0.5:
                second.append(document[i + 1])
                labels.append(1)
            else:
                other = rng.randrange(len(documents) - 1)
                other += other >= index  # any document but this one
                second.append(rng.choice(documents[other]))
                labels.append(0)
    return first, second, np.asarray(labels, "int32")


def make_document_segments(documents, tokenizer, sequence_length):
    """Single-segment texts for masked-LM pretraining without next-sentence
    prediction: RoBERTa's DOC-SENTENCES inputs (Liu et al., 2019, section
    4.2) at `sequence_length`. The sentences of each document, in order,
    are joined while `[CLS] text [SEP]` fits in `sequence_length` tokens of
    `tokenizer`; an example never crosses a document boundary, and a
    sentence longer than that is an example alone (cut when packed).
    Deterministic: every sentence is in exactly one example.

    Returns:
        A list of strings (the sentences of an example joined by a space,
        which WordPiece tokenizes as the sentences one after another).
    """
    budget = sequence_length - 2  # [CLS] and [SEP]
    pack = pack_pairs(tokenizer, sequence_length)
    sentences = [sentence for document in documents for sentence in document]
    lengths = []
    for start in range(0, len(sentences), 1024):
        _, _, padding_mask = pack(tf.constant(sentences[start:start + 1024]))
        lengths.extend(np.asarray(padding_mask).sum(axis=1) - 2)
    segments, index = [], 0
    for document in documents:
        current, used = [], 0
        for sentence in document:
            length = int(lengths[index])
            index += 1
            if current and used + length > budget:
                segments.append(" ".join(current))
                current, used = [], 0
            current.append(sentence)
            used += length
        if current:
            segments.append(" ".join(current))
    return segments


def dynamic_masking(tokenizer, mask_rate=0.15, max_predictions=20, seed=None):
    """A function that masks a dense `(B, T)` batch of packed token ids.

    Each token that is not `[PAD]`, `[CLS]` or `[SEP]` is chosen with
    probability `mask_rate`, independently; if more than `max_predictions`
    are chosen in a sequence, a random `max_predictions` of them are kept.
    Chosen tokens become `[MASK]` (80%), a random token (10%) or stay (10%),
    and their positions, original ids and weights are laid out as
    `keras_hub.layers.MaskedLMMaskGenerator` does.

    Why not the generator itself: in a graph (a tf.data map) it selects
    `ceil(mask_rate * n)` tokens of a sequence with `n` candidates
    (`tensorflow_text.RandomItemSelector`), which overshoots for short
    sequences: 2 of 8 is 25%, and 16.3% instead of 15% on the sentence pairs
    of the embedded corpus at length 64 (measured); and its draws come from
    stateful random ops, so a pass over the data cannot be repeated.

    Every draw here is a stateless op keyed by a `(2,)` seed. `mask(ids,
    seed)` with a given seed is a pure function (what resumable training
    needs: `pretraining_dataset(..., epoch=e)` keys it by seed, epoch and
    batch). Without one, the seed comes from a `tf.random.Generator` (seeded
    with `seed`, or from fresh entropy when None) that the pipeline captures:
    its state advances across passes over the dataset, so every epoch gets
    new masks even under `keras.utils.set_random_seed`. (Plain
    `tf.random.uniform` in a `tf.data` map restarts the same sequence with
    every new iterator once a global seed is set, which would make "dynamic"
    masking static.)

    A process of a data-parallel job that feeds only some rows of a batch
    masks only those: `mask(token_ids, seed, rows=rows, batch_size=size)`
    with `token_ids` the rows `rows` `(R,)` of a batch of `size` rows draws
    for the whole batch (every draw is one per token or per slot, all from
    the batch's seed) and keeps those rows' draws, so each row is masked
    exactly as in `mask(whole_batch, seed)`.

    Returns:
        `mask(token_ids, seed=None, rows=None, batch_size=None) ->
        dict(token_ids, mask_positions, mask_ids, mask_weights)`; positions
        `(B, max_predictions)` in increasing order, padded with 0 (weight 0).
    """
    rng = (
        tf.random.Generator.from_seed(seed)
        if seed is not None
        else tf.random.Generator.from_non_deterministic_state()
    )
    pad = _token_id(tokenizer, "[PAD]")
    mask_id = _token_id(tokenizer, "[MASK]")
    vocabulary_size = int(tokenizer.vocabulary_size())
    special = tf.constant([pad] + [_token_id(tokenizer, t) for t in ("[CLS]", "[SEP]")])

    def mask(token_ids, seed=None, rows=None, batch_size=None):
        if (rows is None) != (batch_size is None):
            raise ValueError("Masking some rows of a batch needs both `rows` and `batch_size`. "
                             f"Received: rows={rows!r}, batch_size={batch_size!r}")
        token_ids = tf.convert_to_tensor(token_ids)
        if seed is None:
            seed = rng.make_seeds(1)[:, 0]
        seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 4)

        def uniform(shape, seed, **kwargs):
            if rows is None:
                return tf.random.stateless_uniform(shape, seed, **kwargs)
            whole = tf.concat([tf.reshape(tf.cast(batch_size, shape.dtype), [1]), shape[1:]], 0)
            return tf.gather(tf.random.stateless_uniform(whole, seed, **kwargs), rows)

        shape = tf.shape(token_ids)
        length = shape[1]
        candidate = tf.reduce_all(token_ids[..., None] != special, axis=-1)  # (B, T)
        chosen = candidate & (uniform(shape, seeds[0]) < mask_rate)
        # Keep a random max_predictions of the chosen: the highest priorities.
        priority = tf.where(chosen, uniform(shape, seeds[1]), -1.0)
        top, index = tf.math.top_k(priority, tf.minimum(max_predictions, length))
        index = tf.sort(tf.where(top >= 0.0, index, length), axis=-1)  # unused slots last
        index = tf.pad(index, [[0, 0], [0, max_predictions - tf.shape(index)[1]]],
                       constant_values=length)  # (B, P)
        weights = index < length
        positions = tf.where(weights, index, 0)
        original = tf.gather(token_ids, positions, batch_dims=1)  # (B, P)
        choice = uniform(tf.shape(positions), seeds[2])
        random_ids = uniform(tf.shape(positions), seeds[3], minval=0, maxval=vocabulary_size,
                             dtype=tf.int32)
        replaced = tf.where(
            choice < 0.8,
            tf.cast(mask_id, token_ids.dtype),
            tf.where(choice < 0.9, tf.cast(random_ids, token_ids.dtype), original),
        )
        rows = tf.broadcast_to(tf.range(shape[0])[:, None], tf.shape(positions))
        updates = tf.boolean_mask(tf.stack([rows, positions], -1), weights)  # (M, 2)
        masked = tf.tensor_scatter_nd_update(token_ids, updates, tf.boolean_mask(replaced, weights))
        return {
            "token_ids": masked,
            "mask_positions": positions,
            "mask_ids": tf.where(weights, original, tf.zeros_like(original)),
            "mask_weights": tf.cast(weights, "float32"),
        }

    return mask


def pretraining_dataset(
    first,
    second,
    labels,
    tokenizer,
    sequence_length=128,
    batch_size=32,
    mask_rate=0.15,
    max_predictions=20,
    shuffle=True,
    seed=None,
    epoch=None,
    rows=None,
    weightless=None,
):
    """A `tf.data.Dataset` of `(x, y, sample_weight)` for `BertPretrainer`.

    Masking is dynamic (RoBERTa-style, see `dynamic_masking`): it runs inside
    the pipeline, so every epoch sees new masks (`seed` makes the sequence
    of masks reproducible; it also seeds the shuffle). Each non-special token is
    selected with probability `mask_rate` (at most `max_predictions` per
    sequence); of those 80% become `[MASK]`, 10% a random token, 10% stay.

    With `epoch` (an int), the dataset is that epoch's batches only, a pure
    function of `(seed, epoch)`: the order is a permutation keyed by both
    and each batch's masks are keyed by both and the batch index, so every
    pass gives the same batches (`seed` None counts as 0).

    With `rows` (and `epoch`): only some rows of every batch, as one process
    of a data-parallel job feeds them, the others neither tokenized nor
    masked. `rows(size)` gives the positions `(R,)` of the rows to make in
    the batch filled up to `positions`' extent (position p is example
    p % size of the batch, as `even_batches` fills it); each row is made as
    in the whole batch (`dynamic_masking`'s draws are the whole batch's),
    and `weightless(batch, positions < size)` makes the filler rows count
    for nothing.

    With `second` and `labels` None: single segments `[CLS] text [SEP]`
    (segment ids 0) and the masked LM alone (RoBERTa's objective, for
    `BertPretrainer(next_sentence=False)`): no "nsp" target or weight.

    Returns:
        A dataset of batches: `x` = token_ids (masked), segment_ids,
        padding_mask, mask_positions `(B, max_predictions)`;
        `y` = {"mlm": original ids at those positions, "nsp": labels};
        `sample_weight` = {"mlm": 1 for a real prediction else 0, "nsp": 1}.
    """
    pack = pack_pairs(tokenizer, sequence_length)
    mask_tokens = dynamic_masking(tokenizer, mask_rate, max_predictions, seed=seed)
    single = second is None
    if single != (labels is None):
        raise ValueError("Single segments (masked LM alone) need both `second` and `labels` "
                         f"None. Received: second is None: {second is None}, labels is None: "
                         f"{labels is None}")
    if single:  # the pairs' columns and batching; only `first` is packed
        second, labels = first, np.zeros(len(first), "int32")

    def to_example(first, second, label, mask_seed=None, kept=None, size=None):
        token_ids, segment_ids, padding_mask = pack(first, None if single else second)
        masked = mask_tokens(token_ids, mask_seed, rows=kept, batch_size=size)
        x = {
            "token_ids": tf.cast(masked["token_ids"], "int32"),
            "segment_ids": segment_ids,
            "padding_mask": padding_mask,
            "mask_positions": tf.cast(masked["mask_positions"], "int32"),
        }
        y = {"mlm": tf.cast(masked["mask_ids"], "int32"), "nsp": label}
        weight = {
            "mlm": tf.cast(masked["mask_weights"], "float32"),
            "nsp": tf.ones_like(label, "float32"),
        }
        if single:
            del y["nsp"], weight["nsp"]
        return x, y, weight

    if rows is not None and (epoch is None or weightless is None):
        raise ValueError("Making some rows of each batch needs `epoch` (the draws keyed by "
                         "it) and `weightless`. Received: "
                         f"epoch={epoch!r}, weightless={weightless!r}")

    def some_rows(i, first, second, label):
        size = tf.shape(label)[0]
        positions = rows(size)
        kept = positions % size
        batch = to_example(tf.gather(first, kept), tf.gather(second, kept),
                           tf.gather(label, kept), batch_seed(i), kept, size)
        return weightless(batch, positions < size)

    columns = (list(first), list(second), np.asarray(labels, "int32"))
    if epoch is not None:
        seed = seed or 0
        if shuffle:
            order = epoch_permutation(len(columns[2]), seed, epoch)
            columns = tuple(np.asarray(column)[order] for column in columns)
        key = tf.constant([seed, epoch], tf.int64)

        def batch_seed(i):
            return tf.random.experimental.stateless_fold_in(key, i)

        dataset = tf.data.Dataset.from_tensor_slices(columns).batch(batch_size).enumerate()
        dataset = dataset.map(
            traced_as_written(lambda i, batch: to_example(*batch, batch_seed(i)))
            if rows is None else traced_as_written(lambda i, batch: some_rows(i, *batch)),
            num_parallel_calls=AUTOTUNE,  # stateless draws: the call order is free
        )
        return dataset.prefetch(AUTOTUNE)
    dataset = tf.data.Dataset.from_tensor_slices(columns)
    if shuffle:
        dataset = dataset.shuffle(len(labels), seed=seed, reshuffle_each_iteration=True)
    return dataset.batch(batch_size).map(
        traced_as_written(to_example), num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)


INPUTS = ("token_ids", "segment_ids", "padding_mask")
# Examples tokenized together before the cache (one map call each).
_TOKENIZE_BATCH = 1024


def input_names(model=None):
    """The inputs of `model` a text pipeline makes: its input names (a
    Keras model's `model.input` dict, or `model.inputs`' names), each one of
    `INPUTS`; all of `INPUTS` without a model (BERT's)."""
    if model is None:
        return INPUTS
    inputs = getattr(model, "input", None)
    try:
        names = list(inputs) if isinstance(inputs, dict) else [t.name for t in model.inputs]
    except (AttributeError, TypeError, ValueError):
        names = None
    if not names or not set(names) <= set(INPUTS) or "token_ids" not in names:
        raise ValueError(
            f"Invalid value for argument `model`: a text model whose inputs are token_ids and "
            f"some of {list(INPUTS[1:])}. Received: model={type(model).__name__} with inputs "
            f"{names}")
    return tuple(name for name in INPUTS if name in names)


def _cached(dataset, count, to_example, batch_size, shuffle, seed, batch=None):
    """`dataset`'s examples tokenized once, here (in chunks, `to_example`),
    held in memory as arrays, then shuffled at every pass (as the raw
    examples were: the same seed and buffer give the same order) and
    batched.

    Tokenized now rather than lazily at the first pass: tensorflow-text's
    SentencePiece op (XLM-R's tokenizer) keeps its model in a resource that
    its eager kernel owns, and `tf.random.set_seed` (so
    `keras.utils.set_random_seed`) clears the eager kernels: a pipeline
    still to tokenize when the user seeds before `fit` would stop with
    "Resource ... SentencepieceOp does not exist"."""
    chunks = (batch or tf.data.Dataset.batch)(dataset, _TOKENIZE_BATCH)
    tokenized = chunks.map(traced_as_written(to_example), num_parallel_calls=AUTOTUNE)
    parts = list(tokenized.as_numpy_iterator())
    if parts:
        dataset = tf.data.Dataset.from_tensor_slices(
            tf.nest.map_structure(lambda *chunk: np.concatenate(chunk), *parts))
    else:  # no examples: nothing to tokenize
        dataset = tokenized.unbatch()
    # Keras reads an epoch's steps from the count (else its first epoch ends
    # in "Your input ran out of data").
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(count))
    if shuffle:
        dataset = dataset.shuffle(count, seed=seed)
    return dataset.batch(batch_size).prefetch(AUTOTUNE)


def classification_dataset(texts, labels, tokenizer, sequence_length=128,
                           batch_size=32, shuffle=False, seed=None, second_texts=None,
                           inputs=INPUTS):
    """A dataset of `(x, labels)` for a sequence classifier: `[CLS] text
    [SEP]` (or `[CLS] text [SEP] second [SEP]`), with the tokenizer's own
    special tokens and padding (`text_form`: RoBERTa's `<s> A </s></s> B
    </s>`), padded to `sequence_length` and cut as transformers'
    `truncation=True, max_length=sequence_length` (`pack_pairs`'s
    `"longest_first"`); `x` holds `inputs` (`input_names(model)`).

    Tokenized once: the packed examples are cached in memory (each input
    `sequence_length` int32 per example, and its label) and shuffled from
    there at every pass."""
    pack = pack_pairs(tokenizer, sequence_length, truncate="longest_first")
    labels = np.asarray(labels, "int32")
    columns = (list(texts),) if second_texts is None else (list(texts), list(second_texts))

    def to_example(*args):
        *strings, label = args
        packed = dict(zip(INPUTS, pack(*strings)))
        return {name: packed[name] for name in inputs}, label

    dataset = tf.data.Dataset.from_tensor_slices(columns + (labels,))
    return _cached(dataset, len(labels), to_example, batch_size, shuffle, seed)


def align_word_labels(tokenizer, words, tags):
    """Tokenizes a batch of words and gives each word piece a label.

    The word's label goes to its first piece; the other pieces get label 0
    and weight 0, so that each word counts once in the loss and the
    accuracy (what Hugging Face's `word_ids()` recipe does with label -100,
    as a `sample_weight` here). A word that yields no piece is dropped.

    Args:
        tokenizer: a WordPiece tokenizer (`make_tokenizer`).
        words: a `(B, W)` ragged string tensor, one word per entry.
        tags: a `(B, W)` ragged int tensor, the words' labels.

    Returns:
        `(piece_ids, labels, weights)`: three `(B, N)` int32 ragged tensors,
        `N` the pieces of each example's words.
    """
    pieces = tokenizer(words.flat_values)  # (words in the batch, P)
    lengths = pieces.row_lengths()
    first = tf.ragged.range(lengths).flat_values == 0  # (pieces,)
    labels = tf.where(first, tf.repeat(tf.cast(tags.flat_values, "int32"), lengths), 0)
    # Pieces per example: the sum of its words' pieces.
    splits = tf.gather(pieces.row_splits, words.row_splits)

    def per_example(values):
        return tf.RaggedTensor.from_row_splits(values, splits)

    return (per_example(tf.cast(pieces.flat_values, "int32")), per_example(labels),
            per_example(tf.cast(first, "int32")))


def token_classification_dataset(words, tags, tokenizer, sequence_length=128, batch_size=32,
                                 shuffle=False, seed=None, inputs=INPUTS):
    """A dataset of `(x, labels, sample_weight)` for `BertTokenClassifier`.

    Each example is a list of words with one integer label per word. The
    words are split into WordPieces; a word's label is on its first piece,
    and `sample_weight` is 1 there and 0 on the other pieces, `[CLS]`,
    `[SEP]` and padding (`align_word_labels`), so the loss and the accuracy
    count each word once. Packed as `[CLS] pieces [SEP]` with keras-hub's
    `StartEndPacker`, truncated (the last words first) and padded to
    `sequence_length`, with the tokenizer's own start, end and padding
    tokens (`text_form`); `x` holds `inputs` (`input_names(model)`). A
    byte-level BPE tokenizer reads each word after a space (`"Ġword"`), as
    transformers' `is_split_into_words=True` with `add_prefix_space=True`
    (the only way it splits words for RoBERTa). Tokenized once and cached
    in memory, as `classification_dataset`.

    Args:
        words: a list of examples, each a list of word strings.
        tags: a list of examples, each a list of int labels, one per word.
        tokenizer: from `make_tokenizer` (or `load_hf_bert_tokenizer`).
        sequence_length: the packed length.
        batch_size: examples per batch.
        shuffle: shuffle the examples at every pass.
        seed: the shuffle's seed.

    Returns:
        Batches of `x` = {"token_ids", "segment_ids", "padding_mask"}
        `(B, sequence_length)`, labels and sample weights of that shape.
    """
    import keras_hub

    words, tags = [list(w) for w in words], [list(t) for t in tags]
    for index, (example_words, example_tags) in enumerate(zip(words, tags)):
        if len(example_words) != len(example_tags):
            raise ValueError(
                "Each example needs one tag per word. Received: "
                f"{len(example_words)} words and {len(example_tags)} tags in example {index}"
            )
    if len(words) != len(tags):
        raise ValueError(f"`words` and `tags` must have as many examples. Received: "
                         f"len(words)={len(words)}, len(tags)={len(tags)}")
    # Checked here, not after `tf.ragged.constant(..., tf.int32)`, which wraps
    # a 2**32 + 3 (a Python int or an int64) to a valid 3.
    for index, example_tags in enumerate(tags):
        for position, tag in enumerate(example_tags):
            if (isinstance(tag, (bool, np.bool_)) or not isinstance(tag, (int, np.integer))
                    or not 0 <= tag < 2 ** 31):
                raise ValueError(
                    "Invalid value for argument `tags`: each tag must be an integer class "
                    f"id in [0, {2 ** 31}). Received: tags[{index}][{position}]={tag!r}")

    def packer(start, end, pad):
        return keras_hub.layers.StartEndPacker(
            sequence_length=sequence_length, start_value=start, end_value=end, pad_value=pad,
            return_padding_mask=False)

    start, end, pad, _, _ = text_form(tokenizer)
    pack_ids = packer(start, end, pad)
    pack_labels = packer(0, 0, 0)  # labels and weights: 0 on [CLS], [SEP], padding
    pack_mask = packer(1, 1, 0)
    vocabulary_size = int(tokenizer.vocabulary_size())
    spaced = _prefix_space(tokenizer)

    def to_example(batch_words, batch_tags):
        if spaced:
            batch_words = batch_words.with_flat_values(
                tf.strings.join([" ", batch_words.flat_values]))
        piece_ids, labels, weights = align_word_labels(tokenizer, batch_words, batch_tags)
        token_ids = _check_ids(pack_ids(piece_ids), vocabulary_size)
        packed = {"token_ids": token_ids, "segment_ids": tf.zeros_like(token_ids),
                  "padding_mask": tf.cast(pack_mask(tf.ones_like(piece_ids)), "int32")}
        return ({name: packed[name] for name in inputs}, tf.cast(pack_labels(labels), "int32"),
                tf.cast(pack_labels(weights), "float32"))

    dataset = tf.data.Dataset.from_tensor_slices((
        tf.ragged.constant(words, dtype=tf.string, ragged_rank=1),
        tf.ragged.constant(tags, dtype=tf.int32, ragged_rank=1),
    ))
    return _cached(dataset, len(words), to_example, batch_size, shuffle, seed,
                   batch=tf.data.Dataset.ragged_batch)


def _prefix_space(tokenizer):
    """Whether words need a space before them: a byte-level BPE tokenizer
    (keras-hub's `BytePairTokenizer`) that does not add one itself."""
    import keras_hub

    return (isinstance(tokenizer, keras_hub.tokenizers.BytePairTokenizer)
            and not getattr(tokenizer, "add_prefix_space", False))
