import math

import numpy as np
import pytest
import tensorflow_datasets as tfds

from keras_attn.data import translation as tr

# The data pipelines alone (tf.data and NumPy, no model): the JAX pass would
# run the same thing again.
pytestmark = pytest.mark.backend_independent


@pytest.fixture(scope="module")
def data():
    return tr.load_number_translation(num_train=200, num_test=30, batch_size=8, seed=3)


def test_number_pairs_known_values():
    assert tr.number_pairs([345, 12345, 10000]) == [
        ("three hundred and forty-five", "三百四十五"),
        ("twelve thousand, three hundred and forty-five", "一万二千三百四十五"),
        ("ten thousand", "一万"),
    ]


def test_split_is_random_disjoint_and_seeded():
    train, test = tr.split_numbers(500, 100, max_number=1000, seed=1)
    assert len(train) == 500 and len(test) == 100
    assert not set(train) & set(test) and set(train) | set(test) <= set(range(1, 1001))
    np.testing.assert_array_equal(train, tr.split_numbers(500, 100, 1000, seed=1)[0])
    assert not np.array_equal(train, tr.split_numbers(500, 100, 1000, seed=2)[0])
    with pytest.raises(ValueError, match="Received: num_train=900, num_test=200, max_number=1000"):
        tr.split_numbers(900, 200, max_number=1000)


def test_tokenizer_is_character_level_for_japanese(data):
    vocabulary = data.vocabulary
    assert vocabulary[:4] == list(tr.SPECIAL_TOKENS)
    ids = np.asarray(data.tokenizer("三百四十五"))
    assert [vocabulary[i] for i in ids] == list("三百四十五")
    english = "twenty-one thousand, three hundred and five"
    assert [vocabulary[i] for i in np.asarray(data.tokenizer(english))] == [
        "twenty", "-", "one", "thousand", ",", "three", "hundred", "and", "five"
    ]
    with pytest.raises(ValueError, match="Received: vocabulary"):
        tr.make_tokenizer(["a", "b", "c", "d"])


def test_batches_shift_targets_and_pad_by_bucket(data):
    widths = []
    for (source, target_in), target_out in data.train:
        source, target_in, target_out = (np.asarray(x) for x in (source, target_in, target_out))
        assert source.shape[0] == target_in.shape[0] == target_out.shape[0] <= 8
        assert np.all(target_in[:, 0] == tr.START_ID)
        real = target_out != tr.PAD_ID
        # Decoder input = label shifted right by one (the label's END aside).
        words = real[:, :-1] & (target_out[:, :-1] != tr.END_ID)
        np.testing.assert_array_equal(target_in[:, 1:][words], target_out[:, :-1][words])
        assert np.all((target_in != tr.PAD_ID) == real)
        lengths = real.sum(1)
        assert np.all(target_out[np.arange(len(lengths)), lengths - 1] == tr.END_ID)
        source_lengths = (source != tr.PAD_ID).sum(1)
        assert np.all(source[np.arange(len(source)), source_lengths - 1] == tr.END_ID)
        # Padded to this batch's longest, not the corpus's.
        assert source.shape[1] == source_lengths.max()
        widths.append(source.shape[1])
    assert len(set(widths)) > 1  # several buckets
    sentences = sum(int(np.asarray(y).shape[0]) for _, y in data.test)
    assert sentences == 30


def test_detokenize_round_trips(data):
    (source, _), target_out = next(iter(data.test))
    english = tr.detokenize(data.tokenizer, source)
    japanese = tr.detokenize(data.tokenizer, target_out, join_characters=True)
    by_english = dict(data.test_pairs)
    for en, ja in zip(english, japanese):
        en = en.replace(" - ", "-").replace(" ,", ",")
        assert by_english[en] == ja
    assert tr.detokenize(data.tokenizer, [[tr.START_ID, tr.END_ID, 5]]) == [""]


def test_bleu_and_exact_match_known_values():
    # One sentence, character n-grams all right but one character short:
    # precisions 4/4, 3/3, 2/2, 1/1, brevity penalty exp(1 - 5/4).
    result = tr.evaluate_translations(["三百四十"], ["三百四十五"], tokenize="char")
    assert math.isclose(result["bleu"], 100 * math.exp(1 - 5 / 4), rel_tol=1e-4)
    assert result["exact_match"] == 0.0
    result = tr.evaluate_translations(["三百四十五", "一万二千"], ["三百四十五", "一万二千"], tokenize="char")
    assert math.isclose(result["bleu"], 100.0) and result["exact_match"] == 1.0
    # Corpus BLEU needs 4-grams somewhere: all-short corpora score 0 even
    # when exact (why the exact match is reported beside it).
    result = tr.evaluate_translations(["三百", "十一"], ["三百", "十一"], tokenize="char")
    assert result == {"bleu": 0.0, "exact_match": 1.0}
    with pytest.raises(ValueError, match="Received: len\\(hypotheses\\)=1, len\\(references\\)=2"):
        tr.evaluate_translations(["a"], ["a", "b"])


def test_tfds_translation_by_name_with_mock_data(tmp_path):
    with tfds.testing.mock_data(num_examples=12):
        dataset, tokenizer = tr.load_tfds_translation(
            "ted_hrlr_translate/pt_to_en", data_dir=str(tmp_path), source_language="pt",
            vocabulary_size=60, batch_size=4,
        )
        batches = list(dataset)
    assert sum(int(np.asarray(y).shape[0]) for _, y in batches) == 12
    (source, target_in), target_out = batches[0]
    assert source.dtype == "int32" and target_in.shape == target_out.shape
    assert np.all(np.asarray(target_in)[:, 0] == tr.START_ID)
    with tfds.testing.mock_data(num_examples=2):
        with pytest.raises(ValueError, match="Received: source_language='de'"):
            tr.load_tfds_translation("ted_hrlr_translate/pt_to_en", source_language="de")


def test_epoch_batches_repeat_and_count_as_predicted(data):
    from keras_attn._epochs import bucket_batch_count

    english, japanese = zip(*data.train_pairs)

    def batches(epoch):
        dataset = tr.make_translation_dataset(english, japanese, data.tokenizer, batch_size=8,
                                              shuffle=True, seed=1, epoch=epoch)
        return [np.asarray(y) for _, y in dataset]

    a = batches(0)
    for u, v in zip(a, batches(0)):
        np.testing.assert_array_equal(u, v)
    assert not np.array_equal(a[0], batches(1)[0])
    lengths = [max(len(np.asarray(data.tokenizer(en))), len(np.asarray(data.tokenizer(ja)))) + 1
               for en, ja in data.train_pairs]
    assert len(a) == bucket_batch_count(lengths, [8, 16, 32, 64], 8)
    # The dataset says so itself (Keras reads it: the epoch's length).
    dataset = tr.make_translation_dataset(english, japanese, data.tokenizer, batch_size=8,
                                          shuffle=True, seed=1)
    assert int(dataset.cardinality()) == len(a) == len(list(dataset))
