import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn.models.bert import BertMaskedLMHead
from keras_attn.models.bert import BertPretrainer
from keras_attn.models.bert import BertSequenceClassifier
from keras_attn.models.bert import BertTokenClassifier
from keras_attn.training import Perplexity
from _families import FAMILIES
from test_case import run_layer_test
from test_case import to_numpy

V, B, T, P = 50, 8, 10, 3


def backbone():
    return FAMILIES["bert"].backbone(vocabulary_size=V, num_layers=1)


def features(seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((B, T), "int32")
    mask[:, 7:] = 0
    return {
        "token_ids": (rng.integers(5, V, (B, T)) * mask).astype("int32"),
        "segment_ids": np.zeros((B, T), "int32"),
        "padding_mask": mask,
    }


def test_masked_lm_head_layer(tmp_path):
    rng = np.random.default_rng(0)
    run_layer_test(
        BertMaskedLMHead,
        init_kwargs={"vocabulary_size": 11, "activation": "relu",
                     "layer_norm_epsilon": 1e-6, "kernel_initializer": "he_normal"},
        input_data={"inputs": rng.normal(size=(2, 5, 4)).astype("float32"),
                    "mask_positions": np.array([[0, 4], [2, 2]], "int32")},
        call_kwargs={"embeddings": rng.normal(size=(11, 4)).astype("float32")},
        expected_output_shape=(2, 2, 11),
        expected_num_trainable_weights=5,  # dense kernel + bias, LN gamma + beta, output bias
        tmp_path=tmp_path,
    )


def test_masked_lm_head_math_and_errors():
    rng = np.random.default_rng(1)
    head = BertMaskedLMHead(vocabulary_size=7)
    x = rng.normal(size=(2, 5, 4)).astype("float32")
    table = rng.normal(size=(7, 4)).astype("float32")
    positions = np.array([[1, 3], [0, 0]], "int32")
    logits = to_numpy(head(x, positions, embeddings=table))
    kernel, bias = (to_numpy(w) for w in head.transform_dense.weights)
    h = np.take_along_axis(x, positions[..., None], axis=1) @ kernel + bias
    h = to_numpy(keras.activations.gelu(h, approximate=False))
    h = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-12)
    np.testing.assert_allclose(logits, h @ table.T, atol=1e-4)  # LN at init, zero bias
    with pytest.raises(ValueError, match=r"Received: embeddings.shape=\(6, 4\)"):
        head(x, positions, embeddings=table[:6])
    with pytest.raises(ValueError, match="Received: vocabulary_size=0"):
        BertMaskedLMHead(vocabulary_size=0)


def test_perplexity_equals_keras_hub():
    import keras_hub

    rng = np.random.default_rng(2)
    y_true = rng.integers(0, 9, (4, 6))
    y_pred = rng.normal(size=(4, 6, 9)).astype("float32")
    weight = (rng.random((4, 6)) > 0.3).astype("float32")
    ours, theirs = Perplexity(), keras_hub.metrics.Perplexity(from_logits=True)
    ours.update_state(y_true, y_pred, sample_weight=weight)
    theirs.update_state(y_true, y_pred, sample_weight=weight)
    np.testing.assert_allclose(float(ours.result()), float(theirs.result()), rtol=1e-5)


def test_pretrainer_ties_decoder_to_token_embedding_and_fits():
    bb = backbone()
    model = BertPretrainer(bb)
    table = bb.get_layer("token_embedding").embeddings
    # One (V, D) variable in the whole model: the decoder is the input table.
    matrices = [w for w in model.weights if tuple(w.shape) == (V, 16)]
    assert matrices == [table]
    head = model.get_layer("mlm_head")
    assert [w.path for w in head.weights if tuple(w.shape) == (V,)] == ["mlm_head/output_bias"]
    assert model.count_params() == bb.count_params() + (16 * 16 + 16 + 2 * 16 + V) + (16 * 2 + 2)

    x = features()
    rng = np.random.default_rng(3)
    x["mask_positions"] = rng.integers(0, 7, (B, P)).astype("int32")
    # The decoder really uses the table: changing it changes the logits.
    before = to_numpy(model(x)["mlm"])
    table.assign(table * 2.0)
    assert not np.allclose(before, to_numpy(model(x)["mlm"]))

    y = {"mlm": rng.integers(5, V, (B, P)).astype("int32"),
         "nsp": rng.integers(0, 2, (B,)).astype("int32")}
    w = {"mlm": np.ones((B, P), "float32"), "nsp": np.ones((B,), "float32")}
    w["mlm"][:, -1] = 0.0
    dataset = tf.data.Dataset.from_tensor_slices((x, y, w)).batch(4)
    model.compile(keras.optimizers.Adam(1e-3))
    start = table.numpy().copy()
    history = model.fit(dataset, epochs=1, verbose=0).history
    for name in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "mlm_perplexity", "nsp_accuracy"):
        assert np.isfinite(history[name][-1]), name
    # The perplexity is exp of the masked-LM loss averaged over real predictions.
    np.testing.assert_allclose(history["mlm_perplexity"][-1],
                               np.exp(history["mlm_loss"][-1]), rtol=0.05)
    assert not np.allclose(start, table.numpy())


def test_pretrainer_saves_with_the_tie(tmp_path):
    model = BertPretrainer(backbone())
    model.compile(keras.optimizers.Adam(1e-3))
    x = features()
    x["mask_positions"] = np.zeros((B, P), "int32")
    y = {"mlm": np.ones((B, P), "int32"), "nsp": np.zeros((B,), "int32")}
    model.train_on_batch(x, y)
    path = str(tmp_path / "pretrainer.keras")
    model.save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reloads compiled, without a warning
        reloaded = keras.saving.load_model(path)
    np.testing.assert_allclose(to_numpy(model(x)["mlm"]), to_numpy(reloaded(x)["mlm"]), atol=1e-6)
    # The same losses and metrics (perplexity included) as the saved model.
    scores = [m.evaluate(x, y, verbose=0, return_dict=True) for m in (model, reloaded)]
    assert "mlm_perplexity" in scores[1]
    assert scores[0] == pytest.approx(scores[1], rel=1e-5)
    table = reloaded.backbone.get_layer("token_embedding").embeddings
    assert [w for w in reloaded.weights if tuple(w.shape) == (V, 16)] == [table]


def test_masked_lm_alone_without_next_sentence_fits_and_saves(tmp_path):
    model = BertPretrainer(backbone(), next_sentence=False)
    assert all("nsp" not in w.path for w in model.weights)
    x = features()
    x["mask_positions"] = np.zeros((B, P), "int32")
    y = {"mlm": np.ones((B, P), "int32")}
    model.compile(keras.optimizers.Adam(1e-3))
    logs = model.train_on_batch(x, y, return_dict=True)
    # One output: Keras names its metrics without the "mlm_" prefix.
    assert set(logs) == {"loss", "accuracy", "perplexity"}
    assert all(np.isfinite(value) for value in logs.values())
    path = str(tmp_path / "masked_lm.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path)
    assert reloaded.next_sentence is False
    np.testing.assert_allclose(to_numpy(model(x)["mlm"]), to_numpy(reloaded(x)["mlm"]), atol=1e-6)
    assert list(reloaded(x)) == ["mlm"]
    with pytest.raises(ValueError, match="Received: next_sentence=1"):
        BertPretrainer(backbone(), next_sentence=1)


def test_sequence_classifier_fits_and_reports_accuracy(tmp_path):
    model = BertSequenceClassifier(backbone(), num_classes=3, dropout=0.2)
    labels = np.arange(B) % 3
    dataset = tf.data.Dataset.from_tensor_slices((features(), labels)).batch(4)
    model.compile(keras.optimizers.Adam(1e-3))
    history = model.fit(dataset, verbose=0).history
    assert set(history) == {"loss", "accuracy"}
    assert model.output_shape == (None, 3)
    path = str(tmp_path / "classifier.keras")
    model.save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "compile() was not called ..." would fail here
        reloaded = keras.saving.load_model(path)
    assert reloaded.num_classes == 3 and reloaded.dropout == 0.2
    np.testing.assert_allclose(to_numpy(model(features())), to_numpy(reloaded(features())),
                               atol=1e-6)
    # Reloaded compiled, with the optimizer's state: it evaluates and trains on.
    assert reloaded.compiled
    assert int(reloaded.optimizer.iterations) == int(model.optimizer.iterations) == 2
    for a, b in zip(model.optimizer.variables, reloaded.optimizer.variables):
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), atol=1e-7)
    scores = [m.evaluate(dataset, verbose=0, return_dict=True) for m in (model, reloaded)]
    assert scores[0] == pytest.approx(scores[1], rel=1e-5)
    with pytest.raises(ValueError, match="Received: num_classes=0"):
        BertSequenceClassifier(backbone(), num_classes=0)
    with pytest.raises(ValueError, match="Received: backbone=Sequential"):
        BertSequenceClassifier(keras.Sequential(), num_classes=2)


def test_token_classifier_ignores_padding_in_loss_and_accuracy():
    model = BertTokenClassifier(backbone(), num_classes=4, dropout=0.0)
    x = features()
    labels = np.random.default_rng(4).integers(0, 4, (B, T))
    weight = x["padding_mask"].astype("float32")
    model.compile(keras.optimizers.Adam(1e-3))
    history = model.fit(tf.data.Dataset.from_tensor_slices((x, labels, weight)).batch(4),
                        verbose=0).history
    assert {"loss", "accuracy"} <= set(history)
    # Changing labels at padded positions changes neither loss nor accuracy.
    other = labels.copy()
    other[:, 7:] = (other[:, 7:] + 1) % 4
    a = model.evaluate(x, labels, sample_weight=weight, verbose=0, return_dict=True)
    b = model.evaluate(x, other, sample_weight=weight, verbose=0, return_dict=True)
    assert a == pytest.approx(b)
    assert model.output_shape == (None, None, 4)
