"""ConformerTransducer: training moves the RNN-T and TDT losses, a
`.keras` round trip keeps the frames and the transcripts, a row's
transcript does not depend on its batch, and bad labels and options are
refused by name."""

import keras
import numpy as np
import pytest

from keras_attn.models.conformer import build_conformer_transducer
from test_case import to_numpy

LABELS = np.array([[1, 2, 3, 0], [4, 4, 0, 0], [5, 1, 2, 3], [2, 0, 0, 0]])


def _inputs():
    rng = np.random.default_rng(0)
    return {"features": rng.normal(size=(4, 64, 40)).astype("float32"),
            "feature_length": np.array([64, 64, 48, 40])}


def _model(durations=None):
    keras.utils.set_random_seed(0)
    return build_conformer_transducer(
        "conformer_tiny", vocabulary_size=5, input_type="features", predictor_dim=16,
        durations=durations, dropout=0.0, freq_mask_count=0, time_mask_count=0)


@pytest.mark.parametrize("durations", [None, [0, 1, 2]])
def test_fit_moves_the_loss_and_a_keras_file_keeps_the_model(durations, tmp_path):
    model = _model(durations)
    assert model.joint.outputs == 6 + len(durations or ())
    model.compile(keras.optimizers.Adam(1e-2))
    history = model.fit(_inputs(), LABELS, epochs=20, batch_size=4, verbose=0).history["loss"]
    assert history[-1] < 0.5 * history[0], history
    path = str(tmp_path / "transducer.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.durations == durations and loaded.predictor_dim == 16
    np.testing.assert_allclose(to_numpy(loaded(_inputs())["frames"]),
                               to_numpy(model(_inputs())["frames"]), atol=1e-6)
    np.testing.assert_array_equal(loaded.decode(_inputs()), model.decode(_inputs()))


def test_a_row_decodes_alone_as_in_its_batch():
    model = _model([0, 1, 2])
    # Weights drawn away from their start so that labels get emitted.
    rng = np.random.default_rng(1)
    for weight in model.joint.weights + model.predictor.weights:
        weight.assign(rng.normal(0, 0.5, weight.shape).astype("float32"))
    inputs = _inputs()
    batch = model.decode(inputs)
    assert (batch > 0).sum() >= 4  # labels, not only blanks
    beam = model.decode(inputs, strategy="beam_search", beam_width=3)
    assert beam.shape[0] == 4 and ((beam > 0) | (beam == -1)).all()
    for row in range(4):
        one = {k: v[row:row + 1] for k, v in inputs.items()}
        for ours, theirs in ((model.decode(one), batch),
                             (model.decode(one, strategy="beam_search", beam_width=3), beam)):
            width = ours.shape[1]
            np.testing.assert_array_equal(ours[0], theirs[row, :width])
            assert (theirs[row, width:] == -1).all()


def test_bad_labels_and_options_are_refused():
    model = _model()
    model.compile(keras.optimizers.Adam(1e-3))
    with pytest.raises(ValueError, match=r"labels.*0 inside row\(s\) \[1\]"):
        model.fit(_inputs(), np.array([[1, 2, 0, 0], [4, 0, 4, 0], [1, 0, 0, 0],
                                       [2, 0, 0, 0]]), epochs=1, verbose=0)
    with pytest.raises(ValueError, match="labels"):
        model.fit(_inputs(), LABELS + 1, epochs=1, verbose=0)  # 6 is past V = 5
    with pytest.raises(ValueError, match=r"`strategy`.*Received: strategy='beam'"):
        model.decode(_inputs(), strategy="beam")
    with pytest.raises(ValueError, match=r"`chunk_size`.*Received: a model with chunk_size=None"):
        model.initial_state(1)  # an offline model does not stream
    with pytest.raises(ValueError, match=r"`durations`.*Received: \[0\]"):
        build_conformer_transducer("conformer_tiny", vocabulary_size=5, durations=[0])
    with pytest.raises(ValueError, match="predictor_dim"):
        build_conformer_transducer("conformer_tiny", vocabulary_size=5, predictor_dim=0)


def test_with_vocabulary_keeps_everything_but_the_vocabulary_layers():
    model = _model([0, 1, 2])
    keras.utils.set_random_seed(5)
    mine = model.with_vocabulary(8, dropout=0.1)
    assert (mine.vocabulary_size, mine.joint.outputs, mine.durations) == (8, 9 + 3, [0, 1, 2])
    assert mine.conformer_config.dropout == 0.1 and mine.predictor_dim == 16
    fresh = ("predictor/embedding/", "joint/head/")
    old = {w.path: to_numpy(w) for w in model.weights}
    for weight in mine.weights:
        if not weight.path.startswith(fresh):
            np.testing.assert_array_equal(to_numpy(weight), old[weight.path])
    assert tuple(mine.get_layer("encoder_projector").kernel.shape) == (64, 16)  # hidden_dim 64
    np.testing.assert_allclose(to_numpy(mine(_inputs())["frames"]),
                               to_numpy(model(_inputs())["frames"]), atol=1e-6)
    mine.compile(keras.optimizers.Adam(1e-3))  # trains on labels 1..8
    mine.fit(_inputs(), np.minimum(LABELS + 3, 8) * (LABELS > 0), epochs=1, verbose=0)
    with pytest.raises(ValueError, match=r"only dropout.*Received: hidden_dim=8"):
        model.with_vocabulary(8, hidden_dim=8)
