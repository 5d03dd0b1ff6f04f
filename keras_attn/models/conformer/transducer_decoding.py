"""Greedy decoding of a transducer (RNN-T, Graves 2012; TDT, Xu et al.
2023), as NeMo and transformers' Parakeet `generate` walk it.

A pointer walks the encoder frames of each row. At each step the joint
scores the frame under the pointer against the prediction network's
output for the labels emitted so far; the best label is taken:

- RNN-T: a blank moves the pointer one frame on; a label is emitted and
  the pointer stays, unless `max_symbols_per_step` labels in a row were
  emitted at this frame, which moves it on (the guard of NeMo and
  transformers).
- TDT: the joint's last `len(durations)` logits choose how many frames
  the pointer moves (a label with duration 0 stays); a blank moves at
  least one frame. The same guard applies (NeMo has it; transformers
  bounds the whole walk by `max_symbols_per_step` times the frames
  instead, which ends the same walks).

The prediction network runs only on an emitted label, from the blank as
start symbol. A row is done when its pointer passes its valid frames.

The walk is a loop on the host (each step's choice decides the next
step's input): it is meant for evaluation and serving of one batch,
eagerly, on every backend. Each row's answer is its own: rows never
share a step's choice, and a row's padding frames are never scored.
"""

import numpy as np
from keras import ops

from keras_attn._checks import check_positive_int


def transducer_greedy_decode(encoder, lengths, predictor, joint, blank_id, durations=None,
                             max_symbols_per_step=10, return_frames=False):
    """Greedy transducer decoding of a batch of encoder frames.

    Args:
        encoder: `(B, T, D)` encoder frames already of the joint's width
            (after the encoder's projection).
        lengths: `(B,)` valid frames of each row, in `[0, T]`.
        predictor: a `keras_attn.layers.TransducerPredictor`.
        joint: a `keras_attn.layers.TransducerJoint` with
            `predictor.vocabulary_size` outputs (RNN-T), or that many plus
            `len(durations)` (TDT).
        blank_id: the blank's id in `[0, vocabulary_size)` (Parakeet: the
            last id).
        durations: None for RNN-T; for TDT the frames each duration logit
            moves, distinct non-negative ints, one at least 1 (Parakeet:
            `[0, 1, 2, 3, 4]`).
        max_symbols_per_step: labels emitted at one frame before the
            pointer is moved on regardless.
        return_frames: also return the frame at which each label was
            emitted (word timing).

    Returns:
        A list of B lists of label ids (blanks left out); with
        `return_frames`, `(labels, frames)`, two such lists.

    Example:

    >>> import numpy as np
    >>> from keras_attn.layers import TransducerJoint, TransducerPredictor
    >>> predictor = TransducerPredictor(vocabulary_size=5, hidden_dim=4)
    >>> joint = TransducerJoint(outputs=5)
    >>> frames = np.random.default_rng(0).normal(size=(2, 6, 4)).astype("float32")
    >>> labels = transducer_greedy_decode(frames, [6, 3], predictor, joint, blank_id=4)
    >>> len(labels), all(0 <= i < 4 for row in labels for i in row)
    (2, True)
    """
    vocabulary = predictor.vocabulary_size
    blank_id = _check_id("blank_id", blank_id, vocabulary)
    max_symbols_per_step = check_positive_int("max_symbols_per_step", max_symbols_per_step)
    steps = None
    if durations is not None:
        steps = check_durations(durations)
    expected = vocabulary + (0 if steps is None else len(steps))
    if joint.outputs != expected:
        raise ValueError(
            f"Invalid value for argument `joint`: its outputs must be the predictor's vocabulary "
            f"({vocabulary})" + ("" if steps is None else f" plus {len(steps)} durations")
            + f", {expected}. Received: a joint of {joint.outputs} outputs")
    if len(encoder.shape) != 3:
        raise ValueError("Invalid value for argument `encoder`: (batch, frames, width) frames. "
                         f"Received: shape {tuple(encoder.shape)}")
    batch, frames = int(encoder.shape[0]), int(encoder.shape[1])
    lengths = np.asarray(ops.convert_to_numpy(lengths)).reshape(-1)
    if lengths.shape != (batch,) or not np.issubdtype(lengths.dtype, np.integer) or (
            batch and (lengths.min() < 0 or lengths.max() > frames)):
        raise ValueError(
            f"Invalid value for argument `lengths`: {batch} integer frame counts in [0, {frames}]. "
            f"Received: {lengths.tolist()}")
    labels = [[] for _ in range(batch)]
    at = [[] for _ in range(batch)]
    if batch == 0:
        return (labels, at) if return_frames else labels
    encoder = ops.convert_to_tensor(encoder)
    pointer = np.zeros(batch, "int64")
    symbols = np.zeros(batch, "int64")
    done = pointer >= lengths
    prediction, states = predictor.step(ops.full((batch,), blank_id, "int32"))
    while not done.all():
        index = ops.convert_to_tensor(np.minimum(pointer, frames - 1)[:, None, None], "int32")
        frame = ops.take_along_axis(encoder, index, axis=1)
        logits = ops.convert_to_numpy(
            ops.cast(joint(frame, prediction[:, None, :])[:, 0, 0], "float32"))
        token = logits[:, :vocabulary].argmax(-1)
        blank = token == blank_id
        if steps is None:
            move = blank.astype("int64")
        else:
            move = steps[logits[:, vocabulary:].argmax(-1)]
            move = np.where(blank & (move == 0), 1, move)
        symbols = np.where(move > 0, 0, symbols + 1)
        forced = symbols >= max_symbols_per_step
        move = np.where(forced, 1, move)
        symbols = np.where(forced, 0, symbols)
        emit = ~blank & ~done
        for row in np.flatnonzero(emit):
            labels[row].append(int(token[row]))
            at[row].append(int(pointer[row]))
        if emit.any():
            new_prediction, new_states = predictor.step(
                ops.convert_to_tensor(np.where(emit, token, blank_id), "int32"), states)
            keep = ops.convert_to_tensor(emit[:, None])
            prediction = ops.where(keep, new_prediction, prediction)
            states = [ops.where(keep, new, old) for new, old in zip(new_states, states)]
        pointer = np.where(done, pointer, pointer + move)
        done = pointer >= lengths
    return (labels, at) if return_frames else labels


def _check_id(name, value, vocabulary):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not (
            0 <= value < vocabulary):
        raise ValueError(f"Invalid value for argument `{name}`: an id in [0, {vocabulary}) (the "
                         f"predictor's vocabulary). Received: {value!r}")
    return int(value)


def check_durations(durations):
    values = list(durations)
    if not values or any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0
                         for d in values) or len(set(values)) != len(values) or max(values) < 1:
        raise ValueError("Invalid value for argument `durations`: distinct non-negative frame "
                         "counts, one at least 1 (a blank must move), e.g. [0, 1, 2, 3, 4]. "
                         f"Received: {durations!r}")
    return np.asarray(values, "int64")
