"""Multi-head attention with masks, a fused route and a key/value cache."""

import numbers

import keras
from keras import ops

from keras_attn._keras_compat import SpecFromCall
from keras_attn._checks import check_flash_attention
from keras_attn._checks import check_positive_int
from keras_attn._checks import check_rate
from keras_attn._checks import check_static_shape
from keras_attn._checks import static_dim
from keras_attn.layers._projection import einsum_projection
from keras_attn.ops.attention import fused_attention_supports
from keras_attn.ops.attention import normalize_attention_mask
from keras_attn.ops.attention import scaled_dot_product_attention
from keras_attn.ops.kernels import attend
from keras_attn.ops.local_attention import banded_attention
from keras_attn.ops.masking import causal_mask
from keras_attn.ops.masking import checked_agreement
from keras_attn.ops.masking import checked_mask
from keras_attn.ops.masking import checked_positions
from keras_attn.ops.masking import checked_segment_ids
from keras_attn.ops.masking import get_keras_mask
from keras_attn.ops.masking import local_mask
from keras_attn.ops.masking import merge_masks
from keras_attn.ops.masking import nan_where
from keras_attn.ops.masking import segment_mask
from keras_attn.ops.masking import set_keras_mask
from keras_attn.ops.rotary import apply_rotary
from keras_attn.ops.rotary import check_rotary_head_dim
from keras_attn.ops.rotary import check_rotary_theta
from keras_attn.ops.rotary import segment_positions


def _check_rank(name, shape):
    if len(shape) != 3:
        raise ValueError(
            f"`{name}` must have rank 3, (B, length, width). "
            f"Received: {name}.shape={tuple(shape)}"
        )


def _check_shapes(query_shape, value_shape, key_shape):
    _check_key_value(key_shape, value_shape)
    for name, shape in (("query", query_shape), ("value", value_shape), ("key", key_shape)):
        _check_rank(name, shape)


def _output_dim_from_keras(output_dim, output_shape):
    """`output_dim` given Keras's `output_shape` (an int or a 1-tuple)."""
    if output_shape is None:
        return output_dim
    if output_dim is not None:
        raise ValueError(
            "Give `output_dim` or Keras's `output_shape`, not both. Received: "
            f"output_dim={output_dim!r}, output_shape={output_shape!r}"
        )
    if isinstance(output_shape, (tuple, list)):
        if len(output_shape) != 1:
            raise ValueError(
                "keras_attn projects the attention output to one axis: "
                "`output_shape` must be an int or a 1-tuple. Received: "
                f"output_shape={output_shape!r}"
            )
        (output_shape,) = output_shape
    if isinstance(output_shape, bool) or not isinstance(output_shape, numbers.Integral):
        # Keras's own words first, so code matching Keras's error still matches.
        raise ValueError(
            f"Invalid `output_shape`: {output_shape!r}. keras_attn projects the "
            "attention output to one axis: `output_shape` must be a positive int "
            f"or a 1-tuple of one. Received: output_shape={output_shape!r}"
        )
    return check_positive_int("output_shape", output_shape)


def _check_key_value(key_shape, value_shape):
    """`key` and `value` agree on every axis but the width, as Keras asks
    (checked before their ranks, so that a mismatch is named as Keras
    names it whatever the ranks)."""
    key_dims = [static_dim(dim) for dim in tuple(key_shape)[:-1]]
    value_dims = [static_dim(dim) for dim in tuple(value_shape)[:-1]]
    if len(key_dims) != len(value_dims) or any(
        k is not None and v is not None and k != v for k, v in zip(key_dims, value_dims)
    ):
        # Keras's sentence first, so code matching Keras's error still matches.
        raise ValueError(
            "All dimensions of `value` and `key`, except the last one, must be equal: "
            "the batch B and the lengths S of `key` and `value` must be equal. Received: "
            f"key.shape={tuple(key_shape)}, value.shape={tuple(value_shape)}"
        )


def _arange_positions(length):
    """`(1, length)` positions `0 .. length - 1`, int32."""
    return ops.expand_dims(ops.arange(length, dtype="int32"), 0)


def _update_rows(cache, new, index):
    """`cache` (B, S, N, H) with rows `index .. index + T - 1` replaced by
    `new` (B, T, N, H): a dynamic update slice (in place inside a compiled
    loop)."""
    return ops.slice_update(cache, (0, index, 0, 0), new)


def _select_rows(cache, new, index):
    """The same write as `_update_rows` by a gather and a select, which ONNX
    and LiteRT's builtin ops hold (TensorFlow's dynamic update slice is an
    XLA op that neither converter takes). It rewrites the whole cache, so it
    is used only for those exports (`portable_cache_write`)."""
    offset = ops.arange(ops.shape(cache)[1], dtype="int32") - ops.cast(index, "int32")  # (S,)
    steps = ops.shape(new)[1]
    inside = ops.logical_and(offset >= 0, offset < steps)
    spread = ops.take(new, ops.clip(offset, 0, steps - 1), axis=1)  # (B, S, N, H)
    return ops.where(ops.reshape(inside, (1, -1, 1, 1)), spread, cache)


@keras.saving.register_keras_serializable(package="keras_attn")
class MultiHeadAttention(SpecFromCall, keras.layers.Layer):
    """Multi-head attention: `concat(head_1..head_N) W^O` with
    `head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)`.

    Self-attention when only `query` is given, cross-attention (source-target
    attention) when `value` (and optionally `key`) come from another sequence.
    The call goes through `keras.ops.dot_product_attention` (flash / cuDNN
    kernels where the backend has them) unless attention dropout is active,
    the scores are asked for, or `value_dim != key_dim`; then through the
    explicit reference formula.
    Both give the same numbers (to float32 round-off).

    Args:
        num_heads: number of attention heads N.
        key_dim: size H of each query/key head. Defaults to the query width
            divided by `num_heads` (the paper's `d_k = d_model / h`).
        value_dim: size of each value head. Defaults to `key_dim`.
        dropout: dropout rate on the attention probabilities.
        use_bias: whether the four projections have biases.
        output_dim: width of the output. Defaults to the query width.
        flash_attention: passed to `keras.ops.dot_product_attention`: None
            lets the backend decide, True requires the fused path (refused,
            as by Keras, with `dropout > 0`, with `return_attention_scores`
            and with `value_dim != key_dim`), False forbids it.
        kernel_initializer: initializer of the projection kernels (cloned
            for each projection, so that each starts from its own draw).
        bias_initializer: initializer of the projection biases.
        kernel_regularizer: optional regularizer of the projection kernels.
        bias_regularizer: optional regularizer of the projection biases.
        kernel_constraint: optional constraint of the projection kernels.
        bias_constraint: optional constraint of the projection biases.
        seed: seed of the attention dropout.
        rotary_theta: None (default) or the base `theta` of a rotary position
            embedding (RoPE; Su et al. 2021): after their projections, each
            query and key head is turned feature pair by feature pair, pair
            `(i, i + H/2)` by the angle `position * theta^(-2i/H)`, so that a
            score depends on the two tokens' distance only. The "rotate half"
            pairing of GPT-NeoX, Llama and ModernBERT (10000.0 in most
            models; ModernBERT 160000.0 on its global layers and 10000.0 on
            its local ones). Needs an even `key_dim`.
        window: None (default, global attention) or the span in tokens of
            local (sliding-window) attention: query `t` attends only to keys
            `s` with `|t - s| <= window // 2` (ModernBERT's
            `local_attention=128`: 64 tokens on each side; with a cache, `t`
            counts from `cache_update_index`). Merged (AND) with every other
            mask: padding, packing, causal.
        output_shape: Keras's name for `output_dim`: an int or a 1-tuple
            (keras_attn projects to one axis; a longer tuple is refused).
            Not kept in the config (`output_dim` is).
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(B, T, D)`.
        value: `(B, S, Dv)`; defaults to `query` (self-attention).
        key: `(B, S, Dk)`; defaults to `value`.
        query_mask: `(B, T)` boolean, True = a real (non-padding) query.
            Defaults to the implicit Keras mask of `query`. A padded query
            gets a zero attention output.
        value_mask: `(B, S)` boolean, True = a key/value that may be attended
            to. Defaults to the implicit Keras mask of `value` (of `query` in
            self-attention).
        key_mask: `(B, S)`, merged with `value_mask`; defaults to the implicit
            Keras mask of `key`.
        attention_mask: boolean, True = may attend: `(T, S)` (the same for
            every example), `(B, T, S)`, or `(B, N, T, S)` (per head), as in
            Keras; merged (AND) with the above. Each dimension must match or
            be 1.
        use_causal_mask: query `i` attends only to keys `j <= i` (shifted by
            `cache_update_index` when decoding with a cache).
        segment_ids: `(B, T)` integer ids of packed rows: 1, 2, ..., k on the
            tokens of the row's k examples, then 0 on its padding. A query
            attends only to keys of its own example (block-diagonal; causal
            inside each example with `use_causal_mask`); padding sees
            nothing and is seen by nothing. Merged (AND) with the masks
            above, which must agree with it (`query_mask` True exactly where
            `segment_ids > 0`). Not with a `cache`.
        value_segment_ids: `(B, S)`, the keys' segment ids in
            cross-attention (query example `i` attends to key example `i`);
            defaults to `segment_ids` in self-attention, needed with
            `segment_ids` in cross-attention.
        positions: with `rotary_theta`, optional `(B, T)` integer positions
            of the queries (and of the keys in self-attention), restarting
            at 0 with each example of a packed row (checked as
            `PositionEmbedding` checks them, against `segment_ids` when
            given). Defaults to the positions `segment_ids` imply (0, 1, ...
            in each example), else to `0 .. T-1`. With a cache the tokens
            are at `cache_update_index + 0 .. T-1` and `positions` is
            refused. In cross-attention the keys are at `0 .. S-1`, or at
            the positions `value_segment_ids` imply. Refused without
            `rotary_theta` (nothing would use them).
        return_attention_scores: also return the probabilities `(B, N, T, S)`.
        training: whether attention dropout is active.
        cache: optional `(B, 2, S_max, N, H)` projected keys and values (see
            `empty_cache` and `compute_key_value_cache`; `H` is the larger of
            the key and value head sizes).
        cache_update_index: with `cache`, the position at which this call's
            keys and values are written; keys after the written ones are never
            attended to. Without it the cache is used as is (cross-attention
            over a precomputed encoder output).

    Returns:
        `output (B, T, output_dim)`, then the scores if asked for, then the
        updated cache if one was given.

    Example:

    >>> import numpy as np
    >>> layer = MultiHeadAttention(num_heads=2)
    >>> x = np.random.rand(2, 5, 8).astype("float32")
    >>> tuple(layer(x, use_causal_mask=True).shape)
    (2, 5, 8)
    >>> out, scores = layer(x, np.random.rand(2, 3, 8), return_attention_scores=True)
    >>> tuple(scores.shape)
    (2, 2, 5, 3)

    References:
        Vaswani et al., "Attention Is All You Need", 2017, section 3.2.
    """

    def __init__(
        self,
        num_heads,
        key_dim=None,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        output_dim=None,
        flash_attention=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        seed=None,
        rotary_theta=None,
        window=None,
        output_shape=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        output_dim = _output_dim_from_keras(output_dim, output_shape)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.key_dim = check_positive_int("key_dim", key_dim, allow_none=True)
        self.value_dim = check_positive_int(
            "value_dim", value_dim, allow_none=True
        )
        self.dropout = check_rate("dropout", dropout)
        self.use_bias = bool(use_bias)
        self.output_dim = check_positive_int(
            "output_dim", output_dim, allow_none=True
        )
        self.flash_attention = check_flash_attention(flash_attention)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        if self.flash_attention and self.dropout > 0:
            raise ValueError(
                # Keras's sentence first, so code matching Keras's error still matches.
                "Dropout is not supported when flash attention is enabled. Attention "
                "dropout has no fused kernel: `flash_attention=True` needs `dropout=0` "
                "(None lets the layer choose). Received: "
                f"flash_attention=True, dropout={self.dropout}"
            )
        self.seed = seed
        self.rotary_theta = check_rotary_theta(rotary_theta)
        check_rotary_head_dim(self.rotary_theta, self.key_dim)
        self.window = check_positive_int("window", window, allow_none=True)
        self.supports_masking = True
        self.seed_generator = (
            keras.random.SeedGenerator(seed) if self.dropout > 0 else None
        )

    # How a cached call writes its keys and values: False, a dynamic update
    # slice; True, a gather and a select (the ONNX / LiteRT exporters set it
    # while they convert a decoder; not part of the config).
    portable_cache_write = False

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        _check_shapes(query_shape, value_shape, key_shape)
        width = query_shape[-1]
        if self.key_dim is None and width % self.num_heads != 0:
            raise ValueError(
                f"The query width must be divisible by `num_heads` when "
                f"`key_dim` is not given (num_heads={self.num_heads}). "
                f"Received: query width={width}"
            )
        n = self.num_heads
        self._key_dim = self.key_dim or width // n
        self._value_dim = self.value_dim or self._key_dim
        self._output_dim = self.output_dim or width
        check_rotary_head_dim(self.rotary_theta, self._key_dim)
        if self.flash_attention and self._key_dim != self._value_dim:
            raise ValueError(
                "The fused kernel needs equal key and value head sizes: "
                "`flash_attention=True` needs `value_dim == key_dim`. Received: "
                f"key_dim={self._key_dim}, value_dim={self._value_dim}"
            )

        self.query_dense = einsum_projection(
            self, "btd,dnh->btnh", (None, n, self._key_dim), "nh", "query", query_shape
        )
        self.key_dense = einsum_projection(
            self, "bsd,dnh->bsnh", (None, n, self._key_dim), "nh", "key", key_shape
        )
        self.value_dense = einsum_projection(
            self, "bsd,dnh->bsnh", (None, n, self._value_dim), "nh", "value", value_shape
        )
        self.output_dense = einsum_projection(
            self, "btnh,nhd->btd", (None, self._output_dim), "d", "attention_output",
            (query_shape[0], query_shape[1], n, self._value_dim),
        )
        self.built = True

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        """`(B, T, output_dim)`: the attention output (the scores and cache,
        when asked for, come from `compute_output_spec`)."""
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        _check_shapes(query_shape, value_shape, key_shape)
        return tuple(query_shape[:-1]) + (self.output_dim or query_shape[-1],)

    # === Cache helpers ===

    def empty_cache(self, batch_size, max_length, dtype=None):
        """Zeros of shape `(B, 2, max_length, N, H)` for cached self-attention.

        `H = max(key_dim, value_dim)`: when the two differ (the paper's Table 3
        rows with a small key size) the shorter of keys and values is stored
        zero-padded to `H`, so one tensor holds both.
        """
        self._check_cacheable()
        return ops.zeros(
            (batch_size, 2, max_length, self.num_heads, self._cache_dim()),
            dtype=dtype or self.compute_dtype,
        )

    def compute_key_value_cache(self, value, key=None):
        """Projected keys and values `(B, 2, S, N, H)` of a fixed sequence
        (the encoder output in cross-attention), computed once."""
        self._check_cacheable()
        key = value if key is None else key
        k = self.key_dense(key)  # (B, S, N, H)
        if self.rotary_theta is not None:  # cached rotated, at 0 .. S-1
            k = apply_rotary(k, _arange_positions(ops.shape(k)[1]), self.rotary_theta)
        k, v = self._pad_to_cache(k, self.value_dense(value))
        return ops.stack([k, v], axis=1)

    def _cache_dim(self):
        return max(self._key_dim, self._value_dim)

    def _pad_to_cache(self, k, v):
        """Zero-pad the head axis of `(B, S, N, H_k)` keys or `(B, S, N, H_v)`
        values to the cache's `H`."""
        width = self._cache_dim()

        def pad(x, size):
            if size == width:
                return x
            return ops.pad(x, ((0, 0), (0, 0), (0, 0), (0, width - size)))

        return pad(k, self._key_dim), pad(v, self._value_dim)

    def _segment_ids(self, segment_ids, value_segment_ids, self_attention, cache):
        """The query and key segment ids (int32, or None) and the invalidity
        of each (`checked_segment_ids`)."""
        if segment_ids is None:
            if value_segment_ids is not None:
                raise ValueError(
                    "Invalid value for argument `value_segment_ids`: it pairs "
                    "the keys' examples with the queries' `segment_ids`, which "
                    "are missing. Received: segment_ids=None, value_segment_ids="
                    f"{getattr(value_segment_ids, 'shape', value_segment_ids)}"
                )
            return None, None, ()
        if cache is not None:
            raise ValueError(
                "Invalid value for argument `segment_ids`: packed rows are for "
                "training and scoring, not cached decoding. Received: "
                "segment_ids with a cache"
            )
        segment_ids, bad_query = checked_segment_ids(segment_ids, "segment_ids")
        if value_segment_ids is None:
            if not self_attention:
                raise ValueError(
                    "Invalid value for argument `value_segment_ids`: "
                    "cross-attention over packed rows needs the keys' segment "
                    "ids as well. Received: value_segment_ids=None"
                )
            return segment_ids, segment_ids, (bad_query,)
        value_segment_ids, bad_value = checked_segment_ids(
            value_segment_ids, "value_segment_ids")
        return segment_ids, value_segment_ids, (bad_query, bad_value)

    def _check_cacheable(self):
        if not self.built:
            raise ValueError(
                "The layer must be built (called once) before it has a cache. "
                f"Received: layer {self.name!r} unbuilt"
            )

    # === Call ===

    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
        cache=None,
        cache_update_index=None,
        segment_ids=None,
        value_segment_ids=None,
        positions=None,
    ):
        if query_mask is None:
            query_mask = get_keras_mask(query)
        self_attention = value is None
        segment_ids, value_segment_ids, bad_ids = self._segment_ids(
            segment_ids, value_segment_ids, self_attention, cache)
        if value is None:  # self-attention
            value = query
            if value_mask is None:
                value_mask = query_mask
        elif value_mask is None:
            value_mask = get_keras_mask(value)
        if key is None:
            key = value
        elif key_mask is None:
            key_mask = get_keras_mask(key)
        if cache_update_index is not None and cache is None:
            raise ValueError(
                "`cache_update_index` needs a `cache`. Received: "
                f"cache=None, cache_update_index={cache_update_index!r}"
            )
        if self.flash_attention and return_attention_scores:
            raise ValueError(
                "The fused kernel does not return the attention scores: "
                "`return_attention_scores=True` needs `flash_attention` None "
                "or False. Received: flash_attention=True"
            )
        _check_shapes(query.shape, value.shape, key.shape)

        masks, invalid = self._checked_masks(
            query, value, query_mask, value_mask, key_mask, attention_mask,
            segment_ids, value_segment_ids)
        invalid += bad_ids
        # A key or value hidden from every query never reaches the answer,
        # whatever it holds: zeroed before its projection, so that a NaN in
        # padding cannot leak through `0 * NaN` (forward or gradients).
        for name in ("value_mask", "key_mask"):
            mask = masks[name]
            if mask is not None and cache is None:
                check_static_shape(name, mask, tuple(value.shape[:2]), "(B, S)")
                seen = ops.expand_dims(mask, -1)  # (B, S, 1)
                value = ops.where(seen, value, ops.zeros_like(value))
                key = ops.where(seen, key, ops.zeros_like(key))

        rotary = self._rotary_positions(
            query, key, positions, segment_ids, value_segment_ids, self_attention,
            cache, cache_update_index)
        invalid += rotary[2:]
        q, k, v, cache = self._project(
            query, value, key, cache, cache_update_index, rotary[:2])
        if self._takes_the_band(q, masks, self_attention, cache, use_causal_mask,
                                return_attention_scores):
            attended, scores = self._banded_attention(q, k, v, masks, segment_ids, training)
        else:
            mask, is_causal = self._compute_attention_mask(
                q, k, masks, segment_ids, value_segment_ids, use_causal_mask,
                cache_update_index)
            attended, scores = self._compute_attention(
                q, k, v, mask, is_causal, training, return_attention_scores)
        output = self.output_dense(attended)  # (B, T, output_dim)
        for bad in invalid:
            output = nan_where(bad, output)

        outputs = (output,)
        if return_attention_scores:
            outputs += (scores,)
        if cache is not None:
            outputs += (cache,)
        return outputs[0] if len(outputs) == 1 else outputs

    def _checked_masks(self, query, value, query_mask, value_mask, key_mask,
                       attention_mask, segment_ids, value_segment_ids):
        """The masks, checked: `({name: mask or None}, invalid)`, where
        `invalid` holds a per-example flag for each check that cannot raise
        inside a graph. Numeric masks hold 0 and 1 only: another value is an
        error here, or NaN for that example inside a graph (`checked_mask`)."""
        query_mask, bad_query = checked_mask(query_mask, "query_mask")
        value_mask, bad_value = checked_mask(value_mask, "value_mask")
        key_mask, bad_key = checked_mask(key_mask, "key_mask")
        attention_mask, bad_attention = checked_mask(attention_mask, "attention_mask", pairwise=True)
        invalid = (bad_query, bad_value, bad_key, bad_attention)
        if segment_ids is not None:
            # Padding is segment 0: the masks follow the ids, and a mask given
            # beside them must say the same (else an error, or NaN in a graph).
            check_static_shape("segment_ids", segment_ids, tuple(query.shape[:2]), "(B, T)")
            check_static_shape(
                "value_segment_ids", value_segment_ids, tuple(value.shape[:2]), "(B, S)")
            query_mask, bad_q = checked_agreement(
                query_mask, segment_ids, "query_mask", "segment_ids")
            ids_name = "segment_ids" if value_segment_ids is segment_ids else "value_segment_ids"
            agreed = [checked_agreement(mask, value_segment_ids, name, ids_name)
                      for name, mask in (("value_mask", value_mask), ("key_mask", key_mask))]
            (value_mask, bad_v), (_, bad_k) = agreed
            invalid += (bad_q, bad_v, bad_k)
        if query_mask is not None:
            check_static_shape("query_mask", query_mask, tuple(query.shape[:2]), "(B, T)")
        masks = {"query_mask": query_mask, "value_mask": value_mask, "key_mask": key_mask,
                 "attention_mask": attention_mask}
        return masks, invalid

    def _rotary_positions(self, query, key, positions, segment_ids, value_segment_ids,
                          self_attention, cache, cache_update_index):
        """`(query positions, key positions, invalid)` for the rotary
        embedding: `(B|1, T)` and `(B|1, S)` integers (None for keys read
        from a cache, rotated when written), and the examples whose given
        `positions` break the packing rule (None when checked here); both
        positions None without `rotary_theta`."""
        if self.rotary_theta is None:
            if positions is not None:
                raise ValueError(
                    "Invalid value for argument `positions`: they place the "
                    "rotary position embedding, which this layer does not have. "
                    "Received: positions with rotary_theta=None"
                )
            return None, None, None
        if positions is not None and cache is not None:
            raise ValueError(
                "Invalid value for argument `positions`: cached decoding places "
                "its tokens at `cache_update_index`. Received: positions with a cache"
            )
        if cache is not None:
            start = 0 if cache_update_index is None else cache_update_index
            query_positions = _arange_positions(ops.shape(query)[1]) + start
            keys = None if cache_update_index is None else query_positions
            return query_positions, keys, None
        bad = None
        if positions is not None:
            positions, bad = checked_positions(positions, segment_ids)
            check_static_shape("positions", positions, tuple(query.shape[:2]), "(B, T)")
        elif segment_ids is not None:
            positions = segment_positions(segment_ids)
        else:
            positions = _arange_positions(ops.shape(query)[1])
        if self_attention:
            return positions, positions, bad
        if value_segment_ids is not None:
            return positions, segment_positions(value_segment_ids), bad
        return positions, _arange_positions(ops.shape(key)[1]), bad

    def _project(self, query, value, key, cache, cache_update_index, rotary=(None, None)):
        """`(q, k, v, cache)`: the heads' projections `(B, T|S, N, H)`, the
        keys and values read from the cache or written into it; with
        `rotary_theta`, queries and new keys turned at the `rotary`
        positions (query, key) before they are used or cached."""
        # The masks were read by `call`. The projections do not support
        # masking, so they get the inputs without them; the masks are put back
        # after, since the caller may use the same tensors again.
        held = [(t, get_keras_mask(t)) for t in (query, value, key)]
        for tensor, _ in held:
            set_keras_mask(tensor, None)
        q = self.query_dense(query)  # (B, T, N, H)
        if cache is not None and cache_update_index is None:
            # precomputed, (B, S, N, H_k) and (B, S, N, H_v)
            k = cache[:, 0, :, :, : self._key_dim]
            v = cache[:, 1, :, :, : self._value_dim]
        else:
            k = self.key_dense(key)  # (B, S, N, H)
            v = self.value_dense(value)  # (B, S, N, Hv)
        for tensor, mask in held:
            set_keras_mask(tensor, mask)
        query_positions, key_positions = rotary
        if query_positions is not None:
            q = apply_rotary(q, query_positions, self.rotary_theta)
        if key_positions is not None:
            k = apply_rotary(k, key_positions, self.rotary_theta)
        if cache is not None and cache_update_index is not None:
            k, v = self._pad_to_cache(k, v)
            write = _select_rows if self.portable_cache_write else _update_rows
            k = write(cache[:, 0], ops.cast(k, cache.dtype), cache_update_index)
            v = write(cache[:, 1], ops.cast(v, cache.dtype), cache_update_index)
            cache = ops.stack([k, v], axis=1)  # (B, 2, S_max, N, H)
            k, v = k[..., : self._key_dim], v[..., : self._value_dim]
        return q, k, v, cache

    def _takes_the_band(self, q, masks, self_attention, cache, use_causal_mask,
                        return_attention_scores):
        """Whether local self-attention runs on its band only
        (`ops.local_attention.banded_attention`: O(T x window) scores and
        masks, not O(T^2)). Taken for a `window` layer's self-attention
        without a cache, a causal mask, a pairwise `attention_mask` or
        returned scores, unless `flash_attention=True` asks for the fused
        kernel, and where the band is the smaller: T unknown when traced, or
        longer than the band's three blocks of `window // 2` keys. Both
        routes give the same answer."""
        if (self.window is None or not self_attention or cache is not None or use_causal_mask
                or return_attention_scores or masks["attention_mask"] is not None
                or self.flash_attention):
            return False
        length = static_dim(q.shape[1])
        return length is None or length > 3 * max(self.window // 2, 1)

    def _banded_attention(self, q, k, v, masks, segment_ids, training):
        key_mask = merge_masks(masks["value_mask"], masks["key_mask"])
        attended = banded_attention(
            q, k, v, self.window, query_mask=masks["query_mask"], key_mask=key_mask,
            segment_ids=segment_ids, dropout=self.dropout, training=training,
            seed_generator=self.seed_generator)
        return attended, None

    def _compute_attention_mask(self, q, k, masks, segment_ids, value_segment_ids,
                                use_causal_mask, cache_update_index):
        """`(mask, is_causal)`: the merged boolean mask, broadcastable to
        `(B, N, T, S)` (None: everything visible), and whether a causal mask
        is left to the fused kernel's causal mode."""
        batch, q_len, k_len = q.shape[0], q.shape[1], k.shape[1]
        merged = []  # each broadcastable to (B, N, T, S)
        if masks["query_mask"] is not None:
            check_static_shape("query_mask", masks["query_mask"], (batch, q_len), "(B, T)")
            merged.append(ops.expand_dims(masks["query_mask"], (1, 3)))  # (B, 1, T, 1)
        for name in ("value_mask", "key_mask"):
            if masks[name] is not None:
                check_static_shape(name, masks[name], (batch, k_len), "(B, S)")
                merged.append(ops.expand_dims(masks[name], (1, 2)))  # (B, 1, 1, S)
        if segment_ids is not None:
            # Block-diagonal: each example of a packed row sees only itself.
            merged.append(ops.expand_dims(segment_mask(segment_ids, value_segment_ids), 1))
        if masks["attention_mask"] is not None:
            # (T, S), (B, T, S) or (B, N, T, S) -> rank 4, each dim checked.
            merged.append(normalize_attention_mask(masks["attention_mask"], q, k,
                                                   name="attention_mask"))
        t, s = ops.shape(q)[1], ops.shape(k)[1]
        if self.window is not None:
            offset = 0 if cache_update_index is None else cache_update_index
            merged.append(ops.expand_dims(local_mask(t, s, self.window, offset), (0, 1)))
        if cache_update_index is not None:
            # Positions after the ones written so far hold no keys yet.
            if use_causal_mask:
                visible = causal_mask(t, s, offset=cache_update_index)
            else:
                visible = ops.arange(s) < cache_update_index + t
                visible = ops.broadcast_to(ops.expand_dims(visible, 0), (t, s))
            merged.append(ops.expand_dims(visible, (0, 1)))  # (1, 1, T, S)
        elif use_causal_mask:
            if not merged:
                return None, True  # lets flash kernels use their causal mode
            merged.append(ops.expand_dims(causal_mask(t, s), (0, 1)))
        return merge_masks(*merged), False  # (B|1, N|1, T, S) or None

    def _compute_attention(self, q, k, v, mask, is_causal, training, return_attention_scores):
        """`(attended (B, T, N, H_v), scores or None)`: the fused kernel where
        it can run (no scores asked, no dropout, equal key and value head
        sizes, a dtype it takes), else the explicit softmax."""
        dropout_active = self.dropout > 0 and bool(training)
        # keras.ops.dot_product_attention needs equal key and value head sizes.
        fusable = self._key_dim == self._value_dim and fused_attention_supports(q.dtype)
        if return_attention_scores or dropout_active or not fusable:
            if is_causal:
                mask = causal_mask(ops.shape(q)[1], ops.shape(k)[1])
            return scaled_dot_product_attention(
                q, k, v, mask=mask, dropout=self.dropout, training=training,
                seed_generator=self.seed_generator, return_attention_scores=True)
        # The kernel module's dispatch (issue 61): with the one merged mask
        # it takes today's keras.ops route on every backend and device.
        attended = attend(
            q, k, v, mask=mask, is_causal=is_causal, flash_attention=self.flash_attention)
        return attended, None

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "output_dim": self.output_dim,
                "flash_attention": self.flash_attention,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
                "kernel_regularizer": keras.regularizers.serialize(
                    self.kernel_regularizer
                ),
                "bias_regularizer": keras.regularizers.serialize(
                    self.bias_regularizer
                ),
                "kernel_constraint": keras.constraints.serialize(
                    self.kernel_constraint
                ),
                "bias_constraint": keras.constraints.serialize(self.bias_constraint),
                "seed": self.seed,
                "rotary_theta": self.rotary_theta,
                "window": self.window,
            }
        )
        return config
