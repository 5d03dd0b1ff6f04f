"""ONNX and LiteRT export of every family: each artifact
run in its own runtime (onnxruntime, ai_edge_litert) in a fresh process
that imports neither TensorFlow nor Keras, against the Keras model."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from _families import FAMILIES
from keras_attn.data import text
from keras_attn.export import export_image_classifier
from keras_attn.export import export_speech_recognizer
from keras_attn.export import export_text_classifier
from keras_attn.export import export_translator
from keras_attn.export.portable import Artifact
from keras_attn.export.portable import export_portable
from keras_attn.models.bert import BertSequenceClassifier
from keras_attn.models.conformer import build_conformer
from keras_attn.models.transformer import build_transformer
from keras_attn.models.transformer.decoding import transformer_beam_search
from keras_attn.models.vit import build_vit
from test_case import to_numpy

pytestmark = pytest.mark.tf_only

RUNNER = os.path.join(os.path.dirname(__file__), "_run_portable.py")
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat",
         "dog", "##s", "a", "run", "##ning", ".", ","]
TEXTS = ["the cat sat on the mat .", "a dog", "dogs running , cats sat on a mat . the end"]


def run_in_runtimes(tmp_path, jobs):
    """`jobs`: `[(artifact dir, {input: array})]` -> per job the outputs
    dict, or the runtime's error message (a string)."""
    spec = []
    for index, (path, inputs) in enumerate(jobs):
        np.savez(tmp_path / f"in{index}.npz", **inputs)
        spec.append({"path": str(path), "inputs": str(tmp_path / f"in{index}.npz"),
                     "outputs": str(tmp_path / f"out{index}.npz")})
    result = subprocess.run([sys.executable, RUNNER, json.dumps(spec)], capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    imported = json.loads(result.stdout.split("IMPORTED")[-1])
    assert imported == [], f"the serving process imported {imported}"
    results = []
    for job in spec:
        if os.path.exists(job["outputs"] + ".json"):
            with open(job["outputs"] + ".json") as stream:
                results.append(json.load(stream)["error"])
        else:
            with np.load(job["outputs"]) as stored:
                results.append(dict(stored))
    return results


def randomize(model, seed=0):
    """Trained-looking weights: the classifier heads start at zero (every
    answer uniform), which would hide any difference."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(variable.dtype))
    return model


def softmax(logits):
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.large
def test_image_classifier_runs_the_same_in_onnx_runtime_and_litert(tmp_path):
    # One block: each block is the same code in the graph, and the
    # converters' time grows with the graph (five conversions); wide enough
    # that the weights, not the graph, make most of each file (sizes below).
    vit = build_vit("vit_tiny_16", image_size=16, patch_size=4, num_channels=3, num_layers=1,
                    hidden_dim=64, num_heads=2, intermediate_dim=128, num_classes=5)
    randomize(vit)
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 256, (n, 16, 16, 3)).astype("uint8") for n in (1, 4)]
    expected = [softmax(to_numpy(vit(b.astype("float32")))) for b in batches]
    assert np.ptp(expected[1], axis=0).max() > 1e-3  # the examples get different answers

    paths = {}
    for format, precision in (("onnx", "float32"), ("onnx", "float16"), ("litert", "float32"),
                              ("litert", "float16"), ("litert", "int8")):
        paths[format, precision] = export_image_classifier(
            vit, tmp_path / f"{format}_{precision}", format=format, precision=precision)
    for path in paths.values():  # nothing left beside the artifacts
        assert sorted(os.listdir(path)) in (["model.onnx", "serving.json"],
                                            ["model.tflite", "serving.json"])
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in paths.values())
    with open(os.path.join(paths["onnx", "float32"], "serving.json")) as stream:
        contract = json.load(stream)
    assert contract["inputs"] == [{"name": "images", "dtype": "uint8", "shape": [-1, 16, 16, 3],
                                   "axes": ["batch", None, None, None]}]
    assert contract["outputs"] == [{"name": "probabilities", "dtype": "float32",
                                    "shape": [-1, 5]}]

    jobs = [(paths[key], {"images": b}) for key in paths for b in batches]
    # Bad input, one per format: float pixels, and images of another size.
    jobs.append((paths["onnx", "float32"], {"images": batches[0].astype("float32")}))
    jobs.append((paths["litert", "float32"], {"images": batches[0].astype("float32")}))
    jobs.append((paths["onnx", "float32"], {"images": np.zeros((1, 20, 20, 3), "uint8")}))
    jobs.append((paths["litert", "float32"], {"images": np.zeros((1, 20, 20, 3), "uint8")}))
    results = run_in_runtimes(tmp_path, jobs)

    for (key, b), got in zip([(key, b) for key in paths for b in range(2)], results):
        assert isinstance(got, dict), (key, got)
        assert got["probabilities"].shape == expected[b].shape
        if key[1] == "float32":
            np.testing.assert_allclose(got["probabilities"], expected[b], atol=1e-4,
                                       err_msg=str(key))
        else:  # reduced precision: probabilities still, the drop is measured elsewhere
            np.testing.assert_allclose(got["probabilities"].sum(-1), 1.0, atol=1e-3)
    bad = results[len(paths) * 2:]
    assert all(isinstance(message, str) for message in bad), bad
    assert "data type" in bad[0] and "uint8" in bad[0], bad[0]
    assert "UINT8" in bad[1], bad[1]
    assert "Got invalid dimensions" in bad[2] or "dimension" in bad[2], bad[2]
    assert bad[3].startswith("RuntimeError"), bad[3]  # LiteRT: a RESHAPE that fails

    # Reduced precision: the weights are stored smaller.
    size = {key: os.path.getsize(os.path.join(p, "model.onnx" if key[0] == "onnx" else
                                              "model.tflite")) for key, p in paths.items()}
    # (ONNX: the tiny graph's node names weigh as much as its weights.)
    weights = 4 * vit.count_params()
    assert size["onnx", "float32"] - size["onnx", "float16"] > 0.4 * weights
    assert size["litert", "float16"] < 0.75 * size["litert", "float32"]
    assert size["litert", "int8"] < size["litert", "float16"]

    # The in-package runner gives the same numbers, with any thread count.
    for key in (("onnx", "float32"), ("litert", "float32")):
        for threads in (None, 1):
            got = Artifact(paths[key], num_threads=threads)(images=batches[1])["probabilities"]
            np.testing.assert_allclose(got, expected[1], atol=1e-4)


@pytest.mark.large
def test_text_classifier_follows_its_contract_in_onnx_runtime_and_litert(tmp_path):
    import keras_hub
    import tensorflow as tf

    # The table's, on VOCAB, 16 positions (the contract's maximum, below); one
    # block: see the ViT's.
    backbone = FAMILIES["bert"].backbone(vocabulary_size=len(VOCAB), num_layers=1,
                                         max_sequence_length=16)
    model = randomize(BertSequenceClassifier(backbone, num_classes=3))
    tokenizer = text.make_tokenizer(VOCAB)
    paths = {format: export_text_classifier(model, tokenizer, tmp_path / format,
                                            sequence_length=12, format=format,
                                            class_names=["news", "sport", "weather"])
             for format in ("onnx", "litert")}
    assert sorted(os.listdir(paths["onnx"])) == ["model.onnx", "serving.json", "tokenizer.json",
                                                 "vocab.txt"]

    # A server follows the contract: the tokenizer rebuilt from vocab.txt and
    # serving.json, [CLS] text [SEP] padded to sequence_length.
    with open(os.path.join(paths["litert"], "serving.json")) as stream:
        contract = json.load(stream)
    assert contract["labels"] == ["news", "sport", "weather"]  # probability i's class
    pre = contract["preprocessing"]
    assert (pre["sequence_length"], pre["max_sequence_length"]) == (12, 16)
    served = keras_hub.tokenizers.WordPieceTokenizer(
        vocabulary=os.path.join(paths["litert"], "vocab.txt"), lowercase=pre["lowercase"],
        strip_accents=pre["strip_accents"], suffix_indicator=pre["suffix_indicator"],
        oov_token=pre["oov_token"])
    token_ids = np.full((len(TEXTS), pre["sequence_length"]), pre["pad_id"], "int32")
    for row, ids in enumerate(served(TEXTS)):
        ids = [pre["start_id"]] + list(np.asarray(ids))[: pre["sequence_length"] - 2] + [pre["end_id"]]
        token_ids[row, : len(ids)] = ids
    packed = {"token_ids": token_ids, "segment_ids": np.zeros_like(token_ids),
              "padding_mask": (token_ids != pre["pad_id"]).astype("int32")}
    # ... is what the SavedModel's string signature packs.
    reference = [np.asarray(x) for x in text.pack_pairs(tokenizer, 12)(tf.constant(TEXTS))]
    np.testing.assert_array_equal(packed["token_ids"], reference[0])
    np.testing.assert_array_equal(packed["padding_mask"], reference[2])
    # ... and what TextClassifierArtifact packs from the tokenizer.json beside.
    from keras_attn.export import TextClassifierArtifact

    served_text = TextClassifierArtifact(paths["onnx"])
    assert served_text.labels == ["news", "sport", "weather"]
    for name, value in served_text.pack(TEXTS).items():
        np.testing.assert_array_equal(value, packed[name])

    # Another length (7: any length up to the maximum), and one past it (20).
    short = {name: value[:, :7].copy() for name, value in packed.items()}
    short["token_ids"][:, 6] = np.where(short["padding_mask"][:, 6], 3, 0)
    rng = np.random.default_rng(1)
    long_ids = rng.integers(5, len(VOCAB), (2, 20)).astype("int32")
    too_long = {"token_ids": long_ids, "segment_ids": np.zeros_like(long_ids),
                "padding_mask": np.ones_like(long_ids)}
    expected = [softmax(to_numpy(model(batch))) for batch in (packed, short)]
    assert np.ptp(expected[0], axis=0).max() > 1e-4

    jobs = [(paths[f], batch) for f in ("onnx", "litert") for batch in (packed, short)]
    jobs += [(paths[f], too_long) for f in ("onnx", "litert")]
    results = run_in_runtimes(tmp_path, jobs)
    for index, got in enumerate(results[:4]):
        assert isinstance(got, dict), got
        np.testing.assert_allclose(got["probabilities"], expected[index % 2], atol=1e-4)
    # Past max_sequence_length: the runtime's error or NaN probabilities
    # (the position table is NaN past its end), never a finite answer.
    for got in results[4:]:
        assert isinstance(got, str) or np.isnan(got["probabilities"]).all(), got


@pytest.mark.large
def test_speech_recognizer_decodes_the_same_tokens_in_onnx_runtime_and_litert(tmp_path):
    # One block and 5-tap convolutions (conformer_tiny: 2 and 15): each block
    # and tap is the same code in the graph, and the converters' time grows
    # with the graph (four exports: 150 -> 87 s on a loaded machine).
    model = build_conformer("conformer_tiny", vocabulary_size=12, num_layers=1, kernel_size=5)
    rng = np.random.default_rng(0)
    for variable in model.trainable_weights:  # varied tokens, finite logits
        if "kernel" in variable.path or "embeddings" in variable.path:
            fan_in = variable.shape[-2] if len(variable.shape) > 1 else 1
            variable.assign(rng.normal(0, 0.3 / np.sqrt(fan_in), variable.shape)
                            .astype(variable.dtype))
    batches = []
    for samples, lengths in ((8000, [8000, 5000, 2600]), (3000, [3000])):
        waveform = rng.normal(0, 0.1, (len(lengths), samples)).astype("float32")
        for row, length in enumerate(lengths):
            waveform[row, length:] = rng.normal(0, 0.1, samples - length)  # any padding
        batches.append({"waveform": waveform, "waveform_length": np.array(lengths, "int32")})
    expected = [(model(b)["logits"], [[t for t in row if t >= 0] for row in
                                       np.asarray(model.decode(b)).tolist()]) for b in batches]
    assert len({tuple(row) for row in expected[0][1]}) == 3  # three different transcripts
    paths = {f: export_speech_recognizer(model, tmp_path / f, format=f) for f in ("onnx", "litert")}
    assert all(layer.stft == "fft" for layer in model._flatten_layers()
               if type(layer).__name__ == "LogMelFeatures")  # the switch is put back
    # float16 LiteRT stores every constant in float16: a 1e-10 power floor
    # once became 0 there and made every logit NaN (WER 1.0).
    for format in ("onnx", "litert"):
        paths[format, "float16"] = export_speech_recognizer(
            model, tmp_path / f"{format}16", format=format, precision="float16")

    # Bad input: a length past the waveform gives -2 rows, never a transcript.
    bad = dict(batches[1], waveform_length=np.array([3500], "int32"))
    jobs = [(paths[f], b) for f in paths for b in batches + [bad]]
    results = run_in_runtimes(tmp_path, jobs)
    for index, got in enumerate(results):
        assert isinstance(got, dict), got
        if index % 3 == 2:
            assert (got["token_ids"] == -2).all(), got["token_ids"]
            continue
        logits, tokens = expected[index % 3]
        tolerance = 0.05 if index >= 6 else 1e-4  # float16 weights (both formats)
        np.testing.assert_allclose(got["logits"], to_numpy(logits), atol=tolerance)
        assert [[t for t in row if t >= 0] for row in got["token_ids"].tolist()] == tokens
    with pytest.raises(ValueError, match="strategy='beam_search', format='onnx'"):
        export_speech_recognizer(model, tmp_path / "beam", strategy="beam_search", format="onnx")


@pytest.mark.large
def test_parakeet_front_end_serves_the_logits_of_the_model_in_every_format(tmp_path):
    """A FastConformer with Parakeet's front end (`ParakeetLogMelFeatures`):
    its FFT (`keras.ops.stft`) once made an ONNX file that onnxruntime
    refuses to load (tf2onnx cannot take the Real / Imag ops after an
    RFFT); the export computes it as a convolution, as for `LogMelFeatures`.
    SavedModel, ONNX and LiteRT serve the Keras model's logits and tokens
    on a padded batch of two lengths."""
    import tensorflow as tf

    model = build_conformer("parakeet_ctc_tiny", vocabulary_size=12, num_layers=1,
                            hidden_dim=16, subsampling_filters=8, kernel_size=5,
                            num_mel_bins=20, freq_mask_width=8)
    rng = np.random.default_rng(0)
    for variable in model.trainable_weights:
        if "kernel" in variable.path or "embeddings" in variable.path:
            fan_in = variable.shape[-2] if len(variable.shape) > 1 else 1
            variable.assign(rng.normal(0, 0.3 / np.sqrt(fan_in), variable.shape)
                            .astype(variable.dtype))
    # Tones that change every 50 ms, the second row reversed and cut at 5000
    # samples (noise after it: any padding).
    tones = np.repeat(rng.uniform(100, 4000, 10), 800)
    waveform = 0.3 * np.sin(2 * np.pi * np.cumsum(tones) / 16000) + rng.normal(0, 0.02, (2, 8000))
    waveform[1] = waveform[1, ::-1]
    waveform[1, 5000:] = rng.normal(0, 0.1, 3000)
    batch = {"waveform": waveform.astype("float32"),
             "waveform_length": np.array([8000, 5000], "int32")}
    # A head centred on the frames' mean logits, so that the tokens vary.
    head = model.get_layer("ctc_logits")
    kernel, bias = (to_numpy(w) for w in head.weights)
    head.set_weights([kernel, bias * 0])
    head.set_weights([kernel * 20, -20 * to_numpy(model(batch)["logits"])[0].mean(0)])
    logits = to_numpy(model(batch)["logits"])
    tokens = to_numpy(model.decode(batch))
    assert len({t for t in tokens.ravel().tolist() if t >= 0}) >= 2, tokens

    saved = tf.saved_model.load(str(export_speech_recognizer(model, tmp_path / "saved_model")))
    served = saved.serve(batch["waveform"], batch["waveform_length"])["token_ids"]
    np.testing.assert_array_equal(served.numpy(), tokens)
    paths = [export_speech_recognizer(model, tmp_path / f, format=f) for f in ("onnx", "litert")]
    for path, got in zip(paths, run_in_runtimes(tmp_path, [(p, batch) for p in paths])):
        assert isinstance(got, dict), got  # the runtime's error, if any
        np.testing.assert_allclose(got["logits"], logits, atol=1e-4, err_msg=str(path))
        np.testing.assert_array_equal(got["token_ids"], tokens)
    assert model.get_layer("log_mel").stft == "fft"  # the switch is put back


def _reversing_transformer():
    """A Transformer trained for three epochs to reverse 1-5 ids: random weights
    repeat one token whatever the source (every beam alike, no end), which
    would hide a search that went wrong. Learned positions: a source past
    the table is bad input too. One decoder block: each block's cache is
    the same code in the loop's body, and the three conversions' time
    grows with the graph (two blocks: 272 -> 156 s on a loaded machine)."""
    model = build_transformer(
        "transformer_base", vocabulary_size=13, hidden_dim=16, intermediate_dim=32, num_heads=2,
        num_encoder_layers=1, num_decoder_layers=1, max_sequence_length=10,
        position_embedding="learned", dropout=0.0)
    rng = np.random.default_rng(0)
    sources, targets = np.zeros((2048, 6), "int32"), np.zeros((2048, 7), "int32")
    for row in range(2048):
        words = rng.integers(3, 13, rng.integers(1, 6))
        sources[row, :len(words) + 1] = [*words, 2]
        targets[row, :len(words) + 2] = [1, *words[::-1], 2]
    model.compile(optimizer=keras.optimizers.Adam(3e-3))
    model.fit([sources, targets[:, :-1]], targets[:, 1:], batch_size=64, epochs=3, verbose=0)
    return model


@pytest.mark.large
def test_translator_searches_the_same_beams_in_onnx_runtime_and_litert(tmp_path):
    model = _reversing_transformer()
    batches = [np.array([[5, 6, 7, 2, 0, 0], [8, 9, 3, 10, 11, 2], [4, 2, 0, 0, 0, 0]], "int32"),
               np.array([[12, 3, 5, 2]], "int32")]
    expected = [[to_numpy(x) for x in transformer_beam_search(
        model, b, 1, 2, beam_width=3, max_length=10)] for b in batches]
    rows = [tuple(row) for row in expected[0][0].tolist()]
    assert len(set(rows)) == 3 and any(2 in row[:-1] for row in rows)  # varied, ends early
    paths = {f: export_translator(model, tmp_path / f, 1, 2, beam_width=3, format=f,
                                  vocabulary=[f"t{i}" for i in range(13)])
             for f in ("onnx", "litert")}
    # float16 weights, also inside the ONNX loop's body: the same beams.
    paths["onnx16"] = export_translator(model, tmp_path / "onnx16", 1, 2, beam_width=3,
                                        format="onnx", precision="float16")
    assert not any(getattr(layer, "portable_cache_write", False)
                   for layer in model._flatten_layers())  # the switch is put back
    contract = json.loads((tmp_path / "onnx" / "serving.json").read_text())
    assert contract["preprocessing"]["max_length"] == 10
    assert (tmp_path / "litert" / "vocab.txt").read_text().split() == [f"t{i}" for i in range(13)]

    # Bad input: an id outside the vocabulary, a source past the positions:
    # that row -2 and NaN, its batch mate as alone.
    bad = [np.array([[5, 13, 2], [5, 6, 2]], "int32"), np.full((1, 11), 5, "int32")]
    jobs = [(paths[f], {"source_ids": b}) for f in paths for b in batches + bad]
    results = run_in_runtimes(tmp_path, jobs)
    alone = [to_numpy(x) for x in transformer_beam_search(
        model, bad[0][1:], 1, 2, beam_width=3, max_length=10)]
    for index, got in enumerate(results):
        assert isinstance(got, dict), got
        if index % 4 < 2:
            tokens, scores = expected[index % 4]
            np.testing.assert_array_equal(got["tokens"], tokens)
            tolerance = 1e-4 if index < 8 else 5e-3  # onnx16: float16 weights
            np.testing.assert_allclose(got["scores"], scores, atol=tolerance)
        elif index % 4 == 2:
            assert (got["tokens"][0] == -2).all() and np.isnan(got["scores"][0])
            np.testing.assert_array_equal(got["tokens"][1:], alone[0])
            tolerance = 1e-4 if index < 8 else 5e-3
            np.testing.assert_allclose(got["scores"][1:], alone[1], atol=tolerance)
        else:
            assert (got["tokens"] == -2).all() and np.isnan(got["scores"]).all()
    with pytest.raises(ValueError, match="tokenizer=object, format='litert'"):
        export_translator(model, tmp_path / "t", 1, 2, tokenizer=object(), format="litert")


def test_refusals_name_the_argument(tmp_path):
    vit = FAMILIES["vit"].build()
    with pytest.raises(ValueError, match="format='tflite'"):
        export_image_classifier(vit, tmp_path / "a", format="tflite")
    with pytest.raises(ValueError, match="precision='bfloat16'"):
        export_image_classifier(vit, tmp_path / "a", format="onnx", precision="bfloat16")
    with pytest.raises(ValueError, match="precision='int8'"):
        export_image_classifier(vit, tmp_path / "a", precision="int8")  # SavedModel
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        export_image_classifier(vit, tmp_path / "file", format="litert")
    assert not (tmp_path / "a").exists()


def test_a_missing_converter_names_the_extra(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tf2onnx" else real(name, *a))
    images = keras.Input((4, 4, 1), dtype="uint8", name="images")
    serving = keras.Model(images, {"probabilities": keras.ops.cast(images, "float32")})
    with pytest.raises(ImportError, match=r"keras-attn\[onnx\]"):
        export_portable(serving, tmp_path / "m", "onnx")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("format", ["onnx", "litert"])
def test_a_dict_input_model_exports_and_scores_as_in_keras(tmp_path, format):
    # The BERT backbone is called with a dict (its call refuses a list, which
    # the exporter once passed): each input is served under its key.
    bert = FAMILIES["bert"]
    backbone = bert.backbone(num_layers=1)
    x = bert.inputs(size=2)
    expected = {name: to_numpy(value) for name, value in backbone(x).items()}
    path = export_portable(backbone, tmp_path / format, format)
    artifact = Artifact(path)
    assert sorted(artifact.input_names) == ["padding_mask", "segment_ids", "token_ids"]
    assert [o["name"] for o in artifact.contract["outputs"]] == ["pooled_output",
                                                                "sequence_output"]
    got = artifact(**x)
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], atol=1e-5, err_msg=name)


@pytest.mark.parametrize("format", ["onnx", "litert"])
def test_a_lone_output_is_served_under_the_contracts_name(tmp_path, format):
    # LiteRT named it "output_0" while serving.json said "probabilities", and
    # the artifact refused to load.
    model = FAMILIES["vit"].build()
    x = FAMILIES["vit"].inputs(size=2)
    artifact = Artifact(export_portable(model, tmp_path / format, format))
    got = artifact(**{artifact.input_names[0]: np.asarray(x, "float32")})
    assert sorted(got) == ["probabilities"]
    np.testing.assert_allclose(got["probabilities"], to_numpy(model(x)), atol=1e-5)


def test_onnx_weights_reach_the_file_as_initializers_without_passing_through_tf2onnx(
        tmp_path, monkeypatch):
    # Keras's own conversion froze every weight into the graph tf2onnx
    # rewrites (grappler and ~12 optimizer passes, each copying them):
    # BERT-base's export grew past 11 GB (issue 60). tf2onnx now converts a
    # function of the inputs and the weights, which are written as the
    # model's initializers: the same values, once each.
    import onnx
    import tf2onnx
    from onnx import numpy_helper

    functions = []
    convert = tf2onnx.convert.from_function

    def spy(function, input_signature=None, **kwargs):
        functions.append(function.get_concrete_function(*input_signature))
        return convert(function, input_signature, **kwargs)

    monkeypatch.setattr(tf2onnx.convert, "from_function", spy)
    features = keras.Input((3,), name="features")
    hidden = keras.layers.LayerNormalization()(keras.layers.Dense(4)(features))
    serving = keras.Model(features, {"probabilities": keras.ops.softmax(
        keras.layers.Dense(2)(hidden))})
    randomize(serving)
    path = export_portable(serving, tmp_path / "m", "onnx")
    assert len(functions) == 1 and list(functions[0].captured_inputs) == []
    stored = [numpy_helper.to_array(tensor)
              for tensor in onnx.load(os.path.join(path, "model.onnx")).graph.initializer]
    for variable in serving.weights:
        value = to_numpy(variable)
        assert sum(x.shape == value.shape and np.array_equal(x, value) for x in stored) == 1, \
            variable.path
    x = np.random.default_rng(1).normal(size=(2, 3)).astype("float32")
    np.testing.assert_allclose(Artifact(path)(features=x)["probabilities"],
                               to_numpy(serving(x)["probabilities"]), atol=1e-6)


def count_ops(file):
    import collections

    import onnx

    return collections.Counter(node.op_type for node in onnx.load(file).graph.node)


@pytest.mark.large
def test_int8_onnx_quantizes_every_projection_and_answers_near_the_float_model(tmp_path):
    # onnxruntime's quantize_dynamic skips a Gemm and a weight behind a
    # Reshape (tf2onnx's einsum projections): the export folds and rewrites
    # them first, so every kernel of the model is an int8 product.
    backbone = FAMILIES["bert"].backbone(vocabulary_size=len(VOCAB), num_layers=1,
                                         max_sequence_length=16)
    model = randomize(BertSequenceClassifier(backbone, num_classes=3))
    rng = np.random.default_rng(0)
    tokenizer = text.make_tokenizer(VOCAB)
    paths = {precision: export_text_classifier(model, tokenizer, tmp_path / precision,
                                               sequence_length=12, format="onnx",
                                               precision=precision)
             for precision in ("float32", "int8")}
    ops = count_ops(os.path.join(paths["int8"], "model.onnx"))
    kernels = [w for w in model.weights if w.path.endswith("kernel")]
    assert len(kernels) == 8  # q, k, v, output, two feed-forward, pooler, classifier
    assert ops["MatMulInteger"] == len(kernels) and ops["Gemm"] == 0, ops
    with open(os.path.join(paths["int8"], "serving.json")) as stream:
        assert json.load(stream)["precision"] == "int8"
    assert sorted(os.listdir(tmp_path)) == ["float32", "int8"]  # nothing left beside

    ids = rng.integers(5, len(VOCAB), (16, 12)).astype("int32")
    ids[:, 0], ids[:, -1] = 2, 3
    ids[8:, 6:] = 0  # padded rows too
    batch = {"token_ids": ids, "segment_ids": np.zeros_like(ids),
             "padding_mask": (ids != 0).astype("int32")}
    expected = softmax(to_numpy(model(batch)))
    assert np.ptp(expected, axis=0).max() > 0.02
    got = {p: Artifact(path)(**batch)["probabilities"] for p, path in paths.items()}
    np.testing.assert_allclose(got["float32"], expected, atol=1e-5)
    gap = np.abs(got["int8"] - expected).max()
    assert 0 < gap < 0.01, gap  # quantized: close, not equal
    # A row whose top two classes are further apart than twice the error
    # keeps its class (the random model's near ties may swap).
    top = np.sort(expected, axis=-1)
    clear = top[:, -1] - top[:, -2] > 2 * gap
    assert clear.sum() >= 4, top
    assert (got["int8"].argmax(-1) == expected.argmax(-1))[clear].all()
    # Each token's activations get their own scale: a row's answer is the
    # same alone, in its batch, and whatever its padding holds (one scale
    # per tensor moved them by 4e-3).
    assert ops["DynamicQuantizeLinear"] == 0, ops
    int8 = Artifact(paths["int8"])
    alone = np.concatenate([int8(**{k: v[i:i + 1] for k, v in batch.items()})["probabilities"]
                            for i in (0, 8, 15)])
    np.testing.assert_allclose(alone, got["int8"][[0, 8, 15]], atol=1e-6)
    other_padding = dict(batch, token_ids=np.where(ids == 0, 7, ids).astype("int32"))
    np.testing.assert_allclose(int8(**other_padding)["probabilities"], got["int8"], atol=1e-6)

    # The image classifier: every projection quantized, the patch
    # convolution kept float (its int8 input would take one scale for the
    # whole batch); an image's answer the same alone.
    vit = build_vit("vit_tiny_16", image_size=16, patch_size=4, num_channels=3, num_layers=1,
                    hidden_dim=32, num_heads=2, intermediate_dim=64, num_classes=5)
    for variable in vit.weights:
        variable.assign(variable + rng.normal(0, 0.05, variable.shape).astype(variable.dtype))
    path = export_image_classifier(vit, tmp_path / "vit", format="onnx", precision="int8")
    ops = count_ops(os.path.join(path, "model.onnx"))
    assert ops["ConvInteger"] == 0 and ops["Conv"] == 1 and ops["MatMulInteger"] == 7, ops
    images = rng.integers(0, 256, (4, 16, 16, 3)).astype("uint8")
    reference = softmax(to_numpy(vit(images.astype("float32"))))
    served = Artifact(path)(images=images)["probabilities"]
    gap = np.abs(served - reference).max()
    assert 0 < gap < 0.01, gap
    np.testing.assert_allclose(Artifact(path)(images=images[2:3])["probabilities"], served[2:3],
                               atol=1e-6)


@pytest.mark.parametrize("export", ["speech_recognizer", "translator"])
def test_int8_onnx_is_refused_where_its_answers_are_untested(tmp_path, export):
    exporter = {"speech_recognizer": export_speech_recognizer,
                "translator": lambda *a, **k: export_translator(*a, start_id=1, end_id=2, **k)}
    with pytest.raises(ValueError, match=r"`precision` must be one of \('float32', 'float16'\) "
                                         r"for format='onnx'. Received: precision='int8'"):
        exporter[export](None, tmp_path / "out", format="onnx", precision="int8")
    assert not os.path.exists(tmp_path / "out")


def test_an_op_onnx_lacks_is_refused_not_written(tmp_path):
    # tf2onnx leaves an op it cannot convert in the graph (logging it): the
    # file would not load in onnxruntime (the Parakeet front end's RFFT did).
    inputs = keras.Input((16,), name="waveform")
    spectrum = keras.ops.abs(keras.ops.rfft(inputs)[0])
    model = keras.Model(inputs, keras.layers.Dense(2)(spectrum))
    with pytest.raises(ValueError, match=r"could not convert the ops \[.*RFFT.*\]"):
        export_portable(model, tmp_path / "out", "onnx")
    assert not os.path.exists(tmp_path / "out")
