"""Self-attention with relative sinusoidal positions (Transformer-XL style)."""

import keras
from keras import ops

from keras_attn._keras_compat import SpecFromCall
from keras_attn._clone import for_sublayer

from keras_attn._checks import check_positive_float
from keras_attn._checks import check_positive_int
from keras_attn._checks import check_rate
from keras_attn._checks import check_static_shape
from keras_attn.layers._projection import einsum_projection
from keras_attn.ops.masking import checked_mask
from keras_attn.ops.masking import get_keras_mask
from keras_attn.ops.masking import merge_masks
from keras_attn.ops.masking import nan_where
from keras_attn.ops.attention import (
    scaled_dot_product_attention,
)
from keras_attn.layers.sinusoidal_positional_encoding import (
    sinusoidal_positional_encoding,
)
from keras_attn.layers.streaming import check_built
from keras_attn.layers.streaming import check_left_context
from keras_attn.layers.streaming import check_state_tensor


def relative_logits(query, positions, key_length=None):
    """`out[b, n, i, j] = query[b, i, n] . positions[i - j + S - 1, n]`.

    The `T` queries are the last `T` of the `S` keys (`S = T` offline; a
    streamed chunk's keys are the cached left context and then the chunk),
    so query `i` and key `j` are `i + S - T - j` frames apart.

    Args:
        query: `(B, T, N, H)`.
        positions: `(T + S - 1, N, H)`, rows for relative distances
            `-(T - 1), ..., S - 1` in ascending order.
        key_length: `S`; defaults to `T`.

    Returns:
        `(B, N, T, S)`.
    """
    # (B, N, T, H) @ (N, H, T+S-1), not einsum("btnh,rnh->bntr"): the same
    # values, and on CPUs a faster training step (the product alone at B32
    # T100: 1.55x on TensorFlow, 1.27x on JAX, benchmarks/einsum_forms.py; a
    # Conformer-S block 1.07x on TensorFlow, a tie on JAX; benchmarks/RESULTS.md).
    scores = ops.matmul(
        ops.transpose(query, (0, 2, 1, 3)), ops.transpose(positions, (1, 2, 0))
    )  # (B, N, T, T+S-1)
    shape = ops.shape(scores)
    t = shape[2]
    s = t if key_length is None else key_length
    # Column i - j + S - 1 of row i, picked by a gather along the last axis
    # (no reshapes: JAX's symbolic shapes cannot check T * (2T - 1) sizes).
    rows = ops.expand_dims(ops.arange(t), 1)  # (T, 1)
    cols = ops.expand_dims(ops.arange(s), 0)  # (1, S)
    index = ops.broadcast_to(ops.expand_dims(rows - cols + s - 1, (0, 1)), (shape[0], shape[1], t, s))
    return ops.take_along_axis(scores, index, axis=-1)  # (B, N, T, S)


@keras.saving.register_keras_serializable(package="keras_attn")
class RelativeMultiHeadAttention(SpecFromCall, keras.layers.Layer):
    """Self-attention whose logits add a relative-position term.

    For query `i` and key `j` at distance `r = i - j`, with projected query
    `q_i`, key `k_j`, learned content bias `u`, position bias `v` and the
    sinusoid `R_r` of the distance projected by `W_R`:

    ```
    logit(i, j) = [(q_i + u) . k_j + (q_i + v) . (W_R R_r)] / sqrt(H)
    ```

    per head (Dai et al., 2019, section 3.3; the attention of the Conformer).
    The term depends only on `i - j`, so the layer handles any length.

    Args:
        num_heads: number of heads N.
        key_dim: size H of each head; defaults to width / num_heads.
        dropout: dropout rate on the attention probabilities.
        use_bias: whether the query/key/value/output projections have biases
            (the position projection never has one).
        max_wavelength: base of the relative sinusoids.
        kernel_initializer: initializer of the projection kernels.
        bias_initializer: initializer of the projection biases and of the
            content and position biases `u`, `v`.
        seed: seed of the attention dropout.
        **kwargs: base layer arguments.

    Call arguments:
        inputs: `(B, T, D)`.
        padding_mask: `(B, T)`, True = real frame; defaults to the implicit
            Keras mask.
        attention_mask: `(B, T, T)`, merged with `padding_mask`
            (`chunk_attention_mask` for chunked, streamable attention).
        training: whether dropout is active.
        return_attention_scores: also return `(B, N, T, T)`.

    Returns:
        `(B, T, D)`, and the scores if asked for.

    Streaming: `stream_step(chunk, cache)` attends one chunk to itself and
    to the cached keys and values of the `left_context` frames before it
    (`initial_cache(batch_size, left_context)`), equal to the offline call
    with `chunk_attention_mask`.

    Example:

    >>> import numpy as np
    >>> layer = RelativeMultiHeadAttention(num_heads=2)
    >>> tuple(layer(np.ones((2, 5, 8), "float32")).shape)
    (2, 5, 8)

    References:
        Dai et al., "Transformer-XL", 2019; Gulati et al., "Conformer", 2020.
    """

    def __init__(
        self,
        num_heads,
        key_dim=None,
        dropout=0.0,
        use_bias=True,
        max_wavelength=10000.0,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.key_dim = check_positive_int("key_dim", key_dim, allow_none=True)
        self.dropout = check_rate("dropout", dropout)
        self.use_bias = bool(use_bias)
        self.max_wavelength = check_positive_float("max_wavelength", max_wavelength)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.seed = seed
        self.supports_masking = True
        self.seed_generator = (
            keras.random.SeedGenerator(seed) if self.dropout > 0 else None
        )

    def build(self, inputs_shape):
        if len(inputs_shape) != 3:
            raise ValueError(
                "`inputs` must have rank 3, (B, T, D). "
                f"Received: inputs.shape={tuple(inputs_shape)}"
            )
        width = inputs_shape[-1]
        if self.key_dim is None and width % self.num_heads:
            raise ValueError(
                f"The width must be divisible by `num_heads` when `key_dim` is "
                f"not given (num_heads={self.num_heads}). Received: width={width}"
            )
        n = self.num_heads
        h = self._key_dim = self.key_dim or width // n
        self._width = width

        def dense(equation, output_shape, bias_axes, name, input_shape):
            return einsum_projection(self, equation, output_shape, bias_axes, name, input_shape)

        self.query_dense = dense("btd,dnh->btnh", (None, n, h), "nh", "query", inputs_shape)
        self.key_dense = dense("btd,dnh->btnh", (None, n, h), "nh", "key", inputs_shape)
        self.value_dense = dense("btd,dnh->btnh", (None, n, h), "nh", "value", inputs_shape)
        # No bias (Transformer-XL's W_{k,R}); the leading r plays the batch axis.
        self.position_dense = dense("rd,dnh->rnh", (n, h), None, "position", (None, width))
        self.output_dense = dense(
            "btnh,nhd->btd", (None, width), "d", "attention_output",
            (inputs_shape[0], inputs_shape[1], n, h),
        )
        self.content_bias = self.add_weight(
            name="content_bias", shape=(n, h),
            initializer=for_sublayer(self.bias_initializer, "content_bias"),
        )
        self.position_bias = self.add_weight(
            name="position_bias", shape=(n, h),
            initializer=for_sublayer(self.bias_initializer, "position_bias"),
        )
        self.built = True

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
    ):
        if padding_mask is None and attention_mask is None:
            padding_mask = get_keras_mask(inputs)
        batch, length = inputs.shape[0], inputs.shape[1]
        padding_mask, bad_padding = checked_mask(padding_mask, "padding_mask")
        attention_mask, bad_attention = checked_mask(attention_mask, "attention_mask", pairwise=True)
        masks = []
        if padding_mask is not None:
            check_static_shape("padding_mask", padding_mask, (batch, length), "(B, T)")
            masks += [ops.expand_dims(padding_mask, 2), ops.expand_dims(padding_mask, 1)]
        if attention_mask is not None:
            check_static_shape(
                "attention_mask", attention_mask, (batch, length, length), "(B, T, T)"
            )
            masks.append(attention_mask)
        mask = merge_masks(*masks)  # (B, T, T) or None

        q, k, v = self._project(inputs)
        output, scores = self._attend(q, k, v, mask, training)
        output = nan_where(bad_attention, nan_where(bad_padding, output))
        if return_attention_scores:
            return output, scores
        return output

    def _project(self, inputs):
        q = self.query_dense(inputs)  # (B, T, N, H)
        return q, self.key_dense(inputs), self.value_dense(inputs)

    def _attend(self, q, k, v, mask, training):
        """Attention of the queries `(B, T, N, H)`, the last `T` of the keys
        `(B, S, N, H)`, with relative positions; `(B, T, D)` and the scores."""
        t, s = ops.shape(q)[1], ops.shape(k)[1]
        # Distances -(T-1) .. S-1, ascending: row r + T - 1 is distance r.
        table = sinusoidal_positional_encoding(
            t + s - 1,
            self._width,
            max_wavelength=self.max_wavelength,
            start_index=1 - t,
            dtype=self.compute_dtype,
        )  # (T+S-1, D)
        positions = self.position_dense(table)  # (T+S-1, N, H)
        content_bias = ops.cast(self.content_bias, q.dtype)
        position_bias = ops.cast(self.position_bias, q.dtype)
        scale = 1.0 / float(self._key_dim) ** 0.5
        position_logits = relative_logits(q + position_bias, positions, s) * scale
        attended, scores = scaled_dot_product_attention(
            q + content_bias,
            k,
            v,
            mask=mask,
            scale=scale,
            bias=position_logits,
            dropout=self.dropout,
            training=training,
            seed_generator=self.seed_generator,
            return_attention_scores=True,
        )
        return self.output_dense(attended), scores  # (B, T, D)

    def initial_cache(self, batch_size, left_context):
        """The streaming cache before the first chunk: `left_context` frames
        of zero keys and values `(B, L, N, H)`, all hidden (`mask` False)."""
        check_built(self)
        left_context = check_left_context(left_context)
        shape = (batch_size, left_context, self.num_heads, self._key_dim)
        return {
            "key": ops.zeros(shape, self.compute_dtype),
            "value": ops.zeros(shape, self.compute_dtype),
            "mask": ops.zeros((batch_size, left_context), "bool"),
        }

    def check_cache(self, cache, batch_size, prefix=""):
        """A ValueError naming the entry of `cache` that does not fit this
        layer and a batch of `batch_size` (shape, dtype, keys)."""
        if not isinstance(cache, dict) or set(cache) != {"key", "value", "mask"}:
            raise ValueError(
                "Invalid value for argument `cache`: a dict of 'key', 'value' "
                "and 'mask', as `initial_cache` returns. Received: cache="
                f"{sorted(cache) if isinstance(cache, dict) else type(cache).__name__}"
            )
        left = cache["mask"].shape[1] if len(cache["mask"].shape) == 2 else None
        shape = (batch_size, left, self.num_heads, self._key_dim)
        check_state_tensor(prefix + "key", cache["key"], shape, self.compute_dtype)
        check_state_tensor(prefix + "value", cache["value"], shape, self.compute_dtype)
        check_state_tensor(prefix + "mask", cache["mask"], (batch_size, left), "bool")

    def stream_step(self, inputs, cache, padding_mask=None):
        """One chunk of chunked self-attention, with the left context cached.

        The chunk's frames attend to each other and to the cached frames
        before them, with the relative positions of the whole (cache + chunk)
        span: the same outputs as `call` over the utterance with
        `chunk_attention_mask(T, C, L)` for the frames of a chunk that starts
        at a multiple of `C`.

        Args:
            inputs: `(B, C, D)`, one chunk.
            cache: the previous step's cache (`initial_cache` at the start):
                `{"key", "value": (B, L, N, H), "mask": (B, L)}`.
            padding_mask: `(B, C)`, True = real frame (default: all).

        Returns:
            `(outputs (B, C, D), new_cache)`; the new cache holds the last `L`
            frames of cache + chunk. `cache` itself is not changed.
        """
        batch, chunk = inputs.shape[0], inputs.shape[1]
        self.check_cache(cache, batch)
        if padding_mask is None:
            padding_mask = ops.ones((batch, chunk), "bool")
        check_static_shape("padding_mask", padding_mask, (batch, chunk), "(B, C)")
        padding_mask = ops.cast(padding_mask, "bool")
        q, k, v = self._project(ops.convert_to_tensor(inputs, self.compute_dtype))  # (B, C, N, H)
        keys = ops.concatenate([cache["key"], k], axis=1)  # (B, L + C, N, H)
        values = ops.concatenate([cache["value"], v], axis=1)
        key_mask = ops.concatenate([cache["mask"], padding_mask], axis=1)  # (B, L + C)
        mask = ops.logical_and(ops.expand_dims(padding_mask, 2), ops.expand_dims(key_mask, 1))
        output, _ = self._attend(q, keys, values, mask, training=False)
        left = cache["mask"].shape[1]
        total = ops.shape(keys)[1]
        new_cache = {
            "key": keys[:, total - left:],
            "value": values[:, total - left:],
            "mask": key_mask[:, total - left:],
        }
        return output, new_cache

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "max_wavelength": self.max_wavelength,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "seed": self.seed,
            }
        )
        return config
