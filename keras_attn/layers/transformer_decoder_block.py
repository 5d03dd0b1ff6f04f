"""The Transformer decoder block with cached incremental decoding."""

import keras

from keras_attn._keras_compat import SpecFromCall
from keras_attn._remat import RematCall
from keras_attn.ops.masking import agreeing_padding_mask
from keras_attn.ops.masking import checked_mask
from keras_attn.ops.masking import get_keras_mask
from keras_attn.ops.masking import nan_where
from keras_attn.layers.transformer_block import ResidualSublayers


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerDecoderBlock(SpecFromCall, RematCall, ResidualSublayers, keras.layers.Layer):
    """Causal self-attention, cross-attention over the encoder output, and a
    feed-forward network, each with a residual connection and a LayerNorm.

    ```
    post-norm:                              pre-norm: LayerNorm before each
    y  -> causal MHA -> drop -> + -> LN     sublayer instead of after the
    |_________________________/             addition, e.g.
    y  -> MHA(y, enc) -> drop -> + -> LN    y -> LN -> MHA(., enc) -> drop -> +
    |___________________________/           |_______________________________/
    y  -> FFN -> drop -> + -> LN
    |__________________/
    ```

    Without `encoder_sequence` (at build time) there is no cross-attention:
    a decoder-only (GPT-style) block.

    Incremental decoding: pass `self_attention_cache` (from
    `self_attention.empty_cache`) and `self_attention_cache_update_index`,
    and optionally `cross_attention_cache` instead of re-projecting the
    encoder output each step. The outputs equal those of the full causal pass
    at the same positions. The calling convention is keras-hub's
    `TransformerDecoder`: `cross_attention_cache_update_index=0` projects
    `encoder_sequence` into the cross-attention cache (the first step) and
    returns it; None uses the cache as given (from an earlier step, or
    `compute_cross_attention_cache`); a block without cross-attention returns
    `(outputs, self_attention_cache)`.

    Args: as `TransformerBlock` (without `use_causal_mask`: a decoder block is
    causal unless a call says `use_causal_mask=False`).

    Call arguments:
        decoder_sequence: `(B, T, D)`.
        encoder_sequence: `(B, S, De)`, or None for a decoder-only block.
        decoder_padding_mask: `(B, T)`; overrides the implicit Keras mask of
            `decoder_sequence`.
        decoder_attention_mask: `(B, T, T)` for the self-attention.
        encoder_padding_mask: `(B, S)`; overrides the implicit Keras mask of
            `encoder_sequence`.
        encoder_attention_mask: `(B, T, S)` for the cross-attention.
        self_attention_cache: `(B, 2, T_max, N, H)`.
        self_attention_cache_update_index: where this call's tokens go.
        cross_attention_cache: `(B, 2, S, N, H)`.
        cross_attention_cache_update_index: 0 to compute the cross cache from
            `encoder_sequence` (any earlier value of it is replaced), None to
            use it as given.
        use_causal_mask: default True.
        training: whether dropout is active.
        decoder_segment_ids: `(B, T)` integer ids of packed target rows
            (1..k per example, 0 = padding): self-attention stays inside each
            example (causal there), and cross-attention pairs target example
            `i` with source example `i`. Not with caches.
        encoder_segment_ids: `(B, S)`, the source rows' ids packed in step
            with the targets; needed with `decoder_segment_ids` in a block
            with cross-attention.

    Returns:
        `(B, T, D)`; with `self_attention_cache`, the tuple
        `(outputs, self_attention_cache, cross_attention_cache)`, or
        `(outputs, self_attention_cache)` for a block without
        cross-attention.

    Example:

    >>> import numpy as np
    >>> block = TransformerDecoderBlock(num_heads=2, intermediate_dim=32)
    >>> tuple(block(np.ones((2, 4, 8), "float32"), np.ones((2, 6, 8), "float32")).shape)
    (2, 4, 8)

    References:
        Vaswani et al., "Attention Is All You Need", 2017, section 3.1.
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
        use_bias=True,
        flash_attention=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
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

    def build(self, decoder_sequence_shape, encoder_sequence_shape=None):
        shape = decoder_sequence_shape
        # === Layers ===
        self.self_attention = self._attention("self_attention", shape)
        self.self_attention_layer_norm = self._layer_norm(
            "self_attention_layer_norm", shape
        )
        self.self_attention_dropout = self._dropout("self_attention_dropout")
        self.cross_attention = None
        if encoder_sequence_shape is not None:
            self.cross_attention = self._attention(
                "cross_attention", shape, encoder_sequence_shape
            )
            self.cross_attention_layer_norm = self._layer_norm(
                "cross_attention_layer_norm", shape
            )
            self.cross_attention_dropout = self._dropout("cross_attention_dropout")
        self.feed_forward = self._feed_forward(shape)
        self.feed_forward_layer_norm = self._layer_norm(
            "feed_forward_layer_norm", shape
        )
        self.feed_forward_dropout = self._dropout("feed_forward_dropout")
        self.built = True

    def compute_cross_attention_cache(self, encoder_sequence):
        """Projected encoder keys and values `(B, 2, S, N, H)`, computed once
        per source sentence and reused at every decoding step."""
        if self.cross_attention is None:
            raise ValueError(
                "This block has no cross-attention (it was built without an "
                f"encoder_sequence). Received: block {self.name!r}"
            )
        return self.cross_attention.compute_key_value_cache(encoder_sequence)

    def compute_output_shape(self, decoder_sequence_shape, encoder_sequence_shape=None):
        """`(B, T, D)`: the block's output (with a cache, the caches come
        back as well: `compute_output_spec`)."""
        return tuple(decoder_sequence_shape)

    def call(
        self,
        decoder_sequence,
        encoder_sequence=None,
        decoder_padding_mask=None,
        decoder_attention_mask=None,
        encoder_padding_mask=None,
        encoder_attention_mask=None,
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        cross_attention_cache=None,
        cross_attention_cache_update_index=None,
        use_causal_mask=True,
        training=None,
        decoder_segment_ids=None,
        encoder_segment_ids=None,
    ):
        has_encoder = encoder_sequence is not None or cross_attention_cache is not None
        if has_encoder and self.cross_attention is None:
            raise ValueError(
                "This block was built without cross-attention; it cannot attend "
                f"to an encoder output. Received: encoder_sequence with block {self.name!r}"
            )
        if not has_encoder and self.cross_attention is not None:
            raise ValueError(
                "This block has cross-attention and needs `encoder_sequence` or "
                "`cross_attention_cache`. Received: encoder_sequence=None"
            )
        if cross_attention_cache_update_index is not None:
            if isinstance(cross_attention_cache_update_index, bool) or (
                    cross_attention_cache_update_index != 0):
                raise ValueError(
                    "The whole encoder output is projected at once: "
                    "`cross_attention_cache_update_index` must be 0 (compute "
                    "the cache) or None (use it as given). Received: "
                    f"cross_attention_cache_update_index={cross_attention_cache_update_index!r}"
                )
            if encoder_sequence is None:
                raise ValueError(
                    "`cross_attention_cache_update_index=0` computes the cross "
                    "cache from `encoder_sequence`. Received: encoder_sequence=None"
                )
        if decoder_padding_mask is None and decoder_attention_mask is None:
            decoder_padding_mask = get_keras_mask(decoder_sequence)
        if encoder_padding_mask is None and encoder_attention_mask is None:
            encoder_padding_mask = get_keras_mask(encoder_sequence)
        decoder_padding_mask, bad_1 = checked_mask(decoder_padding_mask, "decoder_padding_mask")
        decoder_attention_mask, bad_2 = checked_mask(
            decoder_attention_mask, "decoder_attention_mask", pairwise=True)
        encoder_padding_mask, bad_3 = checked_mask(encoder_padding_mask, "encoder_padding_mask")
        encoder_attention_mask, bad_4 = checked_mask(
            encoder_attention_mask, "encoder_attention_mask", pairwise=True)
        invalid = (bad_1, bad_2, bad_3, bad_4)
        decoder_padding_mask = agreeing_padding_mask(
            decoder_padding_mask, decoder_segment_ids, "decoder_padding_mask",
            "decoder_segment_ids")
        encoder_padding_mask = agreeing_padding_mask(
            encoder_padding_mask, encoder_segment_ids, "encoder_padding_mask",
            "encoder_segment_ids")

        def self_attend(x):
            return self.self_attention(
                x,
                query_mask=decoder_padding_mask,
                value_mask=decoder_padding_mask,
                attention_mask=decoder_attention_mask,
                use_causal_mask=use_causal_mask,
                cache=self_attention_cache,
                cache_update_index=self_attention_cache_update_index,
                training=training,
                segment_ids=decoder_segment_ids,
            )

        x, extras = self._residual(
            decoder_sequence,
            self_attend,
            self.self_attention_layer_norm,
            self.self_attention_dropout,
            training,
        )
        if self_attention_cache is not None:
            self_attention_cache = extras[0]

        if self.cross_attention is not None:
            if cross_attention_cache_update_index is not None:
                cross_attention_cache = self.compute_cross_attention_cache(encoder_sequence)

            def cross_attend(y):
                # With a precomputed cache the key/value projections are
                # skipped and `value` only stands in for the encoder output.
                value = encoder_sequence if encoder_sequence is not None else y
                return self.cross_attention(
                    y,
                    value,
                    query_mask=decoder_padding_mask,
                    value_mask=encoder_padding_mask,
                    attention_mask=encoder_attention_mask,
                    cache=cross_attention_cache,
                    training=training,
                    segment_ids=decoder_segment_ids,
                    value_segment_ids=encoder_segment_ids,
                )

            x, _ = self._residual(
                x,
                cross_attend,
                self.cross_attention_layer_norm,
                self.cross_attention_dropout,
                training,
            )

        x, _ = self._residual(
            x,
            lambda y: self.feed_forward(y, training=training),
            self.feed_forward_layer_norm,
            self.feed_forward_dropout,
            training,
        )
        for bad in invalid:
            x = nan_where(bad, x)
        if self_attention_cache is not None:
            if self.cross_attention is None:
                return x, self_attention_cache
            return x, self_attention_cache, cross_attention_cache
        return x

    def get_config(self):
        config = super().get_config()
        config.update(self._common_config())
        return config
