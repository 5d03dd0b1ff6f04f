"""Your own files to a trained model, one task at a time (`keras_attn.data`'s
`load_*_files`): files the test writes (a dozen examples), a tiny model
whose loss goes down, saved and reloaded with the same outputs; the text
classifier exported and served from its SavedModel; bad files refused with
the path named."""

import csv
import json
import os
import struct
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from _families import FAMILIES
from keras_attn import data
from keras_attn.data import files

# tf.data pipelines, and models trained on TensorFlow (the exports need it).
pytestmark = pytest.mark.tf_only

SENTENCES = [("a great film, I loved it", "good"), ("dull and far too long", "bad"),
             ("wonderful acting and a great story", "good"), ("I want those hours back", "bad"),
             ("great fun from start to end", "good"), ("a boring, tired plot", "bad")] * 2


def write_csv(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    return str(path)


def fit_loss(model, dataset, epochs):
    """The loss on `dataset` before and after `epochs` of training."""
    keras.utils.set_random_seed(0)
    before = model.evaluate(dataset, verbose=0, return_dict=True)["loss"]
    model.fit(dataset, epochs=epochs, verbose=0)
    return before, model.evaluate(dataset, verbose=0, return_dict=True)["loss"]


def trains_and_reloads(model, train, batch, path, epochs):
    """`model` compiled with its own loss, its loss on `train` lower after
    `epochs`, and the same outputs on `batch` once saved and reloaded."""
    model.compile(optimizer=keras.optimizers.Adam(3e-3))
    before, after = fit_loss(model, train, epochs)
    assert after < before
    return save_and_reload(model, batch, path)


def save_and_reload(model, batch, path):
    """The reloaded model's outputs equal the model's on `batch`."""
    model.save(str(path))
    reloaded = keras.saving.load_model(str(path))
    x = batch[0]
    for new, old in zip(keras.tree.flatten(reloaded.predict(x, verbose=0)),
                        keras.tree.flatten(model.predict(x, verbose=0))):
        np.testing.assert_allclose(np.asarray(new), np.asarray(old), rtol=1e-5, atol=1e-5)
    return reloaded


def tiny_bert(vocabulary_size, sequence_length):
    """The table's BERT on the files' vocabulary and sequence length: one
    block, 32 wide. The sequence classifier's loss on the 12 sentences falls
    by only ~1e-4 in its 4 epochs at this width, and `trains_and_reloads`
    asserts that it falls (16 wide: by 4e-5 in one run, not at all in
    another)."""
    return FAMILIES["bert"].backbone(vocabulary_size=vocabulary_size, num_layers=1,
                                     hidden_dim=32, intermediate_dim=64,
                                     max_sequence_length=sequence_length)


# === Text classification ===


@pytest.mark.slow
def test_text_classification_from_a_folder_of_csv_trains_saves_exports_and_serves(tmp_path):
    from keras_attn.export import export_text_classifier
    from keras_attn.models import BertSequenceClassifier

    folder = tmp_path / "reviews"
    folder.mkdir()
    write_csv(folder / "train.csv", ["text", "label"], SENTENCES)
    write_csv(folder / "test.csv", ["text", "label"], SENTENCES[:4])
    loaded = data.load_text_classification_files(str(folder), vocabulary_size=120,
                                                 sequence_length=16, batch_size=4, seed=0)
    assert loaded.class_names == ["bad", "good"]  # names sorted: ids 0, 1
    assert loaded.examples == {"train": 12, "test": 4}
    assert loaded.validation is None
    assert loaded.vocabulary[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    x, y = next(iter(loaded.test))
    assert x["token_ids"].shape == (4, 16) and list(y.numpy()) == [1, 0, 1, 0]

    keras.utils.set_random_seed(0)
    classifier = BertSequenceClassifier(tiny_bert(len(loaded.vocabulary), 16), num_classes=2)
    trains_and_reloads(classifier, loaded.train, next(iter(loaded.test)),
                       tmp_path / "classifier.keras", epochs=4)

    exported = export_text_classifier(classifier, loaded.tokenizer, str(tmp_path / "served"),
                                      sequence_length=16)
    # Served from the SavedModel with this tokenizer learned from the files.
    # Loaded here: a fresh process with TensorFlow alone (tensorflow-text,
    # Keras and keras-hub not importable) loads and serves what
    # export_text_classifier writes in tests/export/test_text_classifier.py
    # (test_two_signatures_reload_in_a_fresh_process); a TensorFlow start-up less.
    loaded_model = tf.saved_model.load(exported)
    served = loaded_model.serve(tf.constant(["a great story", "dull and tired"])).numpy()
    packed = data.classification_dataset(["a great story", "dull and tired"], [0, 0],
                                         loaded.tokenizer, sequence_length=16, batch_size=2)
    expected = keras.ops.softmax(classifier.predict(next(iter(packed))[0], verbose=0))
    np.testing.assert_allclose(served, np.asarray(expected), atol=1e-5)


def test_text_classification_holds_out_a_seeded_validation_share(tmp_path):
    path = write_jsonl(tmp_path / "reviews.jsonl",
                       [{"text": t, "label": int(l == "good")} for t, l in SENTENCES])
    first = data.load_text_classification_files(path, vocabulary_size=100, sequence_length=16,
                                                batch_size=32, validation_fraction=0.25)
    again = data.load_text_classification_files(path, vocabulary_size=100, sequence_length=16,
                                                batch_size=32, validation_fraction=0.25)
    assert first.examples == {"train": 9, "validation": 3}
    assert first.class_names == ["0", "1"]  # integer labels are the ids
    ids = [next(iter(d.validation))[0]["token_ids"].numpy() for d in (first, again)]
    np.testing.assert_array_equal(ids[0], ids[1])


def test_class_names_fix_the_label_order_and_refuse_other_labels():
    # As Keras's image_dataset_from_directory(class_names=...): the model's
    # order, not the sorted labels; a label outside it is refused by place.
    labels = {"train": ["pets", "film", "speed", "film"], "validation": ["speed"], "test": None}
    ids, names = files.label_ids(labels, "topics.csv", class_names=["speed", "film", "pets"])
    assert names == ["speed", "film", "pets"]
    assert ids["train"].tolist() == [2, 1, 0, 1] and ids["validation"].tolist() == [0]
    assert files.label_ids({"train": [2, 0]}, "t.csv", class_names=["a", "b", "c"])[0][
        "train"].tolist() == [2, 0]  # integer labels index the names
    with pytest.raises(files.DataFileError, match=r"validation example 1: the label 'sport' is "
                                                  r"not one of class_names=\['film'\]"):
        files.label_ids({"train": ["film"], "validation": ["sport"]}, "t.csv",
                        class_names=["film"])
    for bad in ([], ["a", "a"], "film", [1]):
        with pytest.raises(ValueError, match=r"`class_names`.*Received: class_names="):
            files.label_ids({"train": ["a"]}, "t.csv", class_names=bad)


def test_a_hugging_face_style_tokenizer_is_used_as_given(tmp_path):
    path = write_csv(tmp_path / "reviews.csv", ["text", "label"], SENTENCES)
    own = data.load_text_classification_files(path, vocabulary_size=80, sequence_length=16)
    given = data.load_text_classification_files(path, tokenizer=own.tokenizer,
                                                sequence_length=16)
    assert given.tokenizer is own.tokenizer and given.vocabulary == own.vocabulary


# === Any Hugging Face tokenizer (issue 70) ===

# A RoBERTa model reads all three inputs (segment ids 0, one row), a
# ModernBERT one no segment ids.
TEXT_PAIRS = [("the cat sat on the great mat, I loved it", "a dull fox", "good"),
         ("a dull fox", "the quick brown fox jumps over the lazy dog again", "bad"),
         ("great", "wonderful acting", "good"),
         ("the lazy dog jumps over the quick brown fox and the cat", "dull", "bad")] * 3


def hf_model(kind, vocabulary_size, sequence_length):
    """The tiny classifier of `kind`'s family: BERT's (BERT), RoBERTa's
    (RoBERTa, XLM-R: a BERT backbone with padding_id 1 and one segment
    row), ModernBERT's."""
    from keras_attn.models import BertSequenceClassifier

    size = dict(vocabulary_size=vocabulary_size, max_sequence_length=sequence_length)
    if kind == "modernbert":
        return FAMILIES["modernbert"].build(**size, pad_id=3, dropout=0.0)
    extra = {} if kind == "bert" else dict(padding_id=1, num_segments=1)
    backbone = FAMILIES["bert"].backbone(num_layers=1, **size, **extra)
    return BertSequenceClassifier(backbone, num_classes=2)


def rows(x, names):
    """The rows of a batch's inputs `names`, side by side, sorted (the
    training batches are shuffled)."""
    return sorted(map(tuple, np.concatenate([np.asarray(x[name]) for name in names], 1)))


@pytest.mark.parametrize("kind", ["bert", "roberta", "modernbert", "xlm_roberta"])
def test_any_hf_tokenizer_gives_transformers_ids_and_the_inputs_the_model_reads(tmp_path, kind):
    import transformers
    from _hf_tokenizers import save_tokenizer

    from keras_attn.convert import load_hf_tokenizer

    directory = save_tokenizer(tmp_path, kind)
    tokenizer = load_hf_tokenizer(directory)
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    length = 12  # pairs cut both ways (transformers' longest first), single texts too
    model = hf_model(kind, int(tokenizer.vocabulary_size()), length)
    path = write_csv(tmp_path / "pairs.csv", ["text", "second", "label"], TEXT_PAIRS)
    loaded = data.load_text_classification_files(
        path, tokenizer=tokenizer, sequence_length=length, batch_size=len(TEXT_PAIRS),
        second_text_field="second", model=model)
    # Seeding between loading and the first pass cleared TensorFlow's eager
    # kernels, and XLM-R's SentencePiece resource with them ("Resource ...
    # SentencepieceOp does not exist" at the first batch): the loader
    # tokenizes before it returns.
    keras.utils.set_random_seed(0)
    x, _ = next(iter(loaded.train))
    assert sorted(x) == sorted(model.input)
    names = {"token_ids": "input_ids", "padding_mask": "attention_mask",
             "segment_ids": "token_type_ids"}
    for second in ([b for _, b, _ in TEXT_PAIRS], None):
        expected = theirs([a for a, _, _ in TEXT_PAIRS], second, truncation=True,
                          max_length=length, padding="max_length", return_token_type_ids=True)
        assert rows(x, list(x)) == rows({k: expected[names[k]] for k in x}, list(x))
        # Single texts, packed as the loader packs them.
        x = dict(zip(data.text.INPUTS, data.text.pack_pairs(tokenizer, length, "longest_first")(
            tf.constant([a for a, _, _ in TEXT_PAIRS]))))
        x = {name: x[name] for name in model.input}
    if kind in ("roberta", "modernbert"):  # the model trains on what the loader gives
        model.compile(optimizer=keras.optimizers.Adam(1e-3))
        history = model.fit(loaded.train, epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"][0])


class CountingTokenizer:
    """A tokenizer that counts the texts it tokenizes, in the graph (a
    tf.data map traces the Python call once)."""

    def __init__(self, inner):
        self.inner = inner
        self.texts = tf.Variable(0, dtype=tf.int64)

    def __call__(self, texts):
        texts = tf.convert_to_tensor(texts)
        with tf.control_dependencies([self.texts.assign_add(tf.size(texts, tf.int64))]):
            return self.inner(tf.identity(texts))

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_texts_are_tokenized_once_and_shuffled_at_every_epoch(tmp_path):
    path = write_csv(tmp_path / "reviews.csv", ["text", "label"], SENTENCES)
    own = data.load_text_classification_files(path, vocabulary_size=80, sequence_length=16)
    counting = CountingTokenizer(own.tokenizer)
    loaded = data.load_text_classification_files(path, tokenizer=counting, sequence_length=16,
                                                 batch_size=4, seed=0)
    epochs = [np.concatenate([x["token_ids"].numpy() for x, _ in loaded.train])
              for _ in range(2)]
    assert int(counting.texts.numpy()) == len(SENTENCES)  # once, not once an epoch
    assert sorted(map(tuple, epochs[0])) == sorted(map(tuple, epochs[1]))
    assert not np.array_equal(epochs[0], epochs[1])  # a new order each epoch
    # The order of the examples is that of the shuffle of the raw rows.
    order = list(tf.data.Dataset.range(len(SENTENCES)).shuffle(len(SENTENCES), seed=0)
                 .as_numpy_iterator())
    unshuffled = next(iter(data.classification_dataset(
        [t for t, _ in SENTENCES], [0] * len(SENTENCES), own.tokenizer, sequence_length=16,
        batch_size=len(SENTENCES))))[0]["token_ids"].numpy()
    np.testing.assert_array_equal(epochs[0], unshuffled[order])


def test_a_model_with_other_inputs_is_refused_naming_them(tmp_path):
    path = write_csv(tmp_path / "reviews.csv", ["text", "label"], SENTENCES)
    with pytest.raises(ValueError, match=r"Invalid value for argument `model`.*Received: "
                                         r"model=.* with inputs \['images'\]"):
        images = keras.Input((4,), name="images")
        model = keras.Model(images, keras.layers.Dense(2)(images))
        data.load_text_classification_files(path, vocabulary_size=80, model=model)


# === Token classification ===

TAGGED = [(["John", "lives", "in", "Paris"], ["B-PER", "O", "O", "B-LOC"]),
          (["Mary", "visited", "Berlin", "yesterday"], ["B-PER", "O", "B-LOC", "O"]),
          (["Paris", "is", "lovely"], ["B-LOC", "O", "O"]),
          (["Anna", "met", "John", "in", "Rome"], ["B-PER", "O", "B-PER", "O", "B-LOC"])] * 3


def test_word_labels_go_to_the_first_word_piece_and_the_rest_weigh_nothing():
    vocabulary = data.train_wordpiece_vocabulary(["unbelievable things", "a b"], 40)
    tokenizer = data.make_tokenizer(vocabulary)
    words = [["unbelievable", "a"]]
    pieces = [[int(i) for i in row] for row in tokenizer(tf.constant(words[0]))]
    assert len(pieces[0]) > 1  # the long word is split: the case that matters
    x, labels, weights = next(iter(data.token_classification_dataset(
        words, [[5, 7]], tokenizer, sequence_length=32, batch_size=1)))
    n = len(pieces[0])
    ids = x["token_ids"].numpy()[0]
    assert list(ids[1:1 + n]) == pieces[0] and ids[0] == vocabulary.index("[CLS]")
    # [CLS], the first piece (5), the rest of the word (ignored), "a" (7), [SEP], padding.
    assert list(labels.numpy()[0][: n + 3]) == [0, 5] + [0] * (n - 1) + [7, 0]
    assert list(weights.numpy()[0]) == [0, 1] + [0] * (n - 1) + [1] + [0] * (30 - n)


@pytest.mark.slow
def test_token_classification_from_jsonl_trains_saves_and_reloads(tmp_path):
    from keras_attn.models import BertTokenClassifier

    path = write_jsonl(tmp_path / "tags.jsonl",
                       [{"tokens": w, "tags": t} for w, t in TAGGED])
    loaded = data.load_token_classification_files(path, vocabulary_size=80,
                                                  sequence_length=12, batch_size=4)
    assert loaded.class_names == ["B-LOC", "B-PER", "O"]
    x, tags, weights = next(iter(loaded.train))
    assert weights.shape == tags.shape == x["token_ids"].shape == (4, 12)

    keras.utils.set_random_seed(0)
    tagger = BertTokenClassifier(tiny_bert(len(loaded.vocabulary), 12), num_classes=3)
    trains_and_reloads(tagger, loaded.train, next(iter(loaded.train)),
                       tmp_path / "tagger.keras", epochs=4)


def test_token_classification_reads_csv_with_space_separated_words_and_tags(tmp_path):
    path = write_csv(tmp_path / "tags.csv", ["tokens", "tags"],
                     [(" ".join(w), " ".join(t)) for w, t in TAGGED])
    loaded = data.load_token_classification_files(path, vocabulary_size=80,
                                                  sequence_length=32, batch_size=12)
    _, _, weights = next(iter(loaded.train))
    # One weighted position per word: the loss counts words, not pieces.
    assert int(weights.numpy().sum()) == sum(len(w) for w, _ in TAGGED)


# === Images ===


def write_images(folder, count=6, size=12):
    rng = np.random.default_rng(0)
    for label, brightness in (("dark", 40), ("light", 215)):
        os.makedirs(folder / label, exist_ok=True)
        for i in range(count):
            pixels = np.clip(rng.normal(brightness, 20, (size, size, 3)), 0, 255)
            keras.utils.save_img(str(folder / label / f"{i}.png"), pixels.astype("uint8"))


def test_image_folder_trains_saves_and_reloads(tmp_path):
    write_images(tmp_path / "photos")
    loaded = data.load_image_files(str(tmp_path / "photos"), image_size=8, batch_size=4,
                                   validation_fraction=0.25, seed=0)
    assert loaded.class_names == ["dark", "light"]
    assert loaded.examples == {"train": 9, "validation": 3}
    images, labels = next(iter(loaded.validation))
    assert images.shape[1:] == (8, 8, 3) and float(tf.reduce_max(images)) > 100

    keras.utils.set_random_seed(0)
    model = FAMILIES["vit"].build(image_size=8, num_classes=2, num_layers=1)
    trains_and_reloads(model, loaded.train, next(iter(loaded.validation)),
                       tmp_path / "vit.keras", epochs=3)


def test_image_split_folders_keep_the_training_class_ids(tmp_path):
    write_images(tmp_path / "photos" / "train", count=2)
    os.makedirs(tmp_path / "photos" / "test" / "light")
    keras.utils.save_img(str(tmp_path / "photos" / "test" / "light" / "0.png"),
                         np.full((5, 7, 3), 200, "uint8"))
    loaded = data.load_image_files(str(tmp_path / "photos"), image_size=6, num_channels=1)
    images, labels = next(iter(loaded.test))
    assert images.shape == (1, 6, 6, 1) and labels.numpy().tolist() == [1]  # "light" is 1


# === Speech ===


@pytest.mark.slow
def test_speech_table_of_wav_files_trains_saves_and_reloads(tmp_path):
    from scipy.io import wavfile

    rng = np.random.default_rng(0)
    rows = []
    for i, words in enumerate(["yes", "no", "yes no", "no yes"] * 3):
        # 8 kHz: resampled to 16 kHz (stereo is refused, not averaged).
        audio = (rng.normal(0, 0.1, 2000 * len(words.split())) * 32767).astype("int16")
        wavfile.write(str(tmp_path / f"clip{i}.wav"), 8000, audio)
        rows.append({"audio": f"clip{i}.wav", "text": words})
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    loaded = data.load_speech_files(path, batch_size=4)
    assert loaded.vocabulary == list(" enosy")
    inputs, labels = next(iter(loaded.train))
    lengths = sorted(int(n) for n in inputs["waveform_length"])
    assert set(lengths) <= {4000, 8000}  # 0.25 s at 8 kHz is 4,000 samples at 16 kHz

    keras.utils.set_random_seed(0)
    model = FAMILIES["conformer"].build(vocabulary_size=len(loaded.vocabulary) + 1, num_layers=1)
    trains_and_reloads(model, loaded.train, next(iter(loaded.train)),
                       tmp_path / "conformer.keras", epochs=3)


# === Translation ===

PAIRS = [{"en": "one cat", "fr": "un chat"}, {"en": "two cats", "fr": "deux chats"},
         {"en": "one dog", "fr": "un chien"}, {"en": "two dogs", "fr": "deux chiens"}] * 3


@pytest.mark.slow
def test_translation_pairs_train_save_and_reload(tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", PAIRS)
    loaded = data.load_translation_files(path, vocabulary_size=60, batch_size=4,
                                         source_field="en", target_field="fr")
    assert loaded.vocabulary[:4] == ["[PAD]", "[START]", "[END]", "[UNK]"]
    keras.utils.set_random_seed(0)
    model = FAMILIES["transformer"].build(vocabulary_size=len(loaded.vocabulary))
    trains_and_reloads(model, loaded.train, next(iter(loaded.train)),
                       tmp_path / "transformer.keras", epochs=3)


# === Bad files, refused by name ===


@pytest.mark.parametrize("write, message", [
    (lambda p: str(p / "missing.csv"), "No file or folder"),
    (lambda p: write_csv(p / "empty.csv", ["text", "label"], []), "holds no examples"),
    (lambda p: write_csv(p / "x.csv", ["sentence", "label"], [("a", 1)]), "has no column"),
    (lambda p: write_jsonl(p / "x.jsonl", [{"text": "a"}]), "line 1 has no field"),
    (lambda p: write_csv(p / "x.txt", ["text", "label"], [("a", 1)]), "CSV or JSON Lines"),
    (lambda p: str(p), "needs train.csv or train.jsonl"),
])
def test_bad_tables_are_refused_naming_the_path(tmp_path, write, message):
    path = write(tmp_path)
    with pytest.raises(ValueError, match=message) as error:
        data.load_text_classification_files(path)
    assert str(error.value).endswith(f"Received: path={path!r}")


def test_a_test_label_unknown_to_training_is_refused(tmp_path):
    write_csv(tmp_path / "train.csv", ["text", "label"], SENTENCES)
    write_csv(tmp_path / "test.csv", ["text", "label"], [("so so", "meh")])
    with pytest.raises(ValueError, match=r"labels the training set does not have: \['meh'\]"):
        data.load_text_classification_files(str(tmp_path))


def test_a_tag_count_unlike_the_word_count_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "tags.jsonl", [{"tokens": ["a", "b"], "tags": ["O"]}])
    with pytest.raises(ValueError, match="2 words and 1 tags"):
        data.load_token_classification_files(path)


def test_an_image_folder_without_class_folders_or_images_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no class sub-folder"):
        data.load_image_files(str(tmp_path), image_size=8)
    os.makedirs(tmp_path / "cats")
    with pytest.raises(ValueError, match="hold no image"):
        data.load_image_files(str(tmp_path), image_size=8)


def test_a_missing_audio_file_is_refused(tmp_path):
    path = write_csv(tmp_path / "train.csv", ["audio", "text"], [("nowhere.wav", "yes")])
    with pytest.raises(ValueError, match="no audio file"):
        data.load_speech_files(path)


def test_check_table_files_reads_only_the_first_row(tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", [{"en": "a", "fr": "b"}])
    with open(path, "a") as handle:
        handle.write("not json\n")  # found when the data loads, not by the quick check
    assert files.check_table_files(path, ["en", "fr"])["train"] == path
    with pytest.raises(ValueError, match="line 2: not JSON"):
        data.load_translation_files(path, source_field="en", target_field="fr")


# === No silent wrong answer: each refusal names the file, the line and the value ===


def refused(match, load, *args, **kwargs):
    """The `DataFileError` (a `ValueError`) that `load(*args, **kwargs)`
    raises, its message matching `match`."""
    from keras_attn.errors import DataFileError

    with pytest.raises(DataFileError, match=match) as error:
        load(*args, **kwargs)
    return str(error.value)


def test_an_integer_label_the_training_set_lacks_is_refused_naming_file_and_line(tmp_path):
    write_csv(tmp_path / "train.csv", ["text", "label"], [("a", 0), ("b", 1), ("c", 2)])
    write_csv(tmp_path / "test.csv", ["text", "label"], [("d", 1), ("e", 5)])
    refused(r"test set has labels the training set does not have: \[5\] "
            r"\(first: .*test\.csv, line 3\)", data.load_text_classification_files,
            str(tmp_path))


@pytest.mark.parametrize("label", [-1, "-1"])
def test_a_negative_integer_label_is_refused(tmp_path, label):
    path = write_jsonl(tmp_path / "x.jsonl", [{"text": "a", "label": 0},
                                             {"text": "b", "label": label}])
    refused(r"x\.jsonl, line 2: .*negative.*Received: label=-1",
            data.load_text_classification_files, path)


@pytest.mark.parametrize("line", ["hello, world,good", "hello"])
def test_a_csv_row_with_more_or_fewer_values_than_the_header_is_refused(tmp_path, line):
    (tmp_path / "x.csv").write_text(f"text,label\nfine,bad\n{line}\n", encoding="utf-8")
    refused(r"x\.csv, line 3: .* values; the header has 2 columns",
            data.load_text_classification_files, str(tmp_path / "x.csv"))


@pytest.mark.parametrize("row, match", [
    ({"text": None, "label": "good"}, r"line 1: field `text` is null.*Received: text=None"),
    ({"text": 42, "label": "good"}, r"line 1: field `text` must be a string.*text=42"),
    ({"text": "a", "label": float("nan")}, r"line 1: field `label` is NaN"),
    ({"text": "a", "label": float("inf")}, r"line 1: field `label` is infinite"),
    ({"text": "a", "label": True}, r"line 1: field `label` .*true.*Received: label=True"),
    ({"text": "a", "label": 1.5}, r"line 1: field `label` .*Received: label=1.5"),
    ({"text": "a", "label": None}, r"line 1: field `label` is null"),
])
def test_null_nan_and_values_of_the_wrong_kind_are_refused(tmp_path, row, match):
    with open(tmp_path / "x.jsonl", "w", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")  # json.dumps writes NaN and Infinity as Python does
    refused(r"x\.jsonl, " + match, data.load_text_classification_files,
            str(tmp_path / "x.jsonl"))


def test_a_null_translation_target_and_a_null_tag_are_refused(tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", [{"en": "one", "fr": "un"},
                                                 {"en": "two", "fr": None}])
    refused(r"pairs\.jsonl, line 2: field `fr` is null", data.load_translation_files, path,
            source_field="en", target_field="fr")
    path = write_jsonl(tmp_path / "tags.jsonl", [{"tokens": ["a", "b"], "tags": ["O", None]}])
    refused(r"tags\.jsonl, line 1: field `tags` .*null", data.load_token_classification_files,
            path)


def test_a_file_that_is_not_utf8_is_refused_naming_file_and_line(tmp_path):
    (tmp_path / "x.csv").write_bytes("text,label\nfine,good\ncaf\u00e9,bad\n".encode("latin-1"))
    refused(r"x\.csv, line 3: .*not UTF-8", data.load_text_classification_files,
            str(tmp_path / "x.csv"))
    (tmp_path / "x.jsonl").write_bytes('{"text": "caf\u00e9", "label": 1}\n'.encode("latin-1"))
    refused(r"x\.jsonl, line 1: .*not UTF-8", data.load_text_classification_files,
            str(tmp_path / "x.jsonl"))
    # UTF-8 with a byte-order mark first (Excel's "CSV UTF-8") is UTF-8.
    (tmp_path / "bom.csv").write_bytes("\ufefftext,label\ncaf\u00e9,good\n".encode("utf-8"))
    assert files.read_table(str(tmp_path / "bom.csv"), ["text", "label"]) == [
        {"text": "caf\u00e9", "label": "good"}]


def test_an_empty_class_folder_is_refused_naming_it(tmp_path):
    write_images(tmp_path / "photos", count=1, size=4)
    os.makedirs(tmp_path / "photos" / "empty")
    message = refused(r"photos/empty holds no image", data.load_image_files,
                      str(tmp_path / "photos"), image_size=4)
    assert "dark" not in message


def test_an_image_that_does_not_decode_is_refused_when_the_data_loads(tmp_path):
    write_images(tmp_path / "photos", count=1, size=4)
    good = (tmp_path / "photos" / "dark" / "0.png").read_bytes()
    (tmp_path / "photos" / "dark" / "cut.png").write_bytes(good[: len(good) // 2])
    refused(r"photos/dark/cut\.png does not decode", data.load_image_files,
            str(tmp_path / "photos"), image_size=4)


def test_apple_double_files_are_skipped_and_a_gif_named_jpg_is_read(tmp_path):
    from PIL import Image

    write_images(tmp_path / "photos", count=1, size=4)
    # macOS's metadata beside an image on a non-Mac disk: not an image.
    (tmp_path / "photos" / "dark" / "._0.png").write_bytes(b"\x00\x05\x16\x07" + b"\x00" * 60)
    Image.fromarray(np.full((4, 4, 3), 200, "uint8")).save(
        tmp_path / "photos" / "light" / "1.jpg", format="GIF")
    loaded = data.load_image_files(str(tmp_path / "photos"), image_size=4, num_channels=1)
    assert loaded.examples == {"train": 3}
    images, labels = next(iter(loaded.train))
    assert images.shape == (3, 4, 4, 1)


def write_wav(path, samples, rate=16000, channels=1):
    from scipy.io import wavfile

    wavfile.write(str(path), rate, np.asarray(samples, "int16").reshape(
        (-1, channels) if channels > 1 else (-1,)))
    return str(path)


@pytest.mark.parametrize("samples, channels, rate, match", [
    (np.ones(200), 2, 16000, r"bad\.wav has 2 channels"),  # out of phase, a mix is silence
    (np.zeros(0), 1, 16000, r"bad\.wav holds no samples"),
    (np.ones(200), 1, 1, r"bad\.wav has a sample rate of 1 Hz"),
])
def test_stereo_empty_and_odd_rate_wav_files_are_refused_naming_them(tmp_path, samples,
                                                                       channels, rate, match):
    write_wav(tmp_path / "bad.wav", samples, rate, channels)
    path = write_csv(tmp_path / "train.csv", ["audio", "text"], [("bad.wav", "yes")])
    message = refused(match, data.load_speech_files, path)
    assert "train.csv, line 2" in message


def test_a_clip_too_short_for_its_transcript_is_refused_naming_it(tmp_path):
    from keras_attn.layers.conv_subsampling import subsampled_length
    from keras_attn.models.conformer.conformer_model import ctc_frames_needed

    # 1,600 samples: 11 log-mel frames, 2 after the 4x subsampling; "aa" needs
    # 3 (a blank between the repeated a's), "ab" 2. It used to load, and
    # training stopped at step 1 on a NaN loss naming no file.
    write_wav(tmp_path / "long.wav", np.ones(16000))
    write_wav(tmp_path / "short.wav", np.ones(1600))
    assert files.ctc_frames(1600, 160) == int(subsampled_length(1 + 1600 // 160)) == 2
    assert files.ctc_frames_needed_by("aa") == int(ctc_frames_needed(np.array([[1, 1]]))[0])
    write_csv(tmp_path / "train.csv", ["audio", "text"], [("long.wav", "aa"), ("short.wav", "ab")])
    write_csv(tmp_path / "test.csv", ["audio", "text"], [("long.wav", "ab"), ("short.wav", "aa")])
    message = refused(r"test\.csv, line 3: .*short\.wav is too short for its transcript: its "
                      r"1600 samples at 16000 Hz give 2 CTC frame\(s\).*CTC needs 3 to emit "
                      r"'aa'", data.load_speech_files, str(tmp_path))
    assert "Received: path=" in message and "1600 samples" in message
    # At the frame step of the model the clips are for (5 ms), it is long enough.
    assert data.load_speech_files(str(tmp_path), frame_step=80).examples == {"train": 2,
                                                                              "test": 2}
    with pytest.raises(ValueError, match=r"`frame_step`.*Received: frame_step=0"):
        data.load_speech_files(str(tmp_path), frame_step=0)
    # The model's own config counts its frames (a FastConformer's 8x): refused
    # at the default 4x count above, and a model_config that is not one is named.
    from keras_attn.models.conformer import get_conformer_config

    fast = get_conformer_config("conformer_tiny", subsampling="fast")
    refused(r"short\.wav is too short.*its 8x subsampling", data.load_speech_files,
            str(tmp_path), model_config=fast)
    with pytest.raises(ValueError, match=r"`model_config`: a ConformerConfig.*"
                                         r"Received: model_config=dict"):
        data.load_speech_files(str(tmp_path), model_config={"subsampling": "fast"})


def test_resampled_audio_stays_in_the_range_the_models_take(tmp_path):
    # A near full-scale square wave at 22,050 Hz: the polyphase filter rang
    # to 1.22 at 16 kHz, which the front ends (offline and streaming) refuse.
    square = np.sign(np.sin(np.arange(4410) * 2 * np.pi * 441 / 22050)) * 32767
    samples = files.read_wav(write_wav(tmp_path / "square.wav", square, rate=22050))
    assert len(samples) == 3200 and np.abs(samples).max() <= 1.0
    assert np.abs(samples).max() > 0.99


def write_riff(path, fmt, data, after=b""):
    """A RIFF/WAVE file of a `fmt ` chunk's bytes, then a `data` chunk, then
    `after` (more chunks)."""
    body = (b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
            + b"data" + struct.pack("<I", len(data)) + data + after)
    Path(path).write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    return str(path)


def extensible_fmt(sub_format, bits=16, valid_bits=None):
    """A WAVE_FORMAT_EXTENSIBLE `fmt ` chunk (mono, 16 kHz) whose sub-format
    GUID carries the format tag `sub_format`."""
    guid = struct.pack("<H", sub_format) + bytes.fromhex("000000001000800000aa00389b71")
    width = bits // 8
    return struct.pack("<HHIIHHHHI", 0xFFFE, 1, 16000, 16000 * width, width, bits, 22,
                       valid_bits or bits, 4) + guid


def test_wave_format_extensible_pcm_is_read_and_other_sub_formats_named(tmp_path):
    # What SoX and many recorders write past 16 bits: the PCM sub-format is
    # read as plain PCM; the standard library's `wave` refused it (3.11).
    plain = write_wav(tmp_path / "plain.wav", np.arange(-300, 300, 7))
    expected = files.read_wav(plain)
    ints = np.arange(-300, 300, 7).astype("<i2").tobytes()
    same = write_riff(tmp_path / "ext.wav", extensible_fmt(1), ints)
    np.testing.assert_array_equal(files.read_wav(same), expected)
    # 24 valid bits in a 32-bit container sit in its top bytes.
    wide = (np.arange(-300, 300, 7).astype("<i4") << 16).tobytes()
    np.testing.assert_array_equal(
        files.read_wav(write_riff(tmp_path / "ext32.wav", extensible_fmt(1, 32, 24), wide)),
        expected)
    write_riff(tmp_path / "float.wav", extensible_fmt(3, 32), np.zeros(8, "<f4").tobytes())
    write_riff(tmp_path / "alaw.wav", extensible_fmt(6, 8), bytes(8))
    write_riff(tmp_path / "guid.wav", extensible_fmt(1)[:-14] + bytes(14), bytes(8))
    write_csv(tmp_path / "train.csv", ["audio", "text"], [("float.wav", "yes")])
    for name, match in [
        ("float.wav", r"float\.wav is not a readable PCM WAV file \(its samples are "
                      r"WAVE_FORMAT_EXTENSIBLE sub-format IEEE float \(format tag 0x0003\)"),
        ("alaw.wav", r"alaw\.wav is not a readable PCM WAV file.*A-law"),
        ("guid.wav", r"guid\.wav is not a readable PCM WAV file \(a WAVE_FORMAT_EXTENSIBLE "
                     r"sub-format GUID that is not a format tag"),
    ]:
        refused(match, files.read_wav, str(tmp_path / name))
    message = refused(r"float\.wav.*IEEE float", data.load_speech_files,
                      str(tmp_path / "train.csv"))
    assert "train.csv, line 2" in message


def test_an_empty_data_chunk_is_an_empty_clip_not_a_damaged_file(tmp_path):
    fmt = struct.pack("<HHIIHH", 1, 1, 16000, 32000, 2, 16)
    # An empty `data` chunk followed by a LIST chunk, and one at the file's end.
    write_riff(tmp_path / "list.wav", fmt, b"", b"LIST" + struct.pack("<I", 4) + b"INFO")
    write_riff(tmp_path / "end.wav", fmt, b"")
    write_riff(tmp_path / "ext.wav", extensible_fmt(1), b"")
    for name in ("list.wav", "end.wav", "ext.wav"):
        message = refused(rf"{name.replace('.', '[.]')} holds no samples \(an empty clip",
                          files.read_wav, str(tmp_path / name))
        assert "not a readable" not in message


def test_a_wav_file_cut_short_is_refused_by_both_readers(tmp_path):
    from keras_attn.zoo.transcribe import read_wav

    write_wav(tmp_path / "whole.wav", np.arange(1000))
    whole = (tmp_path / "whole.wav").read_bytes()
    (tmp_path / "cut.wav").write_bytes(whole[:-500])  # its header says 1,000 samples
    refused(r"cut\.wav is cut short: its header says 1000 samples, it holds 750",
            files.read_wav, str(tmp_path / "cut.wav"))
    refused(r"cut\.wav is cut short", read_wav, str(tmp_path / "cut.wav"))
