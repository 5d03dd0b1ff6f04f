"""FastConvSubsampling: the generic layer checks, padding safety, the
length function, streaming (issue 59), and equality with transformers'
Parakeet subsampling."""

import keras
import numpy as np
import pytest

from keras_attn.layers import FastConvSubsampling
from keras_attn.layers import fast_subsampled_length
from test_case import run_layer_test
from test_case import to_numpy

RNG = np.random.default_rng(59)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def test_fast_conv_subsampling_layer(tmp_path):
    # Three stages: conv_1 (2) + 2 x (depthwise 2 + pointwise 2) + projection 2.
    run_layer_test(
        FastConvSubsampling,
        init_kwargs={"hidden_dim": 8, "filters": 3, "subsampling_factor": 8,
                     "kernel_initializer": "he_uniform"},
        input_data={"inputs": rand(2, 20, 12)},
        expected_output_shape=(2, 3, 8),
        expected_num_trainable_weights=12,
        tmp_path=tmp_path,
    )


def test_fast_subsampled_length_is_ceil_of_the_factor():
    lengths = np.arange(0, 50)
    assert fast_subsampled_length(lengths).tolist() == (-(-lengths // 8)).tolist()
    assert fast_subsampled_length(lengths, 4).tolist() == (-(-lengths // 4)).tolist()
    assert fast_subsampled_length(9) == 2


def test_padding_changes_no_valid_output():
    layer = FastConvSubsampling(8, filters=4)
    lengths = [21, 9]
    x = rand(2, 21, 16)
    mask = np.arange(21)[None] < np.array(lengths)[:, None]
    garbage = np.where(mask[..., None], x, 100.0 * rand(2, 21, 16)).astype("float32")
    batched = to_numpy(layer(garbage, padding_mask=mask))
    for row, length in enumerate(lengths):
        alone = to_numpy(layer(x[row:row + 1, :length]))
        steps = fast_subsampled_length(length)
        assert alone.shape[1] == steps
        np.testing.assert_allclose(batched[row, :steps], alone[0], atol=1e-5)
    out_mask = to_numpy(layer.compute_mask(garbage, mask))
    assert out_mask.sum(axis=1).tolist() == [3, 2]


@pytest.mark.parametrize("chunk", [1, 3, 8, 30] if keras.backend.backend() == "tensorflow"
                         else [3])
def test_streamed_equals_offline(chunk):
    """Each stage carries the frames its next output reads and pads the
    stream's end: a stream in chunks of any size, then `final`, gives the
    whole call's outputs and mask (rows of 30, 17 and 1 frames)."""
    layer = FastConvSubsampling(8, filters=3)
    x = rand(3, 30, 12)
    mask = np.arange(30)[None] < np.array([30, 17, 1])[:, None]
    expected = to_numpy(layer(x, padding_mask=mask))
    state, outputs, masks = layer.initial_state(3), [], []
    for start in range(0, 30, chunk):
        y, y_mask, state = layer.stream_step(x[:, start:start + chunk], state,
                                             mask[:, start:start + chunk])
        outputs.append(to_numpy(y))
        masks.append(to_numpy(y_mask))
        # Only what the next output reads: one or two frames a stage.
        assert all(state[f"frames_{i}"].shape[1] in (1, 2) for i in (1, 2, 3))
    y, y_mask, _ = layer.stream_step(x[:, :0], state, mask[:, :0], final=True)
    got = np.concatenate(outputs + [to_numpy(y)], 1)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    np.testing.assert_array_equal(np.concatenate(masks + [to_numpy(y_mask)], 1),
                                  to_numpy(layer.output_padding_mask(mask)))


def test_a_bad_stream_state_is_refused_by_name():
    layer = FastConvSubsampling(8, filters=3)
    layer(rand(1, 8, 12))
    state = layer.initial_state(1)
    with pytest.raises(ValueError, match=r"entry 'frames_2' must be float32 of shape "
                                         r"\(1, None, 6, 3\)"):
        layer.stream_step(rand(1, 4, 12), dict(state, frames_2=keras.ops.zeros((1, 1, 6, 4))))
    with pytest.raises(ValueError, match=r"a dict of \['frames_1'.*Received: state=\['frames_1'\]"):
        layer.stream_step(rand(1, 4, 12), {"frames_1": state["frames_1"]})


@pytest.mark.parametrize("value", [0, 1, 6, 12])
def test_subsampling_factor_must_be_a_power_of_two(value):
    with pytest.raises(ValueError, match=f"subsampling_factor={value}"):
        FastConvSubsampling(8, subsampling_factor=value)


def test_equals_transformers_parakeet_subsampling():
    torch = pytest.importorskip("torch")
    parakeet = pytest.importorskip("transformers.models.parakeet.modeling_parakeet")
    from transformers import ParakeetEncoderConfig

    config = ParakeetEncoderConfig(hidden_size=8, subsampling_conv_channels=4, num_mel_bins=16)
    torch.manual_seed(0)
    reference = parakeet.ParakeetEncoderSubsamplingConv2D(config).eval()
    layer = FastConvSubsampling(8, filters=4)
    x = rand(2, 19, 16)
    lengths = np.array([19, 11])
    mask = np.arange(19)[None] < lengths[:, None]
    x = np.where(mask[..., None], x, 0.0).astype("float32")
    layer.build((None, None, 16))
    convs = [m for m in reference.layers if isinstance(m, torch.nn.Conv2d)]
    weights = [w.detach().numpy() for m in convs for w in (m.weight, m.bias)]
    conv_1 = [np.transpose(weights[0], (2, 3, 1, 0)), weights[1]]  # (C,1,3,3) -> (3,3,1,C)
    layer.conv_1.set_weights(conv_1)
    for stage, (depthwise, pointwise) in enumerate(zip(layer.depthwise_convs,
                                                       layer.pointwise_convs)):
        dw, dwb, pw, pwb = weights[2 + 4 * stage: 6 + 4 * stage]
        depthwise.set_weights([np.transpose(dw, (2, 3, 0, 1)), dwb])  # (C,1,3,3) -> (3,3,C,1)
        pointwise.set_weights([np.transpose(pw, (2, 3, 1, 0)), pwb])  # (C,C,1,1) -> (1,1,C,C)
    layer.projection.set_weights([reference.linear.weight.detach().numpy().T,
                                  reference.linear.bias.detach().numpy()])
    with torch.no_grad():
        expected = reference(torch.from_numpy(x), torch.from_numpy(mask.astype("int64"))).numpy()
    actual = to_numpy(layer(x, padding_mask=mask))
    assert actual.shape == expected.shape == (2, 3, 8)
    for row, length in enumerate(lengths):
        steps = fast_subsampled_length(int(length))
        np.testing.assert_allclose(actual[row, :steps], expected[row, :steps], atol=1e-5)
