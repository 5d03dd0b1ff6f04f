import json
import os
import subprocess
import sys

import numpy as np
import pytest

from keras_attn.data import text
from keras_attn.export import export_text_classifier
from keras_attn.models.bert import BertSequenceClassifier
from keras_attn.models.bert import build_bert
from test_case import to_numpy

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat",
         "dog", "##s", "a", "run", "##ning", ".", ","]
TEXTS = ["the cat sat on the mat .", "a dog", "dogs running , cats sat on a mat . the end"]

pytestmark = pytest.mark.tf_only

LOAD = r"""
import json, sys
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the WordPiece ops)
loaded = tf.saved_model.load(sys.argv[1])
texts = json.loads(sys.argv[2])
ids = json.loads(sys.argv[3])
out = {"text": {}, "ids": {}}
for n in (1, 3):
    out["text"][n] = loaded.serve(tf.constant(texts[:n])).numpy().tolist()
for length, (t, s, m) in ids.items():
    out["ids"][length] = loaded.serve_ids(tf.constant(t, tf.int32), tf.constant(s, tf.int32),
                                          tf.constant(m, tf.int32)).numpy().tolist()
print("RESULT" + json.dumps(out))
"""


@pytest.mark.large
def test_two_signatures_reload_in_a_fresh_process(tmp_path):
    backbone = build_bert("bert_tiny", vocabulary_size=len(VOCAB), hidden_dim=16,
                          intermediate_dim=32, num_layers=1, max_sequence_length=16)
    model = BertSequenceClassifier(backbone, num_classes=3)
    tokenizer = text.make_tokenizer(VOCAB)
    path = export_text_classifier(model, tokenizer, str(tmp_path / "classifier"),
                                  sequence_length=12)
    pack = text.pack_pairs(tokenizer, 12)

    def in_memory(token_ids, segment_ids, padding_mask):
        logits = to_numpy(model({"token_ids": np.asarray(token_ids),
                                 "segment_ids": np.asarray(segment_ids),
                                 "padding_mask": np.asarray(padding_mask)}))
        e = np.exp(logits - logits.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    rng = np.random.default_rng(0)
    ids = {}
    for length, batch in ((3, 1), (9, 3), (16, 3)):
        t = rng.integers(5, len(VOCAB), (batch, length))
        t[:, 0] = 2
        m = np.ones_like(t)
        m[-1, length // 2:] = 0
        t = t * m
        ids[str(length)] = (t.tolist(), np.zeros_like(t).tolist(), m.tolist())
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(
        [sys.executable, "-c", LOAD, path, json.dumps(TEXTS), json.dumps(ids)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("RESULT", 1)[1])
    for n in (1, 3):
        expected = in_memory(*(np.asarray(x) for x in pack(np.array(TEXTS[:n]))))
        np.testing.assert_allclose(np.array(out["text"][str(n)]), expected, atol=1e-5)
    for length, (t, s, m) in ids.items():
        np.testing.assert_allclose(np.array(out["ids"][length]), in_memory(t, s, m), atol=1e-5)


def test_rejects_a_model_without_bert_inputs(tmp_path):
    import keras

    inputs = keras.Input((4,), name="features")
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    with pytest.raises(ValueError, match="token_ids, segment_ids and padding_mask"):
        export_text_classifier(model, text.make_tokenizer(VOCAB), str(tmp_path / "x"))
    backbone = build_bert("bert_tiny", vocabulary_size=len(VOCAB), hidden_dim=16,
                          intermediate_dim=32, num_layers=1, max_sequence_length=16)
    with pytest.raises(ValueError, match="Received: sequence_length=32"):
        export_text_classifier(BertSequenceClassifier(backbone, 2),
                               text.make_tokenizer(VOCAB), str(tmp_path / "x"), 32)
