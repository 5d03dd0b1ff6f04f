"""The transducer's prediction and joint networks against transformers'
Parakeet RNN-T modules (`ParakeetRNNTDecoder`, `ParakeetRNNTJointNetwork`,
random weights copied in: the LSTM's gates in the same order, its two
biases summed); the predictor fed one token at a time with its states
equals the whole sequence; padding after a transcript changes nothing
before it; a `.keras` round trip keeps the outputs."""

import numpy as np
import pytest

from keras_attn.layers.transducer import TransducerJoint
from keras_attn.layers.transducer import TransducerPredictor
from _parakeet import transducer_from_torch
from test_case import run_layer_test
from test_case import to_numpy

VOCABULARY, HIDDEN, LAYERS = 7, 6, 2


@pytest.fixture(scope="module")
def parakeet():
    """transformers' decoder and joint of a tiny RNN-T config, weights
    drawn away from their defaults."""
    import torch
    import transformers
    from transformers.models.parakeet.modeling_parakeet import ParakeetRNNTDecoder
    from transformers.models.parakeet.modeling_parakeet import ParakeetRNNTJointNetwork

    config = transformers.ParakeetRNNTConfig(
        vocab_size=VOCABULARY, decoder_hidden_size=HIDDEN, num_decoder_layers=LAYERS,
        blank_token_id=VOCABULARY - 1, pad_token_id=0,
        encoder_config=dict(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=8))
    torch.manual_seed(0)
    decoder, joint = ParakeetRNNTDecoder(config).eval(), ParakeetRNNTJointNetwork(config).eval()
    with torch.no_grad():
        for module in (decoder, joint):
            for tensor in module.parameters():
                tensor.normal_(0, 0.5)
    return decoder, joint


def _ours(decoder, joint):
    state = {**decoder.state_dict(), **{f"head.{k}": v for k, v in joint.head.state_dict().items()}}
    return transducer_from_torch(state, VOCABULARY, HIDDEN, LAYERS, VOCABULARY)


def test_the_networks_equal_transformers_parakeet_rnnt(parakeet):
    import torch

    decoder, joint = parakeet
    predictor, ours_joint = _ours(decoder, joint)
    ids = np.array([[6, 1, 2, 3, 4], [6, 5, 0, 0, 0]], "int64")  # the blank first
    with torch.no_grad():
        expected = decoder(torch.tensor(ids)).numpy()
    outputs = predictor(ids)
    np.testing.assert_allclose(to_numpy(outputs), expected, atol=1e-5)
    encoder = np.random.default_rng(0).normal(0, 1, (2, 4, HIDDEN)).astype("float32")
    with torch.no_grad():
        logits = joint(torch.tensor(expected)[:, None], torch.tensor(encoder)[:, :, None]).numpy()
    np.testing.assert_allclose(to_numpy(ours_joint(encoder, outputs)), logits, atol=1e-5)


def test_one_token_at_a_time_is_the_whole_sequence_and_padding_is_ignored():
    predictor = TransducerPredictor(VOCABULARY, HIDDEN, LAYERS, return_states=True)
    ids = np.array([[6, 1, 2, 3], [6, 5, 4, 1]], "int32")
    whole, *_ = predictor(ids)
    states, steps = None, []
    for u in range(ids.shape[1]):
        step, *states = predictor(ids[:, u:u + 1], states)
        steps.append(to_numpy(step))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), to_numpy(whole), atol=1e-5)
    padded, *_ = predictor(np.concatenate([ids, np.zeros((2, 3), "int32")], axis=1))
    np.testing.assert_allclose(to_numpy(padded)[:, :4], to_numpy(whole), atol=1e-6)


def test_a_keras_file_keeps_the_outputs(tmp_path):
    import keras

    token_ids = keras.Input((None,), dtype="int32")
    frames = keras.Input((None, HIDDEN))
    outputs = TransducerPredictor(VOCABULARY, HIDDEN, LAYERS)(token_ids)
    model = keras.Model([frames, token_ids], TransducerJoint(VOCABULARY + 3)(frames, outputs))
    inputs = [np.random.default_rng(1).normal(size=(2, 3, HIDDEN)).astype("float32"),
              np.array([[6, 1], [6, 2]], "int32")]
    path = str(tmp_path / "joint.keras")
    model.save(path)
    np.testing.assert_allclose(to_numpy(keras.saving.load_model(path)(inputs)),
                               to_numpy(model(inputs)), atol=1e-6)


def test_the_layer_checks(tmp_path):
    # Non-default sizes: two LSTM layers, a tanh joint with durations' logits.
    run_layer_test(TransducerPredictor, {"vocabulary_size": 9, "hidden_dim": 5, "num_layers": 2},
                   {"token_ids": np.array([[8, 1, 2], [8, 3, 0]], "int32")}, (2, 3, 5),
                   expected_num_trainable_weights=1 + 2 * 3 + 2, tmp_path=tmp_path)
    run_layer_test(TransducerJoint, {"outputs": 7, "activation": "tanh"},
                   {"encoder": np.random.default_rng(0).normal(size=(2, 4, 5)).astype("float32"),
                    "prediction": np.random.default_rng(1).normal(size=(2, 3, 5)).astype(
                        "float32")},
                   (2, 4, 3, 7), expected_num_trainable_weights=2, tmp_path=tmp_path)


def test_bad_sizes_and_states_are_refused():
    with pytest.raises(ValueError, match="hidden_dim"):
        TransducerPredictor(VOCABULARY, 0)
    predictor = TransducerPredictor(VOCABULARY, HIDDEN, LAYERS, return_states=True)
    with pytest.raises(ValueError, match=r"argument `states`: .* 4 tensors\. Received: 2"):
        predictor(np.array([[6]]), [np.zeros((1, HIDDEN), "float32")] * 2)
    # A valid call right after the refused one.
    assert len(predictor(np.array([[6]]))) == 1 + 2 * LAYERS
    with pytest.raises(ValueError, match=r"joint's width.*encoder.shape=\(2, 3, 5\)"):
        TransducerJoint(4)(np.zeros((2, 3, 5), "float32"), np.zeros((2, 2, 4), "float32"))
