"""What an ONNX / LiteRT export refuses: damaged files (checked against the
sha256 serving.json records), calls that do not fit serving.json (checked
before the runtime sees them: LiteRT's interpreter corrupts its heap on a
call after a bad one), an export of another run under `evaluate`, and a
quantized Keras model sent to the LiteRT converter. One small export per
format, shared by the module."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import keras_attn.cli as cli
from _families import FAMILIES
from keras_attn.data import text
from keras_attn.export import export_image_classifier
from keras_attn.export import export_text_classifier
from keras_attn.export.portable import Artifact
from keras_attn.export.text_runtime import TextClassifierArtifact
from keras_attn.models.bert import BertSequenceClassifier
from keras_attn.zoo import runs
from test_case import to_numpy

# One worker (`-n 2 --dist loadgroup`): the module's exports are converted
# once, not once on each worker.
pytestmark = [pytest.mark.tf_only, pytest.mark.xdist_group("export_integrity")]

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat",
         "dog", "##s", "a", "run", "##ning", ".", ","]
FILES = {"onnx": "model.onnx", "litert": "model.tflite"}


def _randomize(model, seed=0):
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(variable.dtype))
    return model


def _tiny_vit():
    """The table's ViT on 8x8x3 images (the requests below name that shape),
    one block 8 wide: each block is converted to ONNX and LiteRT."""
    return FAMILIES["vit"].build(image_size=8, num_layers=1, hidden_dim=8)


def _tiny_bert():
    """The table's BERT on `VOCAB`, one block 8 wide, as `_tiny_vit`."""
    return FAMILIES["bert"].backbone(vocabulary_size=len(VOCAB), num_layers=1, hidden_dim=8)


def _softmax(logits):
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """A tiny ViT (8x8x3 images) and a tiny BERT classifier, each in ONNX
    and LiteRT, with a valid batch and the Keras model's answer to it."""
    root = tmp_path_factory.mktemp("exports")
    vit = _randomize(_tiny_vit())
    backbone = _tiny_bert()
    bert = _randomize(BertSequenceClassifier(backbone, num_classes=3), seed=1)
    tokenizer = text.make_tokenizer(VOCAB)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (2, 8, 8, 3)).astype("uint8")
    token_ids = rng.integers(5, len(VOCAB), (2, 6)).astype("int32")
    ids = {"token_ids": token_ids, "segment_ids": np.zeros_like(token_ids),
           "padding_mask": np.ones_like(token_ids)}
    result = {"images": images, "ids": ids, "vit": vit,
              "image_expected": _softmax(to_numpy(vit(images.astype("float32")))),
              "ids_expected": _softmax(to_numpy(bert(ids)))}
    assert np.ptp(result["image_expected"], axis=0).max() > 1e-3  # answers that differ
    for format in ("onnx", "litert"):
        result["vit", format] = pathlib.Path(export_image_classifier(
            vit, root / f"vit_{format}", format=format))
        result["bert", format] = pathlib.Path(export_text_classifier(
            bert, tokenizer, root / f"bert_{format}", sequence_length=8, format=format))
    return result


def _copy(path, tmp_path, name="copy"):
    return shutil.copytree(path, tmp_path / name)


# === Files checked against serving.json ===


def test_serving_json_records_each_file_sha256(exports):
    import hashlib

    for family, format in (("vit", "onnx"), ("bert", "litert")):
        path = exports[family, format]
        contract = json.loads((path / "serving.json").read_text())
        # A WordPiece export carries its vocabulary and the tokenizer.json
        # rebuilt from it (TextClassifierArtifact's): both are recorded.
        expected = [FILES[format]] + (["tokenizer.json", "vocab.txt"] if family == "bert" else [])
        assert sorted(contract["sha256"]) == sorted(expected)
        for name, digest in contract["sha256"].items():
            assert hashlib.sha256((path / name).read_bytes()).hexdigest() == digest
    # The inputs that share their length say so.
    contract = json.loads((exports["bert", "onnx"] / "serving.json").read_text())
    assert [spec["axes"] for spec in contract["inputs"]] == [["batch", "length"]] * 3
    contract = json.loads((exports["vit", "onnx"] / "serving.json").read_text())
    assert contract["inputs"][0]["axes"] == ["batch", None, None, None]


@pytest.mark.parametrize("format", ["onnx", "litert"])
def test_the_image_contract_names_the_resize_the_loaders_use(exports, tmp_path, format):
    # serving.json said "uint8 pixels of the model's size" only: it names how an
    # image is made that size, and that is what keras_attn.data's loaders (the
    # zoo's) do to an image file.
    import tensorflow as tf

    from keras_attn.data.images import image_files_pipeline

    resize = json.loads((exports["vit", format] / "serving.json").read_text())[
        "preprocessing"]["resize"]
    assert (resize["size"], resize["method"], resize["antialias"]) == ([8, 8], "bilinear", False)
    assert (resize["keep_aspect_ratio"], resize["crop"]) == (False, None)
    # A 20 x 12 file: shrunk, its aspect ratio not kept.
    pixels = np.random.default_rng(2).integers(0, 256, (20, 12, 3)).astype("uint8")
    (tmp_path / "image.png").write_bytes(tf.io.encode_png(pixels).numpy())
    loaded, _ = next(iter(image_files_pipeline([str(tmp_path / "image.png")], [0], 8)))
    served = tf.image.resize(pixels, resize["size"], method=resize["method"],
                             antialias=resize["antialias"])
    np.testing.assert_allclose(loaded[0].numpy(), served.numpy(), atol=1e-4)


@pytest.mark.parametrize("format", ["onnx", "litert"])
def test_a_flipped_byte_in_the_model_is_refused_by_name(exports, tmp_path, format):
    path = _copy(exports["vit", format], tmp_path)
    Artifact(path)  # the copy loads
    model = path / FILES[format]
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0x01
    model.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"{FILES[format]} is damaged or was replaced: "
                                         r"its sha256 is [0-9a-f]{64}"):
        Artifact(path)


def test_a_changed_vocabulary_is_refused_by_name(exports, tmp_path):
    path = _copy(exports["bert", "onnx"], tmp_path)
    vocab = path / "vocab.txt"
    vocab.write_text(vocab.read_text().replace("cat", "cow"))
    with pytest.raises(ValueError, match="vocab.txt is damaged or was replaced"):
        Artifact(path)
    # The tokenizer.json TextClassifierArtifact reads is held the same way.
    path = _copy(exports["bert", "onnx"], tmp_path, "tokenizer")
    tokenizer = path / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text().replace('"cat"', '"cow"'))
    with pytest.raises(ValueError, match="tokenizer.json is damaged or was replaced"):
        TextClassifierArtifact(path)


def test_damaged_exports_are_value_errors_naming_the_file(exports, tmp_path):
    source = exports["vit", "onnx"]

    truncated = _copy(source, tmp_path, "truncated")
    data = (truncated / "model.onnx").read_bytes()
    (truncated / "model.onnx").write_bytes(data[: len(data) // 3])
    with pytest.raises(ValueError, match="model.onnx is damaged or was replaced"):
        Artifact(truncated)

    missing = _copy(source, tmp_path, "missing")
    os.remove(missing / "model.onnx")
    with pytest.raises(ValueError, match=rf"{missing / 'model.onnx'} does not exist"):
        Artifact(missing)

    invalid = _copy(source, tmp_path, "invalid")
    (invalid / "serving.json").write_text('{"format": "onnx", ')
    with pytest.raises(ValueError, match=rf"{invalid / 'serving.json'} is not valid JSON"):
        Artifact(invalid)

    (invalid / "serving.json").unlink()
    with pytest.raises(ValueError, match=rf"{invalid / 'serving.json'} does not exist"):
        Artifact(invalid)

    contract = json.loads((source / "serving.json").read_text())
    renamed = _copy(source, tmp_path, "renamed")
    contract["outputs"][0]["name"] = "probs"
    (renamed / "serving.json").write_text(json.dumps(contract))
    with pytest.raises(ValueError, match=r"describes the outputs \['probs'\]; .*model.onnx has "
                                         r"\['probabilities'\]"):
        Artifact(renamed)

    unchecked = _copy(source, tmp_path, "unchecked")
    del contract["sha256"]
    (unchecked / "serving.json").write_text(json.dumps(contract))
    with pytest.raises(ValueError, match="serving.json lacks sha256"):
        Artifact(unchecked)


# === Calls checked against serving.json ===

IMAGE_REQUESTS = [  # (inputs, what the message names)
    ({"images": np.zeros((1, 9, 8, 3), "uint8")}, r"images.shape=\(1, 9, 8, 3\)"),
    ({"images": np.zeros((0, 8, 8, 3), "uint8")}, r"a batch of 0.*images.shape=\(0, 8, 8, 3\)"),
    ({"images": np.zeros((1, 8, 8, 1), "uint8")}, r"3 on axis 3.*images.shape=\(1, 8, 8, 1\)"),
    ({"images": np.zeros((8, 8, 3), "uint8")}, r"rank 4.*images.shape=\(8, 8, 3\)"),
    ({"images": np.zeros((1, 8, 8, 3), "float32")}, r"must be uint8.*dtype=float32"),
    ({"pixels": np.zeros((1, 8, 8, 3), "uint8")}, r"must be \['images'\]"),
]


def _id_requests():
    ids = np.full((1, 5), 6, "int32")
    return [
        ({"token_ids": ids, "segment_ids": ids[:, :4] * 0, "padding_mask": ids * 0 + 1},
         r"`token_ids` and `segment_ids` must have the same length.*segment_ids.shape=\(1, 4\)"),
        ({"token_ids": ids, "segment_ids": ids * 0, "padding_mask": np.ones((2, 5), "int32")},
         r"`token_ids` and `padding_mask` must have the same batch.*padding_mask.shape=\(2, 5\)"),
        ({"token_ids": ids[:, :0], "segment_ids": ids[:, :0], "padding_mask": ids[:, :0]},
         r"`token_ids` is empty \(size 0 on axis 1\).*token_ids.shape=\(1, 0\)"),
        ({"token_ids": ids[:0], "segment_ids": ids[:0], "padding_mask": ids[:0]},
         r"a batch of 0"),
        ({"token_ids": ids.astype("int64"), "segment_ids": ids, "padding_mask": ids},
         r"`token_ids` must be int32.*dtype=int64"),
    ]


def test_bad_onnx_requests_are_value_errors_and_the_session_still_answers(exports):
    for family, good, requests, expected in (
            ("vit", {"images": exports["images"]}, IMAGE_REQUESTS, exports["image_expected"]),
            ("bert", exports["ids"], _id_requests(), exports["ids_expected"])):
        artifact = Artifact(exports[family, "onnx"])
        before = artifact(**good)["probabilities"]
        np.testing.assert_allclose(before, expected, atol=1e-4)
        for inputs, message in requests:
            with pytest.raises(ValueError, match=message):
                artifact(**inputs)
        np.testing.assert_array_equal(artifact(**good)["probabilities"], before)


LITERT_REQUESTS = r"""
import json, sys
import numpy as np
from keras_attn.export.portable import Artifact

reports = []
for job in json.loads(sys.argv[1]):
    with np.load(job["good"]) as stored:
        good = dict(stored)
    artifact = Artifact(job["path"])
    before = artifact(**good)["probabilities"]
    errors = []
    with np.load(job["requests"]) as stored:
        requests = {}
        for key in stored.files:
            index, name = key.split("/", 1)
            requests.setdefault(int(index), {})[name] = stored[key]
    for index in sorted(requests):
        try:
            artifact(**requests[index])
            errors.append(None)
        except ValueError as error:
            errors.append(str(error))
        # The interpreter still answers, the same, after each refused call.
        after = artifact(**good)["probabilities"]
        assert np.array_equal(after, before), (job["path"], index, after, before)
    reports.append({"before": before.tolist(), "errors": errors})
print("RESULT" + json.dumps(reports))
"""


def _litert_requests(exports, family):
    good = {"images": exports["images"]} if family == "vit" else exports["ids"]
    return good, IMAGE_REQUESTS if family == "vit" else _id_requests()


@pytest.fixture(scope="module")
def litert_reports(exports, tmp_path_factory):
    """Each family's bad requests to its LiteRT export, in one subprocess
    (one TensorFlow start-up for both): before the checks, these calls
    ended the process ("free(): double free", SIGSEGV)."""
    root = tmp_path_factory.mktemp("litert_requests")
    jobs = []
    for family in ("vit", "bert"):
        good, requests = _litert_requests(exports, family)
        np.savez(root / f"{family}_good.npz", **good)
        np.savez(root / f"{family}_requests.npz", **{
            f"{index}/{name}": value for index, (inputs, _) in enumerate(requests)
            for name, value in inputs.items()})
        jobs.append({"path": str(exports[family, "litert"]),
                     "good": str(root / f"{family}_good.npz"),
                     "requests": str(root / f"{family}_requests.npz")})
    result = subprocess.run(
        [sys.executable, "-c", LITERT_REQUESTS, json.dumps(jobs)],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(zip(("vit", "bert"), json.loads(result.stdout.split("RESULT")[-1])))


@pytest.mark.parametrize("family", ["vit", "bert"])
def test_bad_litert_requests_are_value_errors_and_the_interpreter_survives(
        exports, litert_reports, family):
    import re

    _, requests = _litert_requests(exports, family)
    report = litert_reports[family]
    expected = exports["image_expected"] if family == "vit" else exports["ids_expected"]
    np.testing.assert_allclose(report["before"], expected, atol=1e-4)
    assert len(report["errors"]) == len(requests)
    for (_, message), error in zip(requests, report["errors"]):
        assert error is not None and re.search(message, error), (message, error)


# === A quantized Keras model and LiteRT ===


def test_an_int8_quantized_vit_is_refused_by_name_before_the_litert_converter(tmp_path):
    import warnings

    vit = _tiny_vit()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the layers without a quantized form, named by Keras
        vit.quantize("int8")
    with pytest.raises(ValueError, match=r"model.quantize\('int8'\).* cannot be converted to "
                                         r"LiteRT.*precision='int8'.*format='litert'"):
        export_image_classifier(vit, tmp_path / "litert", format="litert")
    assert os.listdir(tmp_path) == []  # refused before anything was written


# === The SavedModel's serve_ids ===


def test_serve_ids_refuses_inputs_of_different_lengths_by_name(tmp_path):
    import tensorflow as tf  # alone: the SavedModel's tokenizer is core TensorFlow ops

    backbone = _tiny_bert()
    model = _randomize(BertSequenceClassifier(backbone, num_classes=3))
    path = export_text_classifier(model, text.make_tokenizer(VOCAB), str(tmp_path / "sm"),
                                  sequence_length=8)
    loaded = tf.saved_model.load(path)
    ids = tf.constant([[2, 5, 6, 7, 3]], tf.int32)
    expected = _softmax(to_numpy(model({"token_ids": ids, "segment_ids": tf.zeros_like(ids),
                                        "padding_mask": tf.ones_like(ids)})))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"`segment_ids` must have the shape \(B, T\) of `token_ids`"):
        loaded.serve_ids(ids, tf.zeros((1, 4), tf.int32), tf.ones_like(ids))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"`padding_mask` must have the shape \(B, T\) of `token_ids`"):
        loaded.serve_ids(ids, tf.zeros_like(ids), tf.ones((2, 5), tf.int32))
    got = loaded.serve_ids(ids, tf.zeros_like(ids), tf.ones_like(ids)).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)


# === The export directory: an earlier export replaced, nothing else ===


def test_an_earlier_export_is_replaced_and_any_other_directory_kept(exports, tmp_path):
    import re

    from keras_attn.export.saved_model import PORTABLE_EXPORT
    from keras_attn.export.saved_model import check_replaceable

    vit = exports["vit"]
    # Refused before the conversion, whatever the format, and left as it is:
    # a directory of someone else's, an export with a file it does not
    # write, a SavedModel (another kind), and for a SavedModel an ONNX export.
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    extra = _copy(exports["vit", "onnx"], tmp_path, "extra")
    (extra / "README.md").write_text("card")
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "saved_model.pb").write_bytes(b"pb")
    cases = [(notes, "litert", "it has no serving.json", "'todo.txt'"),
             (extra, "onnx", "the export does not write 'README.md'",
              "'README.md', 'model.onnx', 'serving.json'"),
             (saved, "onnx", "it has no serving.json", "'saved_model.pb'"),
             (extra, "saved_model", "it has no saved_model.pb",
              "'README.md', 'model.onnx', 'serving.json'")]
    for path, format, reason, shown in cases:
        before = {p.name: p.read_bytes() for p in path.iterdir()}
        what = ("a SavedModel (" if format == "saved_model"
                else "an ONNX or LiteRT export (serving.json and the files it lists)")
        with pytest.raises(ValueError, match=re.escape(f"`path` {path} is not empty and is not "
                                                       f"{what}") + r".*" + re.escape(
                f"({reason}): it holds {shown}. Nothing was changed")):
            export_image_classifier(vit, path, format=format)
        assert {p.name: p.read_bytes() for p in path.iterdir()} == before
    # An earlier export (its serving.json marked) is replaced, and a sibling
    # named like the old move-aside (earlier.old) is not touched.
    earlier = _copy(exports["vit", "onnx"], tmp_path, "earlier")
    contract = json.loads((earlier / "serving.json").read_text())
    (earlier / "serving.json").write_text(json.dumps(dict(contract, marker="earlier")))
    check_replaceable(earlier, PORTABLE_EXPORT)  # what it accepts, a new export replaces
    (tmp_path / "earlier.old").mkdir()
    (tmp_path / "earlier.old" / "keep.txt").write_text("kept")
    export_image_classifier(vit, earlier, format="onnx")
    assert "marker" not in json.loads((earlier / "serving.json").read_text())
    np.testing.assert_allclose(Artifact(earlier)(images=exports["images"])["probabilities"],
                               exports["image_expected"], atol=1e-5)
    assert (tmp_path / "earlier.old" / "keep.txt").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "earlier", "earlier.old", "extra", "notes", "saved"]  # no leftovers


# === evaluate --exported: the export names its run ===


def _run_dir(path, seed, model_bytes=None):
    from keras_attn.zoo.recipe import load_recipe
    from keras_attn._base.zoo_files import recipe_paths

    recipe = load_recipe(recipe_paths()["vit_tiny_digits"], [f"training.seed={seed}"])
    os.makedirs(path)
    runs.write_json(os.path.join(path, "recipe.json"), recipe)
    if model_bytes is not None:
        (path / "model.keras").write_bytes(model_bytes)
    return path


def test_evaluate_refuses_the_export_of_another_run_naming_both(exports, tmp_path, capsys):
    run_c = _run_dir(tmp_path / "run_c", seed=1)
    run_d = _run_dir(tmp_path / "run_d", seed=2)
    exported = _copy(exports["vit", "onnx"], tmp_path, "d_onnx")

    # Not stamped (written by export_image_classifier, not `keras-attn export`).
    with pytest.raises(ValueError, match=r"serving.json does not name the run"):
        runs.evaluate(str(run_c), exported=str(exported))

    runs.stamp_export(str(run_d), str(exported))
    contract = json.loads((exported / "serving.json").read_text())
    assert contract["run"]["recipe"] == "vit_tiny_digits"
    assert contract["run"]["directory"] == str(run_d)
    Artifact(exported)  # the stamp leaves the files' checksums valid
    runs.check_export_origin(str(run_d), str(exported))  # its own run: accepted
    message = (rf"{exported} is an export of the run {run_d} \(recipe 'vit_tiny_digits', "
               rf"recipe.json sha256 [0-9a-f]{{12}}...\), not of {run_c} ")
    with pytest.raises(ValueError, match=message):
        runs.evaluate(str(run_c), exported=str(exported))
    # The command line: status 2, the message, no traceback.
    capsys.readouterr()
    assert cli.main(["evaluate", str(run_c), "--exported", str(exported)]) == 2
    err = capsys.readouterr().err
    assert str(run_d) in err and str(run_c) in err and "Traceback" not in err

    # A SavedModel names its run in run.json (refused before TensorFlow loads it).
    saved = tmp_path / "d_saved_model"
    saved.mkdir()
    (saved / "saved_model.pb").write_bytes(b"")
    runs.stamp_export(str(run_d), str(saved))
    with pytest.raises(ValueError, match=rf"{saved} is an export of the run {run_d} "):
        runs.evaluate(str(run_c), exported=str(saved))


def test_evaluate_refuses_an_export_of_another_model_of_the_same_recipe(exports, tmp_path):
    run_e = _run_dir(tmp_path / "run_e", seed=1, model_bytes=b"model of e")
    run_f = _run_dir(tmp_path / "run_f", seed=1, model_bytes=b"model of f")
    exported = _copy(exports["vit", "litert"], tmp_path, "f_litert")
    runs.stamp_export(str(run_f), str(exported), source=str(run_f / "model.keras"))
    runs.check_export_origin(str(run_f), str(exported))
    with pytest.raises(ValueError, match=rf"not of {run_e / 'model.keras'} \(sha256"):
        runs.evaluate(str(run_e), exported=str(exported))


def test_evaluate_names_a_damaged_export(exports, tmp_path):
    run = _run_dir(tmp_path / "run", seed=1)
    exported = _copy(exports["vit", "onnx"], tmp_path, "onnx")
    runs.stamp_export(str(run), str(exported))
    data = (exported / "model.onnx").read_bytes()
    (exported / "model.onnx").write_bytes(data[:-100])
    with pytest.raises(ValueError, match="model.onnx is damaged or was replaced"):
        runs.evaluate(str(run), exported=str(exported))
    (exported / "serving.json").write_text("not json")
    with pytest.raises(ValueError, match="serving.json is not valid JSON"):
        runs.evaluate(str(run), exported=str(exported))
