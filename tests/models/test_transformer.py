import dataclasses

import keras
import numpy as np
import pytest

from keras_attn.models.transformer import TRANSFORMER_PRESETS
from keras_attn.models.transformer import SharedEmbedding
from keras_attn.models.transformer import TransformerConfig
from keras_attn.models.transformer import build_transformer
from keras_attn.models.transformer import get_transformer_config
from _families import FAMILIES
from _families import unallocated
from test_case import run_layer_test
from test_case import run_model_test
from test_case import to_numpy

TINY = dict(
    vocabulary_size=23,
    hidden_dim=8,
    intermediate_dim=12,
    num_heads=2,
    num_encoder_layers=2,
    num_decoder_layers=1,
)
RNG = np.random.default_rng(5)


def ids(batch, length, vocab=23, pad_from=None, pad_id=0):
    x = RNG.integers(1, vocab, (batch, length)).astype("int32")
    x[x == pad_id] = pad_id + 1
    if pad_from is not None:
        for row, start in enumerate(pad_from):
            x[row, start:] = pad_id
    return x


def test_the_tiny_model_passes_the_model_harness(tmp_path):
    family = FAMILIES["transformer"]
    overrides = dict(dropout=0.0, norm_position="pre", position_embedding="learned",
                     max_sequence_length=16, pad_id=2, key_dim=3, value_dim=5)
    vocabulary = family.config(**overrides).vocabulary_size
    (source, target), labels = family.batch(size=3, **overrides)
    bad_source, bad_target, bad_labels = source.copy(), target.copy(), labels.copy()
    bad_source[1, 2], bad_target[0, 0], bad_labels[0, 0] = vocabulary, -1, vocabulary + 2
    run_model_test(
        lambda: family.build(**overrides), [source, target], labels,
        crop=lambda x, i: family.crop(x, i, **overrides), tmp_path=tmp_path,
        bad_inputs=[
            ([bad_source, target], rf"`source_ids` must lie in \[0, {vocabulary}\).*{vocabulary}"),
            ([source, bad_target], rf"`target_ids` must lie in \[0, {vocabulary}\).*-1"),
            ([source[:, :0], target], "has length 0"),
            ([source, target[:, :0]], "has length 0"),
        ],
        bad_labels=[(bad_labels, rf"`labels` must lie in \[0, {vocabulary}\).*{vocabulary + 2}")],
        expected_config=dataclasses.asdict(family.config(**overrides)),
    )


def test_shared_embedding_layer(tmp_path):
    run_layer_test(
        SharedEmbedding,
        init_kwargs={
            "vocabulary_size": 11,
            "hidden_dim": 6,
            "scale_by_sqrt_dim": False,
            "embeddings_initializer": "he_normal",
        },
        input_data={"inputs": np.array([[1, 2, 3], [4, 0, 0]], "int32")},
        expected_output_shape=(2, 3, 6),
        expected_num_trainable_weights=1,
        tmp_path=tmp_path,
    )


def test_shared_embedding_scales_and_ties():
    layer = SharedEmbedding(5, 4)
    x = to_numpy(layer(np.array([[2]])))
    table = to_numpy(layer.embeddings)
    np.testing.assert_allclose(x[0, 0], table[2] * 2.0, rtol=1e-6)  # sqrt(4)
    logits = to_numpy(layer(np.ones((1, 1, 4), "float32"), reverse=True))
    np.testing.assert_allclose(logits[0, 0], table.sum(axis=1), rtol=1e-5)


@pytest.mark.presets
@pytest.mark.parametrize("preset", sorted(TRANSFORMER_PRESETS))
def test_presets_shrunk(preset):
    model = build_transformer(preset, **TINY)
    assert model.transformer_config.dropout == TRANSFORMER_PRESETS[preset].dropout
    source, target = ids(3, 6, pad_from=[6, 4, 2]), ids(3, 5, pad_from=[5, 3, 1])
    assert tuple(model([source, target]).shape) == (3, 5, 23)


def test_preset_values_are_the_papers():
    base, big = TRANSFORMER_PRESETS["transformer_base"], TRANSFORMER_PRESETS["transformer_big"]
    assert (base.hidden_dim, base.intermediate_dim, base.num_heads, base.dropout) == (512, 2048, 8, 0.1)
    assert (base.num_encoder_layers, base.num_decoder_layers) == (6, 6)
    assert (big.hidden_dim, big.intermediate_dim, big.num_heads, big.dropout) == (1024, 4096, 16, 0.3)
    for config in (base, big):
        assert config.norm_position == "post" and config.activation == "relu"
        assert config.position_embedding == "sinusoidal" and config.shared_vocabulary


def test_label_smoothing_is_a_compile_setting_not_a_config_field():
    # Section 5.4's eps_ls = 0.1 is the default of the "auto" loss.
    model = build_transformer("transformer_base", vocabulary_size=20, hidden_dim=8,
                              intermediate_dim=16, num_heads=2, num_encoder_layers=1,
                              num_decoder_layers=1)
    model.compile()
    assert model.loss.label_smoothing == 0.1
    model.compile(label_smoothing=0.2)
    assert model.loss.label_smoothing == 0.2 and model.loss.pad_id == 0
    with pytest.raises(ValueError, match=r"label_smoothing.*Transformer.compile.*"
                                         r"Received: label_smoothing=0.2"):
        build_transformer("transformer_base", label_smoothing=0.2)


def test_unknown_preset_and_field():
    with pytest.raises(ValueError, match="Unknown Transformer preset 'transformer_huge'"):
        build_transformer("transformer_huge")
    with pytest.raises(ValueError, match="Received: num_layers=3"):
        build_transformer("transformer_base", num_layers=3)
    with pytest.raises(ValueError, match="Received: config=3"):
        get_transformer_config(3)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("num_heads", 3, "Received: hidden_dim=8, num_heads=3"),
        ("norm_position", "middle", "Received: norm_position='middle'"),
        ("position_embedding", "rotary", "Received: position_embedding='rotary'"),
        ("pad_id", 23, "Received: pad_id=23, vocabulary_size=23"),
        ("dropout", 1.0, "Received: dropout=1.0"),
    ],
)
def test_bad_config_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        build_transformer(TransformerConfig(**TINY), **{field: value})


def test_nonzero_pad_id_masks_that_id():
    model = build_transformer(TransformerConfig(**TINY), dropout=0.0, pad_id=3)
    source, target = ids(1, 4, pad_id=3), ids(1, 3, pad_id=3)
    base = to_numpy(model([source, target]))
    padded = np.concatenate([source, [[3, 3]]], axis=1).astype("int32")
    np.testing.assert_allclose(to_numpy(model([padded, target])), base, atol=1e-5)
    # A different filler id is a real token and changes the outputs.
    other = np.concatenate([source, [[0, 0]]], axis=1).astype("int32")
    assert np.abs(to_numpy(model([other, target])) - base).max() > 1e-4


def test_output_is_causal():
    model = build_transformer(TransformerConfig(**TINY), dropout=0.0)
    source, target = ids(1, 5), ids(1, 4)
    changed = target.copy()
    changed[0, 3] = 1 + changed[0, 3] % 20
    a, b = to_numpy(model([source, target])), to_numpy(model([source, changed]))
    np.testing.assert_allclose(a[:, :3], b[:, :3], atol=1e-6)


def test_tied_and_untied_parameter_counts():
    tied = build_transformer(TransformerConfig(**TINY))
    untied = build_transformer(TransformerConfig(**TINY), target_vocabulary_size=17)
    # D=8, F=12. Encoder block: MHA 4 (8*8+8) = 288, FFN 8*12+12+12*8+8 = 212,
    # 2 LayerNorms 32: 532. Decoder block: 2 MHA 576 + FFN 212 + 3 LN 48 = 836.
    assert tied.count_params() == 23 * 8 + 2 * 532 + 836
    # Separate source (23 x 8) and target (17 x 8) embeddings, Dense 8 -> 17.
    assert untied.count_params() == 23 * 8 + 17 * 8 + (8 * 17 + 17) + 2 * 532 + 836
    assert tuple(untied([ids(2, 3), ids(2, 4, vocab=17)]).shape) == (2, 4, 17)
    # Pre-norm adds two final LayerNorms; learned positions two 1024 x 8 tables.
    variant = build_transformer(
        TransformerConfig(**TINY), norm_position="pre", position_embedding="learned"
    )
    assert variant.count_params() == tied.count_params() + 2 * 16 + 2 * 1024 * 8


def test_key_and_value_sizes_per_head():
    # Table 3 rows (A)/(B): d_k and d_v need not be D / h. D=8, h=2, d_k=3,
    # d_v=5: Q, K project 8 -> 2*3 (+bias), V 8 -> 2*5 (+bias), O 10 -> 8.
    model = build_transformer(TransformerConfig(**TINY), key_dim=3, value_dim=5)
    attention = 2 * (8 * 6 + 6) + (8 * 10 + 10) + (10 * 8 + 8)
    default = 4 * (8 * 8 + 8)
    base = build_transformer(TransformerConfig(**TINY)).count_params()
    assert model.count_params() == base + 4 * (attention - default)  # 4 MHAs
    # A key size alone lets the heads not divide the width.
    build_transformer(TransformerConfig(**TINY), num_heads=3, key_dim=4)
    with pytest.raises(ValueError, match="Received: key_dim=0"):
        build_transformer(TransformerConfig(**TINY), key_dim=0)


def _by_hand_count(d, f, layers, vocab=37000):
    attention = 4 * (d * d + d)  # W^Q, W^K, W^V, W^O with biases
    feed_forward = d * f + f + f * d + d
    encoder_block = attention + feed_forward + 2 * (2 * d)  # 2 LayerNorms
    decoder_block = 2 * attention + feed_forward + 3 * (2 * d)  # 3 LayerNorms
    return vocab * d + layers * (encoder_block + decoder_block)  # tied softmax


@pytest.mark.large
@pytest.mark.backend_independent  # a count, the same on every backend
def test_full_size_parameter_counts():
    # base: embedding 37000*512 = 18,944,000; encoder block 1,050,624 (MHA)
    # + 2,099,712 (FFN) + 2,048 (LNs) = 3,152,384, x6 = 18,914,304; decoder
    # block 2,101,248 + 2,099,712 + 3,072 = 4,204,032, x6 = 25,224,192; the
    # pre-softmax projection is the embedding (no weights of its own):
    # 63,082,496 in all.
    # big: 37000*1024 = 37,888,000; encoder block 4,198,400 + 8,393,728 +
    # 4,096 = 12,596,224, x6 = 75,577,344; decoder block 8,396,800 + 8,393,728
    # + 6,144 = 16,796,672, x6 = 100,780,032: 214,245,376.
    # The paper (Table 3) rounds to 65M and 213M and does not say how it
    # counted; no single vocabulary size explains both gaps (65M would need
    # ~40.8k tokens, 213M ~35.8k), so the differences come from counting or
    # implementation details the paper leaves out (e.g. the exact vocabulary,
    # biases, whether embeddings are counted once), not from the architecture.
    assert _by_hand_count(512, 2048, 6) == 63_082_496
    assert _by_hand_count(1024, 4096, 6) == 214_245_376
    # Built with shapes and no values (`unallocated`): a count reads shapes
    # only, and drawing 277M random weights is most of the time otherwise.
    assert unallocated(build_transformer, "transformer_base").count_params() == 63_082_496
    keras.backend.clear_session()
    assert unallocated(build_transformer, "transformer_big").count_params() == 214_245_376
    keras.backend.clear_session()
