"""SavedModel export of a Transformer with beam search, reloaded in a fresh
interpreter (no keras_attn objects there)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from keras_attn.export import export_translator
from keras_attn.models.transformer import build_transformer
from keras_attn.models.transformer.decoding import transformer_beam_search
from test_case import to_numpy

pytestmark = pytest.mark.tf_only

RELOAD = """
import json, sys
import numpy as np
import tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
out = {}
for name, source in json.loads(sys.argv[2]).items():
    result = loaded.serve(tf.constant(source, tf.int32))
    out[name] = [result["tokens"].numpy().tolist(), result["scores"].numpy().tolist()]
print(json.dumps(out))
"""


@pytest.mark.large
def test_exported_translator_serves_beam_search(tmp_path):
    model = build_transformer(
        "transformer_base", vocabulary_size=15, hidden_dim=8, intermediate_dim=16,
        num_heads=2, num_encoder_layers=1, num_decoder_layers=1, max_sequence_length=9,
    )
    path = export_translator(model, tmp_path / "translator", start_id=1, end_id=2, beam_width=3)
    sources = {
        "batch": [[5, 6, 7, 2], [8, 9, 2, 0]],
        "single": [[3, 4, 5, 6, 7, 2]],
    }
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", RELOAD, str(path), json.dumps(sources)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    for name, source in sources.items():
        tokens, scores = transformer_beam_search(
            model, np.array(source, "int32"), 1, 2, beam_width=3, max_length=9
        )
        assert np.array(served[name][0]).shape == (len(source), 9)
        np.testing.assert_array_equal(served[name][0], to_numpy(tokens))
        np.testing.assert_allclose(served[name][1], to_numpy(scores), atol=1e-4)


def test_export_translator_rejects_other_models(tmp_path):
    import keras

    with pytest.raises(ValueError, match="Received: model=Sequential"):
        export_translator(keras.Sequential([keras.layers.Dense(2)]), tmp_path / "x", 1, 2)


# What the docs say a server of the `translate` endpoint imports: TensorFlow
# and tensorflow-text (the SentencePiece ops). Loading without it first shows
# why it is needed.
RELOAD_TRANSLATE = """
import json, sys
import tensorflow as tf
try:
    tf.saved_model.load(sys.argv[1])
    without = None
except Exception as error:
    without = str(error)
import tensorflow_text  # noqa: F401
loaded = tf.saved_model.load(sys.argv[1])
served = loaded.translate(tf.constant(json.loads(sys.argv[2])))["translations"].numpy()
print(json.dumps({"without": without, "translations": [t.decode("utf-8") for t in served]}))
"""


@pytest.mark.large
def test_exported_translate_endpoint_loads_with_tensorflow_text_in_a_fresh_process(tmp_path):
    import sentencepiece

    from keras_attn.convert import MarianTokenizer

    corpus = ["the cat sat on the mat", "a dog ran in the park", "we read books at night"]
    for name in ("source", "target"):
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(corpus), model_prefix=str(tmp_path / name), vocab_size=22,
            character_coverage=1.0, minloglevel=2)
        os.replace(tmp_path / f"{name}.model", tmp_path / f"{name}.spm")
    processor = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "source.spm"))
    pieces = ["</s>", "<unk>"] + [processor.id_to_piece(i) for i in range(3, 22)] + ["<pad>"]
    (tmp_path / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}))
    pad = len(pieces) - 1
    tokenizer = MarianTokenizer(str(tmp_path), start_id=pad, end_id=0, pad_id=pad)
    model = build_transformer(
        "transformer_base", vocabulary_size=len(pieces), hidden_dim=8, intermediate_dim=16,
        num_heads=2, num_encoder_layers=1, num_decoder_layers=1, max_sequence_length=16,
        pad_id=pad)
    path = export_translator(model, tmp_path / "translator", pad, 0, beam_width=2, max_length=6,
                             length_penalty="hf", alpha=1.0, tokenizer=tokenizer)
    texts = ["the cat ran", "we read"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, "-c", RELOAD_TRANSLATE, str(path), json.dumps(texts)],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    assert "Op type not registered" in served["without"]
    assert served["translations"] == tokenizer.translate(model, texts, beam_width=2,
                                                         max_length=6)
