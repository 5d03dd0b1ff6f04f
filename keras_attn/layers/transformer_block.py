"""The Transformer encoder block, post-norm or pre-norm."""

import keras

from keras_attn._keras_compat import SpecFromCall
from keras_attn._clone import for_sublayer

from keras_attn._remat import RematCall
from keras_attn._checks import check_bool
from keras_attn._checks import check_choice
from keras_attn._checks import check_flash_attention
from keras_attn._checks import check_positive_float
from keras_attn._checks import check_positive_int
from keras_attn._checks import check_rate
from keras_attn._checks import get_activation
from keras_attn.ops.rotary import check_rotary_head_dim
from keras_attn.ops.rotary import check_rotary_theta
from keras_attn.layers.activations import serialize_activation
from keras_attn.layers.feed_forward import FeedForward
from keras_attn.ops.masking import agreeing_padding_mask
from keras_attn.ops.masking import checked_mask
from keras_attn.ops.masking import get_keras_mask
from keras_attn.ops.masking import nan_where
from keras_attn.layers.multi_head_attention import MultiHeadAttention

NORM_POSITIONS = ("post", "pre")


class ResidualSublayers:
    """What the encoder and decoder blocks share: argument checks, the
    sublayer factories and the residual wiring around a sublayer."""

    def _init_common(
        self,
        *,
        num_heads,
        intermediate_dim,
        key_dim,
        value_dim,
        norm_position,
        activation,
        dropout,
        attention_dropout,
        activation_dropout,
        layer_norm_epsilon,
        use_bias,
        flash_attention,
        kernel_initializer,
        bias_initializer,
    ):
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.intermediate_dim = check_positive_int("intermediate_dim", intermediate_dim)
        self.key_dim = check_positive_int("key_dim", key_dim, allow_none=True)
        self.value_dim = check_positive_int("value_dim", value_dim, allow_none=True)
        self.norm_position = check_choice("norm_position", norm_position, NORM_POSITIONS)
        self.activation = get_activation("activation", activation)
        self.dropout = check_rate("dropout", dropout)
        self.attention_dropout = check_rate("attention_dropout", attention_dropout)
        self.activation_dropout = check_rate("activation_dropout", activation_dropout)
        self.layer_norm_epsilon = check_positive_float(
            "layer_norm_epsilon", layer_norm_epsilon
        )
        self.use_bias = bool(use_bias)
        self.flash_attention = check_flash_attention(flash_attention)
        if self.flash_attention and self.attention_dropout > 0:
            raise ValueError(
                "Attention dropout has no fused kernel: `flash_attention=True` "
                "needs `attention_dropout=0`. Received: flash_attention=True, "
                f"attention_dropout={self.attention_dropout}"
            )
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def _attention(self, name, query_shape, value_shape=None, **options):
        width = query_shape[-1]
        if self.key_dim is None and width % self.num_heads:
            raise ValueError(
                f"The hidden size must be divisible by `num_heads` "
                f"(num_heads={self.num_heads}). Received: hidden size={width}"
            )
        layer = MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=self.key_dim,
            value_dim=self.value_dim,
            dropout=self.attention_dropout,
            use_bias=self.use_bias,
            flash_attention=self.flash_attention,
            kernel_initializer=for_sublayer(self.kernel_initializer, name),
            bias_initializer=for_sublayer(self.bias_initializer, name),
            dtype=self.dtype_policy,
            name=name,
            **options,
        )
        layer.build(query_shape, value_shape)
        return layer

    def _layer_norm(self, name, shape, **options):
        layer = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name, **options
        )
        layer.build(shape)
        return layer

    def _dropout(self, name):
        return keras.layers.Dropout(self.dropout, dtype=self.dtype_policy, name=name)

    def _feed_forward(self, shape, **options):
        layer = FeedForward(
            self.intermediate_dim,
            activation=self.activation,
            activation_dropout=self.activation_dropout,
            use_bias=self.use_bias,
            kernel_initializer=for_sublayer(self.kernel_initializer, "feed_forward"),
            bias_initializer=for_sublayer(self.bias_initializer, "feed_forward"),
            dtype=self.dtype_policy,
            name="feed_forward",
            **options,
        )
        layer.build(shape)
        return layer

    def _residual(self, x, sublayer, layer_norm, dropout, training, scale=None):
        """post: LayerNorm(x + Sublayer(x)); pre: x + Sublayer(LayerNorm(x)).

        `layer_norm` None (pre-norm only): x + Sublayer(x), no LayerNorm.
        `sublayer` returns its output, or a tuple whose first item is the
        output; the rest is passed back unchanged (scores, caches). `scale`:
        None, or a learned `(D,)` vector that multiplies the sublayer's
        output before the addition (LayerScale).
        """
        pre = self.norm_position == "pre" and layer_norm is not None
        y = sublayer(layer_norm(x) if pre else x)
        extras = ()
        if isinstance(y, tuple):
            y, extras = y[0], y[1:]
        if scale is not None:
            y = y * keras.ops.cast(scale, y.dtype)  # (B, T, D) * (D,)
        x = x + dropout(y, training=training)
        if self.norm_position == "post":
            x = layer_norm(x)
        return x, extras

    def _common_config(self):
        return {
            "num_heads": self.num_heads,
            "intermediate_dim": self.intermediate_dim,
            "key_dim": self.key_dim,
            "value_dim": self.value_dim,
            "norm_position": self.norm_position,
            "activation": serialize_activation(self.activation),
            "dropout": self.dropout,
            "attention_dropout": self.attention_dropout,
            "activation_dropout": self.activation_dropout,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "use_bias": self.use_bias,
            "flash_attention": self.flash_attention,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
        }


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerBlock(SpecFromCall, RematCall, ResidualSublayers, keras.layers.Layer):
    """The encoder block: self-attention then a feed-forward network, each
    wrapped in a residual connection and a LayerNorm.

    ```
    post-norm (Transformer, BERT)        pre-norm (ViT, Conformer)
    x -> MHA -> drop -> + -> LN -> y     x -> LN -> MHA -> drop -> + -> y
    |__________________/                 |_________________________/
    y -> FFN -> drop -> + -> LN          y -> LN -> FFN -> drop -> +
    |__________________/                 |_________________________/
    ```

    A pre-norm stack needs a final LayerNorm after its last block; the model
    builders add it.

    Args:
        num_heads: number of attention heads.
        intermediate_dim: feed-forward hidden width (`d_ff`).
        key_dim: size of each query/key head; defaults to hidden / num_heads.
        value_dim: size of each value head; defaults to `key_dim`.
        norm_position: `"post"` or `"pre"`.
        activation: feed-forward activation (`"relu"`, `"gelu"`, `"swish"`, ...).
        dropout: rate on each sublayer output before the residual addition.
            Unlike keras-hub's `TransformerEncoder`, whose one `dropout` also
            drops the attention probabilities, it does not reach them: the
            paper's residual dropout and the attention dropout are separate
            settings here (BERT and ViT set them apart), and a zero attention
            dropout keeps the fused attention kernel. For keras-hub's
            behaviour give `attention_dropout` the same rate.
        attention_dropout: rate on the attention probabilities.
        activation_dropout: rate after the feed-forward activation.
        layer_norm_epsilon: LayerNorm epsilon.
        use_causal_mask: whether each position sees only earlier ones.
        use_bias: whether the dense layers (the attention's four
            projections and the feed-forward's two) have biases. The
            LayerNorms keep theirs unless `layer_norm_center=False`.
        flash_attention: see `MultiHeadAttention`.
        kernel_initializer: initializer of the dense kernels (cloned for
            each, so that each starts from its own draw).
        bias_initializer: initializer of the dense biases.
        rotary_theta: None, or the base of a rotary position embedding of
            the queries and keys (`MultiHeadAttention`'s `rotary_theta`).
        gated: whether the feed-forward network is a gated linear unit
            (`FeedForward`'s `gated`: GeGLU with `"gelu"`, SwiGLU with
            `"silu"`).
        window: None (global attention), or the span in tokens of local
            (sliding-window) self-attention (`MultiHeadAttention`'s
            `window`: `|t - s| <= window // 2`).
        layer_norm_center: whether the LayerNorms add their learned offset
            `beta` (Keras's `center`); False with `use_bias=False` gives a
            block without any bias (ModernBERT's `norm_bias=False`).
        layer_scale_init: None, or the initial value of LayerScale (Touvron
            et al., "Going deeper with Image Transformers", 2021; DINOv2):
            each sublayer's output is multiplied by a learned per-channel
            `(D,)` vector, `self_attention_layer_scale` and
            `feed_forward_layer_scale`, before the residual addition.
        attention_norm: whether a pre-norm block normalises its input
            before the attention. False leaves that LayerNorm out (the
            block has no `self_attention_layer_norm`): the attention reads
            the block's input as it is, as in ModernBERT's first block,
            which follows the embeddings' LayerNorm. A post-norm block
            needs its LayerNorm (False with `norm_position="post"` is a
            `ValueError`).
        **kwargs: base layer arguments.

    Call arguments:
        inputs: `(B, T, D)`.
        padding_mask: `(B, T)` boolean, True = real token. Overrides the
            implicit Keras mask of `inputs`.
        attention_mask: `(T, T)`, `(B, T, T)` or `(B, N, T, T)` boolean.
            Overrides the implicit mask too; merged with `padding_mask` when
            both are given.
        training: whether dropout is active.
        return_attention_scores: also return the scores `(B, N, T, T)`.
        segment_ids: `(B, T)` integer ids of packed rows (1..k per example,
            0 = padding): each example attends only to itself; see
            `MultiHeadAttention`. A padding mask beside it must agree.
        positions: with `rotary_theta`, optional `(B, T)` positions of a
            packed row (restarting at 0 with each example); by default the
            ones `segment_ids` imply, else `0 .. T-1` (see
            `MultiHeadAttention`).

    Returns:
        `(B, T, D)`, and the scores if asked for.

    Example:

    >>> import numpy as np
    >>> block = TransformerBlock(num_heads=2, intermediate_dim=32, norm_position="pre")
    >>> tuple(block(np.ones((2, 5, 8), "float32")).shape)
    (2, 5, 8)

    References:
        Vaswani et al., "Attention Is All You Need", 2017, section 3.1;
        Xiong et al., "On Layer Normalization in the Transformer
        Architecture", 2020 (pre-norm).
    """

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        key_dim=None,
        value_dim=None,
        norm_position="post",
        activation="relu",
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        layer_norm_epsilon=1e-5,
        use_causal_mask=False,
        use_bias=True,
        flash_attention=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        rotary_theta=None,
        gated=False,
        window=None,
        layer_norm_center=True,
        layer_scale_init=None,
        attention_norm=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self._init_common(
            num_heads=num_heads,
            intermediate_dim=intermediate_dim,
            key_dim=key_dim,
            value_dim=value_dim,
            norm_position=norm_position,
            activation=activation,
            dropout=dropout,
            attention_dropout=attention_dropout,
            activation_dropout=activation_dropout,
            layer_norm_epsilon=layer_norm_epsilon,
            use_bias=use_bias,
            flash_attention=flash_attention,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
        )
        self.use_causal_mask = bool(use_causal_mask)
        self.rotary_theta = check_rotary_theta(rotary_theta)
        check_rotary_head_dim(self.rotary_theta, self.key_dim)
        self.gated = check_bool("gated", gated)
        self.window = check_positive_int("window", window, allow_none=True)
        self.layer_norm_center = check_bool("layer_norm_center", layer_norm_center)
        self.layer_scale_init = None if layer_scale_init is None else check_positive_float(
            "layer_scale_init", layer_scale_init)
        self.attention_norm = check_bool("attention_norm", attention_norm)
        if not self.attention_norm and self.norm_position == "post":
            raise ValueError(
                "A post-norm block normalises the attention's residual sum: only a "
                "pre-norm block can leave its attention LayerNorm out. Received: "
                f"attention_norm=False, norm_position={self.norm_position!r}"
            )

    def build(self, inputs_shape):
        # === Layers ===
        self.self_attention = self._attention(
            "self_attention", inputs_shape, rotary_theta=self.rotary_theta,
            window=self.window)
        self.self_attention_layer_norm = self._layer_norm(
            "self_attention_layer_norm", inputs_shape, center=self.layer_norm_center
        ) if self.attention_norm else None
        self.self_attention_dropout = self._dropout("self_attention_dropout")
        self.feed_forward = self._feed_forward(inputs_shape, gated=self.gated)
        self.feed_forward_layer_norm = self._layer_norm(
            "feed_forward_layer_norm", inputs_shape, center=self.layer_norm_center
        )
        self.feed_forward_dropout = self._dropout("feed_forward_dropout")
        self.self_attention_layer_scale = self._layer_scale(
            "self_attention_layer_scale", inputs_shape)
        self.feed_forward_layer_scale = self._layer_scale(
            "feed_forward_layer_scale", inputs_shape)
        self.built = True

    def _layer_scale(self, name, inputs_shape):
        if self.layer_scale_init is None:
            return None
        return self.add_weight(
            name=name,
            shape=(inputs_shape[-1],),
            initializer=keras.initializers.Constant(self.layer_scale_init),
            trainable=True,
        )

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
        segment_ids=None,
        positions=None,
    ):
        if padding_mask is None and attention_mask is None:
            padding_mask = get_keras_mask(inputs)
        padding_mask, bad_padding = checked_mask(padding_mask, "padding_mask")
        attention_mask, bad_attention = checked_mask(attention_mask, "attention_mask", pairwise=True)
        # Checked here to name this block's argument; the attention layer
        # checks again and makes a bad example NaN inside a graph.
        padding_mask = agreeing_padding_mask(
            padding_mask, segment_ids, "padding_mask", "segment_ids")

        def attend(x):
            return self.self_attention(
                x,
                query_mask=padding_mask,
                value_mask=padding_mask,
                attention_mask=attention_mask,
                use_causal_mask=self.use_causal_mask,
                return_attention_scores=return_attention_scores,
                training=training,
                segment_ids=segment_ids,
                positions=positions,
            )

        x, extras = self._residual(
            inputs,
            attend,
            self.self_attention_layer_norm,
            self.self_attention_dropout,
            training,
            self.self_attention_layer_scale,
        )
        x, _ = self._residual(
            x,
            lambda y: self.feed_forward(y, training=training),
            self.feed_forward_layer_norm,
            self.feed_forward_dropout,
            training,
            self.feed_forward_layer_scale,
        )
        x = nan_where(bad_attention, nan_where(bad_padding, x))
        if return_attention_scores:
            return x, extras[0]
        return x

    def get_config(self):
        config = super().get_config()
        config.update(self._common_config())
        config["use_causal_mask"] = self.use_causal_mask
        config["rotary_theta"] = self.rotary_theta
        config["gated"] = self.gated
        config["window"] = self.window
        config["layer_norm_center"] = self.layer_norm_center
        config["layer_scale_init"] = self.layer_scale_init
        config["attention_norm"] = self.attention_norm
        return config
