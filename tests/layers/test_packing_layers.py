"""The packing contract at the layer level (TensorFlow, JAX and PyTorch):
every example of a packed row gets the outputs it gets alone (<= 1e-5) and
the same gradient contribution to the weights, whatever else is in its
row; a row that is not a valid packing is a ValueError where Python runs
and NaN for that example inside a compiled step."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.data import pack_sequences
from keras_attn.layers import MultiHeadAttention
from keras_attn.layers import PositionEmbedding
from keras_attn.layers import SinusoidalPositionalEncoding
from keras_attn.layers import TransformerBlock
from keras_attn.layers import TransformerDecoderBlock
from keras_attn.ops.masking import checked_positions
from keras_attn.ops.masking import checked_segment_ids
from keras_attn.ops.masking import segment_mask
from test_case import assert_all_close
from test_case import call_at_once
from test_case import to_numpy
from test_case import training_step_results

D = 8
ROW = 12
LENGTHS = (3, 5, 2, 7, 4, 1, 9)
TARGET_LENGTHS = (4, 2, 6, 3, 5, 2, 8)


def _packed(lengths=LENGTHS, targets=None, seed=0):
    """Examples `(L, D)` of the given lengths, and their packing into rows
    of `ROW` (pack_sequences: several examples per row, padding at the end)."""
    rng = np.random.default_rng(seed)
    examples = [rng.normal(size=(n, D)).astype("float32") for n in lengths]
    target_examples = None if targets is None else [
        rng.normal(size=(n, D)).astype("float32") for n in targets]
    packed = pack_sequences(examples, ROW, targets=target_examples, buffer_size=4)
    assert packed["example_ids"].shape[1] > 1  # some row holds several examples
    return examples, target_examples, packed


def _spans(packed, prefix=""):
    """(row, slice, example index) of each example in the packed rows."""
    for row, ids in enumerate(packed["example_ids"]):
        segments = packed[f"{prefix}segment_ids"][row]
        for segment, index in enumerate(ids[ids >= 0], start=1):
            where = np.flatnonzero(segments == segment)
            yield row, slice(where[0], where[-1] + 1), int(index)


def _alone(layer, inputs, call):
    """`call(inputs)` of one example alone (its own length): one compiled
    program on JAX (`call_at_once`), where eagerly every op compiled again
    for each example's length; eager on TensorFlow and PyTorch."""
    return call_at_once(layer, lambda layer, inputs: call(inputs), inputs)


def _assert_each_example_as_alone(packed_out, alone_outs, packed, atol=1e-5):
    for row, span, index in _spans(packed):
        np.testing.assert_allclose(packed_out[row, span], alone_outs[index], rtol=0, atol=atol,
                                   err_msg=f"example {index}")


# === Outputs: each example as alone ===


@pytest.mark.parametrize("scores", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_mha_self_attention_gives_each_example_its_own_output(causal, scores):
    examples, _, packed = _packed()
    layer = MultiHeadAttention(num_heads=2, key_dim=4)

    def run(x, **kwargs):
        out = layer(x, use_causal_mask=causal, return_attention_scores=scores, **kwargs)
        return out[0] if scores else out

    got = to_numpy(run(packed["inputs"], segment_ids=packed["segment_ids"]))
    _assert_each_example_as_alone(got, [to_numpy(_alone(layer, x[None], run))[0]
                                        for x in examples], packed)
    # Padding attends to nothing: a zero attention output, as a padded query.
    assert np.all(got[packed["segment_ids"] == 0] == 0)


@pytest.mark.parametrize("make, ids", [
    (lambda: MultiHeadAttention(num_heads=2), ("segment_ids", "value_segment_ids")),
    (lambda: TransformerDecoderBlock(num_heads=2, intermediate_dim=16),
     ("decoder_segment_ids", "encoder_segment_ids")),
], ids=["cross_attention", "decoder_block"])
def test_source_target_pairs_get_their_own_outputs(make, ids):
    """Cross-attention pairs target example i with source example i."""
    sources, targets, packed = _packed(targets=TARGET_LENGTHS)
    layer = make()
    got = to_numpy(layer(packed["targets"], packed["inputs"], **{
        ids[0]: packed["target_segment_ids"], ids[1]: packed["segment_ids"]}))
    alone = [to_numpy(_alone(layer, (t[None], s[None]), lambda pair: layer(*pair)))[0]
             for s, t in zip(sources, targets)]
    for row, span, index in _spans(packed, prefix="target_"):
        np.testing.assert_allclose(got[row, span], alone[index], rtol=0, atol=1e-5)


def test_segment_ids_keep_the_fused_route(monkeypatch):
    """Segment ids are one more boolean mask: the call still goes through
    `keras.ops.dot_product_attention` (cuDNN / SDPA kernels where the
    backend has them), with the block-diagonal mask."""
    _, _, packed = _packed()
    seen = []
    fused = ops.dot_product_attention

    def spy(*args, **kwargs):
        seen.append(to_numpy(kwargs["mask"]))
        return fused(*args, **kwargs)

    monkeypatch.setattr(ops, "dot_product_attention", spy)
    MultiHeadAttention(num_heads=2)(packed["inputs"], segment_ids=packed["segment_ids"])
    (mask,) = seen
    np.testing.assert_array_equal(mask[:, 0], to_numpy(segment_mask(packed["segment_ids"])))


def test_segment_ids_merge_with_an_attention_mask():
    """An explicit attention mask is ANDed with the segment mask: a key
    hidden by it stays hidden inside the example."""
    examples, _, packed = _packed()
    layer = MultiHeadAttention(num_heads=2)
    rows = packed["inputs"].shape[0]
    hide_first = np.ones((rows, ROW, ROW), bool)
    hide_first[:, :, 0] = False  # nobody sees step 0 of each row
    got = to_numpy(layer(packed["inputs"], segment_ids=packed["segment_ids"],
                         attention_mask=hide_first))
    explicit = segment_mask(packed["segment_ids"]) & hide_first
    want = to_numpy(layer(packed["inputs"], attention_mask=explicit,
                          query_mask=packed["segment_ids"] > 0))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("norm_position, causal", [("post", False), ("pre", True)])
def test_transformer_block_gives_each_example_its_own_output(norm_position, causal):
    examples, _, packed = _packed()
    block = TransformerBlock(num_heads=2, intermediate_dim=16, norm_position=norm_position,
                             use_causal_mask=causal)
    got = to_numpy(block(packed["inputs"], segment_ids=packed["segment_ids"]))
    _assert_each_example_as_alone(got, [to_numpy(_alone(block, x[None], block))[0]
                                        for x in examples], packed)


@pytest.mark.parametrize("window", [None, 4], ids=["global", "local"])
@pytest.mark.parametrize("given", [False, True], ids=["implied", "given"])
def test_rotary_gated_block_gives_each_example_its_own_output(given, window):
    """ModernBERT's blocks (pre-norm, rotary positions, GeGLU, no biases,
    global or local attention): the rotation restarts with each example,
    from the positions or the segment ids; the window stays inside it."""
    examples, _, packed = _packed()
    block = TransformerBlock(num_heads=2, intermediate_dim=16, norm_position="pre",
                             activation="gelu", use_bias=False, rotary_theta=100.0, gated=True,
                             window=window)
    extra = {"positions": packed["positions"]} if given else {}
    got = to_numpy(block(packed["inputs"], segment_ids=packed["segment_ids"], **extra))
    _assert_each_example_as_alone(got, [to_numpy(_alone(block, x[None], block))[0]
                                        for x in examples], packed)


@pytest.mark.parametrize("make", [lambda: PositionEmbedding(max_sequence_length=ROW),
                                  SinusoidalPositionalEncoding], ids=["learned", "sinusoidal"])
def test_position_layers_follow_restarted_positions(make):
    examples, _, packed = _packed()
    layer = make()
    got = to_numpy(layer(packed["inputs"], positions=packed["positions"],
                         segment_ids=packed["segment_ids"]))
    _assert_each_example_as_alone(got, [to_numpy(layer(x[None]))[0] for x in examples], packed,
                                  atol=0)


# === Gradients: the sum of the examples' losses ===


def _weights_of_positions(packed):
    """Fixed random weights `(R, ROW, D)` on the outputs, zero on padding:
    the packed loss `sum(out * w)` is the sum of the examples' losses."""
    w = np.random.default_rng(7).normal(size=packed["inputs"].shape).astype("float32")
    return w * (packed["segment_ids"] > 0)[..., None]


def _assert_gradient_is_the_sum_over_examples(layer, call, examples, packed):
    """`call(layer, x, segment_ids, positions)` on the packed rows against
    `call(layer, x, None, None)` on each example alone, compiled as `fit`
    compiles a step (training_step_results)."""
    w = _weights_of_positions(packed)
    x = keras.Input((None, D))
    segments = keras.Input((None,), dtype="int32")
    positions = keras.Input((None,), dtype="int32")
    packed_model = keras.Model([x, segments, positions], call(layer, x, segments, positions))
    alone_model = keras.Model(x, call(layer, x, None, None))
    outs, grads, _ = training_step_results(
        packed_model, [packed["inputs"], packed["segment_ids"], packed["positions"]],
        lambda out: ops.sum(out * ops.convert_to_tensor(w)))
    total = [np.zeros_like(g) for g in grads]
    for row, span, index in _spans(packed):
        _, example_grads, _ = training_step_results(
            alone_model, examples[index][None],
            lambda out: ops.sum(out[0] * ops.convert_to_tensor(w[row, span])))
        total = [t + g for t, g in zip(total, example_grads)]
    assert any(np.abs(g).max() > 0 for g in grads)
    assert_all_close(total, grads, atol=1e-5, what="weight gradient")


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_mha_gradient_is_the_sum_of_the_examples_gradients(causal):
    examples, _, packed = _packed()

    def call(layer, x, segments, positions):
        return layer(x, segment_ids=segments, use_causal_mask=causal)

    _assert_gradient_is_the_sum_over_examples(MultiHeadAttention(num_heads=2), call,
                                              examples, packed)


def test_block_and_positions_gradient_is_the_sum_of_the_examples_gradients():
    """A learned position table under a pre-norm block: both see the
    restarted positions and the segments."""
    examples, _, packed = _packed()
    table = PositionEmbedding(max_sequence_length=ROW)
    block = TransformerBlock(num_heads=2, intermediate_dim=16, norm_position="pre")

    class Stack(keras.layers.Layer):
        def build(self, x_shape):
            table.build(x_shape)
            block.build(x_shape)

        def call(self, x, segment_ids=None, positions=None):
            x = x + table(x, positions=positions, segment_ids=segment_ids)
            return block(x, segment_ids=segment_ids)

        def compute_output_shape(self, x_shape, *args, **kwargs):
            return x_shape

    def call(layer, x, segments, positions):
        return layer(x, segment_ids=segments, positions=positions)

    stack = Stack()
    stack.table, stack.block = table, block
    _assert_gradient_is_the_sum_over_examples(stack, call, examples, packed)


# === Bad packings ===

X = np.random.default_rng(3).normal(size=(2, 6, D)).astype("float32")
SEGMENTS = np.array([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1]], "int32")
POSITIONS = np.array([[0, 1, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5]], "int32")


@pytest.mark.parametrize("row, what", [
    ([1, 2, 1, 1, 0, 0], "goes back"),
    ([1, 1, 3, 3, 0, 0], "skips an id"),
    ([2, 2, 2, 0, 0, 0], "does not start at 1"),
    ([1, 1, 0, 2, 2, 0], "a segment after padding"),
    ([1, 1, -1, 0, 0, 0], "negative"),
])
def test_mha_refuses_segment_ids_that_are_not_a_packing(row, what):
    segments = SEGMENTS.copy()
    segments[0] = row
    with pytest.raises(ValueError, match=r"Invalid value for argument `segment_ids`: a row "
                                         r"holds segments 1, 2, \.\.\., k.*row 0 breaks it"):
        MultiHeadAttention(num_heads=2)(X, segment_ids=segments)


@pytest.mark.parametrize("dtype", ["float32", "bool"])
def test_segment_ids_of_another_dtype_are_refused(dtype):
    layer = MultiHeadAttention(num_heads=2)
    with pytest.raises(ValueError, match=rf"`segment_ids`: it must hold integer ids .*"
                                         rf"Received: segment_ids.dtype={dtype}"):
        layer(X, segment_ids=SEGMENTS.astype(dtype))
    with pytest.raises(ValueError, match=rf"`positions`: it must hold integer ids .*"
                                         rf"Received: positions.dtype={dtype}"):
        PositionEmbedding(max_sequence_length=8)(X, positions=POSITIONS.astype(dtype))


@pytest.mark.parametrize("offset", [2 ** 32, -2 ** 32, 2 ** 31])
def test_int64_ids_outside_int32_are_refused_before_the_cast(offset):
    # 2**32 + 2 would wrap to 2 in int32 (and JAX without x64 converts an
    # int64 array to int32): a packing that is not one.
    # Keras's Layer.__call__ converts a NumPy argument first, and on JAX
    # without x64 that conversion itself wraps int64 to int32: there the
    # check can only run where the helpers get the NumPy array.
    through_layers = keras.backend.backend() != "jax"
    segments = SEGMENTS.astype("int64")
    segments[0, 2:5] += offset
    positions = POSITIONS.astype("int64")
    positions[1, 3] += offset
    cases = [("segment_ids", segments, (0, 2), checked_segment_ids,
              lambda ids: MultiHeadAttention(num_heads=2)(X, segment_ids=ids)),
             ("positions", positions, (1, 3), checked_positions,
              lambda ids: PositionEmbedding(max_sequence_length=8)(X, positions=ids))]
    for name, ids, (row, column), check, layer_call in cases:
        for call in [check] + ([layer_call] if through_layers else []):
            with pytest.raises(ValueError, match=rf"`{name}`: ids must fit in int32 .*Received: "
                                                 rf"{name}\[{row}, {column}\]={ids[row, column]}"):
                call(ids)
    # In range, int64 ids are the int32 ones.
    layer = MultiHeadAttention(num_heads=2)
    np.testing.assert_array_equal(to_numpy(layer(X, segment_ids=SEGMENTS.astype("int64"))),
                                  to_numpy(layer(X, segment_ids=SEGMENTS)))


@pytest.mark.parametrize("call, argument", [
    (lambda: MultiHeadAttention(num_heads=2)(X, segment_ids=SEGMENTS, query_mask=np.ones((2, 6))),
     "query_mask"),
    (lambda: MultiHeadAttention(num_heads=2)(X, X, segment_ids=SEGMENTS, value_segment_ids=SEGMENTS,
                                             value_mask=np.ones((2, 6), bool)), "value_mask"),
    (lambda: TransformerBlock(num_heads=2, intermediate_dim=8)(
        X, segment_ids=SEGMENTS, padding_mask=np.ones((2, 6), bool)), "padding_mask"),
    (lambda: TransformerDecoderBlock(num_heads=2, intermediate_dim=8)(
        X, X, decoder_segment_ids=SEGMENTS, encoder_segment_ids=SEGMENTS,
        decoder_padding_mask=np.ones((2, 6), bool)), "decoder_padding_mask"),
])
def test_a_padding_mask_that_disagrees_with_the_segment_ids_is_refused(call, argument):
    with pytest.raises(ValueError, match=rf"Invalid value for argument `{argument}`: it must "
                                         rf"be True exactly where `\w*segment_ids` > 0"):
        call()


def test_a_padding_mask_that_agrees_is_accepted():
    layer = MultiHeadAttention(num_heads=2)
    np.testing.assert_array_equal(
        to_numpy(layer(X, segment_ids=SEGMENTS, query_mask=SEGMENTS > 0)),
        to_numpy(layer(X, segment_ids=SEGMENTS)))


@pytest.mark.parametrize("kwargs, match", [
    ({"value": X}, r"`value_segment_ids`: cross-attention over packed rows needs"),
    ({"segment_ids": None, "value_segment_ids": SEGMENTS}, r"`value_segment_ids`: it pairs"),
    ({"cache": np.zeros((2, 2, 6, 2, 4), "float32"), "cache_update_index": 0},
     r"`segment_ids`: packed rows are for training and scoring"),
])
def test_mha_refuses_segment_ids_it_cannot_pair(kwargs, match):
    kwargs = {"segment_ids": SEGMENTS, **kwargs}
    layer = MultiHeadAttention(num_heads=2)
    layer(X)
    with pytest.raises(ValueError, match=match):
        layer(X, **kwargs)


@pytest.mark.parametrize("make", [lambda: PositionEmbedding(max_sequence_length=8),
                                  SinusoidalPositionalEncoding], ids=["learned", "sinusoidal"])
@pytest.mark.parametrize("row, with_segments", [
    ([0, 1, 2, 2, 3, 0], False),  # does not count up by 1
    ([1, 2, 0, 1, 2, 0], False),  # does not start at 0
    ([0, 1, 2, 3, 4, 0], True),  # does not restart where segment 2 starts
    ([0, 1, 0, 1, 3, 0], True),
])
def test_position_layers_refuse_positions_that_do_not_restart(make, row, with_segments):
    positions = POSITIONS.copy()
    positions[0] = row
    extra = {"segment_ids": SEGMENTS} if with_segments else {}
    with pytest.raises(ValueError, match=r"Invalid value for argument `positions`: positions "
                                         r"restart at 0 .*row 0 breaks it"):
        make()(X, positions=positions, **extra)


def test_position_layers_refuse_half_packed_calls():
    layer = PositionEmbedding(max_sequence_length=8)
    with pytest.raises(ValueError, match=r"`segment_ids`: here it only checks `positions`"):
        layer(X, segment_ids=SEGMENTS)
    with pytest.raises(ValueError, match=r"`start_index`: packed `positions` give every"):
        layer(X, positions=POSITIONS, start_index=2)


def _nan_only_where_invalid(model, good_inputs, bad_inputs, bad_row, argument):
    clean = model.predict_on_batch(good_inputs)
    if keras.backend.backend() == "torch":  # predict runs eagerly: it raises
        with pytest.raises(ValueError, match=f"`{argument}`"):
            model.predict_on_batch(bad_inputs)
        return
    bad = model.predict_on_batch(bad_inputs)
    assert np.all(np.isnan(bad[bad_row]))
    others = [r for r in range(len(bad)) if r != bad_row]
    np.testing.assert_allclose(bad[others], clean[others], atol=1e-6)


def test_a_bad_packing_in_a_compiled_step_makes_that_example_nan_only():
    x = keras.Input((6, D))
    segments = keras.Input((6,), dtype="int32")
    model = keras.Model([x, segments], TransformerBlock(num_heads=2, intermediate_dim=8)(
        x, segment_ids=segments))
    bad = SEGMENTS.copy()
    bad[1, 3:] = [2, 1, 1]  # goes back to 1
    _nan_only_where_invalid(model, [X, SEGMENTS], [X, bad], 1, "segment_ids")


def test_a_disagreeing_padding_mask_in_a_compiled_step_makes_that_example_nan_only():
    x = keras.Input((6, D))
    segments = keras.Input((6,), dtype="int32")
    padding = keras.Input((6,), dtype="bool")
    model = keras.Model([x, segments, padding], MultiHeadAttention(num_heads=2)(
        x, segment_ids=segments, query_mask=padding))
    disagreeing = SEGMENTS > 0
    disagreeing[0, 5] = True  # padding in the segment ids, real in the mask
    _nan_only_where_invalid(model, [X, SEGMENTS, SEGMENTS > 0], [X, SEGMENTS, disagreeing], 0,
                            "query_mask")


@pytest.mark.parametrize("make", [lambda: PositionEmbedding(max_sequence_length=8),
                                  SinusoidalPositionalEncoding,
                                  lambda: MultiHeadAttention(num_heads=2, rotary_theta=100.0)],
                         ids=["learned", "sinusoidal", "rotary"])
def test_bad_positions_in_a_compiled_step_make_that_example_nan_only(make):
    x = keras.Input((6, D))
    segments = keras.Input((6,), dtype="int32")
    positions = keras.Input((6,), dtype="int32")
    model = keras.Model([x, segments, positions], make()(
        x, positions=positions, segment_ids=segments))
    bad = POSITIONS.copy()
    bad[0, 2] = 2  # segment 2 does not restart at 0
    _nan_only_where_invalid(model, [X, SEGMENTS, POSITIONS], [X, SEGMENTS, bad], 0, "positions")
