"""LogMelFeatures' constants (the mel weight matrix, the windowed DFT kernel)
are made once per layer for the streaming step (issue 41: rebuilding them
was most of the front end's step), with the numbers of rebuilding them, and
a layer first run inside a trace (`jax.jit`, `tf.function`) keeps nothing of
that trace for its later eager calls."""

import keras
import numpy as np
import pytest

from keras_attn.layers import LogMelFeatures
from test_case import to_numpy

RNG = np.random.default_rng(41)
AUDIO = RNG.uniform(-0.5, 0.5, (2, 3000)).astype("float32")
CHUNK = 700  # not a multiple of the hop: frames complete at uneven steps


def stream(layer):
    """`AUDIO` fed in chunks of `CHUNK` then flushed: the features."""
    state = layer.initial_state(AUDIO.shape[0])
    outputs = []
    for start in range(0, AUDIO.shape[1], CHUNK):
        features, _, state = layer.stream_step(AUDIO[:, start:start + CHUNK], state)
        outputs.append(to_numpy(features))
    features, _, _ = layer.flush(state)
    return np.concatenate(outputs + [to_numpy(features)], axis=1)


def new_layer(stft, build=True):
    layer = LogMelFeatures(num_mel_bins=40, normalization="none", stft=stft)
    if build:
        layer.build(AUDIO.shape)
    return layer


def rebuilt_every_step(layer):
    """`layer` made to rebuild its constants at every use, as before they
    were kept."""
    kernel = layer._dft_kernel

    def fresh_kernel():
        layer._dft_kernel_cache = None
        return kernel()

    layer._dft_kernel = fresh_kernel
    layer._eager_mel_matrix = layer._mel_matrix
    return layer


def traced(function):
    """`function` run inside the backend's trace: `jax.jit` or
    `tf.function`. PyTorch's eager calls trace nothing, so there it runs as
    it is."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.jit(function)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(function)
    return function


@pytest.mark.parametrize("stft", ["fft", "convolution"])
def test_stream_makes_the_mel_matrix_once_with_the_same_values(stft, monkeypatch):
    made = []
    make = keras.layers.MelSpectrogram.linear_to_mel_weight_matrix

    def counted(self, *args, **kwargs):
        made.append(1)
        return make(self, *args, **kwargs)

    monkeypatch.setattr(keras.layers.MelSpectrogram, "linear_to_mel_weight_matrix", counted)
    reference = stream(rebuilt_every_step(new_layer(stft)))
    steps = len(made)
    assert steps > 2  # the uncached layer made it at every step with frames
    made.clear()
    layer = new_layer(stft)
    config = layer.get_config()
    features = stream(layer)
    stream(layer)  # a second utterance through the same layer
    assert len(made) == 1
    np.testing.assert_array_equal(features, reference)
    # Kept outside the weights and the config: saved files do not change.
    assert layer.weights == []
    assert layer.get_config() == config


@pytest.mark.parametrize("stft", ["fft", "convolution"])
def test_first_call_inside_a_trace_leaves_the_eager_calls_unchanged(stft):
    waveform = AUDIO[:, :2000]
    lengths = np.array([2000, 1500], "int32")
    layer = new_layer(stft, build=False)  # built and first called inside the trace
    in_trace = to_numpy(traced(lambda w, n: layer(w, n))(waveform, lengths))
    streamed = stream(layer)
    eager = to_numpy(layer(waveform, lengths))
    np.testing.assert_array_equal(streamed, stream(new_layer(stft)))
    np.testing.assert_array_equal(eager, to_numpy(new_layer(stft)(waveform, lengths)))
    # And the other way: a layer that streamed first traces as a fresh one.
    fresh_trace = to_numpy(traced(lambda w, n: new_layer(stft, build=False)(w, n))(waveform, lengths))
    np.testing.assert_array_equal(in_trace, fresh_trace)
    np.testing.assert_array_equal(to_numpy(traced(lambda w, n: layer(w, n))(waveform, lengths)),
                                  in_trace)
