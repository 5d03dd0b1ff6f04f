"""A mask holds booleans or exactly 0 and 1 (a 0.5 or a 2 is not read as
True), and a key that no query may see never reaches the answer, NaN
included."""

import keras
import numpy as np
import pytest

from keras_attn.layers import ConformerBlock
from keras_attn.layers import MultiHeadAttention
from keras_attn.layers import TransformerBlock
from keras_attn.layers import TransformerDecoderBlock
from test_case import to_numpy

RNG = np.random.default_rng(11)
X = RNG.standard_normal((3, 5, 8)).astype("float32")
PADDING = np.array([[1, 1, 1, 0, 0], [1] * 5, [1, 1, 1, 1, 0]], "float32")


@pytest.mark.parametrize("value", [2.0, 0.5, -3.0])
@pytest.mark.parametrize("argument", ["query_mask", "value_mask", "attention_mask"])
def test_mha_refuses_mask_values_other_than_0_1_eagerly(argument, value):
    layer = MultiHeadAttention(num_heads=2)
    mask = np.ones((3, 5, 5) if argument == "attention_mask" else (3, 5), "float32")
    mask[(1, 2)] = value
    with pytest.raises(ValueError, match=rf"`{argument}` must be boolean or hold only 0 and "
                                         rf"1.*Received: {argument} with values {value}"):
        layer(X, **{argument: mask})
    # 0/1 numbers equal the boolean mask.
    np.testing.assert_array_equal(to_numpy(layer(X, query_mask=PADDING)),
                                  to_numpy(layer(X, query_mask=PADDING.astype(bool))))


@pytest.mark.parametrize("cls, argument", [
    (TransformerBlock, "padding_mask"), (TransformerBlock, "attention_mask"),
    (TransformerDecoderBlock, "decoder_padding_mask"),
    (ConformerBlock, "padding_mask"),
])
def test_blocks_name_their_own_mask_argument(cls, argument):
    kwargs = {"num_heads": 2, "kernel_size": 3} if cls is ConformerBlock else {
        "num_heads": 2, "intermediate_dim": 16}
    block = cls(**kwargs)
    mask = np.ones((3, 5, 5) if argument == "attention_mask" else (3, 5), "int32")
    mask[0, 1] = 2
    with pytest.raises(ValueError, match=rf"`{argument}` must be boolean or hold only 0 and 1"):
        block(X, **{argument: mask})


def test_bad_mask_value_in_a_graph_makes_that_example_nan_only():
    """Inside a compiled function nothing can raise: the example whose mask
    holds a 2 answers NaN, the others are unchanged."""
    padding = keras.Input((5,), dtype="int32")
    inputs = keras.Input((5, 8))
    block = TransformerBlock(num_heads=2, intermediate_dim=16)
    model = keras.Model([inputs, padding], block(inputs, padding_mask=padding))
    mask = PADDING.astype("int32")
    clean = model.predict_on_batch([X, mask])
    mask[1, 2] = 2
    if keras.backend.backend() == "torch":  # predict runs eagerly: it raises
        with pytest.raises(ValueError, match="`padding_mask` must be boolean"):
            model.predict_on_batch([X, mask])
        return
    bad = model.predict_on_batch([X, mask])
    assert np.all(np.isnan(bad[1]))
    np.testing.assert_allclose(bad[[0, 2]], clean[[0, 2]], atol=1e-6)


@pytest.mark.parametrize("scores", [False, True], ids=["fused", "explicit"])
def test_nan_in_a_masked_key_never_reaches_a_valid_row(scores):
    """Found by a hostile user: a NaN in a padded key position turned every
    valid row NaN (0 * NaN in the probabilities' matmul)."""
    layer = MultiHeadAttention(num_heads=2)
    value = RNG.standard_normal((3, 6, 8)).astype("float32")
    value_mask = np.ones((3, 6), bool)
    value_mask[:, 4:] = False
    clean = layer(X, value, value_mask=value_mask, return_attention_scores=scores)
    poisoned = value.copy()
    poisoned[:, 4] = np.nan
    poisoned[:, 5] = np.inf
    got = layer(X, poisoned, value_mask=value_mask, return_attention_scores=scores)
    clean, got = (to_numpy(c[0] if scores else c) for c in (clean, got))
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, clean, atol=1e-6)


def test_nan_in_a_padded_key_keeps_gradients_finite():
    """Training through an attention layer whose padded keys hold NaN: every
    weight stays finite (the hidden rows are zeroed before the projections,
    so no `0 * NaN` reaches a gradient)."""
    value = RNG.standard_normal((3, 6, 8)).astype("float32")
    value[:, 4:] = np.nan
    value_mask = np.ones((3, 6), bool)
    value_mask[:, 4:] = False
    inputs = [keras.Input((5, 8)), keras.Input((6, 8)), keras.Input((6,), dtype="bool")]
    out = MultiHeadAttention(num_heads=2)(inputs[0], inputs[1], value_mask=inputs[2])
    model = keras.Model(inputs, out)
    model.compile("sgd", "mse")
    history = model.fit([X, value, value_mask], np.zeros((3, 5, 8), "float32"), epochs=2,
                        verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    assert all(np.all(np.isfinite(to_numpy(w))) for w in model.weights)
