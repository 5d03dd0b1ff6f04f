import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.layers import PositionEmbedding
from keras_attn.layers import SinusoidalPositionalEncoding
from keras_attn.layers import sinusoidal_positional_encoding
from test_case import run_layer_test
from test_case import to_numpy


def numpy_table(positions, depth, base=10000.0):
    table = np.zeros((len(positions), depth))
    for row, pos in enumerate(positions):
        for k in range(depth // 2):
            table[row, 2 * k] = np.sin(pos / base ** (2 * k / depth))
            table[row, 2 * k + 1] = np.cos(pos / base ** (2 * k / depth))
    return table


def test_sinusoidal_layer(tmp_path):
    run_layer_test(
        SinusoidalPositionalEncoding,
        init_kwargs={"max_wavelength": 500.0},
        input_data={"inputs": np.zeros((2, 5, 6), "float32")},
        expected_output_shape=(2, 5, 6),
        expected_num_trainable_weights=0,
        tmp_path=tmp_path,
    )


def test_position_embedding_layer(tmp_path):
    run_layer_test(
        PositionEmbedding,
        init_kwargs={"max_sequence_length": 9, "initializer": "random_normal"},
        input_data={"inputs": np.zeros((2, 5, 6), "float32")},
        expected_output_shape=(2, 5, 6),
        expected_num_trainable_weights=1,
        tmp_path=tmp_path,
    )


@pytest.mark.parametrize("depth", [4, 64, 512])
def test_sinusoid_values_equal_the_formula(depth):
    positions = [0, 1, 2, 7, 50, 999]
    table = to_numpy(sinusoidal_positional_encoding(1000, depth))
    np.testing.assert_allclose(table[positions], numpy_table(positions, depth), atol=1e-6 * max(1, 1))


def test_sinusoid_start_index_and_layer_agree_with_table():
    table = to_numpy(sinusoidal_positional_encoding(10, 8, start_index=5))
    np.testing.assert_allclose(table, numpy_table(range(5, 15), 8), atol=1e-6)
    layer_out = to_numpy(SinusoidalPositionalEncoding()(np.zeros((3, 4, 8), "float32"), start_index=5))
    np.testing.assert_allclose(layer_out[1], numpy_table(range(5, 9), 8), atol=1e-6)


def test_sinusoid_is_interleaved():
    # Position 0: sin(0) = 0 at even indices, cos(0) = 1 at odd ones.
    row = to_numpy(sinusoidal_positional_encoding(1, 6))[0]
    np.testing.assert_array_equal(row, [0, 1, 0, 1, 0, 1])


def test_any_length_without_weights():
    layer = SinusoidalPositionalEncoding()
    for length in (1, 7, 3000):
        assert layer(np.zeros((1, length, 4), "float32")).shape == (1, length, 4)
    assert layer.weights == []


def test_position_embedding_slices_the_table():
    layer = PositionEmbedding(max_sequence_length=6)
    out = to_numpy(layer(np.zeros((2, 4, 3), "float32")))
    table = to_numpy(layer.position_embeddings)
    np.testing.assert_array_equal(out[0], table[:4])
    np.testing.assert_array_equal(to_numpy(layer(np.zeros((1, 2, 3), "float32"), start_index=4))[0], table[4:6])


def test_length_past_maximum_eager():
    layer = PositionEmbedding(max_sequence_length=4)
    with pytest.raises(ValueError, match=r"max_sequence_length=4.*Received: sequence length=5"):
        layer(np.zeros((1, 5, 3), "float32"))
    with pytest.raises(ValueError, match=r"Received: sequence length=2, start_index=3"):
        layer(np.zeros((1, 2, 3), "float32"), start_index=3)


def test_length_past_maximum_in_a_compiled_function():
    inputs = keras.Input((None, 3))
    model = keras.Model(inputs, PositionEmbedding(max_sequence_length=4)(inputs))
    model.compile(jit_compile=True)
    assert model.predict(np.zeros((1, 4, 3), "float32"), verbose=0).shape == (1, 4, 3)
    too_long = np.zeros((1, 6, 3), "float32")
    if keras.backend.backend() == "tensorflow":
        # tf.function traces the length as unknown, so no check can run while
        # tracing; the rows past the table come out NaN, never clamped.
        out = model.predict(too_long, verbose=0)
        assert np.isfinite(out[0, :4]).all()
        assert np.isnan(out[0, 4:]).all()
    else:  # jax.jit traces concrete shapes: the layer's own check runs.
        with pytest.raises(ValueError, match=r"max_sequence_length=4.*sequence length=6"):
            model.predict(too_long, verbose=0)


def test_length_past_maximum_at_model_construction():
    with pytest.raises(ValueError, match=r"max_sequence_length=4.*Received: sequence length=6"):
        PositionEmbedding(max_sequence_length=4)(keras.Input((6, 3)))


def test_odd_depth():
    with pytest.raises(ValueError, match=r"even depth.*Received: depth=5"):
        SinusoidalPositionalEncoding()(np.zeros((1, 3, 5), "float32"))
    with pytest.raises(ValueError, match=r"Received: depth=7"):
        sinusoidal_positional_encoding(3, 7)


def test_non_positive_max_wavelength():
    with pytest.raises(ValueError, match=r"Received: max_wavelength=0"):
        SinusoidalPositionalEncoding(max_wavelength=0)


def test_negative_length():
    with pytest.raises(ValueError, match=r"Received: length=-1"):
        sinusoidal_positional_encoding(-1, 4)


def test_non_positive_max_sequence_length():
    with pytest.raises(ValueError, match=r"Received: max_sequence_length=0"):
        PositionEmbedding(max_sequence_length=0)


def test_causal_mask_refuses_negative_lengths():
    from keras_attn.ops.masking import causal_mask

    for args, name in (((-1, 3), "query_length"), ((2, -1), "key_length")):
        with pytest.raises(ValueError, match=rf"`{name}` must be a non-negative integer. "
                                             rf"Received: {name}=-1"):
            causal_mask(*args)
    assert tuple(causal_mask(0, 0).shape) == (0, 0)


def test_concatenated_layout_is_the_interleaved_table_regrouped(tmp_path):
    run_layer_test(
        SinusoidalPositionalEncoding,
        init_kwargs={"max_wavelength": 500.0, "layout": "concatenated"},
        input_data={"inputs": np.zeros((2, 5, 6), "float32")},
        expected_output_shape=(2, 5, 6),
        expected_num_trainable_weights=0,
        tmp_path=tmp_path,
    )
    interleaved = to_numpy(sinusoidal_positional_encoding(7, 8))
    expected = np.concatenate([interleaved[:, 0::2], interleaved[:, 1::2]], axis=1)
    np.testing.assert_allclose(
        to_numpy(sinusoidal_positional_encoding(7, 8, layout="concatenated")), expected, atol=1e-6)
    # The traced path (a start index from a decoding step) lays it out the same way.
    layer = SinusoidalPositionalEncoding(layout="concatenated")
    stepped = to_numpy(layer(np.zeros((1, 1, 8), "float32"),
                             start_index=keras.ops.convert_to_tensor(3)))
    np.testing.assert_allclose(stepped[0, 0], expected[3], atol=1e-5)
    with pytest.raises(ValueError, match=r"Received: layout='split'"):
        SinusoidalPositionalEncoding(layout="split")
