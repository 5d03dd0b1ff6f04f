import numpy as np
import pytest

from keras_attn.export import export_speech_recognizer
from keras_attn.models.conformer import build_conformer
from test_case import to_numpy

pytestmark = [pytest.mark.large, pytest.mark.tf_only]


def _model():
    model = build_conformer("conformer_tiny", vocabulary_size=5, num_layers=1, hidden_dim=16,
                            num_mel_bins=20, freq_mask_width=8)
    head = model.get_layer("ctc_logits")
    kernel, bias = (to_numpy(w) for w in head.weights)
    head.set_weights([kernel * 20, bias])  # so that decoding emits tokens
    return model


@pytest.mark.parametrize("strategy", ["greedy", "beam_search"])
def test_saved_model_decodes_like_the_model(tmp_path, strategy):
    import tensorflow as tf

    model = _model()
    path = export_speech_recognizer(model, tmp_path / "asr", strategy=strategy, beam_width=4)
    loaded = tf.saved_model.load(str(path))
    rng = np.random.default_rng(0)
    for lengths in ([9000], [9000, 4000, 6500]):
        wave = np.zeros((len(lengths), max(lengths)), "float32")
        for i, n in enumerate(lengths):
            wave[i, :n] = rng.standard_normal(n) * 0.1
        lengths = np.asarray(lengths, "int32")
        want = to_numpy(model.decode({"waveform": wave, "waveform_length": lengths},
                                     strategy=strategy, beam_width=4))
        got = loaded.serve(wave, lengths)["token_ids"].numpy()
        np.testing.assert_array_equal(got, want)
        assert (got >= 0).any()
        # TensorFlow Serving's signature answers by name ("output_0" before).
        served = loaded.signatures["serving_default"](waveform=wave, waveform_length=lengths)
        np.testing.assert_array_equal(served["token_ids"].numpy(), want)
    # Where nothing raises, a row of 16-bit PCM given as floats is all -2,
    # never an empty transcript (-1s); its batch mates as before.
    wave[-1, 5] = 3000.0
    got = loaded.serve(wave, lengths)["token_ids"].numpy()
    assert (got[-1] == -2).all()
    np.testing.assert_array_equal(got[:-1], want[:-1])


def test_unknown_strategy(tmp_path):
    with pytest.raises(ValueError, match=r"Received: strategy='sampling'"):
        export_speech_recognizer(_model(), tmp_path / "x", strategy="sampling")
