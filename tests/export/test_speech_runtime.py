"""A speech recogniser exported with its vocabulary, served on WAV files
and arrays by `SpeechRecognizerArtifact` in a process without TensorFlow or
Keras: each clip's text is the Keras model's greedy decoding of that clip
alone. A vocabulary that is not one token per id of the head is refused
before anything is converted. (The zoo's speech run carries its vocabulary
into both formats: tests/zoo/test_cli.py; the whole job from a Parakeet
checkpoint: docs/hf_audio.md.)"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.tf_only

VOCABULARY = list(" enosy")
# Parakeet's design (8x fast subsampling, its front end) at a tiny size.
SIZES = dict(num_layers=1, hidden_dim=16, num_heads=2, subsampling_filters=4, num_mel_bins=16,
             freq_mask_width=4)

SERVE = r"""
import json, sys
import numpy as np
from keras_attn.export import SpeechRecognizerArtifact
recognizer = SpeechRecognizerArtifact(sys.argv[1])
clips = json.loads(sys.argv[2])
arrays = [np.load(path) for path in json.loads(sys.argv[3])]
answer = recognizer(clips + arrays)
loaded = sorted(m for m in ("tensorflow", "keras") if m in sys.modules)
refused = []
for bad in ([np.zeros((2, 800), "float32")], [np.full(800, 300.0, "float32")]):
    try:
        recognizer(bad)
    except ValueError as error:
        refused.append(str(error))
again = recognizer(clips + arrays)  # a valid call right after the refused ones
print(json.dumps({"text": answer["text"], "ids": [r.tolist() for r in answer["token_ids"]],
                  "again": again["text"], "rate": recognizer.sampling_rate, "loaded": loaded,
                  "refused": refused}))
"""


def _model():
    import keras

    from keras_attn.models.conformer import build_conformer

    keras.utils.set_random_seed(3)
    return build_conformer("parakeet_ctc_tiny", vocabulary_size=len(VOCABULARY), **SIZES)


def test_the_served_text_is_each_clips_own_greedy_decoding(tmp_path):
    from scipy.io import wavfile

    from keras_attn.data.files import read_wav
    from keras_attn.data.speech import decode_ids
    from keras_attn.export import export_speech_recognizer

    model = _model()
    rng = np.random.default_rng(0)
    # Two WAV files (one at 8 kHz: the server resamples it as the training
    # files are read) and two arrays, all of different lengths.
    wavs = []
    for i, (rate, count) in enumerate([(16000, 9000), (8000, 3000)]):
        path = str(tmp_path / f"clip{i}.wav")
        wavfile.write(path, rate, (rng.normal(0, 0.2, count) * 32767).astype("int16"))
        wavs.append(path)
    arrays = [rng.uniform(-0.5, 0.5, count).astype("float32") for count in (4000, 12000)]
    array_files = []
    for i, array in enumerate(arrays):
        array_files.append(str(tmp_path / f"array{i}.npy"))
        np.save(array_files[-1], array)
    clips = [read_wav(path, 16000) for path in wavs] + arrays
    expected = []
    for clip in clips:  # each alone
        ids = np.asarray(model.decode({"waveform": clip[None],
                                       "waveform_length": np.array([len(clip)], "int32")}))[0]
        expected.append([int(i) for i in ids if i > 0])
    assert len({tuple(row) for row in expected}) > 1  # the clips get different answers

    path = export_speech_recognizer(model, tmp_path / "onnx", format="onnx",
                                    vocabulary=VOCABULARY)
    assert json.loads((tmp_path / "onnx" / "serving.json").read_text())["vocabulary"] \
        == VOCABULARY
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    result = subprocess.run([sys.executable, "-c", SERVE, str(path), json.dumps(wavs),
                             json.dumps(array_files)], capture_output=True, text=True,
                            timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    assert served["loaded"] == [] and served["rate"] == 16000
    assert served["ids"] == expected
    assert served["text"] == [decode_ids(row, VOCABULARY) for row in expected]
    assert served["again"] == served["text"]
    assert len(served["refused"]) == 2
    assert "clips[0] must be a WAV file's path or a non-empty 1-D float array" \
        in served["refused"][0]
    assert "Received: shape=(800,), dtype=float32, largest |sample| 300" in served["refused"][1]


@pytest.mark.parametrize("vocabulary, message", [
    (VOCABULARY[:-1], r".*needs 6 tokens\. Received: 5 tokens"),
    ("enosy ", r"a list of non-empty strings.*Received: vocabulary='enosy '"),
    ([" ", "e", "", "o", "s", "y"], r"a list of non-empty strings"),
])
def test_a_vocabulary_that_is_not_one_token_per_id_is_refused(tmp_path, vocabulary, message):
    from keras_attn.export import export_speech_recognizer

    for format in ("saved_model", "onnx"):
        with pytest.raises(ValueError, match=r"Invalid value for argument `vocabulary`: "
                                             + message):
            export_speech_recognizer(_model(), tmp_path / format, format=format,
                                     vocabulary=vocabulary)
        assert not (tmp_path / format).exists()
