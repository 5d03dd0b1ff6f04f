"""The Conformer block: two half-step feed-forwards around attention and convolution."""

import keras
from keras import ops

from keras_attn._keras_compat import SpecFromCall
from keras_attn._clone import for_sublayer

from keras_attn._remat import RematCall
from keras_attn._checks import check_bool
from keras_attn._checks import check_choice
from keras_attn._checks import check_positive_float
from keras_attn._checks import check_positive_int
from keras_attn._checks import check_rate
from keras_attn.layers.conformer_conv_module import NORMS
from keras_attn.layers.conformer_conv_module import ConformerConvModule
from keras_attn.layers.feed_forward import FeedForward
from keras_attn.ops.masking import checked_mask
from keras_attn.ops.masking import checked_segment_ids
from keras_attn.ops.masking import get_keras_mask
from keras_attn.ops.masking import merge_masks
from keras_attn.ops.masking import nan_where
from keras_attn.ops.masking import segment_mask
from keras_attn.layers.relative_multi_head_attention import RelativeMultiHeadAttention
from keras_attn.layers.streaming import check_built


@keras.saving.register_keras_serializable(package="keras_attn")
class ConformerBlock(SpecFromCall, RematCall, keras.layers.Layer):
    """A macaron of feed-forward halves around self-attention and convolution.

    ```
    x -> x + 1/2 FFN(LN(x))                  FFN: Dense(4D) Swish Drop Dense(D) Drop
      -> x + Drop(RelMHSA(LN(x)))            relative sinusoidal positions
      -> x + Conv(x)                         ConformerConvModule (LN inside)
      -> x + 1/2 FFN(LN(x))
      -> LN(x)
    ```

    Args:
        num_heads: attention heads.
        intermediate_dim: feed-forward hidden width; defaults to 4 x width.
        kernel_size: depthwise kernel of the convolution module.
        dropout: dropout in every module (feed-forward, attention output,
            convolution module).
        attention_dropout: dropout on the attention probabilities.
        conv_expansion: channel expansion of the convolution module.
        layer_norm_epsilon: epsilon of every LayerNorm.
        kernel_initializer: initializer of the dense kernels.
        causal_conv: the convolution module's depthwise convolution sees
            past frames only (needed to stream).
        conv_norm: `"batch_norm"` or `"layer_norm"` in the convolution module.
        batch_norm_epsilon: the convolution module's BatchNorm epsilon
            (Keras's 1e-3; PyTorch checkpoints use 1e-5).
        **kwargs: base layer arguments.

    Call arguments:
        inputs: `(B, T, D)`.
        padding_mask: `(B, T)`; defaults to the implicit Keras mask.
        attention_mask: `(B, T, T)` or `(T, T)` for the self-attention, e.g.
            `chunk_attention_mask(T, chunk_size, left_context)`.
        training: whether dropout is active and BatchNorm uses batch statistics.
        return_attention_scores: also return the scores `(B, N, T, T)`.
        segment_ids: optional `(B, T)` int ids of packed rows (1..k for the
            k utterances of a row, 0 for padding): the self-attention is
            block-diagonal by segment (its relative positions are distances,
            the same in a row as alone) and the convolution module reads
            each utterance's own frames only, so each utterance gets its
            outputs alone. The frames of segment 0 are padding; a given
            `padding_mask` may mark more (the gaps between utterances,
            grouped with the utterance before them). An invalid packing is a
            `ValueError` eagerly and NaN for that row in a graph.

    Returns:
        `(B, T, D)`, and the scores if asked for.

    Streaming (with `causal_conv=True`): `initial_state(batch_size,
    left_context)` and `stream_step(chunk, state, padding_mask)` ->
    `(outputs, new_state)`, the state holding the attention's cached keys and
    values and the convolution's last `kernel_size - 1` frames. Chunks fed
    one after another, each starting at a multiple of `chunk_size` (the last
    one may be shorter), give the offline outputs with the chunk mask.

    Example:

    >>> import numpy as np
    >>> block = ConformerBlock(num_heads=2, kernel_size=3)
    >>> tuple(block(np.ones((2, 6, 8), "float32")).shape)
    (2, 6, 8)

    References:
        Gulati et al., "Conformer: Convolution-augmented Transformer for
        Speech Recognition", 2020, section 2 and equation 1.
    """

    def __init__(
        self,
        num_heads,
        intermediate_dim=None,
        kernel_size=31,
        dropout=0.1,
        attention_dropout=0.0,
        conv_expansion=2,
        layer_norm_epsilon=1e-5,
        kernel_initializer="glorot_uniform",
        causal_conv=False,
        conv_norm="batch_norm",
        batch_norm_epsilon=1e-3,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.intermediate_dim = check_positive_int(
            "intermediate_dim", intermediate_dim, allow_none=True
        )
        self.kernel_size = check_positive_int("kernel_size", kernel_size)
        self.dropout = check_rate("dropout", dropout)
        self.attention_dropout = check_rate("attention_dropout", attention_dropout)
        self.conv_expansion = check_positive_int("conv_expansion", conv_expansion)
        self.layer_norm_epsilon = check_positive_float("layer_norm_epsilon", layer_norm_epsilon)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.causal_conv = check_bool("causal_conv", causal_conv)
        self.conv_norm = check_choice("conv_norm", conv_norm, NORMS)
        self.batch_norm_epsilon = check_positive_float("batch_norm_epsilon", batch_norm_epsilon)
        self.supports_masking = True

    def build(self, inputs_shape):
        width = inputs_shape[-1]

        def layer_norm(name):
            layer = keras.layers.LayerNormalization(
                epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name
            )
            layer.build(inputs_shape)
            return layer

        def feed_forward(name):
            layer = FeedForward(
                self.intermediate_dim or 4 * width,
                activation="silu",
                dropout=self.dropout,
                activation_dropout=self.dropout,
                kernel_initializer=for_sublayer(self.kernel_initializer, name),
                dtype=self.dtype_policy,
                name=name,
            )
            layer.build(inputs_shape)
            return layer

        # === Layers ===
        self.feed_forward_1_layer_norm = layer_norm("feed_forward_1_layer_norm")
        self.feed_forward_1 = feed_forward("feed_forward_1")
        self.self_attention_layer_norm = layer_norm("self_attention_layer_norm")
        self.self_attention = RelativeMultiHeadAttention(
            self.num_heads,
            dropout=self.attention_dropout,
            kernel_initializer=for_sublayer(self.kernel_initializer, "self_attention"),
            dtype=self.dtype_policy,
            name="self_attention",
        )
        self.self_attention.build(inputs_shape)
        self.self_attention_dropout = keras.layers.Dropout(
            self.dropout, dtype=self.dtype_policy, name="self_attention_dropout"
        )
        self.conv_module = ConformerConvModule(
            kernel_size=self.kernel_size,
            expansion=self.conv_expansion,
            dropout=self.dropout,
            layer_norm_epsilon=self.layer_norm_epsilon,
            kernel_initializer=for_sublayer(self.kernel_initializer, "conv_module"),
            causal=self.causal_conv,
            norm=self.conv_norm,
            batch_norm_epsilon=self.batch_norm_epsilon,
            dtype=self.dtype_policy,
            name="conv_module",
        )
        self.conv_module.build(inputs_shape)
        self.feed_forward_2_layer_norm = layer_norm("feed_forward_2_layer_norm")
        self.feed_forward_2 = feed_forward("feed_forward_2")
        self.output_layer_norm = layer_norm("output_layer_norm")
        self.built = True

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)

    def call(self, inputs, padding_mask=None, attention_mask=None, training=None,
             return_attention_scores=False, segment_ids=None):
        if padding_mask is None and segment_ids is None:
            padding_mask = get_keras_mask(inputs)
        if attention_mask is not None and len(attention_mask.shape) == 2:
            attention_mask = ops.expand_dims(attention_mask, 0)  # (T, T) -> (1, T, T)
        segment_ids, bad_segments = checked_segment_ids(segment_ids)
        bad_padding = None
        if segment_ids is not None:
            padding_mask, bad_padding = checked_mask(padding_mask, "padding_mask")
            attention_mask = merge_masks(attention_mask, segment_mask(segment_ids))  # (B, T, T)
            padding_mask = merge_masks(padding_mask, segment_ids > 0)
        x = inputs
        x = x + 0.5 * self.feed_forward_1(self.feed_forward_1_layer_norm(x), training=training)
        attended = self.self_attention(
            self.self_attention_layer_norm(x),
            padding_mask=padding_mask,
            attention_mask=attention_mask,
            training=training,
            return_attention_scores=return_attention_scores,
        )
        scores = None
        if return_attention_scores:
            attended, scores = attended
        x = x + self.self_attention_dropout(attended, training=training)
        x = x + self.conv_module(x, padding_mask=padding_mask, training=training,
                                 segment_ids=segment_ids)
        x = nan_where(bad_padding, nan_where(bad_segments, self._last_half(x, training)))
        if return_attention_scores:
            return x, scores
        return x

    def _last_half(self, x, training):
        x = x + 0.5 * self.feed_forward_2(self.feed_forward_2_layer_norm(x), training=training)
        return self.output_layer_norm(x)

    def initial_state(self, batch_size, left_context):
        """The streaming state before the first chunk: the attention's cache
        (`key`, `value`: `(B, L, N, H)`, `mask`: `(B, L)`) and the
        convolution's (`conv`: `(B, K-1, C)`)."""
        check_built(self)
        state = dict(self.self_attention.initial_cache(batch_size, left_context))
        state["conv"] = self.conv_module.initial_cache(batch_size)
        return state

    def check_state(self, state, batch_size, prefix=""):
        """A ValueError naming the entry of `state` that does not fit."""
        keys = {"key", "value", "mask", "conv"}
        if not isinstance(state, dict) or set(state) != keys:
            raise ValueError(
                f"Invalid value for argument `state`: a dict of {sorted(keys)}, "
                "as `initial_state` returns. Received: state="
                f"{sorted(state) if isinstance(state, dict) else type(state).__name__}"
            )
        self.self_attention.check_cache(
            {k: state[k] for k in ("key", "value", "mask")}, batch_size, prefix)
        self.conv_module.check_cache(state["conv"], batch_size, prefix + "conv")

    def stream_step(self, inputs, state, padding_mask=None):
        """One chunk `(B, C, D)` at inference; returns `(outputs, new_state)`
        and leaves `state` as it was. The chunk must start at a multiple of
        the chunk size the offline mask uses, and be no longer than it."""
        self.check_state(state, inputs.shape[0])
        x = ops.convert_to_tensor(inputs, self.compute_dtype)
        x = x + 0.5 * self.feed_forward_1(self.feed_forward_1_layer_norm(x), training=False)
        attended, cache = self.self_attention.stream_step(
            self.self_attention_layer_norm(x),
            {k: state[k] for k in ("key", "value", "mask")},
            padding_mask=padding_mask,
        )
        x = x + attended
        convolved, conv_cache = self.conv_module.stream_step(
            x, state["conv"], padding_mask=padding_mask)
        x = self._last_half(x + convolved, training=False)
        return x, dict(cache, conv=conv_cache)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim,
                "kernel_size": self.kernel_size,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "conv_expansion": self.conv_expansion,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "causal_conv": self.causal_conv,
                "conv_norm": self.conv_norm,
                "batch_norm_epsilon": self.batch_norm_epsilon,
            }
        )
        return config
