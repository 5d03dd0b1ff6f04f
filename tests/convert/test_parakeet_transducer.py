"""NVIDIA's Parakeet RNN-T and TDT from a Hugging Face directory into a
`ConformerTransducer`, held against transformers' own `ParakeetForRNNT`
and `ParakeetForTDT` (random weights of an untested size, two padded rows
of two lengths): the projected encoder frames, and the transcripts of
`decode` against `generate`'s labels (keras_attn's label i is Parakeet's
token i - 1, its blank the last id)."""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from keras_attn.convert import load_hf  # noqa: E402
from keras_attn.convert.parakeet import load_hf_parakeet  # noqa: E402
from keras_attn.models.conformer import ConformerTransducer  # noqa: E402
from _parakeet import hf_transducer  # noqa: E402
from _parakeet import perturb  # noqa: E402
from test_case import redraw_transducer  # noqa: E402
from test_case import to_numpy  # noqa: E402

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             subsampling_conv_channels=8, num_mel_bins=16, conv_kernel_size=9)
VOCAB, HIDDEN, MAX_SYMBOLS = 10, 12, 3  # 9 tokens and the blank (last)
LENGTHS = [61, 35]  # feature frames -> 8 and 5 encoder frames


def _checkpoint(kind, directory):
    torch.manual_seed(71)  # the initial weights, which the encoder keeps near
    model = hf_transducer(kind, VOCAB, HIDDEN, SMALL, MAX_SYMBOLS)
    perturb(model, 7, redraw=("decoder.", "joint.", "encoder_projector."))
    model.eval().generation_config.decoder_start_token_id = VOCAB - 1
    if kind == "tdt":
        # transformers' TDT walk has no symbols guard: a label of duration 0
        # that repeats would run to the length bound; make duration 0 rarer.
        with torch.no_grad():
            model.joint.head.bias[VOCAB] -= 2.0
        # generate reads the label from the argmax over all the joint's
        # logits: a TDT checkpoint's generation_config.json suppresses the
        # duration logits' ids, as here.
        model.generation_config.suppress_tokens = list(range(VOCAB, VOCAB + 4))
    model.save_pretrained(directory)
    return model


@pytest.fixture(scope="module", params=["rnnt", "tdt"])
def parakeet(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(f"parakeet_{request.param}")
    return request.param, str(directory), _checkpoint(request.param, directory)


def _features():
    rng = np.random.default_rng(0)
    features = rng.standard_normal((2, max(LENGTHS), 16)).astype("float32")
    mask = (np.arange(max(LENGTHS))[None, :] < np.array(LENGTHS)[:, None]).astype("int64")
    return (features * mask[:, :, None]).astype("float32"), mask


def _generated(model, features, mask):
    """Each row's labels from `generate`, up to where its walk ended."""
    with torch.no_grad():
        audio = model.get_audio_features(input_features=torch.tensor(features),
                                         attention_mask=torch.tensor(mask),
                                         output_attention_mask=True)
        out = model.generate(input_features=torch.tensor(features),
                             attention_mask=torch.tensor(mask),
                             max_new_tokens=(MAX_SYMBOLS + 1) * 10)
    lengths = audio.attention_mask.sum(-1).numpy()
    blank = model.config.blank_token_id
    labels = []
    for row in range(len(lengths)):
        row_labels, frame = [], 0
        for token, move in zip(out.sequences[row, 1:].tolist(), out.durations[row, 1:].tolist()):
            if frame >= lengths[row]:
                break
            if token != blank:
                row_labels.append(token)
            frame += move
        assert frame >= lengths[row], "generate stopped at its length bound"
        labels.append(row_labels)
    return audio.pooler_output.numpy(), lengths, labels


def test_a_parakeet_transducer_equals_transformers(parakeet):
    kind, directory, reference = parakeet
    model = load_hf_parakeet(directory)
    assert isinstance(model, ConformerTransducer)
    assert model.durations == ([0, 1, 2, 3] if kind == "tdt" else None)
    assert model.max_symbols_per_step == MAX_SYMBOLS and model.predictor_layers == 2
    features, mask = _features()
    frames, lengths, labels = _generated(reference, features, mask)
    inputs = {"features": features, "feature_length": mask.sum(-1)}
    outputs = model(inputs)
    np.testing.assert_array_equal(to_numpy(outputs["frame_lengths"]), lengths)
    ours = to_numpy(outputs["frames"])
    for row, length in enumerate(lengths):
        np.testing.assert_allclose(ours[row, :length], frames[row, :length], atol=2e-4)
    # The prediction network and the joint on given labels (the walks of
    # random weights repeat few labels): Parakeet's token i is our i + 1,
    # its blank (the last id) our 0.
    theirs = np.array([[VOCAB - 1, 3, 1, 4, 8], [VOCAB - 1, 0, 8, 2, 2]])
    with torch.no_grad():
        prediction = reference.decoder(torch.tensor(theirs))
        joint = reference.joint(decoder_hidden_states=prediction[:, None],
                                encoder_hidden_states=torch.tensor(frames)[:, :, None]).numpy()
    ours_prediction = model.predictor(np.where(theirs == VOCAB - 1, 0, theirs + 1))
    np.testing.assert_allclose(to_numpy(ours_prediction), prediction.numpy(), atol=1e-5)
    ours_joint = to_numpy(model.joint(frames, ours_prediction))
    joint[..., :VOCAB] = np.roll(joint[..., :VOCAB], 1, axis=-1)
    np.testing.assert_allclose(ours_joint, joint, atol=1e-4)
    decoded = model.decode(inputs)
    for row in range(2):
        ids = decoded[row][decoded[row] > 0]
        assert (ids - 1).tolist() == labels[row], (row, labels)
    assert sum(map(len, labels)) >= 3  # the walks emit labels


def test_load_hf_reads_a_transducer_and_refuses_what_it_cannot_compute(parakeet, tmp_path):
    kind, directory, _ = parakeet
    assert isinstance(load_hf(directory), ConformerTransducer)
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    for key, value, match in [
            ("blank_token_id", 0, r"blank_token_id=0"),
            ("hidden_act", "gelu_new", r"hidden_act='gelu_new'"),
            ("num_decoder_layers", 3, r"num_decoder_layers"),
            ("decoder_hidden_size", 16, r"decoder_hidden_size")]:
        bad = tmp_path / f"{key}"
        bad.mkdir()
        os.symlink(os.path.join(directory, "model.safetensors"), bad / "model.safetensors")
        (bad / "config.json").write_text(json.dumps(dict(config, **{key: value})))
        with pytest.raises(ValueError, match=match):
            load_hf_parakeet(str(bad))


def test_the_loss_of_a_padded_batch_equals_transformers(parakeet):
    """The model's loss (the mean over utterances) against the loss of
    transformers' own joint logits for the same labels: its TDT loss
    function for TDT, `rnnt_loss` for RNN-T (transformers' calls torchaudio,
    which has no build for the pinned torch; `rnnt_loss` is held against
    every path of small lattices in tests/training)."""
    from keras_attn.training import rnnt_loss

    kind, directory, reference = parakeet
    model = load_hf_parakeet(directory)
    features, mask = _features()
    theirs = np.array([[3, 1, 4, 8], [5, 2, 0, 0]])  # Parakeet's ids; the second row 2 long
    label_lengths = np.array([4, 2])
    ours = np.where(np.arange(4)[None, :] < label_lengths[:, None], theirs + 1, 0)
    start = np.full((2, 1), VOCAB - 1)
    with torch.no_grad():
        out = reference(input_features=torch.tensor(features), attention_mask=torch.tensor(mask),
                        decoder_input_ids=torch.tensor(np.concatenate([start, theirs], axis=1)))
        frames = reference.get_audio_features(
            input_features=torch.tensor(features), attention_mask=torch.tensor(mask),
            output_attention_mask=True).attention_mask.sum(-1)
        if kind == "tdt":
            from transformers.loss.loss_tdt import tdt_loss

            expected = float(tdt_loss(
                out.logits[..., :VOCAB], out.logits[..., VOCAB:], torch.tensor(theirs), frames,
                torch.tensor(label_lengths), blank_token_id=VOCAB - 1, durations=[0, 1, 2, 3],
                reduction="mean_batch"))
        else:
            expected = float(np.mean(to_numpy(rnnt_loss(
                theirs, out.logits.numpy(), label_lengths, frames.numpy(),
                blank_index=VOCAB - 1))))
    inputs = {"features": features, "feature_length": mask.sum(-1)}
    loss = model.compute_loss(x=inputs, y=ours, y_pred=model(inputs), training=False)
    np.testing.assert_allclose(float(to_numpy(loss)), expected, rtol=1e-4)


def _same_as_transformers(model, hf_model, features, mask):
    """`model`'s frames and transcripts against a transformers transducer."""
    frames, lengths, labels = _generated(hf_model, features, mask)
    inputs = {"features": features, "feature_length": mask.sum(-1)}
    ours = to_numpy(model(inputs)["frames"])
    for row, length in enumerate(lengths):
        np.testing.assert_allclose(ours[row, :length], frames[row, :length], atol=2e-4)
    decoded = model.decode(inputs)
    assert [(row[row > 0] - 1).tolist() for row in decoded] == labels


@pytest.mark.parametrize("source", ["loaded", "built"])
def test_save_hf_writes_what_transformers_loads_with_the_same_transcripts(
        parakeet, source, tmp_path):
    from keras_attn.convert import save_hf
    from keras_attn.models.conformer import build_conformer_transducer

    kind, directory, _ = parakeet
    if source == "loaded":
        model = load_hf_parakeet(directory)
    else:  # a model of ours, one LSTM layer, other durations
        model = build_conformer_transducer(
            "parakeet_ctc_tiny", vocabulary_size=6, input_type="features", num_mel_bins=16,
            freq_mask_width=8,
            predictor_dim=8, predictor_layers=1, durations=[0, 1, 2] if kind == "tdt" else None,
            max_symbols_per_step=MAX_SYMBOLS)
        # Every weight drawn by NumPy: the same walk on every backend (under
        # JAX the backend's own initial weights gave a TDT walk past
        # transformers' length bound, which has no symbols guard).
        redraw_transducer(model, 3)
    path = save_hf(model, tmp_path / "saved")
    cls = transformers.ParakeetForTDT if kind == "tdt" else transformers.ParakeetForRNNT
    # generate reads the saved generation_config.json (the blank as start,
    # TDT's duration ids suppressed).
    again, info = cls.from_pretrained(path, output_loading_info=True)
    assert not any(info.values()), info
    features, mask = _features()
    _same_as_transformers(model, again.eval(), features, mask)
    reloaded = load_hf_parakeet(path, input_type="features")
    np.testing.assert_array_equal(reloaded.decode({"features": features,
                                                   "feature_length": mask.sum(-1)}),
                                  model.decode({"features": features,
                                                "feature_length": mask.sum(-1)}))
