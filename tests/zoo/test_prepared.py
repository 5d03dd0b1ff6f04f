"""Prepared data (`keras-attn prepare`, `train --data`): a recipe's batches
made once with TensorFlow, trained from where TensorFlow is not installed
(issue 23, part 3). The batches are the tf.data pipelines' own, a run from
them is the run from tf.data and resumes exactly, and bad prepared data is
refused before the first step."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest

from _tiny import ROOT
from _tiny import tiny_overrides
from keras_attn.zoo import prepared as prepared_module
from keras_attn.zoo import runs
from keras_attn.zoo.recipe import load_recipe
from keras_attn.zoo.tasks import make_task

NO_TENSORFLOW = os.path.join(os.path.dirname(os.path.abspath(__file__)), "no_tensorflow")
# Two epochs of 4 steps, a checkpoint every 3 (and at epoch ends): step 6
# falls inside the second epoch and is among the 3 checkpoints kept.
_RUN = ["training.epochs=2", "training.steps_per_epoch=4", "training.checkpoint_every=3",
        "training.jit_compile=false"]
SETTINGS = {
    "vit_tiny_digits": tiny_overrides("vit_tiny_digits", run=False) + _RUN
    + ["training.batch_size=16"],
    "bert_tiny_pydoc": tiny_overrides("bert_tiny_pydoc", run=False) + _RUN,
    "transformer_numbers": tiny_overrides("transformer_numbers", run=False) + _RUN,
    "conformer_tiny_digits": tiny_overrides("conformer_tiny_digits", run=False) + _RUN,
}


# What the JAX pass runs here: the prepared batches read back on JAX (its
# own augmentation arithmetic). The rest is the files' format and refusals
# (NumPy and Python) or subprocesses that choose their backend: collected
# once, on TensorFlow (`backend_independent`, docs/backends.md).


def _recipe(name, extra=()):
    return load_recipe(runs.locate_recipe(name), SETTINGS[name] + list(extra))


class _PreparedOnDemand(dict):
    """`{recipe name: prepared directory}`, each recipe prepared the first
    time a test asks for it: the test workers each prepare only what their
    tests use."""

    def __init__(self, tmp_path_factory):
        super().__init__()
        self.tmp_path_factory = tmp_path_factory

    def __missing__(self, name):
        directory = str(self.tmp_path_factory.mktemp("prepared") / name)
        prepared_module.prepare(name, SETTINGS[name], output=directory, verbose=False)
        self[name] = directory
        return directory


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The tiny recipes' prepared directories, by name (made on demand)."""
    return _PreparedOnDemand(tmp_path_factory)


def _copy(prepared, name, tmp_path):
    target = str(tmp_path / f"copy_{name}")
    shutil.copytree(prepared[name], target)
    return target


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_prepared_batches_are_the_pipelines_batches(prepared, name):
    """Every epoch, the validation and the test batches read back from the
    files equal the tf.data pipelines' (the masks, the order, the
    augmentation): bit for bit on TensorFlow; augmented pixels within 1e-3
    of 255 on JAX and PyTorch (`affine_transform`'s own arithmetic)."""
    recipe = _recipe(name)
    task = make_task(recipe)
    data = prepared_module.PreparedData(prepared[name], recipe)
    exact = keras.backend.backend() == "tensorflow"
    passes = [("train", 0, task.train_dataset_fn(0)), ("train", 1, task.train_dataset_fn(1)),
              ("validation", None, task.validation_data()), ("test", None, task.test_data())]
    task.use_prepared(data.state)  # what finish_prepared reads (the speech made again)
    for split, epoch, expected in passes:
        if expected is None:  # translation is tested by decoding, not by batches
            assert data.batches(split, epoch) is None
            continue
        stored = data.batches(split, epoch, task.finish_prepared)
        count = 0
        for want, got in zip(expected, stored):
            want, got = keras.tree.flatten(tuple(want)), keras.tree.flatten(tuple(got))
            assert len(want) == len(got)
            for a, b in zip(want, got):
                a = np.asarray(a)
                assert a.dtype == b.dtype and a.shape == b.shape, (split, epoch)
                if exact or a.dtype.kind != "f":
                    np.testing.assert_array_equal(b, a, err_msg=f"{split} {epoch}")
                else:
                    np.testing.assert_allclose(b, a, atol=1e-3, rtol=0, err_msg=f"{split} {epoch}")
            count += 1
        expected_count = 4 if split == "train" else len(list(expected))
        assert count == expected_count == len(stored), (split, epoch)
    # Resuming reads the rest of an epoch: skip(k) starts at batch k.
    epoch_1 = data.batches("train", 1, task.finish_prepared)
    np.testing.assert_array_equal(keras.tree.flatten(epoch_1.skip(3)[0])[0],
                                  keras.tree.flatten(epoch_1[3])[0])
    assert len(epoch_1.skip(3)) == 1


@pytest.mark.backend_independent
def test_translation_is_scored_from_prepared_data_as_from_the_tokenizer(prepared):
    """The test sources stored for the BLEU are the ones the task decodes,
    and the TensorFlow-free detokenizer gives keras-hub's texts: the same
    BLEU from either path (checked with the references' own ids, and with
    random ids, whose WordPieces join in every way)."""
    from keras_attn.data import translation
    from keras_attn.data.scoring import detokenize_ids

    name = "transformer_numbers"
    recipe = _recipe(name)
    task = make_task(recipe).prepare()
    data = prepared_module.PreparedData(prepared[name], recipe)
    pairs = task.test_pairs[: recipe["evaluation"]["max_examples"]]
    np.testing.assert_array_equal(
        data.tables["test_sources"],
        translation.encode_sources(task.tokenizer, [s for s, _ in pairs]))
    assert list(data.tables["test_references"]) == [t for _, t in pairs]
    assert data.state["vocabulary"] == list(task.vocabulary)
    references = translation.encode_sources(task.tokenizer, [t for _, t in pairs])
    random_ids = np.random.default_rng(0).integers(0, len(task.vocabulary), (64, 12))
    for ids in (references, random_ids):
        for join in (False, True):
            assert (detokenize_ids(ids, task.vocabulary, join)
                    == translation.detokenize(task.tokenizer, ids, join_characters=join))


@pytest.mark.large
@pytest.mark.backend_independent
def test_the_digits_recipe_prepares_into_a_few_mib(tmp_path):
    """The full vit_tiny_digits (60 augmented epochs) is small enough to
    carry to another machine: the augmentation is stored as transforms."""
    manifest = prepared_module.prepare("vit_tiny_digits", output=str(tmp_path / "vit"),
                                       verbose=False)
    total = sum(entry["bytes"] for entry in manifest["files"].values())
    assert len(manifest["files"]) == 60 + 3  # the epochs, validation, test, the table
    assert total < 4 * 2**20, total


@pytest.mark.backend_independent
def test_the_error_rates_without_tensorflow_are_keras_hubs():
    """`edit_distance_rate` (the WER and CER of prepared runs) equals
    keras-hub's EditDistance, which the tf.data runs use."""
    from keras_attn.data import speech
    from keras_attn.data.scoring import edit_distance_rate

    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(list("0123456789"), rng.integers(0, 7))) for _ in range(60)]
    references, hypotheses = texts[:30], texts[30:]
    hypotheses[:5] = references[:5]  # some exact
    assert edit_distance_rate(references, hypotheses) == pytest.approx(
        speech.word_error_rate(references, hypotheses), abs=1e-6)
    characters = lambda text: list(text.replace(" ", ""))  # noqa: E731
    assert edit_distance_rate(references, hypotheses, characters) == pytest.approx(
        speech.character_error_rate(references, hypotheses), abs=1e-6)


# Speech batches vary in width as translation's do (the tf.data route of
# varying-width prepared batches is the same code); translation's prepared
# path is checked by its scoring test and its training without TensorFlow.
# (Fewer runs: the suite's 40-minute budget.)
@pytest.mark.tf_only
@pytest.mark.parametrize("name", ["vit_tiny_digits", "conformer_tiny_digits"])
def test_training_from_prepared_files_is_training_from_tf_data(prepared, tmp_path, name):
    """On TensorFlow the batches are bit-identical, so the run is: the same
    weights and the same test metrics (the BLEU decoded without TensorFlow
    included)."""
    reference = runs.train(name, SETTINGS[name], output=str(tmp_path / "tf_data"),
                           export=False, verbose=0)
    from_files = runs.train(name, SETTINGS[name], output=str(tmp_path / "files"),
                            export=False, verbose=0, data=prepared[name])
    assert from_files["metrics"] == reference["metrics"]
    assert reference["data"] == "tf.data" and from_files["data"].startswith("prepared: ")
    weights = [keras.saving.load_model(os.path.join(run, "model.keras"), compile=False).weights
               for run in (reference["output"], from_files["output"])]
    for a, b in zip(*weights, strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(b),
                                      keras.ops.convert_to_numpy(a))


# Runs `keras_attn.cli.main(argv)` for each `[argv, log]` of the JSON list
# `sys.argv[1]`, its standard output written to `log`; prints the statuses.
_CLI_RUNS = """
import contextlib, json, sys
import keras_attn.cli
statuses = []
for argv, log in json.loads(sys.argv[1]):
    with open(log, "w") as out, contextlib.redirect_stdout(out):
        statuses.append(keras_attn.cli.main(argv))
print(json.dumps(statuses))
"""


# What a run adds on each backend: on JAX XLA-compiled steps, as the
# recipes' own `jit_compile: "auto"` gives there (it does not change the
# batches: prepared data takes either): one compile a step instead of one
# for each eager op and shape (the ViT's whole run 37 -> 17 s, load ~6).
WITHOUT_TENSORFLOW_SETTINGS = {"jax": ["training.jit_compile=true"], "torch": []}


def _train_without_tensorflow(backend, jobs, timeout=1200):
    """`keras-attn train NAME --data DATA --output OUTPUT --verbose 2` for
    each `(name, data, output)` of `jobs`, one after the other in one
    process of `backend` where TensorFlow is not importable (with
    `WITHOUT_TENSORFLOW_SETTINGS[backend]`). Returns `(the process,
    {output: (exit status, its standard output)})`."""
    environment = dict(
        os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
        KERAS_ATTN_TEST_BLOCK_TENSORFLOW="1",
        PYTHONPATH=os.pathsep.join([NO_TENSORFLOW, ROOT, os.environ.get("PYTHONPATH", "")]))
    commands = []
    for name, data, output in jobs:
        os.makedirs(os.path.dirname(output), exist_ok=True)
        sets = [item for value in SETTINGS[name] + WITHOUT_TENSORFLOW_SETTINGS[backend]
                for item in ("--set", value)]
        commands.append([["train", name, "--data", data, "--output", output, "--verbose", "2",
                          *sets], output + ".log"])
    done = subprocess.run([sys.executable, "-c", _CLI_RUNS, json.dumps(commands)],
                          env=environment, capture_output=True, text=True, timeout=timeout)
    logs = {}
    if done.returncode == 0:
        statuses = json.loads(done.stdout.strip().splitlines()[-1])
        for (_, _, output), status in zip(jobs, statuses, strict=True):
            with open(output + ".log") as handle:
                logs[output] = (status, handle.read())
    return done, logs


def _weights(run):
    with np.load(sorted(glob.glob(os.path.join(run, "checkpoints", "ckpt-*.npz")))[-1]) as ckpt:
        return {key: ckpt[key] for key in ckpt.files}


# The backend each recipe trains on without TensorFlow (test_backends.py
# trains it from tf.data on the other), and the checkpoints its run is cut
# back to: inside an epoch (step 6) or at an epoch's end (step 4).
TRAINED_WITHOUT_TENSORFLOW = {"vit_tiny_digits": "jax", "bert_tiny_pydoc": "torch",
                              "transformer_numbers": "torch", "conformer_tiny_digits": "torch"}
CUTS = {"vit_tiny_digits": (6,), "bert_tiny_pydoc": (6, 4), "transformer_numbers": (),
        "conformer_tiny_digits": ()}


@pytest.fixture(scope="module")
def without_tensorflow(prepared, tmp_path_factory):
    """The recipes' runs without TensorFlow, two processes a backend (each a
    TensorFlow-free start-up): the whole runs one after the other in one,
    then in a fresh one, as after a kill, the copies cut back to a
    checkpoint. `{name: {"whole": ..., cut: ...}}`, each `(run directory,
    the process, its (exit status, standard output))`."""
    root = tmp_path_factory.mktemp("without_tensorflow")
    found = {name: {} for name in CUTS}
    for backend in sorted(set(TRAINED_WITHOUT_TENSORFLOW.values())):
        names = sorted(n for n in CUTS if TRAINED_WITHOUT_TENSORFLOW[n] == backend)
        jobs = [(name, prepared[name], str(root / name / "whole")) for name in names]
        done, logs = _train_without_tensorflow(backend, jobs)
        cut_jobs = []
        for name, data, whole in jobs:
            found[name]["whole"] = (whole, done, logs.get(whole))
            if logs.get(whole, (1,))[0] != 0:
                continue
            for cut in CUTS[name]:
                # Cut back to the checkpoint of step `cut`, as a kill after it leaves the run.
                cut_run = str(root / name / f"cut_{cut}")
                shutil.copytree(whole, cut_run)
                for path in glob.glob(os.path.join(cut_run, "checkpoints", "ckpt-*")):
                    if not os.path.basename(path).startswith(f"ckpt-{cut:08d}."):
                        os.remove(path)
                for file in ("model.keras", "results.json"):
                    os.remove(os.path.join(cut_run, file))
                cut_jobs.append((name, data, cut_run, cut))
        if cut_jobs:
            again, logs = _train_without_tensorflow(backend, [job[:3] for job in cut_jobs])
            for name, _, cut_run, cut in cut_jobs:
                found[name][cut] = (cut_run, again, logs.get(cut_run))
    return found


@pytest.mark.large
@pytest.mark.backend_independent
@pytest.mark.xdist_group("without_tensorflow")  # one worker trains the runs once
@pytest.mark.parametrize("name, cuts", sorted(CUTS.items()))
def test_trains_and_resumes_bit_identically_where_tensorflow_is_not_installed(
        without_tensorflow, name, cuts):
    """`keras-attn train --data` on JAX and on PyTorch with TensorFlow (and
    keras-hub, tfds, tensorboard) not importable: the run finishes with its
    model and results, and a run cut back to a checkpoint inside an epoch
    (step 6) or at an epoch's end (step 4) resumes to the uninterrupted
    run's weights and optimizer, bit for bit (dropout on: PyTorch draws its
    masks from torch's global generator, which the trainer sets)."""
    backend = TRAINED_WITHOUT_TENSORFLOW[name]
    whole, done, log = without_tensorflow[name]["whole"]
    assert done.returncode == 0 and log is not None, done.stderr[-3000:]
    status, stdout = log
    assert status == 0, (stdout[-3000:], done.stderr[-3000:])
    assert "TensorFlow is not installed here: no SavedModel written" in stdout
    with open(os.path.join(whole, "results.json")) as handle:
        results = json.load(handle)
    assert results["backend"] == backend and results["steps"] == 8
    assert os.path.exists(os.path.join(whole, "model.keras"))
    assert not os.path.exists(os.path.join(whole, "saved_model"))

    expected = _weights(whole)
    assert sorted(k for k in without_tensorflow[name] if k != "whole") == sorted(cuts)
    for cut in cuts:
        cut_run, again, log = without_tensorflow[name][cut]
        assert again.returncode == 0 and log is not None, again.stderr[-3000:]
        status, stdout = log
        assert status == 0, (stdout[-3000:], again.stderr[-3000:])
        assert f"resuming from ckpt-{cut:08d}.npz at epoch 2/2 step {cut - 4}/4" in stdout
        resumed = _weights(cut_run)
        assert sorted(expected) == sorted(resumed)
        for key in expected:
            np.testing.assert_array_equal(resumed[key], expected[key], err_msg=f"{cut} {key}")


# === Bad prepared data: refused, naming what is wrong, before the first step ===


@pytest.mark.backend_independent
def test_a_directory_without_prepared_data_is_refused(tmp_path):
    with pytest.raises(ValueError, match="written by `keras-attn prepare`.*has no prepared.json"):
        prepared_module.PreparedData(str(tmp_path), _recipe("vit_tiny_digits"))


@pytest.mark.parametrize("name, extra, key", [
    ("vit_tiny_digits", ["training.seed=1"], "`training.seed` is 0 there and 1 here"),
    ("vit_tiny_digits", ["data.augmentation.zoom=0.3"], "`data`"),
    ("vit_tiny_digits", ["training.epochs=3"], "`training.epochs` is 2 there and 3 here"),
])
@pytest.mark.backend_independent
def test_data_prepared_for_another_recipe_is_refused(prepared, name, extra, key):
    with pytest.raises(ValueError, match="prepared for another recipe: " + key):
        prepared_module.PreparedData(prepared[name], _recipe(name, extra))


@pytest.mark.backend_independent
def test_another_recipes_data_and_run_neutral_changes(prepared):
    with pytest.raises(ValueError, match="`family` is 'bert' there and 'vit' here"):
        prepared_module.PreparedData(prepared["bert_tiny_pydoc"], _recipe("vit_tiny_digits"))
    # What does not change the batches may change between prepare and train.
    recipe = _recipe("vit_tiny_digits", ["training.optimizer.learning_rate=0.01",
                                         "training.jit_compile=true"])
    prepared_module.PreparedData(prepared["vit_tiny_digits"], recipe)


@pytest.mark.backend_independent
def test_missing_truncated_or_edited_files_are_refused(prepared, tmp_path):
    recipe = _recipe("vit_tiny_digits")
    directory = _copy(prepared, "vit_tiny_digits", tmp_path)
    os.remove(os.path.join(directory, "train-0001.npz"))
    with pytest.raises(ValueError, match="train-0001.npz is missing"):
        prepared_module.PreparedData(directory, recipe)

    directory = _copy(prepared, "vit_tiny_digits", tmp_path / "truncated")
    test_file = os.path.join(directory, "test.npz")
    with open(test_file, "r+b") as handle:
        handle.truncate(os.path.getsize(test_file) // 2)
    with pytest.raises(ValueError, match="test.npz is not the file `prepare` wrote.*truncated"):
        prepared_module.PreparedData(directory, recipe)

    directory = _copy(prepared, "vit_tiny_digits", tmp_path / "edited")
    tables = os.path.join(directory, "tables.npz")
    with open(tables, "r+b") as handle:  # one byte changed, the size kept
        handle.seek(200)
        byte = handle.read(1)
        handle.seek(200)
        handle.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ValueError, match="tables.npz is not the file `prepare` wrote"):
        prepared_module.PreparedData(directory, recipe)

    directory = _copy(prepared, "vit_tiny_digits", tmp_path / "format")
    manifest = os.path.join(directory, "prepared.json")
    with open(manifest) as handle:
        content = json.load(handle)
    with open(manifest, "w") as handle:
        json.dump(dict(content, format=99), handle)
    with pytest.raises(ValueError, match="of format 99; this keras_attn reads formats 2 to "
                                         f"{prepared_module.FORMAT}"):
        prepared_module.PreparedData(directory, recipe)


def _edit_manifest(directory, change, seal=True):
    """Applies `change(manifest)` to a prepared directory's manifest and
    writes it back; `seal`: with its `manifest_sha256` computed again, as a
    deliberate forger could (the digest is unkeyed), else as it was."""
    path = os.path.join(directory, "prepared.json")
    with open(path) as handle:
        manifest = json.load(handle)
    change(manifest)
    if seal:
        manifest = prepared_module._seal(manifest)
    with open(path, "w") as handle:
        json.dump(manifest, handle)
    return path


def _rewrite(directory, name, change, seal=True):
    """Rewrites a prepared file with `change(arrays)` applied and its
    manifest entry updated (`seal`: and the manifest's own digest): data
    edited consistently, as a bug or a deliberate forger could, which the
    checksums cannot catch (the checks of the batches must)."""
    path = os.path.join(directory, "prepared.json")
    with open(path) as handle:
        manifest = json.load(handle)
    entry = manifest["files"][name]
    file = os.path.join(directory, entry["file"])
    arrays, extra = prepared_module._read_file(file, entry)
    change(arrays)
    written = prepared_module._write_arrays(file, arrays, rows="block_rows" in entry, **extra)

    def update(manifest):  # the pipeline's dtypes (`dtypes`) as they were
        manifest["files"][name].update(
            {key: written[key] for key in ("bytes", "sha256", "stored", "meta_sha256")
             if key in written})

    return _edit_manifest(directory, update, seal=seal)


@pytest.mark.backend_independent
def test_ids_out_of_range_are_refused_before_the_first_step(prepared, tmp_path):
    name = "bert_tiny_pydoc"
    directory = _copy(prepared, name, tmp_path)

    def out_of_range(arrays):
        arrays["x/token_ids"] = arrays["x/token_ids"].astype("int32")
        arrays["x/token_ids"][5, 3] = 100_000

    _rewrite(directory, "train-0001", out_of_range)
    output = str(tmp_path / "run")
    with pytest.raises(ValueError, match=r"train-0001.npz: .*token_ids.*100000"):
        runs.train(name, SETTINGS[name], output=output, export=False, verbose=0,
                   data=directory)
    assert not glob.glob(os.path.join(output, "checkpoints", "ckpt-*"))  # no step was taken

    directory = _copy(prepared, "vit_tiny_digits", tmp_path / "index")

    def past_the_table(arrays):
        arrays["index"] = arrays["index"].astype("int32") + 10_000

    _rewrite(directory, "train-0000", past_the_table)
    recipe = _recipe("vit_tiny_digits")
    data = prepared_module.PreparedData(directory, recipe)
    task = make_task(recipe)
    task.use_prepared(data.state)
    with pytest.raises(ValueError, match=r"train-0000.npz: `index` must lie in \[0, "):
        data.check(task.build_model())


# (What distribution cannot take: tests/zoo/test_prepared_shards.py.)
@pytest.mark.backend_independent
def test_what_cannot_be_prepared_yet_is_refused(tmp_path):
    with pytest.raises(ValueError, match="embedded spoken digits only.*tfds:librispeech"):
        prepared_module.prepare("conformer_small", output=str(tmp_path / "t"), verbose=False)
    assert not os.path.exists(tmp_path / "t")


@pytest.mark.backend_independent
def test_speech_made_again_elsewhere_must_be_the_prepared_speech(prepared, tmp_path):
    """The spoken digits are synthesised again where the data is used: a
    different synthesis (another eSpeak NG or SciPy) is refused, and so is a
    stored length that is not its utterance's."""
    name = "conformer_tiny_digits"
    directory = _copy(prepared, name, tmp_path)
    _edit_manifest(directory, lambda manifest: manifest["state"].update(
        waveforms_sha256="0" * 64))  # sealed again: the task's own check must catch it
    with pytest.raises(ValueError, match="not the ones the data was prepared from"):
        runs.train(name, SETTINGS[name], output=str(tmp_path / "run"), export=False,
                   verbose=0, data=directory)

    directory = _copy(prepared, name, tmp_path / "length")

    def longer(arrays):
        arrays["length"] = arrays["length"].astype("int64")
        arrays["length"][0] += 1

    _rewrite(directory, "test", longer)
    with pytest.raises(ValueError, match=r"test.npz: `length` must be the utterance's own"):
        runs.train(name, SETTINGS[name], output=str(tmp_path / "run2"), export=False,
                   verbose=0, data=directory)


# === `prepare` replaces only what it wrote (issue 44, item 1) ===


def _contents(directory):
    """`{relative path: bytes}` of every file under `directory`, and its
    subdirectories (as None)."""
    found = {}
    for root, folders, files in os.walk(directory):
        for name in folders:
            found[os.path.relpath(os.path.join(root, name), directory)] = None
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                found[os.path.relpath(path, directory)] = handle.read()
    return found


def _add_notes(directory):
    with open(os.path.join(directory, "notes.txt"), "w") as handle:
        handle.write("mine\n")


def _no_format(directory):
    with open(os.path.join(directory, "prepared.json"), "w") as handle:
        json.dump({"name": "vit_tiny_digits"}, handle)


def _folder_for_a_file(directory):
    os.remove(os.path.join(directory, "test.npz"))
    os.mkdir(os.path.join(directory, "test.npz"))
    with open(os.path.join(directory, "test.npz", "mine.txt"), "w") as handle:
        handle.write("mine\n")


@pytest.mark.parametrize("start, make, named", [
    ("empty", lambda d: open(os.path.join(d, "important.txt"), "w").write("x\n"),
     "it has no prepared.json): it holds 'important.txt'"),
    ("prepared", _add_notes, "`prepare` does not write 'notes.txt'"),
    ("empty", _no_format, "has no prepared-data format (format: None)"),
    ("prepared", _folder_for_a_file, "'test.npz' is not a plain file"),
], ids=["a file of the user's", "a prepared directory the user added to",
        "a prepared.json of no format", "a folder named as a prepared file"])
@pytest.mark.backend_independent
def test_prepare_refuses_a_directory_it_did_not_write(prepared, tmp_path, start, make, named):
    """`prepare` replaced whatever `--out` named (issue 44, item 1): a
    non-empty directory that is not an earlier prepared one is refused,
    naming it and what it holds, and left exactly as it was."""
    directory = str(tmp_path / "out")
    if start == "prepared":
        shutil.copytree(prepared["vit_tiny_digits"], directory)
    else:
        os.mkdir(directory)
    make(directory)
    before = _contents(directory)
    with pytest.raises(ValueError, match=re.escape(f"`output` {directory} is not empty "
                                                   "and is not a directory written by")
                       + ".*" + re.escape(named)):
        prepared_module.prepare("vit_tiny_digits", SETTINGS["vit_tiny_digits"],
                                output=directory, verbose=False)
    assert _contents(directory) == before
    assert os.listdir(tmp_path) == ["out"]  # nothing made beside it


@pytest.mark.backend_independent
def test_prepare_refuses_it_when_it_changed_while_the_batches_were_made(tmp_path):
    """The directory is checked again just before it is replaced."""
    staging = tmp_path / ".prepare-out-x"
    staging.mkdir()
    (staging / "prepared.json").write_text("{}")
    output = tmp_path / "out"
    output.mkdir()
    (output / "important.txt").write_text("x\n")
    with pytest.raises(ValueError, match=r"out is not empty .*'important.txt'"):
        prepared_module._replace(str(staging), str(output))
    assert _contents(str(output)) == {"important.txt": b"x\n"}
    assert sorted(os.listdir(tmp_path)) == [".prepare-out-x", "out"]


@pytest.mark.backend_independent
def test_the_command_line_refuses_it_with_status_2(tmp_path, capsys):
    """`keras-attn prepare vit_tiny_digits --out d` with `d/important.txt`:
    exit status 2, the message names the directory, the file survives.
    (`keras-attn` is `sys.exit(main())`: main's status is the exit status;
    called here, a TensorFlow start-up less.)"""
    import keras_attn.cli

    directory = tmp_path / "d"
    directory.mkdir()
    (directory / "important.txt").write_text("x\n")
    status = keras_attn.cli.main(["prepare", "vit_tiny_digits", "--out", str(directory)])
    out, err = capsys.readouterr()
    assert status == 2, (out[-2000:], err[-2000:])
    assert (f"keras-attn prepare: error: `output` (--out) {directory} is not empty and is not "
            "a directory written by `keras-attn prepare`") in err
    assert "'important.txt'" in err
    assert _contents(str(directory)) == {"important.txt": b"x\n"}
    assert os.listdir(tmp_path) == ["d"]


@pytest.mark.backend_independent
def test_prepare_takes_a_new_an_empty_or_an_earlier_prepared_directory(tmp_path):
    name, recipe = "vit_tiny_digits", _recipe("vit_tiny_digits")

    def prepare(directory):
        prepared_module.prepare(name, SETTINGS[name], output=directory, verbose=False)
        return prepared_module.PreparedData(directory, recipe)

    new = str(tmp_path / "parent" / "new")  # its parent made too
    prepare(new)
    empty = str(tmp_path / "empty")
    os.mkdir(empty)
    prepare(empty)
    # An earlier prepared directory, with an epoch file of another run's:
    # replaced whole.
    shutil.copy(os.path.join(empty, "train-0001.npz"), os.path.join(empty, "train-0007.npz"))
    data = prepare(empty)
    assert not os.path.exists(os.path.join(empty, "train-0007.npz"))
    assert sorted(os.listdir(empty)) == sorted(
        ["prepared.json"] + [entry["file"] for entry in data.files.values()])
    # One of format 1 (no manifest digest): refused for training, replaced
    # by `prepare`.

    def format_1(manifest):
        del manifest["manifest_sha256"]
        manifest["format"] = 1

    _edit_manifest(empty, format_1, seal=False)
    with pytest.raises(ValueError, match="of format 1; this keras_attn reads formats 2 to 3. "
                                         "Prepare the data again"):
        prepared_module.PreparedData(empty, recipe)
    prepare(empty)
    assert sorted(os.listdir(tmp_path)) == ["empty", "parent"]  # no staging left beside


# === The manifest is tamper-evident (issue 44, item 7) ===


@pytest.mark.parametrize("change", [
    lambda manifest: manifest["state"].update(num_classes=12),
    lambda manifest: manifest["files"]["train-0000"]["dtypes"].update(transforms="float16"),
    lambda manifest: manifest.update(epochs=1),
    lambda manifest: manifest["files"]["test"].update(sha256="0" * 64),
    lambda manifest: manifest.pop("manifest_sha256"),
], ids=["num_classes", "dtype", "epochs", "a file's sha256", "no digest"])
@pytest.mark.backend_independent
def test_an_edited_manifest_is_refused_naming_it(prepared, tmp_path, change):
    """The tester edited `num_classes` and a 12-class ViT trained, edited
    a dtype and the weights changed: an edit the digest was not computed
    again for is refused, naming the manifest, before anything is built."""
    directory = _copy(prepared, "vit_tiny_digits", tmp_path)
    path = _edit_manifest(directory, change, seal=False)
    with pytest.raises(ValueError, match=re.escape(path) + " is not the manifest `prepare` "
                                         "wrote: its manifest_sha256 .*edited or damaged"):
        prepared_module.PreparedData(directory, _recipe("vit_tiny_digits"))
    output = str(tmp_path / "run")
    with pytest.raises(ValueError, match=re.escape(path) + " is not the manifest"):
        runs.train("vit_tiny_digits", SETTINGS["vit_tiny_digits"], output=output,
                   export=False, verbose=0, data=directory)
    assert not os.path.exists(output)


@pytest.mark.backend_independent
def test_the_manifest_digest_is_of_its_content_and_a_damaged_one_is_refused(prepared, tmp_path):
    recipe = _recipe("vit_tiny_digits")
    directory = _copy(prepared, "vit_tiny_digits", tmp_path)
    path = _edit_manifest(directory, lambda manifest: None, seal=False)  # other spacing
    with open(path) as handle:
        assert "\n" not in handle.read().strip()  # written differently from `prepare`
    prepared_module.PreparedData(directory, recipe)  # the same content: accepted
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) - 40)
    with pytest.raises(ValueError, match=re.escape(path) + r" cannot be read"):
        prepared_module.PreparedData(directory, recipe)


@pytest.mark.backend_independent
def test_a_crafted_file_and_manifest_are_refused(prepared, tmp_path):
    """The tester's crafted npz with its manifest entry to match is refused
    by the manifest digest. A forger who computes that digest again too
    (it is unkeyed) passes the checksums; what is read must still be what
    `prepare` writes for this recipe."""
    name, recipe = "vit_tiny_digits", _recipe("vit_tiny_digits")

    def relabel(arrays):
        arrays["y"] = (arrays["y"].astype("int32") + 1) % 10

    directory = _copy(prepared, name, tmp_path)
    path = _rewrite(directory, "train-0000", relabel, seal=False)
    with pytest.raises(ValueError, match=re.escape(path) + " is not the manifest `prepare` "
                                         "wrote"):
        prepared_module.PreparedData(directory, recipe)

    # Sealed again: a dtype that would change the values is refused as the
    # file is read (float32 stored, float16 claimed; indices up to 1292
    # claimed to be int8).
    for index, (key, dtype, stored) in enumerate([("transforms", "float16", "float32"),
                                                  ("index", "int8", "uint16")]):
        directory = _copy(prepared, name, tmp_path / f"dtype{index}")
        _edit_manifest(directory, lambda manifest: manifest["files"]["train-0001"]["dtypes"]
                       .update({key: dtype}))
        data = prepared_module.PreparedData(directory, recipe)  # the digests pass
        with pytest.raises(ValueError, match=rf"train-0001.npz: `{key}` is stored as {stored}, "
                                             rf"which `prepare` does not write for the "
                                             rf"manifest's dtype '{dtype}'"):
            data.batches("train", 1)

    # Sealed again: steps, files and recipe keys that are not the recipe's.
    for index, (change, message) in enumerate([
        (lambda manifest: manifest.update(steps_per_epoch=3),
         "holds steps_per_epoch=3, the recipe `training.steps_per_epoch` is 4"),
        (lambda manifest: manifest["files"]["test"].update(file="../test.npz"),
         "the entry of `test` names the file '../test.npz'"),
        (lambda manifest: manifest["recipe"].update({"training.seed": 1}),
         "`training.seed` is 1 there and 0 here"),
        (lambda manifest: manifest["files"].update(
            {"train-0002": dict(manifest["files"]["train-0001"], file="train-0002.npz")}),
         r"lists \['train-0002'\], beyond its 2 epochs"),
    ]):
        directory = _copy(prepared, name, tmp_path / f"recipe{index}")
        _edit_manifest(directory, change)
        with pytest.raises(ValueError, match=message):
            prepared_module.PreparedData(directory, recipe)


@pytest.mark.backend_independent
def test_the_recipe_given_to_train_is_the_one_checked(prepared, tmp_path):
    """`train --data` checks the data against the recipe and the overrides
    it is given, not against what the manifest says."""
    name = "vit_tiny_digits"
    with pytest.raises(ValueError, match="prepared for another recipe: `training.batch_size` "
                                         "is 16 there and 8 here"):
        runs.train(name, SETTINGS[name] + ["training.batch_size=8"],
                   output=str(tmp_path / "run"), export=False, verbose=0,
                   data=prepared[name])
