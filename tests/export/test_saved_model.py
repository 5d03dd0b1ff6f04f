"""SavedModel export of a model built from the layers.

TensorFlow backend only (`tf_only`): the other backends refuse to export
(tests/export/test_backend_check.py).
"""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn import layers
from keras_attn.export import export_saved_model

pytestmark = pytest.mark.tf_only


def tiny_encoder_decoder():
    source = keras.Input((None,), dtype="int32", name="source_ids")
    target = keras.Input((None,), dtype="int32", name="target_ids")
    embedding = keras.layers.Embedding(40, 16, name="embedding")

    def embed(ids, positions):
        x = embedding(ids) * 4.0
        return x + positions(x)

    enc = embed(source, layers.SinusoidalPositionalEncoding())
    enc = layers.TransformerBlock(2, 32, name="encoder_0")(enc, padding_mask=source != 0)
    enc = layers.TransformerBlock(2, 32, norm_position="pre", name="encoder_1")(enc, padding_mask=source != 0)
    dec = embed(target, layers.PositionEmbedding(16))
    dec = layers.TransformerDecoderBlock(2, 32, name="decoder_0")(
        dec, enc, decoder_padding_mask=target != 0, encoder_padding_mask=source != 0
    )
    logits = keras.layers.Dense(40, name="logits")(dec)
    return keras.Model([source, target], logits)


def test_saved_model_serves_any_batch_and_length(tmp_path):
    import tensorflow as tf

    model = tiny_encoder_decoder()
    path = export_saved_model(model, tmp_path / "saved")
    loaded = tf.saved_model.load(str(path))
    rng = np.random.default_rng(0)
    for batch in (1, 3):
        for length in (1, 7):
            src = rng.integers(1, 40, (batch, length)).astype("int32")
            tgt = rng.integers(1, 40, (batch, length)).astype("int32")
            src[0, length // 2 + 1 :] = 0  # some padding
            want = ops.convert_to_numpy(model([src, tgt]))
            got = loaded.serve(src, tgt).numpy()
            assert got.shape == (batch, length, 40)
            np.testing.assert_allclose(got, want, atol=1e-5)


def test_export_replaces_an_existing_model_atomically(tmp_path):
    import tensorflow as tf

    model = tiny_encoder_decoder()
    path = tmp_path / "saved"
    export_saved_model(model, path)
    second = tiny_encoder_decoder()  # different random weights
    export_saved_model(second, path)
    ids = np.array([[3, 4, 5]], "int32")
    loaded = tf.saved_model.load(str(path))  # keep a reference: it owns the variables
    got = loaded.serve(ids, ids).numpy()
    np.testing.assert_allclose(got, ops.convert_to_numpy(second([ids, ids])), atol=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved"]  # no leftovers


def test_an_empty_batch_or_length_is_refused_naming_the_input(tmp_path):
    import pytest
    import tensorflow as tf

    loaded = tf.saved_model.load(str(export_saved_model(tiny_encoder_decoder(),
                                                        tmp_path / "saved")))
    ids = np.ones((2, 3), "int32")
    for source, message in ((ids[:0], "`source_ids` holds no example"),
                            (ids[:, :0], "`source_ids` has length 0")):
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            loaded.serve(source, ids[: len(source)])
    assert loaded.serve(ids, ids).shape == (2, 3, 40)
