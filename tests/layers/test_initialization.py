"""Every projection starts from its own draw: the initializer, regularizer and
constraint objects a layer hands to its sublayers are clones
(`keras_attn._clone.for_sublayer`), and a seeded initializer stays
reproducible."""

import keras
import numpy as np
import pytest

from keras_attn._clone import for_sublayer
from keras_attn.layers import ConformerBlock
from keras_attn.layers import FeedForward
from keras_attn.layers import MultiHeadAttention
from keras_attn.layers import RelativeMultiHeadAttention
from keras_attn.layers import TransformerBlock
from keras_attn.layers import TransformerDecoderBlock
from test_case import assert_distinct_draws
from test_case import to_numpy

X = np.random.default_rng(0).standard_normal((2, 5, 16)).astype("float32")

# class -> (constructor arguments without the initializer, how to build it)
LAYERS = {
    "mha": (MultiHeadAttention, {"num_heads": 2}, lambda l: l.build((1, 5, 16))),
    "relative_mha": (RelativeMultiHeadAttention, {"num_heads": 2},
                     lambda l: l.build((1, 5, 16))),
    "feed_forward": (FeedForward, {"intermediate_dim": 16}, lambda l: l.build((1, 5, 16))),
    "encoder_block": (TransformerBlock, {"num_heads": 2, "intermediate_dim": 16},
                      lambda l: l.build((1, 5, 16))),
    "decoder_block": (TransformerDecoderBlock, {"num_heads": 2, "intermediate_dim": 16},
                      lambda l: l.build((1, 5, 16), (1, 7, 16))),
    "conformer_block": (ConformerBlock, {"num_heads": 2, "kernel_size": 3},
                        lambda l: l.build((1, 5, 16))),
}


def _kernels(layer):
    """The weights `kernel_initializer` draws (the Conformer's depthwise
    kernel has an initializer of its own, left at its unseeded default)."""
    return {v.path.split("/", 1)[1]: to_numpy(v) for v in layer.weights
            if "depthwise" not in v.path}


def test_reported_defect_query_key_value_kernels_differ():
    # The reproducer of the issue: one unseeded initializer instance handed to
    # the three projections gave W_Q == W_K == W_V.
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    layer.build((1, 3, 8))
    q, k, v = (to_numpy(d.kernel) for d in (layer.query_dense, layer.key_dense,
                                             layer.value_dense))
    assert not np.array_equal(q, k)
    assert not np.array_equal(q, v)
    assert not np.array_equal(k, v)


@pytest.mark.parametrize("name", sorted(LAYERS))
@pytest.mark.parametrize(
    "initializer",
    [None, "truncated_normal_object", "seeded"],
    ids=["default", "one_truncated_normal", "seeded"],
)
def test_every_kernel_is_its_own_draw(name, initializer):
    cls, kwargs, build = LAYERS[name]
    kwargs = dict(kwargs)
    if initializer == "truncated_normal_object":
        kwargs["kernel_initializer"] = keras.initializers.TruncatedNormal(stddev=0.02)
    elif initializer == "seeded":
        kwargs["kernel_initializer"] = keras.initializers.TruncatedNormal(stddev=0.02, seed=7)
    layer = cls(**kwargs)
    build(layer)
    assert_distinct_draws(layer.weights)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_seeded_initializer_is_reproducible(name):
    cls, kwargs, build = LAYERS[name]
    seeded = lambda: keras.initializers.GlorotUniform(seed=11)  # noqa: E731
    first, second = cls(**kwargs, kernel_initializer=seeded()), cls(
        **kwargs, kernel_initializer=seeded())
    build(first)
    build(second)
    a, b = _kernels(first), _kernels(second)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    # Another seed, other weights.
    third = cls(**kwargs, kernel_initializer=keras.initializers.GlorotUniform(seed=12))
    build(third)
    c = _kernels(third)
    assert any(not np.array_equal(a[key], c[key]) for key in a if np.ptp(a[key]) > 0)


def test_seeded_layer_from_config_gives_the_same_weights():
    layer = TransformerBlock(num_heads=2, intermediate_dim=16,
                             kernel_initializer=keras.initializers.HeNormal(seed=3))
    layer.build((1, 5, 16))
    revived = TransformerBlock.from_config(layer.get_config())
    revived.build((1, 5, 16))
    for a, b in zip(layer.weights, revived.weights):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b), err_msg=a.path)


def test_for_sublayer_clones_and_derives_seeds():
    unseeded = keras.initializers.GlorotUniform()
    a, b = for_sublayer(unseeded, "query"), for_sublayer(unseeded, "key")
    assert a is not unseeded and type(a) is type(unseeded)
    assert not np.array_equal(to_numpy(a((8, 8))), to_numpy(b((8, 8))))

    seeded = keras.initializers.RandomNormal(stddev=0.5, seed=4)
    q1, q2, k = (for_sublayer(seeded, n) for n in ("query", "query", "key"))
    assert q1.get_config() == q2.get_config()  # same name, same seed
    np.testing.assert_array_equal(to_numpy(q1((4, 4))), to_numpy(q2((4, 4))))
    assert not np.array_equal(to_numpy(q1((4, 4))), to_numpy(k((4, 4))))
    assert q1.get_config()["stddev"] == 0.5

    # A SeedGenerator advances at each call: shared as it is.
    generator_seeded = keras.initializers.RandomNormal(seed=keras.random.SeedGenerator(1))
    assert for_sublayer(generator_seeded, "query") is generator_seeded

    # Regularizers and constraints are copied with their settings; None and a
    # plain function pass through.
    regularizer = for_sublayer(keras.regularizers.L2(0.3), "key")
    assert isinstance(regularizer, keras.regularizers.L2)
    assert regularizer.get_config()["l2"] == pytest.approx(0.3)
    assert isinstance(for_sublayer(keras.constraints.NonNeg(), "key"), keras.constraints.NonNeg)
    assert for_sublayer(None, "key") is None
    function = lambda shape, dtype=None: keras.ops.ones(shape)  # noqa: E731
    assert for_sublayer(function, "key") is function
