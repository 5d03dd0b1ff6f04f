import json
import os
import subprocess
import sys

import numpy as np
import pytest

from _families import FAMILIES
from keras_attn.data import text
from keras_attn.export import export_text_classifier
from keras_attn.models.bert import BertSequenceClassifier
from test_case import to_numpy

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat",
         "dog", "##s", "a", "run", "##ning", ".", ",", "cafe", "naive", "东", "京", "!"]
TEXTS = ["the cat sat on the mat .", "a dog", "dogs running , cats sat on a mat . the end",
         "The CAFÉ, naïve Dogs!!! 东京 😀", "", "   ", "cat" * 40]

pytestmark = pytest.mark.tf_only

# TensorFlow alone, as TensorFlow Serving has it: tensorflow-text (whose
# ops the SavedModel must not need), Keras and the packages built on them
# cannot be imported there, as on a machine without them.
LOAD = r"""
import importlib.abc, importlib.util, json, sys
OTHERS = ("tensorflow_text", "keras", "keras_hub", "keras_nlp", "keras_attn", "tf_keras")
def blocked(name):
    return name.split(".")[0] in OTHERS
class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if blocked(name):
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, NotInstalled())
find_spec = importlib.util.find_spec  # TensorFlow asks it whether Keras is there
importlib.util.find_spec = lambda name, package=None: (
    None if blocked(name) else find_spec(name, package))
import tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
texts = json.loads(sys.argv[2])
ids = json.loads(sys.argv[3])
out = {"text": {}, "ids": {}}
for n in (1, len(texts)):
    out["text"][n] = loaded.serve(tf.constant(texts[:n])).numpy().tolist()
for length, (t, s, m) in ids.items():
    out["ids"][length] = loaded.serve_ids(tf.constant(t, tf.int32), tf.constant(s, tf.int32),
                                          tf.constant(m, tf.int32)).numpy().tolist()
out["loaded"] = sorted(m for m in OTHERS if m in sys.modules)
print("RESULT" + json.dumps(out))
"""


def _tiny_bert():
    """The table's BERT on `VOCAB`, one block; 16 positions: the longest
    ids served below, and fewer than the 32 refused."""
    return FAMILIES["bert"].backbone(vocabulary_size=len(VOCAB), num_layers=1,
                                     max_sequence_length=16)


@pytest.mark.large
def test_two_signatures_reload_in_a_fresh_process(tmp_path):
    backbone = _tiny_bert()
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
    assert out["loaded"] == []
    # The strings tokenized by keras-hub (tensorflow-text in tf.data, Python
    # eagerly: the same ids), then the Keras model.
    packed = [np.asarray(x) for x in pack(np.array(TEXTS))]
    # "The CAFÉ, naïve Dogs!!! 东京 😀": the cafe , naive dog ##s ! ! ! 东, truncated
    assert packed[0][3].tolist() == [2, 5, 17, 16, 18, 10, 11, 21, 21, 21, 19, 3]
    for n in (1, len(TEXTS)):
        expected = in_memory(*(x[:n] for x in packed))
        np.testing.assert_allclose(np.array(out["text"][str(n)]), expected, atol=1e-6)
    for length, (t, s, m) in ids.items():
        np.testing.assert_allclose(np.array(out["ids"][length]), in_memory(t, s, m), atol=1e-5)


def test_rejects_a_model_without_bert_inputs(tmp_path):
    import keras

    inputs = keras.Input((4,), name="features")
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    with pytest.raises(ValueError, match="token_ids, segment_ids and padding_mask"):
        export_text_classifier(model, text.make_tokenizer(VOCAB), str(tmp_path / "x"))
    backbone = _tiny_bert()
    with pytest.raises(ValueError, match="Received: sequence_length=32"):
        export_text_classifier(BertSequenceClassifier(backbone, 2),
                               text.make_tokenizer(VOCAB), str(tmp_path / "x"), 32)


@pytest.mark.parametrize("format", ["saved_model", "litert"])
def test_a_byte_level_bpe_tokenizer_without_its_tokenizer_json_is_refused_by_name(tmp_path,
                                                                                    format):
    # A keras-hub BPE tokenizer built by hand: no tokenizer.json a server
    # could tokenize with (load_hf_tokenizer's carry theirs:
    # tests/export/test_text_runtime.py). Refused before any file is written.
    import keras_hub

    model = FAMILIES["bert"].build(num_layers=1, num_segments=1, padding_id=1)
    bpe = keras_hub.tokenizers.BytePairTokenizer(
        vocabulary={"<s>": 0, "<pad>": 1, "</s>": 2, "a": 3, "b": 4, "ab": 5}, merges=["a b"])
    with pytest.raises(ValueError, match=r"WordPieceTokenizer .*load_hf_tokenizer.*"
                                         r"Received: tokenizer=BytePairTokenizer without "
                                         r"hf_tokenizer_file"):
        export_text_classifier(model, bpe, tmp_path / "x", sequence_length=8, format=format)
    assert os.listdir(tmp_path) == []


def test_the_export_refuses_a_graph_with_ops_core_tensorflow_lacks():
    import tensorflow as tf
    import tensorflow_text as tf_text

    from keras_attn.export.text_classifier import check_core_ops

    spec = tf.TensorSpec((None,), tf.string)
    check_core_ops(tf.function(tf.strings.lower).get_concrete_function(spec))
    nfd = tf.function(lambda x: tf.strings.upper(tf_text.normalize_utf8(x, "NFD")))
    with pytest.raises(RuntimeError, match=r"ops that core TensorFlow lacks: \['NormalizeUTF8'\]"):
        check_core_ops(nfd.get_concrete_function(spec))
