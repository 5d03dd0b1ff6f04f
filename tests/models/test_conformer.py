import dataclasses
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_attn.layers import subsampled_length
from keras_attn.models.conformer import CONFORMER_PRESETS
from keras_attn.models.conformer import build_conformer
from keras_attn.models.conformer.conformer_model import encoder_length
from _families import FAMILIES
from _families import with_value
from test_case import run_model_test
from test_case import to_numpy

TINY = dict(num_layers=1, hidden_dim=16, num_heads=2, kernel_size=5, num_mel_bins=20,
            freq_mask_width=4)


def batch(lengths, seed=0):
    rng = np.random.default_rng(seed)
    wave = np.zeros((len(lengths), max(lengths)), "float32")
    for i, n in enumerate(lengths):
        wave[i, :n] = rng.standard_normal(n) * 0.1
    return {"waveform": wave, "waveform_length": np.asarray(lengths, "int32")}


def test_the_tiny_model_passes_the_model_harness(tmp_path):
    family = FAMILIES["conformer"]
    # One block: every check here is of the model as a whole (config, file,
    # batching, mixed precision, a fit step, refusals), and each of the 8
    # builds and the compiled fit step cost a block's graph each. Padding
    # through two blocks is checked by tests/models/test_batching.py
    # (test_conformer_training_outputs_ignore_padding: noise in the padding).
    overrides = dict(dropout=0.0, freq_mask_count=0, time_mask_count=0, kernel_size=5,
                     layer_norm_epsilon=1e-4, num_layers=1)
    vocabulary = family.config(**overrides).vocabulary_size
    x, y = family.batch(size=3, **overrides)
    longest = int(x["waveform"].shape[1])
    too_large, zero_inside = y.copy(), y.copy()
    too_large[0, 0] = vocabulary + 1
    zero_inside[1, :3] = [1, 0, 2]
    run_model_test(
        lambda: family.build(**overrides), x, y, crop=family.crop, tmp_path=tmp_path,
        bad_inputs=[
            (with_value(x, "waveform_length", 0, -1), rf"`waveform_length` must lie in \[0, {longest + 1}\).*-1"),
            (with_value(x, "waveform_length", 0, longest + 1),
             rf"`waveform_length` must lie in \[0, {longest + 1}\).*{longest + 1}"),
            ({"waveform": x["waveform"][:, :0], "waveform_length": 0 * x["waveform_length"]},
             "has length 0"),
        ],
        bad_labels=[
            (too_large, rf"`labels` must lie in \[0, {vocabulary + 1}\).*{vocabulary + 1}"),
            (zero_inside, r"`labels` must be each transcript's ids followed by 0s.*row\(s\) \[1\], "
                          r"e\.g\. \[1, 0, 2"),
        ],
        expected_config=dataclasses.asdict(family.config(**overrides)),
        more_batches=[family.inputs(size=3, fill="zeros", **overrides)],
        # BatchNorm normalises with the batch's statistics in training: batch
        # mates matter there by design (the padding must not:
        # tests/models/test_batching.py).
        training_modes=(False,),
    )


@pytest.mark.presets
@pytest.mark.parametrize("name", sorted(CONFORMER_PRESETS))
def test_every_preset_shrunk_builds_and_runs(name):
    config = CONFORMER_PRESETS[name]
    model = build_conformer(name, vocabulary_size=5, num_layers=1,
                            hidden_dim=config.num_heads * 4, subsampling_filters=4)
    out = model(batch([4000, 3000]))
    # The front end's frames (Parakeet's: one fewer), then the 4x or 8x subsampling.
    frames = model.get_layer("log_mel").num_frames(4000)
    assert out["logits"].shape == (2, encoder_length(model.conformer_config, frames), 6)
    assert np.isfinite(to_numpy(out["logits"])).all()


# Each full-size encoder built with its variables' shapes and no values (as
# `_families.unallocated`), without its CTC head.
_COUNT_ENCODERS = """
import json, sys
import keras
from keras_attn.models.conformer import build_conformer
counts = {}
for name in sys.argv[1:]:
    with keras.StatelessScope(initialize_variables=False):
        model = build_conformer(name, vocabulary_size=28)
    counts[name] = model.count_params() - model.get_layer("ctc_logits").count_params()
    keras.backend.clear_session()
print(json.dumps(counts))
"""


@pytest.mark.large
@pytest.mark.backend_independent  # a subprocess that sets its own backend
def test_encoder_parameter_counts():
    # Encoder without the CTC head (BatchNorm moving statistics included).
    # Gulati et al. (2020) Table 1 report 10.3M / 30.7M / 118.8M for S / M / L
    # with a one-layer LSTM decoder, which this CTC model does not have.
    expected = {"conformer_small": 8_697_024, "conformer_medium": 27_274_240,
                "conformer_large": 114_875_392}
    # Counted on JAX (a count is the same on every backend): building the 49
    # blocks symbolically takes TensorFlow's graph 2.4x the CPU time of JAX's
    # tracing (26 s vs 11 s, the process's start included).
    result = subprocess.run([sys.executable, "-c", _COUNT_ENCODERS, *expected],
                            env={**os.environ, "KERAS_BACKEND": "jax"}, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == expected


def test_logit_lengths_are_exact():
    model = build_conformer(TINY, vocabulary_size=5)
    lengths = [8000, 5123, 1200]
    out = model(batch(lengths))
    want = [subsampled_length(1 + n // 160) for n in lengths]
    assert to_numpy(out["logit_lengths"]).tolist() == want
    assert out["logits"].shape[1] == max(want)


@pytest.mark.slow
def test_fit_lowers_the_ctc_loss():
    model = build_conformer(TINY, vocabulary_size=6, dropout=0.0, time_mask_count=0,
                            freq_mask_count=0)
    model.compile(optimizer=keras.optimizers.Adam(3e-3))
    data = batch([6000, 4000, 5000, 3000])
    labels = np.array([[1, 2, 3], [4, 5, 0], [6, 0, 0], [2, 2, 0]], "int32")
    history = model.fit(data, labels, epochs=8, batch_size=4, verbose=0)
    losses = history.history["loss"]
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.7 * losses[0]


def _greedy_reference(logits, length):
    best = logits[:length].argmax(-1)
    out, previous = [], None
    for token in best:
        if token != previous and token != 0:
            out.append(int(token))
        previous = token
    return out


def test_greedy_decode_collapses_repeats_and_drops_blanks():
    model = build_conformer(TINY, vocabulary_size=4)
    # Bias the head so decoding produces tokens instead of only blanks.
    head = model.get_layer("ctc_logits")
    kernel, bias = (to_numpy(w) for w in head.weights)
    head.set_weights([kernel * 20, bias])
    data = batch([6000, 3500])
    out = model(data)
    decoded = to_numpy(model.decode(data))
    logits, lengths = to_numpy(out["logits"]), to_numpy(out["logit_lengths"])
    for i in range(2):
        want = _greedy_reference(logits[i], lengths[i])
        got = [int(t) for t in decoded[i] if t >= 0]
        assert got == want
    assert any(_greedy_reference(logits[i], lengths[i]) for i in range(2))


def test_beam_search_decode_runs():
    model = build_conformer(TINY, vocabulary_size=4)
    decoded = to_numpy(model.decode(batch([4000, 2000]), strategy="beam_search", beam_width=4))
    assert decoded.shape[0] == 2


def test_decode_refuses_lengths_past_the_waveform_before_its_compiled_step():
    model = build_conformer(TINY, vocabulary_size=4)
    data = batch([4000, 2000])
    data["waveform_length"] = np.array([4000, 4001], "int32")
    with pytest.raises(ValueError, match="waveform_length.*4001"):
        model.decode(data)


def test_audio_outside_unit_range_is_refused_naming_the_sample():
    """16-bit PCM given as floats (x 32768): a call, `predict` and `decode`
    name the sample where Python runs; padding may hold anything."""
    model = build_conformer(TINY, vocabulary_size=4)
    data = batch([4000, 2000])
    data["waveform"][1, 3000] = 7.0  # padding: read by nothing
    reference = to_numpy(model(data)["logits"])
    data["waveform"][1, 5] *= 32768.0
    for run in (model, model.predict, model.decode):
        with pytest.raises(ValueError, match=r"`waveform`.*\[-1, 1\].*waveform\[1, 5\]"):
            run(data)
    data["waveform"][1, 5] = np.nan
    with pytest.raises(ValueError, match="`waveform`.*finite.*row\\(s\\) \\[1\\]"):
        model(data)
    assert np.isfinite(reference).all()


def test_spec_augment_only_in_training():
    model = build_conformer(TINY, vocabulary_size=3, dropout=0.0)
    data = batch([5000, 5000])
    a = to_numpy(model(data, training=False)["logits"])
    b = to_numpy(model(data, training=False)["logits"])
    np.testing.assert_array_equal(a, b)


def test_unknown_preset():
    with pytest.raises(ValueError, match=r"Unknown Conformer preset 'conformer_xl'"):
        build_conformer("conformer_xl", vocabulary_size=5)


def test_unknown_override():
    with pytest.raises(ValueError, match=r"Unknown Conformer config field 'hidden_size'"):
        build_conformer("conformer_tiny", vocabulary_size=5, hidden_size=8)


def test_vocabulary_size_is_required():
    # The task's, not the preset's: no default to fall back on silently.
    with pytest.raises(ValueError, match=r"`vocabulary_size` must be a positive integer.*"
                                         r"Received: vocabulary_size=None"):
        build_conformer("conformer_tiny")


@pytest.mark.parametrize("size", [0, 2.5])
def test_bad_vocabulary_size(size):
    with pytest.raises(ValueError, match=rf"Received: vocabulary_size={size}"):
        build_conformer("conformer_tiny", vocabulary_size=size)


def test_feature_inputs_match_the_waveform_model():
    """input_type="features" is the same network after the front end."""
    from keras_attn.layers import LogMelFeatures

    on_audio = build_conformer(TINY, vocabulary_size=5)
    on_features = build_conformer(TINY, vocabulary_size=5, input_type="features")
    on_features.set_weights(on_audio.get_weights())
    data = batch([6000, 4100])
    frontend = LogMelFeatures(num_mel_bins=20)
    features = frontend(data["waveform"], data["waveform_length"])
    frames = 1 + data["waveform_length"] // 160
    want = on_audio(data)
    got = on_features({"features": to_numpy(features), "feature_length": frames.astype("int32")})
    np.testing.assert_allclose(to_numpy(got["logits"]), to_numpy(want["logits"]), atol=1e-5)
    assert to_numpy(got["logit_lengths"]).tolist() == to_numpy(want["logit_lengths"]).tolist()


def test_unknown_input_type():
    with pytest.raises(ValueError, match=r"Received: input_type='spectrogram'"):
        build_conformer(TINY, vocabulary_size=5, input_type="spectrogram")


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("num_layers", 0, "argument `num_layers`: it must be a positive integer. Received: num_layers=0"),
        ("dropout", 1.5, r"argument `dropout`: it must be a number in \[0, 1\). Received: dropout=1.5"),
        ("attention_dropout", -0.1, r"Received: attention_dropout=-0.1"),
        ("kernel_size", 0, "Received: kernel_size=0"),
        ("time_mask_count", -1, "Received: time_mask_count=-1"),
        ("num_heads", 3, "Received: hidden_dim=64, num_heads=3"),
    ],
)
def test_bad_config_fields_are_the_packages_value_errors(field, value, message):
    with pytest.raises(ValueError, match=message):
        build_conformer("conformer_tiny", vocabulary_size=5, **{field: value})


def test_greedy_ids_in_ops_equal_ctc_decode():
    """`ctc_greedy_ids` (the exportable greedy decoder) gives keras.ops.ctc_decode's
    tokens: repeats merged, blanks dropped, frames past the length ignored;
    NaN logits give -2 rows."""
    from keras_attn.models.conformer.conformer_model import ctc_greedy_ids

    rng = np.random.default_rng(3)
    logits = rng.normal(size=(4, 9, 5)).astype("float32")
    logits[1, :, 0] += 1.0  # many blanks
    logits[2, 2:5, 3] += 9.0  # a repeat
    lengths = np.array([9, 6, 9, 1], "int32")
    decoded, _ = keras.ops.ctc_decode(logits, lengths, strategy="greedy", mask_index=0)
    expected = [[t for t in row if t >= 0] for row in to_numpy(decoded[0]).tolist()]
    got = to_numpy(ctc_greedy_ids(logits, lengths))
    assert got.shape == (4, 9)
    assert [[t for t in row if t >= 0] for row in got.tolist()] == expected
    assert all(row[len(want):].tolist() == [-1] * (9 - len(want)) for row, want in zip(got, expected))
    logits[3, 0, 0] = np.nan
    assert to_numpy(ctc_greedy_ids(logits, lengths))[3].tolist() == [-2] * 9


def _utterance_losses(model, data, labels):
    """Each utterance's CTC loss alone (inference: no row affects another)."""
    losses = []
    for i in range(len(labels)):
        row = {name: value[i:i + 1] for name, value in data.items()}
        out = model(row, training=False)
        losses.append(float(to_numpy(model.compute_loss(row, labels[i:i + 1], out))))
    return np.array(losses)


def test_the_ctc_loss_is_the_sample_weighted_mean_over_utterances():
    model = build_conformer(TINY, vocabulary_size=6)
    data = batch([6000, 4000, 5000])
    labels = np.array([[1, 2, 3], [4, 5, 0], [6, 0, 0]], "int32")
    alone = _utterance_losses(model, data, labels)
    out = model(data, training=False)
    np.testing.assert_allclose(to_numpy(model.compute_loss(data, labels, out)), alone.mean(),
                               rtol=1e-5)
    # A weight of 0 leaves an utterance out (the filler rows of several
    # replicas, keras_attn.zoo.tasks.base.even_batches); others weigh as given.
    for weights in ([1.0, 1.0, 0.0], [2.0, 1.0, 0.5], [[0.0], [3.0], [1.0]]):
        w = np.asarray(weights, "float32").reshape(-1)
        found = to_numpy(model.compute_loss(data, labels, out, np.asarray(weights, "float32")))
        np.testing.assert_allclose(found, np.sum(w * alone) / np.sum(w), rtol=1e-5,
                                   err_msg=str(weights))


def test_a_sample_weight_of_another_shape_is_refused():
    model = build_conformer(TINY, vocabulary_size=6)
    data = batch([6000, 4000, 5000])
    labels = np.array([[1, 2, 3], [4, 5, 0], [6, 0, 0]], "int32")
    out = model(data, training=False)
    for weights in (np.ones((3, 2), "float32"), np.ones((2,), "float32")):
        with pytest.raises(ValueError, match=r"`sample_weight` of ConformerCTC must hold one "
                           rf"weight per utterance .*B=3 rows. Received: sample_weight of "
                           rf"shape \({weights.shape[0]},"):
            model.compute_loss(data, labels, out, weights)
