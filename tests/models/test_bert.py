import dataclasses

import keras
import numpy as np
import pytest

from keras_attn.layers import gelu
from keras_attn.models.bert import BERT_PRESETS
from keras_attn.models.bert import build_bert
from keras_attn.models.bert import check_token_ids
from keras_attn.models.bert import get_bert_config
from _families import FAMILIES
from _families import unallocated
from _families import with_value
from test_case import run_model_test
from test_case import to_numpy

# The table's tiny backbone with the vocabulary and the length this file's
# batches and messages name.
TINY = dict(vocabulary_size=60, max_sequence_length=24)


def tiny(**overrides):
    return FAMILIES["bert"].backbone(**{**TINY, **overrides})


def batch(batch_size=2, length=7, vocabulary_size=60, seed=0, pad=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocabulary_size, (batch_size, length)).astype("int32")
    mask = np.ones((batch_size, length), "int32")
    if pad:
        ids[:, -pad:] = 0
        mask[:, -pad:] = 0
    segments = np.zeros((batch_size, length), "int32")
    segments[:, length // 2:] = 1
    return {"token_ids": ids, "segment_ids": segments, "padding_mask": mask}


def test_the_tiny_classifier_passes_the_model_harness(tmp_path):
    family = FAMILIES["bert"]
    overrides = dict(dropout=0.0, attention_dropout=0.0, layer_norm_epsilon=1e-5)
    config = family.config(**overrides)
    vocabulary, longest = config.vocabulary_size, config.max_sequence_length
    x, y = family.batch(size=3, **overrides)
    float_mask = dict(x, padding_mask=x["padding_mask"].astype("float32"))
    bad_inputs = [
        (with_value(x, "token_ids", (0, 3), vocabulary),
         rf"`token_ids` must lie in \[0, {vocabulary}\).*out of range: {vocabulary}"),
        (with_value(x, "token_ids", (0, 3), -1),
         rf"`token_ids` must lie in \[0, {vocabulary}\).*out of range: -1"),
        (with_value(x, "segment_ids", (0, 3), -1), r"`segment_ids` must lie in \[0, 2\).*-1"),
        (with_value(x, "segment_ids", (0, 3), 5), r"`segment_ids` must lie in \[0, 2\).*5"),
        (with_value(float_mask, "padding_mask", (0, 3), 0.4),
         r"`padding_mask` must be boolean or hold only 0 and 1.*0.4"),
        (family.inputs(size=3, length=longest + 1),
         f"longer than the model's max_sequence_length={longest}"),
        ({k: v[:, :0] for k, v in x.items()}, "has length 0"),
    ]
    bad_y = y.copy()
    bad_y[0] = 3
    bad_labels = [(bad_y, r"`labels` must lie in \[0, 3\).*out of range: 3")]
    run_model_test(
        lambda: family.build(**overrides), x, y, crop=family.crop, tmp_path=tmp_path,
        bad_inputs=bad_inputs, bad_labels=bad_labels,
        expected_config=dataclasses.asdict(config),
        more_batches=[family.inputs(size=3, fill="zeros", **overrides)],
    )


def test_presets_follow_the_papers():
    expected = {
        "bert_tiny": (2, 128, 2), "bert_mini": (4, 256, 4), "bert_small": (4, 512, 8),
        "bert_medium": (8, 512, 8), "bert_base": (12, 768, 12), "bert_large": (24, 1024, 16),
        "roberta_base": (12, 768, 12), "roberta_large": (24, 1024, 16),
    }
    assert set(BERT_PRESETS) == set(expected)
    for name, (layers, hidden, heads) in expected.items():
        config = BERT_PRESETS[name]
        assert (config.num_layers, config.hidden_dim, config.num_heads) == (layers, hidden, heads)
        assert config.intermediate_dim == 4 * hidden
        assert config.dropout == config.attention_dropout == 0.1
        assert config.max_sequence_length == 512
        if name.startswith("roberta"):  # roberta-base's / roberta-large's config.json
            assert (config.vocabulary_size, config.num_segments, config.padding_id) == (
                50265, 1, 1)
            assert (config.layer_norm_epsilon, config.position_rows()) == (1e-5, 514)
        else:
            assert (config.vocabulary_size, config.num_segments, config.padding_id) == (
                30522, 2, None)
            assert config.layer_norm_epsilon == 1e-12


@pytest.mark.presets
@pytest.mark.parametrize("name", sorted(BERT_PRESETS))
def test_every_preset_shrunk_builds_and_runs(name):
    preset = BERT_PRESETS[name]
    model = build_bert(name, vocabulary_size=60, hidden_dim=4 * preset.num_heads,
                       intermediate_dim=16 * preset.num_heads, num_layers=1,
                       max_sequence_length=16)
    data = batch()
    data["segment_ids"] %= preset.num_segments  # RoBERTa: one segment
    out = model(data)
    assert tuple(out["sequence_output"].shape) == (2, 7, 4 * preset.num_heads)
    assert tuple(out["pooled_output"].shape) == (2, 4 * preset.num_heads)
    assert np.all(np.isfinite(to_numpy(out["sequence_output"])))


def test_unknown_preset_and_override_are_named():
    with pytest.raises(ValueError, match="bert_huge"):
        build_bert("bert_huge")
    with pytest.raises(ValueError, match="Received: hiden_dim=3"):
        build_bert("bert_tiny", hiden_dim=3)
    with pytest.raises(ValueError, match="Received: config=3"):
        get_bert_config(3)
    with pytest.raises(ValueError, match="num_heads"):
        tiny(num_heads=3)
    with pytest.raises(ValueError, match="Received: dropout=1.5"):
        tiny(dropout=1.5)


def test_config_preset_name_and_dict_build_the_same_model():
    a = build_bert("bert_tiny", vocabulary_size=60, num_layers=1)
    b = build_bert({"hidden_dim": 128, "num_layers": 1, "num_heads": 2,
                    "intermediate_dim": 512, "vocabulary_size": 60})
    c = build_bert(dataclasses.replace(BERT_PRESETS["bert_tiny"], vocabulary_size=60,
                                       num_layers=1))
    assert a.bert_config == b.bert_config == c.bert_config
    assert a.count_params() == 4_385_920 - 30462 * 128 - 198_272


@pytest.mark.large
@pytest.mark.backend_independent  # a count, the same on every backend
def test_full_size_parameter_counts():
    assert unallocated(build_bert, "bert_base").count_params() == 109_482_240
    keras.backend.clear_session()
    assert unallocated(build_bert, "bert_large").count_params() == 335_141_888
    # transformers' RobertaModel (pooler included) of the released configs
    # counts the same: 124,645,632 and 355,359,744.
    keras.backend.clear_session()
    assert unallocated(build_bert, "roberta_base").count_params() == 124_645_632
    keras.backend.clear_session()
    assert unallocated(build_bert, "roberta_large").count_params() == 355_359_744


def test_structure_post_norm_exact_gelu_and_names():
    model = tiny()
    for name in ("token_embedding", "segment_embedding", "position_embedding",
                 "embeddings_layer_norm", "embeddings_dropout", "transformer_block_0",
                 "transformer_block_1", "pooled_dense"):
        model.get_layer(name)
    block = model.get_layer("transformer_block_1")
    assert block.norm_position == "post"
    # The exact GELU (erf), not the tanh approximation.
    assert block.activation is gelu
    np.testing.assert_allclose(to_numpy(block.activation(np.float32(1.0))), 0.8413447, rtol=1e-6)
    assert block.layer_norm_epsilon == 1e-12
    assert model.get_layer("embeddings_layer_norm").epsilon == 1e-12
    assert model.get_layer("pooled_dense").activation is keras.activations.tanh
    assert model.get_layer("segment_embedding").input_dim == 2


def test_pooled_output_is_tanh_dense_of_cls():
    model = tiny()
    data = batch()
    out = model(data)
    dense = model.get_layer("pooled_dense")
    kernel, bias = (to_numpy(w) for w in dense.weights)
    expected = np.tanh(to_numpy(out["sequence_output"])[:, 0] @ kernel + bias)
    np.testing.assert_allclose(to_numpy(out["pooled_output"]), expected, atol=1e-5)


def test_embedding_sum_matches_hand_computation():
    model = tiny(num_layers=1)
    data = batch()
    embeddings = keras.Model(model.inputs, model.get_layer("embeddings_layer_norm").output)
    got = to_numpy(embeddings(data))
    tok = to_numpy(model.get_layer("token_embedding").embeddings)[data["token_ids"]]
    seg = to_numpy(model.get_layer("segment_embedding").embeddings)[data["segment_ids"]]
    pos = to_numpy(model.get_layer("position_embedding").weights[0])[:7]
    x = tok + seg + pos
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-12)
    np.testing.assert_allclose(got, x, atol=1e-4)


def test_padding_changes_no_real_output_and_any_length_works():
    model = tiny()
    short = batch(length=6)
    padded = {k: np.pad(v, ((0, 0), (0, 5))) for k, v in short.items()}
    a = model(short)["sequence_output"]
    b = model(padded)["sequence_output"]
    np.testing.assert_allclose(to_numpy(a), to_numpy(b)[:, :6], atol=1e-5)
    for length in (1, 24):
        assert tuple(model(batch(batch_size=3, length=length))["pooled_output"].shape) == (3, 16)


def test_roberta_positions_count_the_real_tokens_past_the_padding_id(tmp_path):
    model = tiny(num_layers=1, padding_id=1, num_segments=1)
    assert model.get_layer("position_embedding").weights[0].shape[0] == 24 + 2
    ids = np.array([[0, 7, 8, 9, 2, 1, 1], [0, 7, 1, 1, 8, 9, 2]], "int32")
    data = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": ids != 1}
    embeddings = keras.Model(model.inputs, model.get_layer("embeddings_layer_norm").output)
    rows = np.array([[2, 3, 4, 5, 6, 1, 1], [2, 3, 1, 1, 4, 5, 6]])  # padding: row 1
    x = (to_numpy(model.get_layer("token_embedding").embeddings)[ids]
         + to_numpy(model.get_layer("segment_embedding").embeddings)[0]
         + to_numpy(model.get_layer("position_embedding").weights[0])[rows])
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-12)
    np.testing.assert_allclose(to_numpy(embeddings(data)), x, atol=1e-4)
    # 24 tokens fit the 26 rows; a 25th is refused.
    full, long = batch(batch_size=1, length=24), batch(length=25)
    full["segment_ids"][:] = long["segment_ids"][:] = 0
    assert tuple(model(full)["pooled_output"].shape) == (1, 16)
    with pytest.raises(ValueError, match="max_sequence_length=24"):
        model(long)
    model.save(tmp_path / "roberta.keras")
    loaded = keras.saving.load_model(tmp_path / "roberta.keras")
    assert loaded.bert_config.padding_id == 1
    np.testing.assert_allclose(to_numpy(loaded(data)["sequence_output"]),
                               to_numpy(model(data)["sequence_output"]), atol=1e-6)
    with pytest.raises(ValueError, match="Received: padding_id=60"):
        tiny(padding_id=60)
    with pytest.raises(ValueError, match="Received: padding_id=-1"):
        tiny(padding_id=-1)


def test_too_long_is_a_value_error():
    with pytest.raises(ValueError, match="max_sequence_length=24"):
        tiny()(batch(length=25))


def test_out_of_range_token_ids():
    with pytest.raises(ValueError, match=r"token_ids out of range: 60, 99"):
        check_token_ids(np.array([[1, 60, 99]]), 60)
    check_token_ids(np.array([[0, 59]]), 60)
    model = tiny()
    data = batch()
    data["token_ids"][0, 3] = 60
    with pytest.raises(ValueError, match=r"`token_ids` must lie in \[0, 60\)"):
        model.predict(data, verbose=0)
    # In a compiled step (here fed by a generator, which is not checked
    # ahead) an out-of-range id cannot raise; its outputs are NaN. PyTorch
    # runs the step eagerly: the model's own check raises there.
    generator = ((data,) for _ in range(1))
    if keras.backend.backend() == "torch":
        with pytest.raises(ValueError, match=r"`token_ids` must lie in \[0, 60\)"):
            model.predict(generator, verbose=0)
        return
    out = model.predict(generator, verbose=0)
    assert np.all(np.isnan(out["sequence_output"][0]))
    assert np.all(np.isfinite(out["sequence_output"][1]))


def test_position_layer_keeps_the_shared_class_name():
    # .keras files store weights under the snake-cased class name; a renamed
    # subclass would make older checkpoints unloadable.
    from keras_attn.layers import PositionEmbedding

    layer = tiny().get_layer("position_embedding")
    assert isinstance(layer, PositionEmbedding)
    assert type(layer).__name__ == "PositionEmbedding"
    assert layer.compute_output_shape((None, None, 16)) == (None, None, 16)


def test_mixed_precision_policy_reaches_every_layer():
    from keras_attn.models.bert import BertPretrainer

    keras.config.set_dtype_policy("mixed_bfloat16")
    model = BertPretrainer(tiny(num_layers=1))
    data = batch()
    data["mask_positions"] = np.zeros((2, 3), "int32")
    out = model(data)
    assert keras.backend.standardize_dtype(out["mlm"].dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(out["nsp"].dtype) == "bfloat16"
    for layer in model._flatten_layers():
        if layer.weights:
            assert layer.dtype_policy.name == "mixed_bfloat16", layer.name
    assert {keras.backend.standardize_dtype(w.dtype) for w in model.weights} == {"float32"}
