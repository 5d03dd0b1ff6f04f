import configparser
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from _tiny import ROOT
from _tiny import SMALL
from _tiny import tiny_overrides
from test_case import TWO_JAX_CPU_DEVICES
from test_case import jax_cpu_devices_flags
import keras_attn.cli as cli
from keras_attn.zoo import runs
from keras_attn._base import zoo_files

pytestmark = pytest.mark.tf_only
RESULT_KEYS = {"name", "metric", "value", "metrics", "train_seconds", "epochs", "steps", "data",
               "parameters", "backend", "hardware", "date", "keras_attn_version"}


# Multi-device JAX runs compile their step, as on a GPU. Run eagerly (the tiny
# runs' jit_compile=false), every primitive of the step is its own program over
# both virtual CPU devices; on a loaded 2-core machine XLA:CPU's asynchronous
# dispatch of those programs deadlocked (one device waiting in an all-reduce, the
# other's launch blocked behind it: two of three concurrent runs hung, seen with
# gdb), while compiled runs finished every time (seven of seven, four at once).
DISTRIBUTED_JIT = ["training.jit_compile=true"]


def _cli(*args, cwd, timeout=600):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "keras_attn.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def _train_args(name, run, extra=()):
    sets = [item for value in tiny_overrides(name) + list(extra) for item in ("--set", value)]
    return ["train", name, "--output", run, "--verbose", "0", *sets]


def _compare_exported(run, task, model):
    """The SavedModel's `serve` against model.keras (`model`, the run's
    `task`) on a few test inputs."""
    import tensorflow as tf

    loaded = tf.saved_model.load(os.path.join(run, "saved_model"))
    inputs = task.example_inputs()
    expected, served = task.reference_outputs(model, inputs), task.served_outputs(loaded, inputs)
    assert sorted(expected) == sorted(served)
    for key in expected:
        assert expected[key].shape == served[key].shape, key
        if np.issubdtype(expected[key].dtype, np.integer):
            np.testing.assert_array_equal(served[key], expected[key], err_msg=key)
        else:
            np.testing.assert_allclose(served[key], expected[key], atol=1e-5, rtol=0, err_msg=key)


def _check_portable_export(run, name, task, model, capsys):
    """`keras-attn export --format onnx|litert`: every task's artifact in
    its runtime gives model.keras's outputs (`model`, the run's `task`)."""
    from keras_attn.export.portable import Artifact

    capsys.readouterr()
    inputs = task.example_inputs()
    expected = task.reference_outputs(model, inputs)
    # One format per recipe (both formats across the four; each exporter is
    # tested in both in tests/export/test_portable.py): the suite's budget.
    format = {"vit_tiny_digits": "litert", "bert_tiny_pydoc": "onnx",
              "conformer_tiny_digits": "onnx", "transformer_numbers": "litert"}[name]
    kind = {"onnx": "ONNX model", "litert": "LiteRT model"}[format]
    assert cli.main(["export", str(run), "--format", format]) == 0
    assert f"{kind} of {run / 'model.keras'}: {run / format}" in capsys.readouterr().out
    served = Artifact(str(run / format))(**inputs)
    if name == "vit_tiny_digits":
        assert Artifact(str(run / format)).labels == [str(d) for d in range(10)]
    # The test metric of the artifact and of the SavedModel in their
    # runtimes is model.keras's.
    results = json.loads((run / "results.json").read_text())
    for exported in (run / format, run / "saved_model"):
        capsys.readouterr()
        status = cli.main(["evaluate", str(run), "--exported", str(exported), "--json"])
        if task.name == "masked_lm":
            assert status == 2
            assert "not scored from an exported model yet" in capsys.readouterr().err
            continue
        assert status == 0
        report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert report["source"] == str(exported)
        assert report["value"] == pytest.approx(results["metrics"][report["metric"]], abs=1e-6)
    if name == "conformer_tiny_digits":  # the tokens; the artifact's width is the frames'
        assert [[t for t in row if t >= 0] for row in served["token_ids"].tolist()] == \
            [[t for t in row if t >= 0] for row in expected["token_ids"].tolist()]
        # The run's vocabulary travels: both exports answer its text.
        import tensorflow as tf

        from keras_attn.data.speech import decode_ids
        from keras_attn.export import SpeechRecognizerArtifact

        texts = [decode_ids(row, task.vocabulary) for row in expected["token_ids"].tolist()]
        clips = [w[:n] for w, n in zip(inputs["waveform"], inputs["waveform_length"])]
        assert SpeechRecognizerArtifact(str(run / format))(clips)["text"] == texts
        loaded = tf.saved_model.load(str(run / "saved_model"))
        text = loaded.serve(inputs["waveform"], inputs["waveform_length"])["text"]
        assert [t.decode() for t in text.numpy()] == texts
        return
    if name == "transformer_numbers":  # cut after the end token, as the reference is
        served = task._outputs(served["tokens"], served["scores"])
    assert sorted(served) == sorted(expected)
    for key in expected:
        np.testing.assert_allclose(served[key], expected[key], atol=1e-4, err_msg=key)


def _check_hf_export(run, name, task, model, capsys):
    """`keras-attn export --format hf`: BERT and ViT runs as directories
    transformers loads with every weight and the run's outputs (`model`, the
    run's `task`); other families refused by name."""
    capsys.readouterr()
    if name not in ("bert_tiny_pydoc", "vit_tiny_digits"):
        assert cli.main(["export", str(run), "--format", "hf"]) == 2
        assert "BERT and ViT runs" in capsys.readouterr().err
        return
    import torch
    import transformers

    assert cli.main(["export", str(run), "--format", "hf"]) == 0
    assert f"Hugging Face directory of {run / 'model.keras'}" in capsys.readouterr().out
    bert = name == "bert_tiny_pydoc"
    hf_class = transformers.BertForPreTraining if bert else transformers.ViTForImageClassification
    hf, info = hf_class.from_pretrained(run / "hf", output_loading_info=True)
    assert not any(info.values()), info
    if not bert:  # the classes' names, as in labels.txt
        assert hf.config.id2label == {d: str(d) for d in range(10)}
    hf.eval()
    if bert:
        text = "The interpreter reads the source file."
        hf_tokenizer = transformers.BertTokenizer.from_pretrained(run / "hf")
        ids = np.asarray(task.tokenizer(text)).tolist()
        assert hf_tokenizer(text, add_special_tokens=False)["input_ids"] == ids
        ids = np.array([[2] + ids + [3]], "int32")  # [CLS] ... [SEP]
        inputs = {"token_ids": ids, "segment_ids": np.zeros_like(ids),
                  "padding_mask": np.ones_like(ids), "mask_positions": np.array([[1, 2, 3]])}
        ours = model.predict_on_batch(inputs)
        with torch.no_grad():
            theirs = hf(input_ids=torch.tensor(ids, dtype=torch.long))
        np.testing.assert_allclose(ours["mlm"], theirs.prediction_logits.numpy()[:, 1:4],
                                   atol=1e-4)
        np.testing.assert_allclose(ours["nsp"], theirs.seq_relationship_logits.numpy(),
                                   atol=1e-4)
    else:
        images = task.example_inputs()["images"].astype("float32")
        with torch.no_grad():
            theirs = hf(pixel_values=torch.tensor((images / 127.5 - 1).transpose(0, 3, 1, 2)))
        np.testing.assert_allclose(model.predict_on_batch(images), theirs.logits.numpy(),
                                   atol=1e-4)


# `keras-attn train` as its own process (exit status, TensorFlow's start-up
# notices held back, the report on stdout) for one recipe; the others train
# through cli.main in this process: the same command and code path per recipe,
# a TensorFlow start-up (5-10 s) less each.
IN_ITS_OWN_PROCESS = "vit_tiny_digits"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMALL))
def test_train_evaluate_export_end_to_end(name, tmp_path, capsys):
    run = tmp_path / "run"
    if name == IN_ITS_OWN_PROCESS:
        result = _cli(*_train_args(name, run), cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-4000:]
        for notice in ("absl::InitializeLog", "oneDNN custom operations", "Could not find cuda"):
            assert notice not in result.stderr, result.stderr[-2000:]
        out = result.stdout
    else:
        capsys.readouterr()
        assert cli.main([str(arg) for arg in _train_args(name, run)]) == 0
        out = capsys.readouterr().out
    for path in ("recipe.json", "model.keras", "saved_model/saved_model.pb",
                 "learning_curves.png", "results.json", "checkpoints/history.json"):
        assert (run / path).is_file(), path
    assert list((run / "checkpoints").glob("ckpt-*.npz"))
    assert list((run / "tensorboard").rglob("events.out.tfevents.*"))
    assert (run / "vocab.txt").is_file() == (name in ("bert_tiny_pydoc", "transformer_numbers"))
    if name == "vit_tiny_digits":  # the class names, in the run and inside the export
        digits = "".join(f"{d}\n" for d in range(10))
        assert (run / "labels.txt").read_text() == digits
        assert (run / "saved_model" / "assets" / "labels.txt").read_text() == digits
    results = json.loads((run / "results.json").read_text())
    recipe = json.loads((run / "recipe.json").read_text())
    assert set(results) == RESULT_KEYS
    metric = recipe["evaluation"]["metric"]
    assert results["metric"] == metric and results["value"] == results["metrics"][metric]
    assert results["steps"] == 3 and results["parameters"] > 0 and results["name"] == name
    for line in (f"model:           {run / 'model.keras'}", f"SavedModel:      {run / 'saved_model'}",
                 f"learning curves: {run / 'learning_curves.png'}"):
        assert line in out, out[-2000:]

    # The other commands run in this process (one TensorFlow start-up less each).
    capsys.readouterr()
    assert cli.main(["evaluate", str(run), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["metric"] == metric
    np.testing.assert_allclose(printed["value"], results["value"], rtol=1e-6, atol=1e-6)

    # model.keras, loaded once for the exports' comparisons.
    _, task, model, _ = runs.load_run(str(run))
    _compare_exported(str(run), task, model)
    _check_portable_export(run, name, task, model, capsys)
    _check_hf_export(run, name, task, model, capsys)

    # Again after completion: nothing is trained, the results are reported.
    assert cli.main(_train_args(name, str(run))) == 0
    assert "already complete" in capsys.readouterr().out
    # The same directory with another recipe: refused, naming the key.
    other = _train_args(name, str(run), ["training.optimizer.learning_rate=0.5"])
    assert cli.main(other) == 2
    assert "`training.optimizer.learning_rate`" in capsys.readouterr().err


@pytest.mark.slow
def test_unfinished_runs_evaluate_from_checkpoints_and_finish_without_training_again(
    tmp_path, capsys
):
    # Every command in this process: the command line's own process (exit
    # status, printed notices) is tested by test_train_evaluate_export_end_to_end
    # and test_errors_exit_with_status_2_and_no_traceback; each TensorFlow
    # start-up spared is 5-10 s.
    run = tmp_path / "run"
    assert cli.main([str(arg) for arg in _train_args("vit_tiny_digits", run)]) == 0
    seconds = (run / "epoch_seconds.json").read_text()
    # As if killed after the last checkpoint, before the model was saved.
    for name in ("results.json", "model.keras"):
        (run / name).unlink()
    shutil.rmtree(run / "saved_model")
    capsys.readouterr()
    assert cli.main(["evaluate", str(run)]) == 0
    out = capsys.readouterr().out
    assert "checkpoint at step 3" in out and "accuracy = " in out
    assert cli.main([str(arg) for arg in _train_args("vit_tiny_digits", run)]
                    + ["--no-export"]) == 0
    out = capsys.readouterr().out
    assert "epoch 1/1" not in out  # the checkpoint says the epoch is done
    assert (run / "epoch_seconds.json").read_text() == seconds
    assert all((run / name).exists() for name in ("results.json", "model.keras"))
    # --no-export: no SavedModel, and the report says how to write it.
    assert not (run / "saved_model").exists()
    assert f"SavedModel:      not written; `keras-attn export {run}` writes it" in out
    assert cli.main(["export", str(run), "--output", str(tmp_path / "exported")]) == 0
    assert (tmp_path / "exported" / "saved_model.pb").is_file()


# Multi-device JAX subprocesses run one at a time (the "distribute" group), so
# that their virtual devices share the 2 cores with as little else as possible.
@pytest.mark.slow
@pytest.mark.xdist_group("distribute")
def test_data_parallel_training_on_jax_exports_on_tensorflow(tmp_path, monkeypatch):
    # The GPU path of the project: train on JAX, here data parallel over two
    # host devices, with a last batch (1293 = 3 x 430 + 3) that the replicas
    # do not divide; the SavedModel is written by a TensorFlow subprocess.
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    monkeypatch.setenv("XLA_FLAGS", TWO_JAX_CPU_DEVICES)
    run = tmp_path / "run"
    extra = ["training.batch_size=430", "training.steps_per_epoch=null", *DISTRIBUTED_JIT]
    result = _cli(*_train_args("vit_tiny_digits", run, extra), "--distribute", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "2 replicas: global batch 430" in result.stdout
    results = json.loads((run / "results.json").read_text())
    assert results["backend"] == "jax" and results["steps"] == 4
    _, task, model, _ = runs.load_run(str(run))
    _compare_exported(str(run), task, model)


# Multi-device JAX subprocesses run one at a time (the "distribute" group), so
# that their virtual devices share the 2 cores with as little else as possible.
@pytest.mark.slow
@pytest.mark.xdist_group("distribute")
def test_model_parallel_training_on_jax(tmp_path, monkeypatch):
    # 4 host devices: 2 replicas x 2 model shards (the tiny ViT's 2 heads and
    # inner width of 32 split in two).
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    monkeypatch.setenv("XLA_FLAGS", jax_cpu_devices_flags(4))
    run = tmp_path / "run"
    result = _cli(*_train_args("vit_tiny_digits", run, DISTRIBUTED_JIT), "--distribute",
                  "model_parallel:2x2", "--no-export", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "2 replicas: global batch" in result.stdout
    assert "each model split over 2 devices" in result.stdout
    results = json.loads((run / "results.json").read_text())
    assert results["backend"] == "jax" and 0 <= results["value"] <= 1
    # (A mesh that does not fit the devices: tests/models/test_parallel.py.)


def test_errors_exit_with_status_2_and_no_traceback(tmp_path):
    result = _cli("train", "vit_tiny_digits", "--set", "training.epochs=0", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "`training.epochs`" in result.stderr and "Received: training.epochs=0" in result.stderr
    assert not (tmp_path / "runs").exists()  # validation comes before anything is written


@pytest.mark.parametrize("override, message", [
    ("training.batch_size=100000000000000000000", "greater than the maximum of 1048576"),
    ("training.optimizer.learning_rate=1e309", "must be a finite number"),
    ("training.seed=-1", "less than the minimum of 0"),
])
def test_numbers_of_any_magnitude_are_refused_before_the_run_directory(
        override, message, tmp_path, capsys):
    run = tmp_path / "run"
    assert cli.main(["train", "vit_tiny_digits", "--output", str(run), "--set", override]) == 2
    error = capsys.readouterr().err
    key = override.partition("=")[0]
    assert f"`{key}`" in error and message in error and "Traceback" not in error, error
    assert not run.exists()


def test_evaluate_refuses_a_streaming_export_by_name(tmp_path):
    (tmp_path / "serving.json").write_text(json.dumps({"format": "onnx", "streaming": {}}))
    with pytest.raises(ValueError, match=r"is an export of the streaming step .*`transcribe "
                                         r"RUN_DIR AUDIO\.wav --streaming`\. Received: exported="):
        runs.evaluate("/no/such/run", exported=str(tmp_path))


@pytest.mark.parametrize("flag", ["--streaming", "--stream"])
def test_streaming_is_one_flag_in_every_command(flag):
    # `transcribe --streaming` was refused ("unrecognized arguments") while
    # `export` took it: --streaming everywhere, --stream its alias.
    parser = cli.build_parser()
    exported = parser.parse_args(["export", "RUN", "--format", "onnx", flag])
    transcribed = parser.parse_args(["transcribe", "RUN", "a.wav", flag, "--chunk-ms", "80"])
    assert exported.streaming and transcribed.stream and transcribed.chunk_ms == 80
    # A library error about the argument names the flag by its one name.
    assert exported.flags["streaming"] == transcribed.flags["stream"] == "--streaming"
    assert not parser.parse_args(["transcribe", "RUN", "a.wav"]).stream


@pytest.mark.parametrize("streaming", [False, True])
def test_an_empty_transcript_is_named(streaming, monkeypatch, capsys):
    # The model recognised nothing: the last line (the transcript) is empty,
    # and stderr names the file, in both modes.
    from keras_attn.zoo import transcribe
    from keras_attn.zoo.transcribe import Partial

    class Silent:
        def __init__(self, run_dir):
            pass

        def stream(self, audio, chunk_ms):
            return iter([Partial(0.32, ""), Partial(0.64, "", final=True)])

    monkeypatch.setattr(transcribe, "transcribe", lambda run_dir, audio, chunk_ms: "")
    monkeypatch.setattr(transcribe, "Transcriber", Silent)
    argv = ["transcribe", "RUN", "quiet.wav"] + (["--streaming"] if streaming else [])
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1:] == [""]
    assert err == ("keras-attn transcribe: the transcript of quiet.wav is empty (the model of "
                   "RUN recognised nothing in it)\n")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "no_such_recipe"], "Received: RECIPE='no_such_recipe'"),
        (["train", "vit_tiny_digits", "--set", "training.epochs"], "Received: --set"),
        (["train", "vit_tiny_digits", "--set", "model.preset=vit_x"], "`model.preset`"),
        (["evaluate", "/no/such/run"], "Received: RUN_DIR='/no/such/run'"),
        (["export", "/no/such/run"], "Received: RUN_DIR='/no/such/run'"),
    ],
)
def test_error_messages(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("command", [[], ["train"], ["evaluate"], ["export"], ["list"]])
def test_help(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(command + ["--help"])
    assert exit_.value.code == 0
    assert "usage: keras-attn" in capsys.readouterr().out


def test_export_help_names_the_formats_of_each_precision(capsys):
    """`export --help` says which formats take which precision, as the
    exporter decides (keras_attn.export.portable.PRECISIONS)."""
    from keras_attn.export.portable import PRECISIONS

    with pytest.raises(SystemExit):
        cli.main(["export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for precision in ("float16", "int8"):
        formats = [format for format, allowed in PRECISIONS.items() if precision in allowed]
        assert f"{precision} ({', '.join(formats)}" in text, (precision, formats, text)


def _python(code, cwd, **env):
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    environment.pop("TF_CPP_MIN_LOG_LEVEL", None)
    environment.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, cwd=cwd, env=environment)


def test_help_list_and_argument_errors_import_neither_keras_nor_tensorflow(tmp_path):
    """They answer at once: nothing heavy is imported (issue 20), and of
    `keras_attn` only its Keras-free `__init__` and `_base` (the launcher
    reads the zoo with `keras_attn._base`), not the zoo, layers or models."""
    code = (
        "import sys, keras_attn.cli as cli\n"
        "for argv in (['--help'], ['train', '--help'], ['list', '--family', 'nope'], ['evaluate']):\n"
        "    try:\n"
        "        cli.main(argv)\n"
        "    except SystemExit as exit_:\n"
        "        print('status', ' '.join(argv), exit_.code)\n"
        "print('status list', cli.main(['list']))\n"
        "heavy = ('keras', 'tensorflow', 'jax', 'torch', 'pydantic', 'keras_attn.zoo',\n"
        "         'keras_attn.layers', 'keras_attn.models')\n"
        "print('imported:', sorted(name for name in heavy if name in sys.modules))\n"
    )
    result = _python(code, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for line in ("status --help 0", "status train --help 0", "status list --family nope 2",
                 "status evaluate 2", "status list 0", "imported: []"):
        assert line in out, out[-3000:]
    assert "invalid choice: 'nope'" in result.stderr and "RUN_DIR" in result.stderr
    assert all(name in out for name in SMALL)


def test_family_choices_are_the_families_with_tasks():
    from keras_attn.zoo.tasks import families

    assert zoo_files.recipe_families() == sorted(families())


def test_tensorflow_start_up_notices_are_held_back_and_nothing_else(tmp_path):
    # A stand-in for TensorFlow's C++ start-up: lines written to fd 2 at import.
    (tmp_path / "noisy.py").write_text(
        "import os\n"
        "os.write(2, b'WARNING: All log messages before absl::InitializeLog() is called are "
        "written to STDERR\\n'\n"
        "         b'I0000 00:00:1 1 port.cc:153] oneDNN custom operations are on. You may\\n'\n"
        "         b'I0000 00:00:1 1 cudart_stub.cc:31] Could not find cuda drivers on your "
        "machine, GPU will not be used.\\n'\n"
        "         b'E0000 something real went wrong\\n')\n"
    )
    code = ("from keras_attn._base.quiet_tensorflow import import_holding_back_notices; "
            "import_holding_back_notices('noisy'); print('after')")
    result = _python(code, tmp_path, PYTHONPATH=os.pathsep.join([ROOT, str(tmp_path)]))
    assert result.returncode == 0 and result.stdout == "after\n", result.stderr
    assert result.stderr == "E0000 something real went wrong\n"
    # The real one, without TF_CPP_MIN_LOG_LEVEL in the environment.
    code = ("from keras_attn._base.quiet_tensorflow import import_tensorflow_quietly; "
            "import_tensorflow_quietly(); import tensorflow as tf; "
            "print(float(tf.reduce_sum(tf.constant([1.0, 2.0]))))")
    result = _python(code, tmp_path)
    assert result.returncode == 0 and result.stdout == "3.0\n", result.stderr[-3000:]
    assert result.stderr == ""


def test_list_shows_every_recipe_and_the_parameter_counts(tmp_path, monkeypatch, capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in SMALL)
    assert cli.main(["list", "--family", "bert"]) == 0
    out = capsys.readouterr().out
    assert "bert_tiny_pydoc" in out and "vit_tiny_digits" not in out
    # models/parameters.json (written by the lead's table script) fills the column.
    models = tmp_path / "models"
    (models / "vit").mkdir(parents=True)
    (models / "results").mkdir()
    shutil.copy(os.path.join(ROOT, SMALL["vit_tiny_digits"]), models / "vit")
    shutil.copy(os.path.join(ROOT, SMALL["vit_tiny_digits"]), models / "results")
    (models / "parameters.json").write_text(json.dumps({"vit_tiny_digits": 136906}))
    monkeypatch.setattr(zoo_files, "models_directory", lambda: str(models))
    assert cli.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "136,906" in lines[1]  # results/ is not a recipe
    # Without an entry there, the recorded run's count (embedded recipes).
    (models / "parameters.json").write_text("{}")
    (models / "results" / "vit_tiny_digits.json").write_text(json.dumps({"parameters": 1234}))
    assert cli.main(["list"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert "1,234" in row
    # The recorded run's training time, where one is recorded.
    assert header.split()[-2:] == ["trained", "in"] and row.endswith("-")
    (models / "results" / "vit_tiny_digits.json").write_text(
        json.dumps({"parameters": 1234, "train_seconds": 150.0}))
    assert cli.main(["list"]) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith("2 min")


def test_recipe_names_resolve_to_zoo_files(tmp_path):
    assert runs.locate_recipe("vit_tiny_digits") == os.path.join(ROOT, SMALL["vit_tiny_digits"])
    path = tmp_path / "mine.json"
    path.write_text("{}")
    assert runs.locate_recipe(str(path)) == str(path)


def test_console_script_is_declared():
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    scripts = config["options.entry_points"]["console_scripts"]
    assert "keras-attn = keras_attn.cli:main" in scripts


# === The command line never leaves a run broken ===


def test_a_recipe_that_fails_to_build_leaves_no_recipe_json(tmp_path, capsys):
    # In this process (a TensorFlow start-up less each): status 2 from
    # cli.main is the caught error; the separate process's status and its
    # stderr without a traceback: test_errors_exit_with_status_2_and_no_traceback.
    run = tmp_path / "run"
    capsys.readouterr()
    bad = [str(arg) for arg in _train_args("vit_tiny_digits", run, ["model.overrides.num_heads=3"])]
    assert cli.main(bad) == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error
    # The message names both values (from the config's check, or the model's).
    assert "hidden_dim=16" in error and "num_heads" in error, error[-2000:]
    assert not run.exists()  # nothing written, not even the directory
    # Leftovers of a process killed while exporting or saving are removed.
    run.mkdir()
    (run / ".export-abc123").mkdir()
    (run / ".partial-model.keras").write_text("half")
    (run / ".results.json.x1y2.tmp").write_text("half")
    assert cli.main([str(arg) for arg in _train_args("vit_tiny_digits", run)]) == 0
    assert (run / "results.json").exists() and not (run / ".lock").exists()
    assert not [p.name for p in run.iterdir() if p.name.startswith(".")]


def test_a_recipe_that_fails_in_its_first_steps_leaves_no_run_behind(tmp_path, monkeypatch,
                                                                     capsys):
    # recipe.json is written once the model builds; a failure before the
    # first checkpoint (bad data at step 1, an interrupt) left it alone in
    # the run directory, which looked like a run.
    from keras_attn.training.resumable import ResumableTrainer

    def fails(self, *args, **kwargs):
        assert (run / "recipe.json").exists()
        raise ValueError("Invalid value for argument `x`: a bad batch at step 1")

    monkeypatch.setattr(ResumableTrainer, "fit", fails)
    run = tmp_path / "run"
    argv = [str(arg) for arg in _train_args("vit_tiny_digits", run)]
    assert cli.main(argv) == 2
    assert "a bad batch at step 1" in capsys.readouterr().err
    assert not run.exists()
    run.mkdir()  # a directory the user made stays, emptied of the run's files
    assert cli.main(argv) == 2
    assert run.exists() and not list(run.iterdir())


def test_output_that_is_a_file_or_cannot_be_made_exits_2(tmp_path, capsys):
    target = tmp_path / "a_file"
    target.write_text("x")
    # The library names its argument; the command line, its flag.
    with pytest.raises(ValueError, match=r"^`output` must be a directory; .* Received: output="):
        runs.train("vit_tiny_digits", output=str(target))
    assert cli.main(["train", "vit_tiny_digits", "--output", str(target)]) == 2
    assert "`output` (--output) must be a directory" in capsys.readouterr().err
    assert target.read_text() == "x"
    # /proc takes no new directory, whoever we are (root included).
    assert cli.main(["train", "vit_tiny_digits", "--output", "/proc/keras_attn/run"]) == 2
    assert "keras-attn train: error:" in capsys.readouterr().err


def test_a_full_disk_is_a_message_and_leaves_no_partial_file(tmp_path, monkeypatch, capsys):
    import errno

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    run = tmp_path / "run"
    argv = [str(arg) for arg in _train_args("vit_tiny_digits", run)]
    assert cli.main(argv) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert not run.exists() or not [p for p in run.iterdir() if p.name != "tensorboard"]


def test_a_second_train_on_the_same_output_is_refused_at_once(tmp_path):
    run = tmp_path / "run"
    with runs.RunLock(str(run)):
        assert (run / ".lock").read_text().strip() == str(os.getpid())
        second = _cli(*_train_args("vit_tiny_digits", run), cwd=tmp_path)
        assert second.returncode == 2 and "Traceback" not in second.stderr
        assert f"being trained by another process (pid {os.getpid()})" in second.stderr
        assert not (run / "recipe.json").exists()
    assert not run.exists()  # the lock made the directory and took it away again


def test_an_unknown_export_format_is_refused_before_the_run_is_read(tmp_path):
    with pytest.raises(ValueError, match="Received: format='tflite'"):
        runs.export("/no/such/run", format="tflite")
    with pytest.raises(ValueError, match="Received: precision='int8', format='hf'"):
        runs.export("/no/such/run", format="hf", precision="int8")
    with pytest.raises(ValueError, match="Received: precision='int4'"):
        runs.export("/no/such/run", format="litert", precision="int4")
    with pytest.raises(ValueError, match=f"nor a SavedModel. Received: exported='{tmp_path}'"):
        runs.evaluate("/no/such/run", exported=str(tmp_path))


def test_export_refuses_an_output_it_did_not_write_and_keeps_it(tmp_path):
    import re

    from keras_attn.zoo.recipe import load_recipe

    # A ViT run (its recipe: the refusal comes before the model is read).
    run = tmp_path / "run"
    run.mkdir()
    runs.write_json(str(run / "recipe.json"),
                    load_recipe(zoo_files.recipe_paths()["vit_tiny_digits"], []))
    output = tmp_path / "my_project"
    output.mkdir()
    (output / "config.json").write_text('{"mine": true}')
    (output / "notes.txt").write_text("mine")
    before = {p.name: p.read_text() for p in output.iterdir()}
    message = (f"`output` {output} is not empty and is not a Hugging Face directory "
               f"written by keras_attn")
    # In Python, naming the argument...
    with pytest.raises(ValueError, match=re.escape(message) + r".*" + re.escape(
            "(it has no model.safetensors): it holds 'config.json', 'notes.txt'. Nothing was "
            f"changed; give a new or empty directory, or one that holds such an export. "
            f"Received: output={str(output)!r}")):
        runs.export(str(run), output=str(output), format="hf")
    # ... and from the command line, naming the flag: status 2, no traceback.
    result = _cli("export", run, "--format", "hf", "--output", output, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    message = message.replace("`output`", "`output` (--output)")
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert {p.name: p.read_text() for p in output.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my_project", "run"]


def test_a_run_whose_recipe_json_is_damaged_is_named(tmp_path, capsys):
    # A run's recipe.json cut short or not UTF-8 (edited by hand): exit 2
    # naming the file, not a JSONDecodeError that names nothing.
    run = tmp_path / "run"
    run.mkdir()
    for content, said in ((b'{"family": "vit", "task"', "is not valid JSON: "),
                          (b'{"name": "caf\xe9"}', "is not UTF-8 JSON: the byte b'\\xe9'")):
        (run / "recipe.json").write_bytes(content)
        assert cli.main(["evaluate", str(run)]) == 2
        err = capsys.readouterr().err
        assert f"{run / 'recipe.json'} {said}" in err, err
        assert "Traceback" not in err
