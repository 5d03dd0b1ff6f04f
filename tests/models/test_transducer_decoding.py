"""Greedy transducer decoding against transformers' Parakeet `generate`
(ParakeetForRNNT and ParakeetForTDT with random weights, their
prediction and joint networks copied into ours, decoding the frames of
their own encoder): the same labels at the same frames, each row alone
as in its batch; the symbols-per-frame guard; bad arguments refused."""

import numpy as np
import pytest

from _parakeet import hf_transducer
from _parakeet import transducer_from_torch
from keras_attn.layers.transducer import TransducerJoint
from keras_attn.layers.transducer import TransducerPredictor
from keras_attn.models.conformer.transducer_decoding import transducer_greedy_decode
from keras_attn.models.conformer.transducer_decoding import transducer_greedy_ids
from test_case import to_numpy

VOCABULARY, BLANK, HIDDEN, MAX_SYMBOLS = 9, 8, 8, 4


def _reference(kind, seed):
    """A tiny transformers transducer with random weights, encoder frames
    and lengths, and what its `generate` emits for them: each row's labels
    and their frames. The encoder is bypassed (its frames drawn here, so
    that they differ enough between frames to make the walks vary): the
    walk over given frames is what is held; the encoder is held in the
    CTC converter's tests."""
    import torch
    from transformers.models.parakeet.modeling_parakeet import ParakeetEncoderModelOutput

    encoder = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                   intermediate_size=16, num_mel_bins=16, subsampling_conv_channels=8)
    model = hf_transducer(kind, VOCABULARY, HIDDEN, encoder, MAX_SYMBOLS)
    torch.manual_seed(seed)
    with torch.no_grad():
        for tensor in model.parameters():
            tensor.normal_(0, 0.5)
        # The labels so far weigh on each choice (a walk that ignored the
        # prediction network's state would be caught); a blank is likelier.
        model.decoder.decoder_projector.weight *= 3.0
        model.decoder.decoder_projector.bias *= 3.0
        model.joint.head.bias[BLANK] += 0.5
        if kind == "tdt":
            model.joint.head.bias[VOCABULARY] -= 0.5  # duration 0 rarer (see the seeds)
    model.eval().generation_config.decoder_start_token_id = BLANK
    if kind == "tdt":
        # generate reads the label from the argmax over all the joint's
        # logits: a TDT checkpoint's generation_config.json suppresses the
        # duration logits' ids, as here.
        model.generation_config.suppress_tokens = list(range(VOCABULARY, VOCABULARY + 4))
    frames = torch.randn(3, 12, HIDDEN, generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 8:] = 0
    mask[2, 4:] = 0
    model.get_audio_features = lambda **kwargs: ParakeetEncoderModelOutput(
        pooler_output=frames, attention_mask=mask)
    with torch.no_grad():
        # A bound past any walk (its default, max_symbols_per_step x frames
        # counting the start token, cuts a walk that uses the guard at every frame).
        out = model.generate(input_features=torch.zeros(3, 96, 16),
                             max_new_tokens=(MAX_SYMBOLS + 1) * 12)
    lengths = mask.sum(-1).numpy()
    labels, at, moves = [], [], set()
    for row in range(3):
        row_labels, row_frames, frame = [], [], 0
        for token, move in zip(out.sequences[row, 1:].tolist(), out.durations[row, 1:].tolist()):
            if frame >= lengths[row]:
                break
            if token != BLANK:
                row_labels.append(token)
                row_frames.append(frame)
            moves.add((token == BLANK, move))
            frame += move
        assert frame >= lengths[row], "generate stopped at its length bound: not a finished walk"
        labels.append(row_labels)
        at.append(row_frames)
    return model, frames.numpy(), lengths, labels, at, moves


def _ours(model, outputs):
    state = {k: v for k, v in model.state_dict().items() if k.startswith(("decoder.", "joint."))}
    state = {k.split(".", 1)[1]: v for k, v in state.items()}
    return transducer_from_torch(state, VOCABULARY, HIDDEN, 2, outputs)


# Seeds whose walks take blanks and labels, and (RNN-T) reach the guard or
# (TDT) stay, or move 1 to 3 frames. On random weights most TDT walks with a
# label of duration 0 repeat it up to generate's length bound (transformers'
# TDT walk has no guard): these seeds are among those that end.
@pytest.mark.parametrize("kind,seeds,expected_moves", [
    ("rnnt", (1, 9), {(True, 1), (False, 0), (False, 1)}),
    ("tdt", (1, 9), {(True, 1), (True, 2), (True, 3), (False, 0), (False, 1), (False, 3)}),
])
def test_greedy_decoding_equals_transformers_generate(kind, seeds, expected_moves):
    durations = [0, 1, 2, 3] if kind == "tdt" else None
    outputs = VOCABULARY + (4 if durations else 0)
    seen = set()
    for seed in seeds:
        model, frames, lengths, labels, at, moves = _reference(kind, seed)
        seen |= moves
        predictor, joint = _ours(model, outputs)
        ours, ours_at = transducer_greedy_decode(
            frames, lengths, predictor, joint, BLANK, durations=durations,
            max_symbols_per_step=MAX_SYMBOLS, return_frames=True)
        assert ours == labels, (seed, lengths)
        assert ours_at == at
        ids = to_numpy(transducer_greedy_ids(frames, lengths, predictor, joint, BLANK,
                                             durations=durations,
                                             max_symbols_per_step=MAX_SYMBOLS))
        assert [row[row >= 0].tolist() for row in ids] == labels
        # A row decoded alone gets the answer it got in the batch.
        for row in range(3):
            alone = transducer_greedy_decode(frames[row:row + 1], lengths[row:row + 1],
                                             predictor, joint, BLANK, durations=durations,
                                             max_symbols_per_step=MAX_SYMBOLS)
            assert alone == [labels[row]]
    assert expected_moves <= seen, seen


def test_the_symbols_guard_moves_the_pointer_on():
    # A joint that never prefers the blank: the guard alone ends the walk,
    # after exactly max_symbols_per_step labels at each valid frame.
    predictor = TransducerPredictor(5, 4)
    joint = TransducerJoint(5)
    joint(np.zeros((1, 1, 4), "float32"), np.zeros((1, 1, 4), "float32"))
    joint.head.kernel.assign(np.zeros((4, 5), "float32"))
    joint.head.bias.assign(np.array([0, 0, 3, 0, -1], "float32"))
    frames = np.ones((2, 6, 4), "float32")
    labels, at = transducer_greedy_decode(frames, np.array([6, 2]), predictor, joint,
                                          blank_id=4, max_symbols_per_step=3,
                                          return_frames=True)
    assert labels == [[2] * 18, [2] * 6]
    assert at[1] == [0, 0, 0, 1, 1, 1]
    # A row with no valid frames emits nothing.
    assert transducer_greedy_decode(frames[:1], np.array([0]), predictor, joint, 4) == [[]]


def test_bad_arguments_are_refused():
    predictor = TransducerPredictor(5, 4)
    frames = np.zeros((1, 3, 4), "float32")
    with pytest.raises(ValueError, match=r"`blank_id`: an id in \[0, 5\).*Received: 5"):
        transducer_greedy_decode(frames, [3], predictor, TransducerJoint(5), blank_id=5)
    with pytest.raises(ValueError, match=r"`joint`: .* plus 2 durations, 7\. Received: .* 5 "):
        transducer_greedy_decode(frames, [3], predictor, TransducerJoint(5), 4, durations=[0, 1])
    with pytest.raises(ValueError, match=r"`durations`: .*Received: \[1, 1\]"):
        transducer_greedy_decode(frames, [3], predictor, TransducerJoint(7), 4, durations=[1, 1])
    with pytest.raises(ValueError, match=r"`lengths`: 1 integer frame counts in \[0, 3\]\. "
                                         r"Received: \[4\]"):
        transducer_greedy_decode(frames, [4], predictor, TransducerJoint(5), 4)
    # The tensor walk refuses the same lengths when their values are known,
    # and answers a valid call right after.
    with pytest.raises(ValueError, match=r"`lengths`: 1 integer frame counts.*Received: \[4\]"):
        transducer_greedy_ids(frames, np.array([4]), predictor, TransducerJoint(5), 4)
    joint = TransducerJoint(5)
    assert to_numpy(transducer_greedy_ids(frames, np.array([3]), predictor, joint, 4)).shape == (
        1, 30)
    with pytest.raises(ValueError, match="max_symbols_per_step"):
        transducer_greedy_decode(frames, [3], predictor, TransducerJoint(5), 4,
                                 max_symbols_per_step=0)


def _all_paths(frames, length, predictor, joint, blank, durations, max_symbols):
    """(score, labels) of every path of one row (the spec the search
    walks), by exhaustive recursion; the networks' outputs memoised by the
    labels so far (the prediction network reads nothing else)."""
    from keras import ops

    vocabulary = predictor.vocabulary_size
    predicted = {}  # labels -> (prediction, states)
    scored = {}  # (labels, frame) -> (token log-probs, duration log-probs)

    def log_softmax(x):
        x = x - x.max()
        return x - np.log(np.exp(x).sum())

    def prediction_of(labels):
        if labels not in predicted:
            if labels:
                _, states = prediction_of(labels[:-1])
                predicted[labels] = predictor.step(ops.convert_to_tensor(labels[-1:], "int32"),
                                                   states)
            else:
                predicted[labels] = predictor.step(ops.convert_to_tensor([blank], "int32"))
        return predicted[labels]

    def scores_of(labels, frame):
        if (labels, frame) not in scored:
            prediction, _ = prediction_of(labels)
            logits = to_numpy(joint(frames[None, frame:frame + 1], prediction[:, None]))[0, 0, 0]
            scored[labels, frame] = (log_softmax(logits[:vocabulary]), None if durations is None
                                     else log_softmax(logits[vocabulary:]))
        return scored[labels, frame]

    def walk(labels, frame, symbols, score):
        if frame >= length:
            yield score, labels
            return
        tokens, moves = scores_of(labels, frame)
        for k in range(vocabulary):
            options = [(1 if k == blank else 0, 0.0)] if durations is None else [
                (d, lp) for d, lp in zip(durations, moves) if not (k == blank and d == 0)]
            for move, move_score in options:
                count = 0 if move > 0 else symbols + 1
                if count >= max_symbols:
                    move, count = 1, 0
                yield from walk(labels if k == blank else labels + (k,), frame + move, count,
                                score + tokens[k] + move_score)

    return list(walk((), 0, 0, 0.0))


@pytest.mark.parametrize("durations", [None, [0, 1, 2]])
def test_a_wide_beam_finds_the_best_path_and_a_narrow_one_no_better(durations):
    from keras_attn.models.conformer.transducer_decoding import transducer_beam_search

    rng = np.random.default_rng(4)
    predictor = TransducerPredictor(3, 4)
    joint = TransducerJoint(3 + len(durations or ()))
    joint(np.zeros((1, 1, 4), "float32"), np.zeros((1, 1, 4), "float32"))
    predictor(np.zeros((1, 1), "int32"))
    for weight in predictor.weights + joint.weights:
        weight.assign(rng.normal(0, 1.0, weight.shape).astype("float32"))
    frames = rng.normal(0, 1.0, (2, 3, 4)).astype("float32")
    lengths = np.array([3, 2])
    wide, wide_scores = transducer_beam_search(
        frames, lengths, predictor, joint, blank_id=2, beam_width=10_000, durations=durations,
        max_symbols_per_step=2, return_scores=True)
    narrow, narrow_scores = transducer_beam_search(
        frames, lengths, predictor, joint, blank_id=2, beam_width=1, durations=durations,
        max_symbols_per_step=2, return_scores=True)
    for row in range(2):
        paths = _all_paths(frames[row], lengths[row], predictor, joint, 2, durations, 2)
        assert len(paths) > 20
        score, labels = max(paths)
        assert wide[row] == list(labels)
        np.testing.assert_allclose(wide_scores[row], score, atol=1e-4)
        assert narrow_scores[row] <= wide_scores[row] + 1e-6
    if durations is None:  # one path kept: the greedy walk
        assert narrow == transducer_greedy_decode(frames, lengths, predictor, joint, 2,
                                                  max_symbols_per_step=2)


@pytest.mark.parametrize("durations", [None, [0, 1, 2]])
def test_the_tensor_walk_compiles_with_the_same_labels(durations):
    """transducer_greedy_ids inside the backend's compiler (tf.function with
    an unknown batch, jax.jit; PyTorch runs it as it is), against the host
    walk, a row with no frames included."""
    import keras

    rng = np.random.default_rng(4)
    predictor = TransducerPredictor(5, 4, num_layers=2)
    joint = TransducerJoint(5 + len(durations or ()))
    predictor(np.zeros((1, 1), "int32"))
    joint(np.zeros((1, 1, 4), "float32"), np.zeros((1, 1, 4), "float32"))
    for weight in predictor.weights + joint.weights:
        weight.assign(rng.normal(0, 1.0, weight.shape).astype("float32"))
    frames = rng.normal(0, 1, (3, 6, 4)).astype("float32")
    lengths = np.array([6, 3, 0], "int32")

    def walk(frames, lengths):
        return transducer_greedy_ids(frames, lengths, predictor, joint, 4, durations=durations,
                                     max_symbols_per_step=2)

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        walk = tf.function(walk, input_signature=[tf.TensorSpec((None, 6, 4)),
                                                  tf.TensorSpec((None,), tf.int32)])
    elif backend == "jax":
        import jax

        walk = jax.jit(walk)
    ids = to_numpy(walk(frames, lengths))
    expected = transducer_greedy_decode(frames, lengths, predictor, joint, 4,
                                        durations=durations, max_symbols_per_step=2)
    assert ids.shape == (3, 12)
    assert [row[row >= 0].tolist() for row in ids] == expected
    assert sum(map(len, expected)) >= 6 and expected[2] == []
