"""The Transformer encoder-decoder as a functional `keras.Model`.

```
source_ids (B, S)                          target_ids (B, T) (BOS y_1 .. y_{T-1})
 -> E[ids] * sqrt(D) "token_embedding"       -> E[ids] * sqrt(D) (the same E when
 -> + positions "encoder_position_embedding"    the vocabulary is shared)
 -> Dropout "encoder_embedding_dropout"       -> + positions, Dropout
 -> N x TransformerBlock "encoder_block_{i}"  -> N x TransformerDecoderBlock
 -> (pre-norm) LayerNorm                          "decoder_block_{i}" (causal self-
    "encoder_final_layer_norm"                    attention, cross-attention)
       |____________ encoder output ________->   (pre-norm) LayerNorm
                                              -> x E^T (tied) or Dense
                                                 "output_projection"  (B, T, V) logits
```

Padding masks are `ids != pad_id` on both sides (the first target position
excepted: it holds the start token, which may be the pad id, as in Marian)
and are passed explicitly to every block (so any `pad_id` works, not only 0).

Packed rows (docs/packing.md) run the same layers through `call`, outside
the functional graph: source and target rows packed in step
(`keras_attn.data.pack_sequences(sources, ..., targets=...)`), segment `k` of
a target row being the translation of segment `k` of its source row. The
segment ids make the encoder's self-attention block-diagonal, the decoder's
causal inside each target segment, and the cross-attention pair target
segment `k` with source segment `k` only; the positions restart with each
segment; the padding masks are `segment_ids > 0`.
"""

import dataclasses
import types

import keras
import numpy as np
from keras import ops

from keras_attn._clone import for_sublayer
from keras_attn._guard import IdSpec
from keras_attn._guard import concrete_value
from keras_attn.models._config import ConfigModel
from keras_attn.models._config import config_arguments
from keras_attn.models._guarded import GuardedModel
from keras_attn.models._packing import any_invalid
from keras_attn.models._packing import packed_inputs
from keras_attn.models._packing import refused
from keras_attn._remat import remat_scope
from keras_attn.ops.masking import checked_positions
from keras_attn.ops.masking import checked_segment_ids
from keras_attn.ops.masking import nan_where
from keras_attn.layers.position_embedding import PositionEmbedding
from keras_attn.layers.sinusoidal_positional_encoding import (
    SinusoidalPositionalEncoding,
)
from keras_attn.layers.transformer_block import TransformerBlock
from keras_attn.layers.transformer_decoder_block import TransformerDecoderBlock
from keras_attn.models.transformer.shared_embedding import SharedEmbedding
from keras_attn.models.transformer.transformer_config import DEFAULT_PRESET
from keras_attn.models.transformer.transformer_config import TransformerConfig
from keras_attn.models.transformer.transformer_config import (
    get_transformer_config,
)


# The model's graph, written once: `Transformer.__init__` builds it from the
# layers it is making, `encode` / `decode` / `decode_step` run it on the
# model's attributes (`layers` is either).


def _embed(layers, side, ids, start_index=0, training=None, packing=None):
    """Token embedding plus positions, then dropout; `packing` is a packed
    side's `(segment_ids, positions)` (None: positions from `start_index`)."""
    if side == "encoder":
        embedding, position, dropout = (layers.source_embedding,
                                        layers.encoder_position_embedding,
                                        layers.encoder_embedding_dropout)
    else:
        embedding, position, dropout = (layers.target_embedding,
                                        layers.decoder_position_embedding,
                                        layers.decoder_embedding_dropout)
    x = embedding(ids)  # (B, L, D), scaled by sqrt(D)
    if packing is None:
        x = x + position(x, start_index=start_index)
    else:
        x = x + position(x, positions=packing[1], segment_ids=packing[0])  # (B, L, D)
    return dropout(x, training=training)


def _logits(layers, y):
    if layers.decoder_final_layer_norm is not None:
        y = layers.decoder_final_layer_norm(y)
    if layers.output_projection is None:
        return layers.target_embedding(y, reverse=True)  # tied: y E^T
    return layers.output_projection(y)


def _encode(layers, pad_id, source_ids, training=None, packing=None):
    """`(encoder output (B, S, D), source mask (B, S))`; `packing` is the
    source's `(segment_ids, positions)` for packed rows, whose mask is
    `segment_ids > 0`."""
    if packing is None:
        source_mask = ops.not_equal(source_ids, pad_id)  # (B, S)
        x = _embed(layers, "encoder", source_ids, training=training)
        segments = {}
    else:
        source_mask = packing[0] > 0  # (B, S)
        x = _embed(layers, "encoder", source_ids, training=training, packing=packing)
        segments = {"segment_ids": packing[0]}
    for block in layers.encoder_blocks:
        x = block(x, padding_mask=source_mask, training=training, **segments)
    if layers.encoder_final_layer_norm is not None:
        x = layers.encoder_final_layer_norm(x)
    return x, source_mask


def _target_mask(target_ids, pad_id):
    """`target_ids != pad_id`, and True at position 0: the first decoder
    input is the start token, real even when it is the pad id (Marian)."""
    first = ops.ones_like(target_ids[:, :1], dtype="bool")  # (B, 1)
    return ops.concatenate([first, ops.not_equal(target_ids[:, 1:], pad_id)], axis=1)


def _decode(layers, pad_id, target_ids, encoder_output, source_mask, training=None,
            packing=None, source_segment_ids=None):
    """Logits `(B, T, V)`; `packing` is the target's `(segment_ids,
    positions)` for packed rows (then `source_segment_ids` pairs segment `k`
    of both rows in the cross-attention)."""
    if packing is None:
        target_mask = _target_mask(target_ids, pad_id)  # (B, T)
        y = _embed(layers, "decoder", target_ids, training=training)
        segments = {}
    else:
        target_mask = packing[0] > 0  # (B, T)
        y = _embed(layers, "decoder", target_ids, training=training, packing=packing)
        segments = {"decoder_segment_ids": packing[0],
                    "encoder_segment_ids": source_segment_ids}
    for block in layers.decoder_blocks:
        y = block(
            y,
            encoder_output,
            decoder_padding_mask=target_mask,
            encoder_padding_mask=source_mask,
            training=training,
            **segments,
        )
    return _logits(layers, y)


# Optional inputs of packed rows (docs/packing.md), outside the functional
# graph: left out, the model runs that graph as it did before packing.
PACKED_INPUT_NAMES = ("source_segment_ids", "source_positions",
                      "target_segment_ids", "target_positions")


def _checked_packing(source_ids, target_ids, packed, pad_id):
    """The packed inputs checked under their own names: `(source packing,
    target packing, invalid)`, each packing `(segment_ids, positions)`
    int32 and `invalid` `(B,)` (or None) the rows to make NaN in a graph.

    Beyond each side being a packing, the rows must hold the same number of
    segments on both sides (target segment `k` translates source segment
    `k`), and a token of a segment may not be the pad id (the padded model
    masks it; a packed row's padding is its segment 0), save the first
    token of a target segment (the start token, which may be the pad id).
    """
    sides, invalid = [], []
    for side, ids in (("source", source_ids), ("target", target_ids)):
        segment_ids, bad_segments = checked_segment_ids(
            packed[f"{side}_segment_ids"], f"{side}_segment_ids")
        positions, bad_positions = checked_positions(
            packed[f"{side}_positions"], segment_ids, name=f"{side}_positions")
        sides.append((segment_ids, positions))
        pads = ops.logical_and(segment_ids > 0, ops.equal(ops.cast(ids, "int32"), pad_id))
        if side == "target":
            pads = ops.logical_and(pads, positions > 0)
        invalid += [bad_segments, bad_positions, refused(
            ops.any(pads, axis=1), f"{side}_ids",
            lambda row, side=side, pads=pads: (
                f"a token of a segment may not be the pad id {pad_id} (the padded "
                "model masks it)" + (", but a segment's first (the start token)"
                                     if side == "target" else "")
                + f". Received: {side}_ids[{row}] holds it at step "
                f"{int(np.argmax(concrete_value(pads)[row]))}"))]
    counts = [ops.max(segment_ids, axis=1) for segment_ids, _ in sides]  # (B,) each
    invalid.append(refused(
        ops.not_equal(counts[0], counts[1]), "target_segment_ids",
        lambda row: (
            "a target row must hold as many segments as its source row (segment k "
            f"of both is one example). Received: target_segment_ids[{row}].max()="
            f"{int(concrete_value(counts[1])[row])}, source_segment_ids[{row}].max()="
            f"{int(concrete_value(counts[0])[row])}")))
    return sides[0], sides[1], any_invalid(*invalid)


@keras.saving.register_keras_serializable(package="keras_attn")
class Transformer(GuardedModel, ConfigModel, keras.Model):
    """The encoder-decoder Transformer: `[source_ids, target_ids]` in,
    next-token logits `(B, T, V)` out.

    Train with `fit([source_ids, target_in_ids], target_out_ids)` where
    `target_in_ids` is the target shifted right (starting with a start
    token) and `target_out_ids` the target followed by an end token; pad both
    with `pad_id`. `compile()` defaults to the paper's loss (label-smoothed
    cross-entropy that ignores padding) and a padding-aware token accuracy.

    Concrete inputs and labels are checked (`ValueError` for an id outside
    the vocabulary, a length past `max_sequence_length` with learned
    positions); inside a compiled step such ids give NaN outputs and a NaN
    loss, and the step is skipped (see `keras_attn.models._guarded`). The arguments are the fields of `TransformerConfig`; prefer
    `build_transformer("transformer_base", ...)`.

    Packed rows (docs/packing.md): call the model on a dict of
    `source_ids`, `target_ids` and the four optional inputs
    `source_segment_ids`, `source_positions`, `target_segment_ids`,
    `target_positions`, all `(B, S)` or `(B, T)` int, as
    `keras_attn.data.pack_sequences(sources, S, targets=..., target_row_length=T)`
    gives them (`segment_ids`, `positions`, `target_segment_ids`,
    `target_positions`): segment `k` of a target row is the translation of
    segment `k` of its source row. Each example of a packed row gets the
    logits, the loss (labels packed like `target_ids`, padded with `pad_id`)
    and the gradient it gets alone. A packing that is not valid (see
    `keras_attn.ops.masking.SEGMENT_RULE`), rows with different numbers of
    segments on the two sides, or a pad id inside a segment is a `ValueError`
    naming the input in an eager call and NaN logits for that row inside a
    compiled step. Without them (a list or a dict of the two ids) the
    functional graph runs as it always did.

    Besides the functional call, the model exposes what decoding needs:
    `encode`, `decode` (the full decoder pass), `init_decoding_state` and
    `decode_step` (one token per sentence, with the key/value caches); see
    `keras_attn.models.transformer.decoding`.

    Example:

    >>> import numpy as np
    >>> model = Transformer(vocabulary_size=20, hidden_dim=8, intermediate_dim=16,
    ...                     num_heads=2, num_encoder_layers=1, num_decoder_layers=1)
    >>> source, target = np.ones((2, 5), "int32"), np.ones((2, 3), "int32")
    >>> tuple(model([source, target]).shape)
    (2, 3, 20)

    References:
        Vaswani et al., "Attention Is All You Need", NeurIPS 2017, section 3
        and Table 3.
    """

    config_attribute = "transformer_config"

    @config_arguments(TransformerConfig, "Transformer")
    def __init__(self, config, dtype=None, **kwargs):
        # N(0, D^-0.5): after the sqrt(D) scaling the embeddings have unit
        # variance, like the sinusoids they are added to (tensor2tensor).
        embedding_init = keras.initializers.RandomNormal(stddev=config.hidden_dim**-0.5)

        # === Layers ===
        # Held in `layers` until the graph is built, then made attributes: Keras
        # orders a model's variables (so the optimizer's, and checkpoints) by
        # the layers it tracks first, and saved files depend on that order.
        layers = types.SimpleNamespace()

        def token_embedding(size, name, bias=False):
            return SharedEmbedding(size, config.hidden_dim,
                                   embeddings_initializer=for_sublayer(embedding_init, name),
                                   output_bias=bias, dtype=dtype, name=name)

        def position(side):
            name = f"{side}_position_embedding"
            if config.position_embedding == "sinusoidal":
                return SinusoidalPositionalEncoding(layout=config.sinusoid_layout, dtype=dtype,
                                                    name=name)
            return PositionEmbedding(
                config.max_sequence_length,
                initializer=keras.initializers.RandomNormal(stddev=0.02),
                dtype=dtype,
                name=name,
            )

        def final_norm(side):
            # Pre-norm stacks end with a LayerNorm (the sublayers' outputs are
            # added to an un-normalised residual stream).
            if config.norm_position != "pre":
                return None
            return keras.layers.LayerNormalization(
                epsilon=config.layer_norm_epsilon, dtype=dtype, name=f"{side}_final_layer_norm"
            )

        block_args = dict(
            num_heads=config.num_heads,
            key_dim=config.key_dim,
            value_dim=config.value_dim,
            intermediate_dim=config.intermediate_dim,
            norm_position=config.norm_position,
            activation=config.activation,
            dropout=config.dropout,
            attention_dropout=config.attention_dropout,
            activation_dropout=config.activation_dropout,
            layer_norm_epsilon=config.layer_norm_epsilon,
            dtype=dtype,
        )
        encoder_names = [f"encoder_block_{i}" for i in range(config.num_encoder_layers)]
        decoder_names = [f"decoder_block_{i}" for i in range(config.num_decoder_layers)]

        layers.source_embedding = token_embedding(
            config.vocabulary_size,
            "token_embedding" if config.shared_vocabulary else "source_token_embedding",
            bias=config.output_bias and config.shared_vocabulary,
        )
        layers.encoder_position_embedding = position("encoder")
        layers.encoder_embedding_dropout = keras.layers.Dropout(
            config.dropout, dtype=dtype, name="encoder_embedding_dropout"
        )
        with remat_scope(config.remat, encoder_names):
            layers.encoder_blocks = [
                TransformerBlock(**block_args, name=name) for name in encoder_names
            ]
        layers.encoder_final_layer_norm = final_norm("encoder")
        if config.shared_vocabulary:
            layers.target_embedding = layers.source_embedding
        else:
            layers.target_embedding = token_embedding(config.target_vocabulary_size,
                                                      "target_token_embedding")
        layers.decoder_position_embedding = position("decoder")
        layers.decoder_embedding_dropout = keras.layers.Dropout(
            config.dropout, dtype=dtype, name="decoder_embedding_dropout"
        )
        with remat_scope(config.remat, decoder_names):
            layers.decoder_blocks = [
                TransformerDecoderBlock(**block_args, name=name) for name in decoder_names
            ]
        layers.decoder_final_layer_norm = final_norm("decoder")
        layers.output_projection = None  # tied to the target embedding
        if not config.shared_vocabulary:
            layers.output_projection = keras.layers.Dense(
                config.target_vocabulary_size, dtype=dtype, name="output_projection"
            )

        # === Functional Model ===
        # The graph is `encode` then `decode`, the methods decoding calls.
        source_ids = keras.Input((None,), dtype="int32", name="source_ids")
        target_ids = keras.Input((None,), dtype="int32", name="target_ids")
        encoder_output, source_mask = _encode(layers, config.pad_id, source_ids)  # (B, S, D), (B, S)
        logits = _decode(layers, config.pad_id, target_ids, encoder_output, source_mask)  # (B, T, V)
        super().__init__(
            inputs=[source_ids, target_ids], outputs=logits, dtype=dtype, **kwargs
        )
        for name, layer in vars(layers).items():
            setattr(self, name, layer)

        # === Config ===
        self.transformer_config = config

    def call(self, inputs, training=None, mask=None):
        self.check_input_keys(inputs)  # a dict is read by name, never by position
        packed = packed_inputs(inputs, PACKED_INPUT_NAMES)
        if packed is None:  # the functional graph, as without packing
            return super().call(inputs, training=training, mask=mask)
        pad_id = self.transformer_config.pad_id
        source_ids, target_ids = inputs["source_ids"], inputs["target_ids"]
        # Checked under this model's input names first (the layers check
        # again under their own, and make a bad row NaN inside a graph).
        source, target, invalid = _checked_packing(source_ids, target_ids, packed, pad_id)
        encoder_output, source_mask = _encode(self, pad_id, source_ids, training,
                                              packing=source)  # (B, S, D), (B, S)
        logits = _decode(self, pad_id, target_ids, encoder_output, source_mask, training,
                         packing=target, source_segment_ids=source[0])  # (B, T, V)
        return nan_where(invalid, logits)

    def compute_output_spec(self, inputs, training=None, mask=None):
        # A symbolic call with the packed inputs is not one the functional
        # graph was built for: the logits' shape is known.
        if packed_inputs(inputs, PACKED_INPUT_NAMES) is None:
            return super().compute_output_spec(inputs, training=training, mask=mask)
        target_ids = inputs["target_ids"]
        return keras.KerasTensor(
            (target_ids.shape[0], target_ids.shape[1], self._target_vocabulary_size()),
            self.compute_dtype)

    def input_specs(self):
        config = self.transformer_config
        return {
            "source_ids": IdSpec(0, config.vocabulary_size, "the source vocabulary"),
            "target_ids": IdSpec(0, self._target_vocabulary_size(), "the target vocabulary"),
        }

    def optional_input_names(self):
        return PACKED_INPUT_NAMES

    def max_length(self):
        config = self.transformer_config
        if config.position_embedding == "sinusoidal":
            return {}
        return {name: config.max_sequence_length for name in ("source_ids", "target_ids")}

    def label_specs(self):
        return {None: IdSpec(0, self._target_vocabulary_size(), "the target vocabulary")}

    def outputs_are_logits(self):
        return True  # next-token logits: a probability loss is refused

    def _target_vocabulary_size(self):
        config = self.transformer_config
        return config.target_vocabulary_size or config.vocabulary_size

    def compile(self, optimizer="adam", loss="auto", metrics="auto", label_smoothing=0.1,
                **kwargs):
        """`keras.Model.compile`; "auto" is the paper's label-smoothed
        cross-entropy (epsilon `label_smoothing`, 0.1 in section 5.4; used
        only by the "auto" loss) averaged over the real target tokens, and the
        token accuracy over them."""
        from keras_attn.training.losses import LabelSmoothedCrossEntropy
        from keras_attn.training.metrics import MaskedTokenAccuracy

        config = self.transformer_config
        if loss == "auto":
            loss = LabelSmoothedCrossEntropy(label_smoothing, pad_id=config.pad_id)
        if metrics == "auto":
            metrics = [MaskedTokenAccuracy(pad_id=config.pad_id)]
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)

    # === The graph's pieces, also used by decoding ===

    def encode(self, source_ids, training=None):
        """The encoder output `(B, S, D)` and the source padding mask `(B, S)`."""
        return _encode(self, self.transformer_config.pad_id, source_ids, training)

    def decode(self, target_ids, encoder_output, source_mask, training=None):
        """The full (uncached) decoder pass: logits `(B, T, V)`."""
        return _decode(self, self.transformer_config.pad_id, target_ids, encoder_output,
                       source_mask, training)

    def init_decoding_state(self, encoder_output, source_mask, max_length):
        """What `decode_step` carries: per decoder block an empty
        self-attention cache `(B, 2, max_length, N, H)` and the cross-attention
        keys/values `(B, 2, S, N, H)`, computed here once; and the source mask.
        """
        batch = ops.shape(encoder_output)[0]
        blocks = self.decoder_blocks
        return {
            "self_caches": [
                block.self_attention.empty_cache(batch, max_length) for block in blocks
            ],
            "cross_caches": [
                block.compute_cross_attention_cache(encoder_output) for block in blocks
            ],
            "source_mask": source_mask,
        }

    def decode_step(self, token_ids, index, state):
        """One decoding step: `token_ids (B,)` at position `index` (int or
        scalar tensor) -> next-token logits `(B, V)` and the updated state."""
        y = _embed(self, "decoder", ops.expand_dims(token_ids, 1), start_index=index)  # (B, 1, D)
        self_caches = []
        for block, cache, cross in zip(
            self.decoder_blocks, state["self_caches"], state["cross_caches"]
        ):
            y, cache, _ = block(
                y,
                None,
                encoder_padding_mask=state["source_mask"],
                self_attention_cache=cache,
                self_attention_cache_update_index=index,
                cross_attention_cache=cross,
            )
            self_caches.append(cache)
        logits = _logits(self, y)[:, 0, :]  # (B, V)
        return logits, dict(state, self_caches=self_caches)


def build_transformer(config=DEFAULT_PRESET, **overrides):
    """Builds a `Transformer` from a `TransformerConfig`, a preset name or a
    dict of fields, with `overrides` (config fields) applied.

    Args:
        config: a `TransformerConfig`, a name from `TRANSFORMER_PRESETS`
            (`"transformer_base"`, `"transformer_big"`) or a dict of
            `TransformerConfig` fields.
        **overrides: `TransformerConfig` fields to change
            (`vocabulary_size=8000`, `num_encoder_layers=3`,
            `max_sequence_length=128`); an unknown name is a `ValueError`.

    Returns:
        A `Transformer` (a functional `keras.Model`: source and target ids
            in, the target's logits out).

    Example:

    >>> model = build_transformer("transformer_base", vocabulary_size=100,
    ...     hidden_dim=16, intermediate_dim=32, num_heads=2,
    ...     num_encoder_layers=1, num_decoder_layers=1)
    >>> model.output_shape
    (None, None, 100)
    """
    config = get_transformer_config(config, **overrides)
    return Transformer(**dataclasses.asdict(config))
