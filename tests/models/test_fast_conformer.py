"""The FastConformer option of ConformerCTC (`subsampling="fast"`): 8x
encoder frames, padding-safe rows, a training step, and what it refuses."""

import keras
import numpy as np
import pytest

from keras_attn.models.conformer import build_conformer
from keras_attn.models.conformer import get_conformer_config
from test_case import to_numpy

TINY = dict(vocabulary_size=5, subsampling="fast", subsampling_filters=4, hidden_dim=16,
            num_layers=1, num_heads=2, kernel_size=5, num_mel_bins=16, freq_mask_width=4,
            scale_input=True, batch_norm_epsilon=1e-5)


def test_waveform_model_emits_an_eighth_of_the_frames_and_pads_safely():
    model = build_conformer("conformer_tiny", **TINY)
    rng = np.random.default_rng(1)
    lengths = np.array([4000, 2400], "int32")  # 26 and 16 frames -> 4 and 2 logits
    waveform = rng.uniform(-0.5, 0.5, (2, 4000)).astype("float32")
    waveform[1, 2400:] = 9.0  # padding that must not reach row 1's logits
    outputs = model.predict_on_batch({"waveform": waveform, "waveform_length": lengths})
    assert to_numpy(outputs["logit_lengths"]).tolist() == [4, 2]
    assert tuple(outputs["logits"].shape) == (2, 4, 6)
    alone = model.predict_on_batch({"waveform": waveform[1:, :2400],
                                    "waveform_length": lengths[1:]})
    np.testing.assert_allclose(to_numpy(alone["logits"])[0],
                               to_numpy(outputs["logits"])[1, :2], atol=1e-4)


def test_a_training_step_on_features_is_finite():
    model = build_conformer("conformer_tiny", input_type="features", **TINY)
    # One step: eager where eager is fast (JAX compiles each op eagerly).
    model.compile(optimizer="adam", run_eagerly=keras.backend.backend() != "jax")
    rng = np.random.default_rng(2)
    x = {"features": rng.standard_normal((2, 40, 16)).astype("float32"),
         "feature_length": np.array([40, 33], "int32")}
    loss = model.train_on_batch(x, np.array([[1, 2, 3], [4, 0, 0]], "int32"))
    assert np.isfinite(loss)


def test_packing_is_refused_for_the_fast_subsampling():
    # Streaming is not (tests/models/test_conformer_streaming.py).
    assert get_conformer_config("conformer_tiny", subsampling="fast", chunk_size=4,
                                left_context=4, causal_conv=True,
                                feature_normalization="none").chunk_size == 4
    model = build_conformer("conformer_tiny", input_type="features", **TINY)
    features = np.zeros((1, 16, 16), "float32")
    with pytest.raises(ValueError, match="subsampling='fast'"):
        model({"features": features, "feature_length": np.array([16], "int32"),
               "segment_ids": np.ones((1, 16), "int32"),
               "positions": np.arange(16, dtype="int32")[None]})



# === Parakeet's front end and presets ===


def test_front_end_options_are_checked_when_a_config_is_made():
    with pytest.raises(ValueError, match="front_end='kaldi'"):
        get_conformer_config("conformer_tiny", front_end="kaldi")
    with pytest.raises(ValueError, match="preemphasis=0.97, front_end='log_mel'"):
        get_conformer_config("conformer_tiny", preemphasis=0.97)
    with pytest.raises(ValueError, match="feature_normalization='none', front_end='parakeet'"):
        get_conformer_config("parakeet_ctc_tiny", feature_normalization="none")
    with pytest.raises(ValueError, match="preemphasis=1.5"):
        get_conformer_config("parakeet_ctc_tiny", preemphasis=1.5)
    assert get_conformer_config("conformer_small").front_end == "log_mel"  # unchanged


@pytest.mark.presets
def test_parakeet_preset_shrunk_takes_waveforms_with_parakeets_frames():
    model = build_conformer("parakeet_ctc_tiny", vocabulary_size=5, num_layers=1,
                            hidden_dim=16, subsampling_filters=4)
    assert type(model.get_layer("log_mel")).__name__ == "ParakeetLogMelFeatures"
    rng = np.random.default_rng(4)
    waveform = rng.uniform(-0.5, 0.5, (2, 4000)).astype("float32")
    out = model.predict_on_batch({"waveform": waveform,
                                  "waveform_length": np.array([4000, 2400], "int32")})
    # 25 and 15 feature frames (L // 160, one fewer than LogMelFeatures') -> 4 and 2.
    assert to_numpy(out["logit_lengths"]).tolist() == [4, 2]
    assert np.isfinite(to_numpy(out["logits"])).all()


@pytest.mark.backend_independent  # a count, the same on every backend
def test_parakeet_tiny_counts_as_transformers_parakeet_for_ctc():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = get_conformer_config("parakeet_ctc_tiny", vocabulary_size=40)
    hf = transformers.ParakeetCTCConfig(vocab_size=41, pad_token_id=40, encoder_config=dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256,
        conv_kernel_size=9, subsampling_conv_channels=64, num_mel_bins=80))
    with torch.device("meta"):
        expected = sum(p.numel() for p in transformers.ParakeetForCTC(hf).parameters())
    model = build_conformer(config)
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    assert trainable == expected == 255_785


# The full-size presets built with shapes and no values (`_families.unallocated`).
_COUNT_PARAKEETS = """
import json, sys
import keras
import numpy as np
from keras_attn.models.conformer import build_conformer
counts = {}
for name in sys.argv[1:]:
    with keras.StatelessScope(initialize_variables=False):
        model = build_conformer(name, vocabulary_size=1024)
    counts[name] = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    keras.backend.clear_session()
print(json.dumps(counts))
"""


@pytest.mark.large
@pytest.mark.backend_independent  # a subprocess that sets its own backend
def test_parakeet_preset_parameter_counts():
    import json
    import os
    import subprocess
    import sys

    # transformers' ParakeetForCTC of nvidia/parakeet-ctc-0.6b's and -1.1b's
    # configs (1,024 tokens and the blank), counted on the meta device:
    # sum(p.numel() for p in model.parameters()).
    expected = {"parakeet_ctc_0_6b": 608_799_745, "parakeet_ctc_1_1b": 1_062_540_289}
    result = subprocess.run([sys.executable, "-c", _COUNT_PARAKEETS, *expected],
                            env={**os.environ, "KERAS_BACKEND": "jax"}, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == expected
