"""ModernBERT's backbone, masked-LM model and config (the numbers
against transformers are in tests/convert/test_modernbert_convert.py)."""

import dataclasses

import numpy as np
import pytest

from keras_attn.models.modernbert import ModernBertMaskedLM
from keras_attn.models.modernbert import ModernBertSequenceClassifier
from _families import FAMILIES
from _families import with_value
from test_case import run_model_test
from test_case import to_numpy

RNG = np.random.default_rng(3)
# The table's tiny ModernBERT (two blocks: a global one without its
# attention LayerNorm, then a local one with a window of 4).
MODERNBERT = FAMILIES["modernbert"]


def test_the_tiny_classifier_passes_the_model_harness(tmp_path):
    # What every family's tiny model passes (tests/test_case.py): config and
    # .keras round trips, an example's outputs the same alone, in its batch
    # and with other padding (both modes), mixed precision, a fit step, and
    # bad inputs and labels refused in every entry point.
    overrides = dict(dropout=0.0)
    config = MODERNBERT.config(**overrides)
    vocabulary, longest = config.vocabulary_size, config.max_sequence_length
    x, y = MODERNBERT.batch(size=3, **overrides)
    float_mask = dict(x, padding_mask=x["padding_mask"].astype("float32"))
    bad_inputs = [
        (with_value(x, "token_ids", (0, 3), vocabulary),
         rf"`token_ids` must lie in \[0, {vocabulary}\).*out of range: {vocabulary}"),
        (with_value(x, "token_ids", (0, 3), -1),
         rf"`token_ids` must lie in \[0, {vocabulary}\).*out of range: -1"),
        (with_value(float_mask, "padding_mask", (0, 3), 0.4),
         r"`padding_mask` must be boolean or hold only 0 and 1.*0.4"),
        (MODERNBERT.inputs(size=3, length=longest + 1),
         f"longer than the model's max_sequence_length={longest}"),
        ({k: v[:, :0] for k, v in x.items()}, "has length 0"),
    ]
    bad_y = y.copy()
    bad_y[0] = 3
    bad_labels = [(bad_y, r"`labels` must lie in \[0, 3\).*out of range: 3")]
    run_model_test(
        lambda: MODERNBERT.build(**overrides), x, y, crop=MODERNBERT.crop, tmp_path=tmp_path,
        bad_inputs=bad_inputs, bad_labels=bad_labels,
        expected_config=dataclasses.asdict(config),
        more_batches=[MODERNBERT.inputs(size=3, fill="zeros", **overrides)],
    )


def test_the_models_save_and_load(tmp_path):
    import keras

    backbone = MODERNBERT.backbone()
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


def test_the_classifier_trains_saves_and_loads(tmp_path):
    import keras

    backbone = MODERNBERT.backbone()
    model = ModernBertSequenceClassifier(backbone, num_classes=3, pooling="mean", dropout=0.2)
    ids = np.array([[3, 5, 7, 9, 11, 13], [4, 6, 8, 0, 0, 0]])
    inputs = {"token_ids": ids, "padding_mask": ids != 0}
    model.compile()  # "auto": cross-entropy on the logits, accuracy
    history = model.fit(inputs, np.array([2, 0]), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0]) and "accuracy" in history.history
    path = str(tmp_path / "classifier.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert (loaded.num_classes, loaded.pooling, loaded.dropout) == (3, "mean", 0.2)
    np.testing.assert_allclose(to_numpy(loaded(inputs)), to_numpy(model(inputs)), atol=1e-6)
    # "mean" reads the real tokens only: the padding's ids change nothing.
    other = {"token_ids": np.where(ids == 0, 17, ids), "padding_mask": ids != 0}
    np.testing.assert_allclose(to_numpy(model(other)), to_numpy(model(inputs)), atol=1e-6)


def test_a_row_of_padding_only_is_refused_and_nan_where_nothing_raises():
    # Its answer would come from the padding's ids (docs/bad_input.md).
    backbone = MODERNBERT.backbone()
    model = ModernBertSequenceClassifier(backbone, num_classes=3)
    ids = np.array([[3, 5, 7, 9], [4, 6, 8, 10]])
    inputs = {"token_ids": ids, "padding_mask": np.array([[1, 1, 1, 0], [0, 0, 0, 0]])}
    with pytest.raises(ValueError, match=r"`padding_mask`: row\(s\) \[1\] hold no real token"):
        model(inputs)
    import keras

    if keras.backend.backend() == "torch":  # PyTorch predicts eagerly: the check raises
        with pytest.raises(ValueError, match=r"row\(s\) \[1\] hold no real token"):
            model.predict_on_batch(inputs)
        return
    answer = np.asarray(model.predict_on_batch(inputs))  # compiled: nothing raises
    good = to_numpy(model({name: value[:1] for name, value in inputs.items()}))
    assert np.isnan(answer[1]).all()
    np.testing.assert_allclose(answer[0], good[0], atol=1e-5)


@pytest.mark.parametrize("kwargs, match", [
    ({"pooling": "max"}, r"Received: pooling='max'"),
    ({"num_classes": 0}, r"Received: num_classes=0"),
    ({"dropout": 1.5}, r"Received: dropout=1.5"),
])
def test_bad_classifier_arguments_are_refused_by_name(kwargs, match):
    backbone = MODERNBERT.backbone(num_layers=1)
    with pytest.raises(ValueError, match=match):
        ModernBertSequenceClassifier(backbone, **{"num_classes": 2, **kwargs})


def test_bad_configs_are_refused_by_name():
    from keras_attn.models.modernbert import get_modernbert_config

    with pytest.raises(ValueError, match="pad_id"):
        get_modernbert_config("modernbert_base", vocabulary_size=100)  # pad id 50283
    with pytest.raises(ValueError, match="local_window"):
        get_modernbert_config("modernbert_base", local_window=0)
    with pytest.raises(ValueError, match="num_heads"):
        get_modernbert_config("modernbert_base", num_heads=5)


def test_the_masked_lm_reads_packed_rows_as_its_examples_alone():
    # Two examples packed in one row (packed_segment_ids 1, 2; positions
    # restart) get the logits each gets alone: no attention between them.
    backbone = MODERNBERT.backbone()
    model = ModernBertMaskedLM(backbone)
    first, second = np.array([[2, 5, 7, 9, 3]]), np.array([[2, 11, 13, 3]])
    row = np.concatenate([first, second, [[0]]], axis=1)
    packed = {"token_ids": row, "padding_mask": (row != 0).astype("int32"),
              "packed_segment_ids": np.array([[1] * 5 + [2] * 4 + [0]]),
              "positions": np.array([[0, 1, 2, 3, 4, 0, 1, 2, 3, 0]])}
    logits = to_numpy(model(packed))
    assert logits.shape == (1, 10, MODERNBERT.tiny["vocabulary_size"])
    for ids, start in ((first, 0), (second, 5)):
        alone = to_numpy(model({"token_ids": ids, "padding_mask": np.ones_like(ids)}))
        np.testing.assert_allclose(logits[:, start:start + ids.shape[1]], alone, atol=1e-5)
