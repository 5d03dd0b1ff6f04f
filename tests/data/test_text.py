import re

import numpy as np
import pytest
import tensorflow as tf

from keras_attn.data import text

# The data pipelines alone (tf.data and NumPy, no model): the JAX pass would
# run the same thing again.
pytestmark = pytest.mark.backend_independent


@pytest.fixture(scope="module")
def corpus():
    documents = text.load_pydoc_corpus()
    sentences = [s for doc in documents for s in doc]
    vocabulary = text.train_wordpiece_vocabulary(sentences[::2], 1500)
    return documents, vocabulary, text.make_tokenizer(vocabulary)


def test_pydoc_corpus_is_real_prose():
    documents = text.load_pydoc_corpus()
    assert len(documents) >= 70
    sentences = [s for doc in documents for s in doc]
    assert len(sentences) > 3000
    assert "An identifier occurring as an atom is a name." in sentences
    # Title underlines ("*****" on their own line) are dropped.
    assert not any(re.search(r"(^|\s)[*=]{5,}(\s|$)", s) for s in sentences)


def test_split_sentences():
    got = text.split_sentences("Title\n*****\n\nOne two three. Four five six!  Seven\neight nine?\n\nx y")
    assert got == ["One two three.", "Four five six!", "Seven eight nine?"]


def test_wordpiece_vocabulary(corpus):
    _, vocabulary, tokenizer = corpus
    assert vocabulary[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert 500 < len(vocabulary) <= 1500
    assert any(token.startswith("##") for token in vocabulary)
    ids = np.asarray(tokenizer("The Identifier is a name."))
    assert tokenizer.detokenize(ids) == "the identifier is a name ."


def test_sentence_pairs_are_half_next_half_random():
    # Synthetic documents with unique sentences: the origin of B is checkable.
    documents = [[f"doc {d} sentence {i}" for i in range(3 + d % 7)] for d in range(200)]
    first, second, labels = text.make_sentence_pairs(documents, seed=0)
    assert len(first) == sum(len(doc) - 1 for doc in documents)
    for a, b, label in zip(first, second, labels):
        doc_a, i = (int(t) for t in a.split()[1::2])
        doc_b, j = (int(t) for t in b.split()[1::2])
        if label == 1:
            assert (doc_b, j) == (doc_a, i + 1)
        else:
            assert doc_b != doc_a
    # The rate on the real corpus, three seeds (> 10,000 pairs).
    corpus = text.load_pydoc_corpus()
    labels = np.concatenate([text.make_sentence_pairs(corpus, seed=s)[2] for s in range(3)])
    assert len(labels) > 10000
    assert abs(labels.mean() - 0.5) <= 0.02
    with pytest.raises(ValueError, match=r"Received: len\(documents\)=1"):
        text.make_sentence_pairs(documents[:1])


def test_packing_and_masking_rates(corpus):
    documents, vocabulary, tokenizer = corpus
    first, second, labels = text.make_sentence_pairs(documents, seed=0)
    dataset = text.pretraining_dataset(first, second, labels, tokenizer, sequence_length=64,
                                       batch_size=256, max_predictions=64, shuffle=False)
    mask_id, cls, sep, pad = (vocabulary.index(t) for t in ("[MASK]", "[CLS]", "[SEP]", "[PAD]"))
    selectable = selected = masked = randomized = kept = 0
    nsp = []
    for x, y, w in dataset:
        ids, segments = x["token_ids"].numpy(), x["segment_ids"].numpy()
        weight = w["mlm"].numpy() > 0
        positions = x["mask_positions"].numpy()
        original = y["mlm"].numpy()[weight]
        now = np.take_along_axis(ids, positions, axis=1)[weight]
        # Put the original tokens back to see the packing before masking (a
        # random replacement may be any id, [PAD] included).
        unmasked = ids.copy()
        rows = np.nonzero(weight)[0]
        unmasked[rows, positions[weight]] = original
        # Packing: [CLS] A [SEP] B [SEP], segment 1 only for B, mask = not padding.
        assert np.all(unmasked[:, 0] == cls)
        assert np.all((unmasked == sep).sum(1) == 2)
        assert np.array_equal(x["padding_mask"].numpy(), (unmasked != pad).astype("int32"))
        ids = unmasked
        assert np.all(segments[ids == cls] == 0)
        assert not np.any(np.isin(original, [pad, cls, sep]))  # never a special token
        # Selectable tokens before masking: real tokens that are not [CLS]/[SEP].
        real = x["padding_mask"].numpy().astype(bool)
        selectable += int(real.sum() - (ids[real] == cls).sum() - 2 * len(ids))
        selected += int(weight.sum())
        masked += int((now == mask_id).sum())
        kept += int((now == original).sum())
        randomized += int(((now != original) & (now != mask_id)).sum())
        nsp.append(y["nsp"].numpy())
    print(f"selected {selected / selectable:.4f} of {selectable} tokens; [MASK] "
          f"{masked / selected:.4f}, random {randomized / selected:.4f}, kept "
          f"{kept / selected:.4f}; NSP IsNext {np.concatenate(nsp).mean():.4f}")
    assert selectable >= 100_000
    assert abs(selected / selectable - 0.15) <= 0.01
    assert abs(masked / selected - 0.8) <= 0.02
    assert abs(randomized / selected - 0.1) <= 0.02
    assert abs(kept / selected - 0.1) <= 0.02
    assert abs(np.concatenate(nsp).mean() - 0.5) <= 0.02


def test_keras_hub_generator_alone_rounds_the_count_up():
    # Why dynamic_masking does its own selection: the generator picks
    # ceil(rate * n) tokens, 2 of 8 (25%) at rate 0.15.
    import keras_hub

    generator = keras_hub.layers.MaskedLMMaskGenerator(
        vocabulary_size=50, mask_selection_rate=0.15, mask_token_id=4,
        mask_selection_length=8, unselectable_token_ids=[0])
    # In a graph, as in a tf.data map (eager calls take another code path).
    out = tf.function(generator)(tf.constant([[10, 11, 12, 13, 14, 15, 16, 17]] * 16))
    assert np.all(np.asarray(out["mask_weights"]).sum(1) == 2)
    ours = text.dynamic_masking(_FakeTokenizer(), mask_rate=0.15, max_predictions=8)
    out = tf.function(ours)(tf.constant([[2, 10, 11, 12, 13, 14, 15, 16, 17, 3]] * 2000))
    # 8 candidates at 0.15: 1.2 per sequence on average (std of the mean 0.023).
    assert abs(np.asarray(out["mask_weights"]).sum(1).mean() - 1.2) < 0.1


class _FakeTokenizer:
    def token_to_id(self, token):
        return {"[PAD]": 0, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}[token]

    def vocabulary_size(self):
        return 50


def test_cap_truncation_and_dynamic_masks(corpus):
    documents, vocabulary, tokenizer = corpus
    first, second, labels = text.make_sentence_pairs(documents, seed=1)
    first, second, labels = first[:64], second[:64], labels[:64]
    # A global seed (as keras.utils.set_random_seed sets) must not freeze the
    # masks: plain tf.random ops in a map would repeat them every pass.
    tf.random.set_seed(0)
    dataset = text.pretraining_dataset(first, second, labels, tokenizer, sequence_length=32,
                                       batch_size=64, max_predictions=3, shuffle=False)
    x1, _, w1 = next(iter(dataset))
    x2, _, _ = next(iter(dataset))
    assert x1["token_ids"].shape == (64, 32)
    assert x1["mask_positions"].shape == (64, 3)
    assert np.all(w1["mlm"].numpy().sum(1) <= 3)
    # A new pass masks differently (dynamic masking).
    assert not np.array_equal(x1["token_ids"].numpy(), x2["token_ids"].numpy())


def test_classification_dataset_and_id_check(corpus):
    _, vocabulary, tokenizer = corpus
    dataset = text.classification_dataset(["a name.", "the value of x"], [0, 1], tokenizer,
                                          sequence_length=8, batch_size=2)
    x, y = next(iter(dataset))
    assert x["token_ids"].shape == (2, 8) and y.numpy().tolist() == [0, 1]
    assert np.all(x["segment_ids"].numpy() == 0)
    # The data path refuses ids past the vocabulary (a tokenizer for a bigger one).
    bigger = text.make_tokenizer(vocabulary + ["zzzextra"])
    small = text.pack_pairs(bigger, 8)
    check = text._check_ids
    with pytest.raises(tf.errors.InvalidArgumentError, match="vocabulary_size=3"):
        check(tf.constant([[1, 2, 3]]), 3)
    assert np.asarray(small(tf.constant(["zzzextra"]))[0])[0, 1] == len(vocabulary)


def test_tfds_documents_with_mock_data(tmp_path):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=6):
        documents = text.load_tfds_documents("imdb_reviews", data_dir=str(tmp_path),
                                             split="train", max_documents=4)
    assert len(documents) == 4
    assert all(isinstance(s, str) and s for doc in documents for s in doc)


def test_masks_are_reproducible_with_a_seed(corpus):
    documents, vocabulary, tokenizer = corpus
    first, second, labels = text.make_sentence_pairs(documents, seed=1)

    def first_batch_ids():
        dataset = text.pretraining_dataset(first[:16], second[:16], labels[:16], tokenizer,
                                           sequence_length=32, batch_size=16, shuffle=False, seed=7)
        return next(iter(dataset))[0]["token_ids"].numpy()

    np.testing.assert_array_equal(first_batch_ids(), first_batch_ids())


def test_epoch_datasets_are_pure_functions_of_seed_and_epoch(corpus):
    documents, _, tokenizer = corpus
    first, second, labels = text.make_sentence_pairs(documents, seed=1)
    first, second, labels = first[:40], second[:40], labels[:40]

    def batches(epoch):
        dataset = text.pretraining_dataset(first, second, labels, tokenizer, sequence_length=32,
                                           batch_size=16, max_predictions=6, seed=3, epoch=epoch)
        return [(x["token_ids"].numpy(), x["mask_positions"].numpy(), y["nsp"].numpy())
                for x, y, _ in dataset]

    a = batches(2)
    assert len(a) == 3
    for one, two in zip(a, batches(2)):
        for u, v in zip(one, two):
            np.testing.assert_array_equal(u, v)
    b = batches(3)
    assert not np.array_equal(a[0][0], b[0][0])  # a new order and new masks
    # Every batch of an epoch has its own masks: same pairs, other batch index.
    unshuffled = text.pretraining_dataset(first[:16] * 2, second[:16] * 2, [*labels[:16]] * 2,
                                          tokenizer, sequence_length=32, batch_size=16,
                                          shuffle=False, epoch=0)
    (x1, _, _), (x2, _, _) = list(unshuffled)
    assert not np.array_equal(x1["token_ids"].numpy(), x2["token_ids"].numpy())


def test_masking_with_a_seed_is_pure():
    mask = text.dynamic_masking(_FakeTokenizer(), mask_rate=0.3, max_predictions=4)
    ids = tf.constant([[2] + list(range(10, 30)) + [3, 0, 0]] * 8)
    a, b = mask(ids, tf.constant([1, 2])), mask(ids, tf.constant([1, 2]))
    for key in a:
        np.testing.assert_array_equal(a[key].numpy(), b[key].numpy())
    positions, weights = a["mask_positions"].numpy(), a["mask_weights"].numpy()
    assert positions.shape == (8, 4) and np.all(weights.sum(1) <= 4)
    real = positions[weights > 0]
    assert np.all((real >= 1) & (real <= 20))  # never [CLS], [SEP] or padding
    for row, w in zip(positions, weights):  # increasing, padding (0) after
        n = int(w.sum())
        assert np.all(np.diff(row[:n]) > 0) and np.all(row[n:] == 0)
    np.testing.assert_array_equal(a["mask_ids"].numpy()[weights > 0], real + 9)


def test_a_vocabulary_without_the_special_tokens_first_is_refused():
    # [PAD] must be id 0 and [MASK] id 4 for the packer and the masking.
    with pytest.raises(ValueError, match=r"must start with \['\[PAD\]'.*Received: vocabulary"):
        text.make_tokenizer(["the", "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
