"""ModernBERT's block, backbone, masked-LM model and config (the numbers
against transformers are in tests/convert/test_modernbert_convert.py)."""

import numpy as np
import pytest

from keras_attn.models.modernbert import ModernBertBackbone
from keras_attn.models.modernbert import ModernBertBlock
from keras_attn.models.modernbert import ModernBertMaskedLM
from test_case import run_layer_test
from test_case import to_numpy

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("attention_norm", [False, True])
def test_block(attention_norm, tmp_path):
    run_layer_test(
        ModernBertBlock,
        init_kwargs={
            "num_heads": 2,
            "intermediate_dim": 6,
            "norm_position": "pre",
            "activation": "gelu",
            "dropout": 0.1,
            "layer_norm_epsilon": 1e-6,
            "use_bias": False,
            "layer_norm_center": False,
            "gated": True,
            "rotary_theta": 500.0,
            "window": 4,
            "attention_norm": attention_norm,
        },
        input_data={"inputs": RNG.standard_normal((2, 7, 8)).astype("float32"),
                    "padding_mask": np.array([[1] * 7, [1] * 4 + [0] * 3], bool)},
        expected_output_shape=(2, 7, 8),
        # 4 attention kernels, 2 feed-forward kernels, one gamma per LayerNorm
        expected_num_trainable_weights=8 if attention_norm else 7,
        tmp_path=tmp_path,
    )


def test_the_first_block_attends_to_its_input_unnormalised():
    block = ModernBertBlock(num_heads=2, intermediate_dim=6, norm_position="pre",
                            attention_norm=False)
    x = RNG.standard_normal((1, 5, 8)).astype("float32")
    block(x)
    attention = to_numpy(block.self_attention(x))
    expected = x + attention  # the residual of the raw input's attention
    ffn_in = to_numpy(block.feed_forward_layer_norm(expected))
    expected = expected + to_numpy(block.feed_forward(ffn_in))
    np.testing.assert_allclose(to_numpy(block(x)), expected, atol=1e-5)


def test_the_models_save_and_load(tmp_path):
    import keras

    backbone = ModernBertBackbone(vocabulary_size=32, num_layers=2, num_heads=2, hidden_dim=8,
                                  intermediate_dim=12, local_window=4, pad_id=0)
    model = ModernBertMaskedLM(backbone)
    ids = np.array([[3, 5, 7, 9, 11, 13]])
    inputs = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    model.compile()  # "auto": the masked positions' cross-entropy
    weights = np.zeros(ids.shape, "float32")
    weights[:, ::2] = 1.0
    history = model.fit(inputs, ids, sample_weight=weights, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    path = str(tmp_path / "mlm.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.backbone.get_layer("transformer_block_0").attention_norm is False
    np.testing.assert_allclose(to_numpy(loaded(inputs)), to_numpy(model(inputs)), atol=1e-6)


def test_bad_configs_are_refused_by_name():
    from keras_attn.models.modernbert import get_modernbert_config

    with pytest.raises(ValueError, match="pad_id"):
        get_modernbert_config("modernbert_base", vocabulary_size=100)  # pad id 50283
    with pytest.raises(ValueError, match="local_window"):
        get_modernbert_config("modernbert_base", local_window=0)
    with pytest.raises(ValueError, match="num_heads"):
        get_modernbert_config("modernbert_base", num_heads=5)
