"""A Hugging Face text checkpoint with its tokenizer, to a served model:
`load_hf(directory, class_names=...)`, fine-tuned on a CSV with the
directory's own tokenizer (`load_hf_tokenizer`), exported with its class
names and `tokenizer.json`, served on raw strings by
`TextClassifierArtifact` in a process without TensorFlow or Keras, and by
the SavedModel's string signature: the Keras model's answers each time."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.tf_only

LABELS = ["speed", "film", "pets"]  # the model's order, not sorted
ROWS = [("a great film and a great story", "film"), ("dull and far too long", "film"),
        ("the cat sat on the mat", "pets"), ("wonderful acting, I loved it", "film"),
        ("the quick brown fox jumps over the lazy dog", "speed"), ("a cat and a dog", "pets")]
TEXTS = ["the cat sat on the mat", "a great film", "The QUICK fox!! 🙂", "", "dull " * 30]
LENGTH = 16

SERVE = r"""
import json, sys
from keras_attn.export import TextClassifierArtifact
classifier = TextClassifierArtifact(sys.argv[1])
answer = classifier(json.loads(sys.argv[2]))
loaded = sorted(m for m in ("tensorflow", "keras", "keras_hub") if m in sys.modules)
print(json.dumps({"probabilities": answer["probabilities"].tolist(),
                  "label": answer["label"], "loaded": loaded}))
"""


def _checkpoint(tmp_path, kind):
    """A tiny random masked LM of `kind` (XLM-R) saved by transformers,
    beside the tiny tokenizer of its kind (tests/_hf_tokenizers.py)."""
    import transformers
    from _hf_tokenizers import save_tokenizer

    directory = save_tokenizer(tmp_path, kind)
    vocabulary = len(transformers.AutoTokenizer.from_pretrained(directory))
    sizes = dict(vocab_size=vocabulary, hidden_size=8, num_hidden_layers=1,
                 num_attention_heads=2, intermediate_size=12)
    # SentencePiece ids, padding id 1, positions from 2; weights drawn wide
    # enough that [CLS] after one layer depends on the text (at
    # transformers' 0.02 every text got the same answer to 1e-6).
    config = transformers.XLMRobertaConfig(**sizes, max_position_embeddings=LENGTH + 2,
                                           type_vocab_size=1, pad_token_id=1,
                                           initializer_range=0.5)
    model = transformers.XLMRobertaForMaskedLM(config)
    model.save_pretrained(directory)
    return directory


# XLM-R's SentencePiece: keras-hub's tokenizer in training and in the
# SavedModel, the tokenizers package's Unigram from tokenizer.json in the
# server. A ModernBERT's byte-level BPE takes the same path through the zoo
# (tests/zoo/test_hf_text_pretrained.py: ONNX and SavedModel on raw strings
# against transformers' ids) and docs/hf_text.md.
@pytest.mark.large
@pytest.mark.parametrize("kind", ["xlm_roberta"])
def test_a_checkpoint_fine_tuned_on_a_csv_exports_and_serves_raw_strings(tmp_path, kind):
    import keras
    import tensorflow as tf

    from keras_attn.convert import load_hf
    from keras_attn.convert import load_hf_tokenizer
    from keras_attn.data import load_text_classification_files
    from keras_attn.data.text import pack_pairs
    from keras_attn.export import export_text_classifier

    directory = _checkpoint(tmp_path, kind)
    csv = tmp_path / "topics.csv"
    csv.write_text("text,label\n" + "".join(f'"{t}",{label}\n' for t, label in ROWS * 4))

    # The ten lines a user writes.
    model = load_hf(directory, class_names=LABELS)
    tokenizer = load_hf_tokenizer(directory)
    data = load_text_classification_files(str(csv), tokenizer=tokenizer, model=model,
                                          sequence_length=LENGTH, batch_size=8,
                                          class_names=model.class_names)
    assert data.class_names == LABELS
    keras.utils.set_random_seed(0)
    model.compile(optimizer=keras.optimizers.Adam(3e-3))
    history = model.fit(data.train, epochs=4, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < losses[0], losses  # it learns from the user's rows
    onnx = export_text_classifier(model, tokenizer, tmp_path / "onnx", sequence_length=LENGTH,
                                  format="onnx", class_names=model.class_names)
    assert {"model.onnx", "serving.json", "tokenizer.json"} <= set(os.listdir(onnx))

    # The Keras model's answers on the texts packed as the loader packs them.
    packed = dict(zip(("token_ids", "segment_ids", "padding_mask"),
                      pack_pairs(tokenizer, LENGTH)(tf.constant(TEXTS))))
    expected = keras.ops.convert_to_numpy(keras.ops.softmax(
        model({name: packed[name] for name in model.input}, training=False)))
    assert np.ptp(expected, axis=0).max() > 1e-4  # the texts get different answers

    # Served without TensorFlow or Keras: the tokenizers package and onnxruntime.
    result = subprocess.run([sys.executable, "-c", SERVE, onnx, json.dumps(TEXTS)],
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "KERAS_BACKEND": "jax"})
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    assert served["loaded"] == []
    np.testing.assert_allclose(served["probabilities"], expected, atol=2e-5)
    assert served["label"] == [LABELS[i] for i in expected.argmax(-1)]

    # The SavedModel: raw strings through keras-hub's tokenizer in the graph.
    import tensorflow_text  # noqa: F401  (the SentencePiece ops)

    saved = export_text_classifier(model, tokenizer, tmp_path / "saved",
                                   sequence_length=LENGTH, class_names=model.class_names)
    assets = os.path.join(saved, "assets")
    assert open(os.path.join(assets, "labels.txt")).read().split() == LABELS
    with open(os.path.join(assets, "tokenizer.json")) as stream:
        assert json.load(stream)["model"]["type"] == "Unigram"
    loaded = tf.saved_model.load(saved)
    np.testing.assert_allclose(loaded.serve(tf.constant(TEXTS)).numpy(), expected,
                               atol=1e-5)
    named = loaded.signatures["serving_default"](text=tf.constant(TEXTS))
    assert [x.decode() for x in named["label"].numpy()] == served["label"]


def test_a_tokenizer_without_its_tokenizer_json_is_refused_by_name(tmp_path):
    from keras_attn.convert import load_hf_tokenizer
    from keras_attn.export import export_text_classifier
    from _hf_tokenizers import roberta_files

    roberta_files(tmp_path, ["Ġ t", "h e"])  # vocab.json and merges.txt only
    tokenizer = load_hf_tokenizer(tmp_path)
    assert tokenizer.hf_tokenizer_file is None
    model = _ids_model()
    with pytest.raises(ValueError, match=r"tokenizer.json .*AutoTokenizer.from_pretrained"
                                         r".*Received: tokenizer=.* without hf_tokenizer_file"):
        export_text_classifier(model, tokenizer, tmp_path / "out", format="onnx")
    assert not os.path.exists(tmp_path / "out")


def _ids_model():
    import keras

    inputs = {name: keras.Input((None,), dtype="int32", name=name)
              for name in ("token_ids", "padding_mask")}
    pooled = keras.ops.mean(keras.layers.Embedding(50, 4)(inputs["token_ids"]), axis=1)
    return keras.Model(inputs, keras.layers.Dense(2)(pooled))


@pytest.mark.parametrize("lowercase", [True, False])
@pytest.mark.parametrize("strip_accents", [True, False])
def test_the_wordpiece_rebuild_for_tokenizers_gives_keras_hubs_ids(lowercase, strip_accents):
    # The tokenizer.json a WordPiece export carries (a zoo vocabulary has no
    # checkpoint file): the `tokenizers` pipeline must give keras-hub's ids.
    # Every character of the probes, folded or not, is a piece and a
    # "##" piece, so a word no whole token matches is spelled out and any
    # difference of normalisation or splitting shows in the ids.
    import unicodedata

    import keras_hub
    from tokenizers import Tokenizer

    from keras_attn.export.text_classifier import PROBES
    from keras_attn.export.text_runtime import wordpiece_tokenizer_json

    texts = list(PROBES) + ["x" * 120, "  spaced   out ", "ＦＵＬＬ width", "ﬀ ﬃ"]
    chars = set()
    for text in texts:
        for form in (text, text.casefold(), unicodedata.normalize("NFKD", text.casefold()),
                     unicodedata.normalize("NFKC", text.casefold())):
            chars.update(form)
    chars = sorted(c for c in chars if not c.isspace() and unicodedata.category(c)[0] != "C")
    vocabulary = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "quick", "fox", "cafe", "naive",
                   "resume", "strasse", "fine"] + chars + ["##" + c for c in chars])
    ours = keras_hub.tokenizers.WordPieceTokenizer(
        vocabulary=vocabulary, lowercase=lowercase, strip_accents=strip_accents)
    rebuilt = Tokenizer.from_str(wordpiece_tokenizer_json(vocabulary, lowercase, strip_accents,
                                                          "##", "[UNK]"))
    for text in texts:
        assert rebuilt.encode(text, add_special_tokens=False).ids == \
            [int(i) for i in np.asarray(ours(text))], text
