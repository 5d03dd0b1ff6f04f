import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_attn.training import LabelSmoothedCrossEntropy
from keras_attn.training import MaskedTokenAccuracy
from keras_attn.training import TransformerSchedule
from keras_attn.training import transformer_adam

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RNG = np.random.default_rng(11)
LABELS = np.array([[3, 1, 4, 0, 0], [2, 2, 0, 0, 0]], "int32")  # 0 = padding
LOGITS = RNG.standard_normal((2, 5, 6)).astype("float32")
REAL = LABELS != 0


def _reference(labels, logits, eps):
    """Per-token smoothed cross-entropy written out in NumPy."""
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    target = np.eye(logits.shape[-1])[labels] * (1 - eps) + eps / logits.shape[-1]
    return -(target * log_probs).sum(-1)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_loss_is_the_mean_over_real_tokens(eps):
    loss = LabelSmoothedCrossEntropy(label_smoothing=eps, pad_id=0)
    expected = _reference(LABELS, LOGITS, eps)[REAL].mean()
    np.testing.assert_allclose(float(loss(LABELS, LOGITS)), expected, rtol=1e-5)


def test_loss_matches_keras_label_smoothing_on_real_tokens():
    keras_loss = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.1)
    expected = float(keras_loss(np.eye(6)[LABELS[REAL]], LOGITS[REAL]))
    got = float(LabelSmoothedCrossEntropy(0.1)(LABELS, LOGITS))
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_loss_ignores_added_padding_and_nonzero_pad_id():
    loss = LabelSmoothedCrossEntropy()
    padded_labels = np.concatenate([LABELS, np.zeros((2, 4), "int32")], axis=1)
    padded_logits = np.concatenate([LOGITS, 9 * RNG.standard_normal((2, 4, 6))], axis=1)
    np.testing.assert_allclose(
        float(loss(padded_labels, padded_logits.astype("float32"))),
        float(loss(LABELS, LOGITS)),
        rtol=1e-5,
    )
    shifted = np.where(REAL, LABELS, 5)  # the same padding spelled 5
    np.testing.assert_allclose(
        float(LabelSmoothedCrossEntropy(pad_id=5)(shifted, LOGITS)),
        float(loss(LABELS, LOGITS)),
        rtol=1e-5,
    )


def test_loss_reductions_probabilities_and_all_padding():
    per_token = _reference(LABELS, LOGITS, 0.1) * REAL
    none = LabelSmoothedCrossEntropy(reduction="none")(LABELS, LOGITS)
    np.testing.assert_allclose(np.asarray(none), per_token, rtol=1e-5)
    total = LabelSmoothedCrossEntropy(reduction="sum")(LABELS, LOGITS)
    np.testing.assert_allclose(float(total), per_token.sum(), rtol=1e-5)
    probs = np.exp(LOGITS) / np.exp(LOGITS).sum(-1, keepdims=True)
    from_probs = LabelSmoothedCrossEntropy(from_logits=False)(LABELS, probs)
    np.testing.assert_allclose(float(from_probs), per_token.sum() / REAL.sum(), rtol=1e-4)
    assert float(LabelSmoothedCrossEntropy()(np.zeros((2, 3), "int32"), LOGITS[:, :3])) == 0.0


def test_loss_config_and_errors():
    loss = LabelSmoothedCrossEntropy(label_smoothing=0.2, pad_id=3, from_logits=False)
    config = json.loads(json.dumps(keras.losses.serialize(loss)))
    revived = keras.losses.deserialize(config)
    assert (revived.label_smoothing, revived.pad_id, revived.from_logits) == (0.2, 3, False)
    with pytest.raises(ValueError, match="Received: label_smoothing=1.5"):
        LabelSmoothedCrossEntropy(label_smoothing=1.5)
    with pytest.raises(ValueError, match="Received: pad_id=None"):
        LabelSmoothedCrossEntropy(pad_id=None)


def test_schedule_known_values():
    schedule = TransformerSchedule(hidden_dim=512, warmup_steps=4000)
    rate = lambda step: float(schedule(step))  # noqa: E731
    np.testing.assert_allclose(rate(1), 512**-0.5 * 4000**-1.5, rtol=1e-5)
    np.testing.assert_allclose(rate(0), rate(1), rtol=1e-6)  # step 0 is clamped
    np.testing.assert_allclose(rate(2000), 512**-0.5 * 2000 * 4000**-1.5, rtol=1e-5)
    np.testing.assert_allclose(rate(4000), (512 * 4000) ** -0.5, rtol=1e-5)
    np.testing.assert_allclose(rate(16000), 512**-0.5 * 16000**-0.5, rtol=1e-5)
    assert rate(3999) < rate(4000) > rate(4001)
    doubled = TransformerSchedule(hidden_dim=512, warmup_steps=4000, scale=2.0)
    np.testing.assert_allclose(float(doubled(100)), 2 * rate(100), rtol=1e-6)


def test_schedule_serializes_and_drives_adam():
    schedule = TransformerSchedule(hidden_dim=64, warmup_steps=10, scale=0.5)
    config = json.loads(json.dumps(keras.optimizers.schedules.serialize(schedule)))
    revived = keras.optimizers.schedules.deserialize(config)
    assert revived.get_config() == {"hidden_dim": 64, "warmup_steps": 10, "scale": 0.5}
    optimizer = transformer_adam(64, warmup_steps=10, scale=0.5)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    revived_optimizer = keras.optimizers.deserialize(
        json.loads(json.dumps(keras.optimizers.serialize(optimizer)))
    )
    assert revived_optimizer.get_config()["learning_rate"]["config"] == schedule.get_config()
    variable = keras.Variable(np.ones(3, "float32"))
    for _ in range(3):
        optimizer.apply_gradients([(np.ones(3, "float32"), variable)])
    np.testing.assert_allclose(float(optimizer.learning_rate), float(schedule(3)), rtol=1e-6)
    for bad, message in [({"hidden_dim": 0}, "hidden_dim=0"), ({"hidden_dim": 8, "warmup_steps": -1}, "warmup_steps=-1")]:
        with pytest.raises(ValueError, match=message):
            TransformerSchedule(**bad)


def test_token_accuracy_accumulates_over_real_tokens():
    metric = MaskedTokenAccuracy(pad_id=0)
    predictions = np.eye(6)[[[3, 1, 1, 0, 2], [2, 5, 4, 4, 4]]]  # 2/3 right, then 1/2
    metric.update_state(LABELS, predictions)
    np.testing.assert_allclose(float(metric.result()), 3 / 5, rtol=1e-6)
    metric.update_state(LABELS[:1], predictions[:1])
    np.testing.assert_allclose(float(metric.result()), 5 / 8, rtol=1e-6)
    metric.reset_state()
    metric.update_state(LABELS, predictions, sample_weight=np.array([[1.0], [0.0]]))
    np.testing.assert_allclose(float(metric.result()), 2 / 3, rtol=1e-6)
    revived = MaskedTokenAccuracy.from_config(MaskedTokenAccuracy(pad_id=4, name="acc").get_config())
    assert (revived.pad_id, revived.name) == (4, "acc")
    with pytest.raises(ValueError, match="Received: pad_id='0'"):
        MaskedTokenAccuracy(pad_id="0")


def test_training_and_decoding_run_on_jax_without_tensorflow():
    code = (
        "import sys; sys.modules['tensorflow'] = None\n"
        "import numpy as np\n"
        "import keras_attn.training\n"
        "from keras_attn.models.transformer import build_transformer\n"
        "from keras_attn.models.transformer.decoding import TransformerTranslator\n"
        "model = build_transformer('transformer_base', vocabulary_size=9, hidden_dim=8,\n"
        "    intermediate_dim=8, num_heads=2, num_encoder_layers=1, num_decoder_layers=1)\n"
        "tokens, scores = TransformerTranslator(model, 1, 2, max_length=4).predict(\n"
        "    np.array([[3, 4, 5]], 'int32'), verbose=0)\n"
        "assert tokens.shape == (1, 4) and np.isfinite(scores).all()\n"
        "print('ok')\n"
    )
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=ROOT)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
