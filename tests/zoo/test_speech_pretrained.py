"""speech_ctc's `training.pretrained`: a Hugging Face ParakeetForCTC
directory (a tiny one the test saves) fine-tuned on a `files:` table with the
table's characters: the model built has the checkpoint's encoder under a new
head, the clips are checked at the checkpoint's 8x frames, the run's log says
the head is new; a model section that contradicts the checkpoint and a
directory that holds none are refused by name."""

import json

import numpy as np
import pytest

from _tiny import recipe_path
from _tiny import tiny_overrides
from keras_attn.zoo.recipe import load_recipe
from keras_attn.zoo.tasks import make_task

pytestmark = pytest.mark.tf_only

# One small block of Parakeet's design (fast 8x subsampling, its front end).
PARAKEET = dict(num_layers=1, hidden_dim=16, num_heads=2, subsampling_filters=4,
                num_mel_bins=16, freq_mask_width=4)
# The tiny recipe's run keys, without its model overrides (the checkpoint's).
RUN = [o for o in tiny_overrides("conformer_tiny_digits")
       if not o.startswith(("data.", "model."))]


def parakeet_directory(tmp_path):
    """A ParakeetForCTC directory (32 tokens) of a tiny model; its model."""
    from keras_attn.convert import save_hf
    from keras_attn.models.conformer import build_conformer

    model = build_conformer("parakeet_ctc_tiny", vocabulary_size=32, **PARAKEET)
    directory = tmp_path / "parakeet"
    save_hf(model, str(directory))
    return directory, model


def clips(tmp_path, rows, samples=8000):
    """A files: folder of noise WAVs at 16 kHz: (file, text) rows."""
    from scipy.io import wavfile

    folder = tmp_path / "clips"
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    for name, _ in rows:
        count = samples[name] if isinstance(samples, dict) else samples
        wavfile.write(str(folder / name), 16000,
                      (rng.normal(0, 0.1, count) * 32767).astype("int16"))
    for split, split_rows in (("train", rows), ("test", rows[:2])):
        (folder / f"{split}.jsonl").write_text("".join(
            json.dumps({"audio": name, "text": text}) + "\n" for name, text in split_rows))
    return folder


def recipe(tmp_path, folder, *extra):
    with open(recipe_path("conformer_tiny_digits"), encoding="utf-8") as handle:
        data = json.load(handle)
    data["data"] = {"dataset": f"files:{folder}"}
    for key in ("expected", "$schema"):
        data.pop(key, None)
    path = tmp_path / "conformer_tiny_digits.json"
    path.write_text(json.dumps(data))
    return load_recipe(str(path), RUN + ["model.overrides={}"] + list(extra))


ROWS = [(f"{i}.wav", text) for i, text in enumerate(["yes", "no", "yes no", "no"] * 2)]


def test_a_parakeet_checkpoint_is_fine_tuned_with_the_tables_characters(tmp_path, capsys):
    from keras_attn import zoo

    directory, checkpoint = parakeet_directory(tmp_path)
    folder = clips(tmp_path, ROWS)
    # Left out of a resolved recipe while null: the task's earlier runs resume.
    assert "pretrained" not in recipe(tmp_path, folder)["training"]
    task = make_task(recipe(tmp_path, folder, f"training.pretrained={directory}",
                            "model.overrides.dropout=0.0"))
    model = task.build_model()
    assert task.vocabulary == tuple(" enosy")
    config = model.conformer_config
    assert (config.vocabulary_size, config.subsampling, config.front_end, config.input_type,
            config.dropout) == (6, "fast", "parakeet", "waveform", 0.0)
    assert tuple(model.get_layer("ctc_logits").kernel.shape) == (16, 7)  # 6 characters + blank
    theirs = {v.path: np.asarray(v) for v in checkpoint.weights}
    ours = {v.path: np.asarray(v) for v in model.weights}
    assert set(ours) == set(theirs)
    for path, value in ours.items():
        if not path.startswith("ctc_logits/"):
            np.testing.assert_allclose(value, theirs[path], atol=1e-6, err_msg=path)

    # Two short epochs through `keras-attn train`'s path: the log says the
    # head is new, and the loss goes down from the checkpoint's encoder.
    overrides = RUN + ["model.overrides={}", f"training.pretrained={directory}",
                       "training.epochs=2", "training.steps_per_epoch=2",
                       "training.optimizer.learning_rate=0.003",
                       "training.schedule={\"name\": \"constant\"}"]
    capsys.readouterr()
    zoo.train(str(tmp_path / "conformer_tiny_digits.json"), overrides,
              output=str(tmp_path / "run"), export=False, verbose=0)
    log = capsys.readouterr().out
    assert f"the encoder of the Hugging Face ParakeetForCTC {directory}" in log
    assert "a new CTC head of 7 outputs" in log
    history = json.loads((tmp_path / "run" / "checkpoints" / "history.json").read_text())
    assert history["loss"][-1] < history["loss"][0], history["loss"]


def test_the_clips_are_checked_at_the_checkpoints_8x_frames(tmp_path):
    from keras_attn.errors import DataFileError

    directory, _ = parakeet_directory(tmp_path)
    # 2,400 samples: 3 CTC frames after the recipe's 4x, 2 after Parakeet's 8x;
    # "yes" needs 3.
    folder = clips(tmp_path, ROWS, samples={name: 2400 if name == "0.wav" else 8000
                                            for name, _ in ROWS})
    assert make_task(recipe(tmp_path, folder)).prepare().vocabulary == tuple(" enosy")
    task = make_task(recipe(tmp_path, folder, f"training.pretrained={directory}"))
    with pytest.raises(DataFileError, match=r"0\.wav is too short for its transcript.*2 CTC "
                                            r"frame\(s\) .*8x subsampling"):
        task.prepare()


@pytest.mark.parametrize("extra, message", [
    (["model.overrides.hidden_dim=32"],
     r"^Recipe key `model\.overrides\.hidden_dim` cannot be set with training\.pretrained.*"
     r"Received: model\.overrides\.hidden_dim=32$"),
    (["model.overrides.input_type=\"features\""],
     r"^Recipe key `model\.overrides\.input_type` cannot be set"),
    (["data.packing=true"], r"^Recipe key `data\.packing` cannot be true with this "
                            r"training\.pretrained"),
])
def test_a_model_section_that_contradicts_the_checkpoint_is_refused(tmp_path, extra, message):
    directory, _ = parakeet_directory(tmp_path)
    folder = clips(tmp_path, ROWS[:2])
    task = make_task(recipe(tmp_path, folder, f"training.pretrained={directory}", *extra))
    with pytest.raises(ValueError, match=message):
        task.prepare()


@pytest.mark.parametrize("name, message", [
    ("nothing_here", r"must be a finished run directory of the speech_ctc task .* or a "
                     r"Hugging Face ParakeetForCTC directory"),
    ("bert", r"names a Hugging Face directory of \['BertModel'\]"),
    ("text_run", r"names a run of the 'text_classification' task"),
])
def test_a_pretrained_directory_that_holds_no_speech_model_is_refused(tmp_path, name, message):
    (tmp_path / "nothing_here").mkdir()
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    (tmp_path / "bert" / "model.safetensors").write_text("")
    (tmp_path / "text_run").mkdir()
    (tmp_path / "text_run" / "model.keras").write_text("")
    (tmp_path / "text_run" / "recipe.json").write_text(
        json.dumps({"task": "text_classification"}))
    path = tmp_path / name
    task = make_task(recipe(tmp_path, clips(tmp_path, ROWS[:2]), f"training.pretrained={path}"))
    with pytest.raises(ValueError, match=message) as error:
        task.prepare()
    assert str(error.value).startswith("Recipe key `training.pretrained`")
    assert str(error.value).endswith(f"Received: training.pretrained={str(path)!r}")


def test_a_finished_speech_ctc_run_brings_its_encoder(tmp_path):
    # The run's model.keras says its config (the recipe's model section
    # would not, for a run fine-tuned from a checkpoint): here a features
    # Conformer of 4x, trained on 10 labels.
    from keras_attn.models.conformer import build_conformer

    run = tmp_path / "digits_run"
    run.mkdir()
    trained = build_conformer("conformer_tiny", vocabulary_size=10, num_layers=1, hidden_dim=16,
                              num_heads=2, kernel_size=5, input_type="features")
    trained.save(str(run / "model.keras"))
    (run / "recipe.json").write_text(json.dumps({"task": "speech_ctc"}))
    task = make_task(recipe(tmp_path, clips(tmp_path, ROWS), f"training.pretrained={run}"))
    model = task.build_model()
    config = model.conformer_config
    assert (config.vocabulary_size, config.input_type, config.hidden_dim, config.subsampling) \
        == (6, "waveform", 16, "conv")
    theirs = {v.path: np.asarray(v) for v in trained.weights}
    for variable in model.weights:
        if not variable.path.startswith("ctc_logits/"):
            np.testing.assert_array_equal(np.asarray(variable), theirs[variable.path])
    assert "speech_ctc run" in task.model_note()
