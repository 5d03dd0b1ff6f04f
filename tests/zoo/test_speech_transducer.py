"""The speech_transducer task (issue 71): its recipe trains, evaluates and
exports a ConformerTransducer through `keras-attn train`'s path; a Hugging
Face Parakeet TDT directory is fine-tuned on a `files:` table with the
table's characters (encoder and LSTM layers kept, embedding and joint head
new); streamed evaluation decodes what `decode` decodes; what it cannot do
is refused by name."""

import json

import numpy as np
import pytest

from _tiny import ROOT
from _tiny import tiny_overrides
from keras_attn.zoo.recipe import load_recipe
from keras_attn.zoo.tasks import make_task
from test_case import redraw_transducer
from test_speech_pretrained import PARAKEET
from test_speech_pretrained import ROWS
from test_speech_pretrained import clips

pytestmark = pytest.mark.tf_only

RECIPE = f"{ROOT}/models/conformer/conformer_tiny_digits_transducer.json"
TINY = tiny_overrides("conformer_tiny_digits") + ["decoder.predictor_dim=8"]
RUN = [o for o in TINY if not o.startswith(("data.", "model.", "decoder."))]


def test_the_recipe_trains_evaluates_and_exports_what_it_decodes(tmp_path):
    """Three steps of the tiny recipe: the loss is finite and the run is
    scored; then, its model redrawn (three steps decode little) and saved
    in the run: `keras-attn transcribe` gives a WAV file's `decode` text,
    and the task's SavedModel serves `decode`'s transcripts."""
    import keras
    import tensorflow as tf
    from scipy.io import wavfile

    from keras_attn import zoo
    from keras_attn.models.conformer import ConformerTransducer
    from keras_attn.zoo.transcribe import Transcriber
    from keras_attn.zoo.transcribe import transcribe

    run = tmp_path / "run"
    results = zoo.train(RECIPE, TINY, output=str(run), export=False, verbose=0)
    model = keras.saving.load_model(str(run / "model.keras"), compile=False)
    assert isinstance(model, ConformerTransducer) and model.predictor_dim == 8
    assert results["metric"] == "wer" and 0.0 <= results["value"]
    history = json.loads((run / "checkpoints" / "history.json").read_text())
    assert np.isfinite(history["loss"]).all()
    redraw_transducer(model, 1)
    model.save(str(run / "model.keras"))

    task = make_task(load_recipe(RECIPE, TINY))
    inputs = task.example_inputs()
    samples = inputs["waveform"][0, :int(inputs["waveform_length"][0])]
    wavfile.write(str(tmp_path / "clip.wav"), 16000, (samples * 32767).astype("int16"))
    clip = Transcriber(str(run)).load(str(tmp_path / "clip.wav"))  # as the file holds it
    ids = model.decode({"waveform": clip[None], "waveform_length": np.array([len(clip)])})
    text = transcribe(str(run), str(tmp_path / "clip.wav"))
    assert text == "".join(task.vocabulary[i - 1] for i in ids[0] if i > 0) and text

    expected = task.reference_outputs(model, inputs)["token_ids"]
    task.export(model, str(tmp_path / "served"))
    served = task.served_outputs(tf.saved_model.load(str(tmp_path / "served")), inputs)
    np.testing.assert_array_equal(served["token_ids"], expected)
    assert (expected > 0).sum() > 0


@pytest.fixture(scope="module")
def parakeet_tdt(tmp_path_factory):
    """A ParakeetForTDT directory of a tiny model (32 tokens); its model."""
    from keras_attn.convert import save_hf
    from keras_attn.models.conformer import build_conformer_transducer

    model = build_conformer_transducer("parakeet_ctc_tiny", vocabulary_size=32,
                                       predictor_dim=8, predictor_layers=2,
                                       durations=[0, 1, 2, 3], **PARAKEET)
    directory = tmp_path_factory.mktemp("parakeet_tdt")
    save_hf(model, str(directory))
    return directory, model


def _recipe(tmp_path, folder, *extra):
    with open(RECIPE, encoding="utf-8") as handle:
        data = json.load(handle)
    data["data"] = {"dataset": f"files:{folder}"}
    data.pop("$schema", None)
    data["decoder"] = {}
    path = tmp_path / "conformer_tiny_digits_transducer.json"
    path.write_text(json.dumps(data))
    return str(path), load_recipe(str(path), RUN + ["model.overrides={}"] + list(extra))


def test_a_parakeet_tdt_checkpoint_is_fine_tuned_with_the_tables_characters(tmp_path, capsys,
                                                                            parakeet_tdt):
    from keras_attn import zoo

    directory, checkpoint = parakeet_tdt
    folder = clips(tmp_path, ROWS)
    path, recipe = _recipe(tmp_path, folder, f"training.pretrained={directory}")
    task = make_task(recipe)
    model = task.build_model()
    assert task.vocabulary == tuple(" enosy")
    assert (model.durations, model.predictor_layers, model.predictor.vocabulary_size,
            model.joint.outputs) == ([0, 1, 2, 3], 2, 7, 7 + 4)
    theirs = {v.path: np.asarray(v) for v in checkpoint.weights}
    new = ("predictor/embedding/", "joint/head/")
    for variable in model.weights:
        if not variable.path.startswith(new):
            np.testing.assert_allclose(np.asarray(variable), theirs[variable.path], atol=1e-6,
                                       err_msg=variable.path)

    overrides = RUN + ["model.overrides={}", f"training.pretrained={directory}",
                       "training.epochs=2", "training.steps_per_epoch=2",
                       "training.optimizer.learning_rate=0.003",
                       "training.schedule={\"name\": \"constant\"}"]
    capsys.readouterr()
    zoo.train(path, overrides, output=str(tmp_path / "run"), export=False, verbose=0)
    log = capsys.readouterr().out
    assert f"the encoder of the Hugging Face ParakeetForRNNT or ParakeetForTDT {directory}" in log
    assert "its prediction network with a new embedding and joint head of 7 outputs" in log
    history = json.loads((tmp_path / "run" / "checkpoints" / "history.json").read_text())
    assert history["loss"][-1] < history["loss"][0], history["loss"]


@pytest.mark.parametrize("extra, message", [
    (["decoder.predictor_dim=16"], r"^Recipe key `decoder` cannot be set with "
                                   r"training\.pretrained"),
    (["model.overrides.hidden_dim=32"], r"^Recipe key `model\.overrides\.hidden_dim` cannot "
                                        r"be set with training\.pretrained"),
])
def test_a_recipe_that_contradicts_the_checkpoint_is_refused(tmp_path, extra, message,
                                                            parakeet_tdt):
    directory, _ = parakeet_tdt
    _, recipe = _recipe(tmp_path, clips(tmp_path, ROWS[:2]), f"training.pretrained={directory}",
                        *extra)
    with pytest.raises(ValueError, match=message):
        make_task(recipe).build_model()


def test_a_ctc_checkpoint_is_not_a_transducer(tmp_path):
    from test_speech_pretrained import parakeet_directory

    directory, _ = parakeet_directory(tmp_path)
    _, recipe = _recipe(tmp_path, clips(tmp_path, ROWS[:2]), f"training.pretrained={directory}")
    with pytest.raises(ValueError, match=r"names a Hugging Face directory of "
                                         r"\['ParakeetForCTC'\]; the speech_transducer task "
                                         r"fine-tunes a ParakeetForRNNT or ParakeetForTDT"):
        make_task(recipe).prepare()


def test_streamed_evaluation_decodes_what_decode_decodes(tmp_path):
    """`evaluation.streaming_chunk_sizes`: the task's streamed decoder (the
    model's stream_step over pieces of one attention chunk) against the
    model's offline `decode` with the same chunk mask."""
    streaming = ["model.overrides.chunk_size=2", "model.overrides.left_context=4",
                 "model.overrides.causal_conv=true",
                 "model.overrides.feature_normalization=\"none\"",
                 "evaluation.streaming_chunk_sizes=[2]"]
    task = make_task(load_recipe(RECIPE, TINY + streaming))
    model = redraw_transducer(task.build_model(), 1)
    inputs = task.example_inputs()
    expected = model.decode(inputs)
    streamed = task._streamed_decoder(model, 2)(inputs)
    assert [row[row > 0].tolist() for row in streamed] == \
        [row[row > 0].tolist() for row in expected]
    assert (expected > 0).sum() > 0
    task.check_export_format("onnx")
    beam = make_task(load_recipe(RECIPE, TINY + ["evaluation.strategy=\"beam_search\""]))
    with pytest.raises(ValueError, match=r"walks greedily.*'beam_search'"):
        beam.check_export_format("litert")


def test_a_clip_too_short_for_ctc_trains_a_transducer(tmp_path):
    """CTC needs a frame per label (and one between two equal ones); a
    transducer emits any number of labels at a frame, so its data checks
    (the files' and the training batches') ask for one frame only: a
    0.15 s clip of "yes no yes no" (3 encoder frames) is refused by the
    CTC task and trains the transducer; a clip of no frame is refused."""
    import keras

    from keras_attn.data.checks import check_batches
    from keras_attn.errors import DataFileError
    from test_speech_pretrained import recipe as ctc_recipe

    rows = [(f"{i}.wav", text) for i, text in enumerate(["yes no yes no", "no", "yes", "no"])]
    folder = clips(tmp_path, rows, samples={"0.wav": 2400, "1.wav": 8000, "2.wav": 8000,
                                            "3.wav": 8000})
    with pytest.raises(DataFileError, match=r"0\.wav is too short for its transcript"):
        make_task(ctc_recipe(tmp_path, folder)).prepare()
    task = make_task(_recipe(tmp_path, folder, "model.overrides.num_layers=1",
                             "model.overrides.hidden_dim=16")[1])
    model = task.build_model()
    batches = list(check_batches(task.train_dataset_fn(0), model))
    assert sum(len(y) for _, y in batches) == len(rows)
    model.compile(keras.optimizers.Adam(1e-3))
    assert np.isfinite(model.fit(task.train_dataset_fn(0), epochs=1, verbose=0)
                       .history["loss"][-1])
    (tmp_path / "short").mkdir()
    short = clips(tmp_path / "short", rows[:2], samples={"0.wav": 8000, "1.wav": 100})
    with pytest.raises(DataFileError, match=r"1\.wav is too short for the model.*a transducer "
                                            r"needs one"):
        make_task(_recipe(tmp_path, short)[1]).prepare()

