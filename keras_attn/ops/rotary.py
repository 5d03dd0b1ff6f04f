"""Rotary position embeddings (RoPE) of queries and keys, and the packed
rows' positions they rotate by.

Written here, not taken from keras-hub's `RotaryEmbedding` (which gives the
same numbers, tests/layers/test_peer_compatibility.py): importing keras-hub
imports TensorFlow, which `keras_attn.ops` and the layers must not need (a
JAX GPU machine has none).

Shape legend: B batch, T length, N heads, H head dim.
"""

import math

import numpy as np
from keras import ops


def check_rotary_theta(rotary_theta):
    """None (no rotation) or a positive finite float."""
    if rotary_theta is None:
        return None
    if (isinstance(rotary_theta, bool) or not isinstance(rotary_theta, (int, float))
            or not math.isfinite(rotary_theta) or not rotary_theta > 0):
        raise ValueError(
            "Invalid value for argument `rotary_theta`: it must be None (no rotary "
            "position embedding) or a positive finite number, the base of the "
            f"rotation frequencies (10000.0 in RoFormer). Received: rotary_theta={rotary_theta!r}"
        )
    return float(rotary_theta)


def check_rotary_head_dim(rotary_theta, key_dim):
    """The rotation turns pairs of features: the query/key head size must be
    even."""
    if rotary_theta is not None and key_dim is not None and key_dim % 2:
        raise ValueError(
            "A rotary position embedding rotates pairs of features: it needs an "
            f"even query/key head size `key_dim` (rotary_theta={rotary_theta}). "
            f"Received: key_dim={key_dim}"
        )


def segment_positions(segment_ids):
    """Positions `(B, T)` int32 that restart at 0 at each segment's first
    token (padding counts on from its own first token; it is masked anyway).

    `segment_ids` must already be checked (`checked_segment_ids`). A token's
    position is its index minus the index of its run's first token: the
    runs' first indices, sorted, are looked up by the run's number.
    """
    steps = ops.arange(ops.shape(segment_ids)[1], dtype="int32")  # (T,)
    previous = ops.concatenate(
        [ops.zeros_like(segment_ids[:, :1]) - 1, segment_ids[:, :-1]], axis=1)
    starts = ops.not_equal(segment_ids, previous)  # (B, T), True at a run's first token
    run = ops.cumsum(ops.cast(starts, "int32"), axis=1) - 1  # (B, T), 0-based run number
    length = ops.shape(segment_ids)[1]
    # The starts' indices first (ascending), then T for every other token.
    first = ops.sort(ops.where(starts, steps, length), axis=1)  # (B, T)
    return steps - ops.take_along_axis(first, run, axis=1)


def apply_rotary(x, positions, theta):
    """`x` `(B, T, N, H)` with each feature pair `(i, i + H/2)` turned by the
    angle `position * theta^(-2i/H)` (the "rotate half" layout of GPT-NeoX,
    Llama and ModernBERT, not RoFormer's interleaved pairs).

    `positions` is `(B, T)` or `(1, T)`, integer. The angles are computed
    and applied in float32 (float16 holds the angle 4001 as 4000 or 4002),
    and the result cast back to `x`'s dtype.
    """
    head_dim = x.shape[-1]
    half = head_dim // 2
    # float64 NumPy, then float32: the frequencies as exact as float32 holds.
    inverse_freq = (1.0 / theta ** (np.arange(half, dtype="float64") * 2 / head_dim))
    inverse_freq = ops.convert_to_tensor(inverse_freq.astype("float32"))  # (H/2,)
    angles = ops.expand_dims(ops.cast(positions, "float32"), -1) * inverse_freq  # (B, T, H/2)
    angles = ops.expand_dims(angles, 2)  # (B, T, 1, H/2)
    cos, sin = ops.cos(angles), ops.sin(angles)
    x32 = ops.cast(x, "float32")
    x1, x2 = x32[..., :half], x32[..., half:]  # (B, T, N, H/2) each
    turned = ops.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return ops.cast(turned, x.dtype)
