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
from keras_attn._guard import concrete_value
from keras_attn.models.conformer.conformer_model import first_argmax


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
    steps = None if durations is None else check_durations(durations)
    _check_joint(joint, vocabulary, steps)
    batch, frames, lengths = _checked_frames(encoder, lengths)
    if batch == 0:
        return ([], []) if return_frames else []
    prediction, states = predictor.step(ops.full((batch,), blank_id, "int32"))
    labels, at, _, _, _ = greedy_walk(encoder, lengths, predictor, joint, blank_id, steps,
                                      max_symbols_per_step, np.zeros(batch, "int64"),
                                      prediction, states)
    return (labels, at) if return_frames else labels


def greedy_walk(encoder, lengths, predictor, joint, blank_id, steps, max_symbols_per_step,
                pointer, prediction, states):
    """The host walk of `transducer_greedy_decode` over checked arguments,
    resumable: it starts each row at `pointer` `(B,)` with the prediction
    network's `prediction` `(B, D)` and `states`, and walks until each
    pointer passes its row's `lengths`. Returns `(labels, frames, pointer,
    prediction, states)`: the labels and the frames they were emitted at
    (lists of B lists), and where the walk stopped, so that a stream walks
    its next chunk's frames on (`pointer - frames`: TDT may skip past a
    chunk's end). A walk always ends on a move, so no symbol count is
    carried: the guard's count starts at 0 on each frame."""
    batch, frames = int(encoder.shape[0]), int(encoder.shape[1])
    vocabulary = predictor.vocabulary_size
    labels = [[] for _ in range(batch)]
    at = [[] for _ in range(batch)]
    encoder = ops.convert_to_tensor(encoder)
    pointer = np.asarray(pointer, "int64").copy()
    symbols = np.zeros(batch, "int64")
    done = pointer >= lengths
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
    return labels, at, pointer, prediction, states


def _check_joint(joint, vocabulary, steps):
    expected = vocabulary + (0 if steps is None else len(steps))
    if joint.outputs != expected:
        raise ValueError(
            f"Invalid value for argument `joint`: its outputs must be the predictor's vocabulary "
            f"({vocabulary})" + ("" if steps is None else f" plus {len(steps)} durations")
            + f", {expected}. Received: a joint of {joint.outputs} outputs")


def _checked_frames(encoder, lengths):
    """(batch, frames, lengths as an int array), or `ValueError`."""
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
    return batch, frames, lengths


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


def transducer_greedy_ids(encoder, lengths, predictor, joint, blank_id, durations=None,
                          max_symbols_per_step=10, initial_state=None, return_state=False):
    """`transducer_greedy_decode`'s walk as tensor ops in one
    `keras.ops.while_loop`: traceable (`jax.jit`, `tf.function`, an
    export), the same labels.

    Every step runs the prediction network on every row (a row that emitted
    nothing keeps its state): the host walk skips the steps where all rows
    chose a blank. Arguments are `transducer_greedy_decode`'s (checked when
    their values are known: `lengths` inside a traced call is not; a model's
    own lengths are, and its encoder makes a row NaN where they do not fit).

    `initial_state` resumes a walk (a stream's next chunk, as
    `greedy_walk` does on the host): `(pointer (B,), prediction (B, D),
    states)`, where the walk starts and the prediction network's output and
    LSTM states after the labels so far; None: the start (frame 0, after
    the blank).

    Returns:
        `(B, L)` int32 label ids, -1 after each row's last, with `L =
        frames x max_symbols_per_step` (the most labels a walk can emit);
        with `return_state`, `(ids, (pointer, prediction, states))` where
        the walk stopped.
    """
    vocabulary = predictor.vocabulary_size
    blank_id = _check_id("blank_id", blank_id, vocabulary)
    max_symbols_per_step = check_positive_int("max_symbols_per_step", max_symbols_per_step)
    steps = None if durations is None else check_durations(durations)
    _check_joint(joint, vocabulary, steps)
    if len(encoder.shape) != 3:
        raise ValueError("Invalid value for argument `encoder`: (batch, frames, width) frames. "
                         f"Received: shape {tuple(encoder.shape)}")
    encoder = ops.convert_to_tensor(encoder)
    # A frame count unknown until the call runs (a traced export): a tensor.
    frames = encoder.shape[1] if encoder.shape[1] is not None else ops.shape(encoder)[1]
    batch = ops.shape(encoder)[0]
    if concrete_value(encoder) is not None and concrete_value(lengths) is not None:
        _checked_frames(encoder, lengths)  # values known: refused as the host walk refuses
    lengths = ops.cast(ops.reshape(lengths, (-1,)), "int32")
    width = frames * max_symbols_per_step
    positions = ops.expand_dims(ops.arange(width, dtype="int32"), 0)  # (1, L)
    zeros = ops.zeros((batch,), "int32")
    if initial_state is None:
        pointer = zeros
        prediction, states = predictor.step(ops.full((batch,), blank_id, "int32"))
    else:
        pointer, prediction, states = initial_state
        pointer = ops.cast(pointer, "int32")
    prediction = ops.cast(prediction, encoder.dtype)

    def cond(step, pointer, symbols, count, out, prediction, *states):
        return ops.logical_and(ops.any(pointer < lengths),
                               step < frames * (max_symbols_per_step + 1))

    def body(step, pointer, symbols, count, out, prediction, *states):
        done = pointer >= lengths
        index = ops.minimum(pointer, frames - 1)[:, None, None]
        frame = ops.take_along_axis(encoder, index, axis=1)  # (B, 1, D)
        logits = ops.cast(joint(frame, prediction[:, None, :])[:, 0, 0], "float32")
        token = first_argmax(logits[:, :vocabulary])
        blank = ops.equal(token, blank_id)
        if steps is None:
            move = ops.cast(blank, "int32")
        else:
            chosen = first_argmax(logits[:, vocabulary:])
            move = ops.take(ops.convert_to_tensor(steps.astype("int32")), chosen)
            move = ops.where(ops.logical_and(blank, move == 0), 1, move)
        symbols = ops.where(move > 0, 0, symbols + 1)
        forced = symbols >= max_symbols_per_step
        move = ops.where(forced, 1, move)
        symbols = ops.where(forced, 0, symbols)
        emit = ops.logical_and(ops.logical_not(blank), ops.logical_not(done))
        here = ops.logical_and(ops.equal(positions, count[:, None]), emit[:, None])
        out = ops.where(here, token[:, None], out)
        count = count + ops.cast(emit, "int32")
        new_prediction, new_states = predictor.step(ops.where(emit, token, blank_id),
                                                    list(states))
        keep = emit[:, None]
        prediction = ops.where(keep, ops.cast(new_prediction, prediction.dtype), prediction)
        states = [ops.where(keep, ops.cast(new, old.dtype), old)
                  for new, old in zip(new_states, states)]
        pointer = ops.where(done, pointer, pointer + move)
        return (step + 1, pointer, symbols, count, out, prediction, *states)

    loop = (ops.convert_to_tensor(0, "int32"), pointer, zeros, zeros,
            ops.full((batch, width), -1, "int32"), prediction, *states)
    result = ops.while_loop(cond, body, loop)
    if return_state:
        return result[4], (result[1], result[5], list(result[6:]))
    return result[4]


def transducer_beam_search(encoder, lengths, predictor, joint, blank_id, beam_width=4,
                           durations=None, max_symbols_per_step=10, return_scores=False):
    """Beam search over a transducer's alignment paths: the best-scoring
    path each row's search finds, its labels.

    A path is the greedy walk's: the same moves (a blank moves one frame,
    or for TDT any duration of at least one; a label stays or, for TDT,
    moves its duration; `max_symbols_per_step` labels at one frame move the
    pointer on), each step scoring the log-probability of its label (TDT:
    plus its duration's). The search keeps the `beam_width` best unfinished
    paths, expanding all of them each step; paths that reach the same
    labels at the same frame are merged (the best kept: their futures are
    the same). It stops when no unfinished path scores above the best
    finished one (a path's score only falls), so with a beam as wide as
    the paths it returns the best path exactly; `beam_width=1` is the
    greedy walk for RNN-T.

    Arguments are `transducer_greedy_decode`'s, and:
        beam_width: the unfinished paths kept each step.
        return_scores: also return each row's best path's score.

    Returns:
        A list of B lists of label ids (blanks left out); with
        `return_scores`, `(labels, scores)`.
    """
    vocabulary = predictor.vocabulary_size
    blank_id = _check_id("blank_id", blank_id, vocabulary)
    beam_width = check_positive_int("beam_width", beam_width)
    max_symbols_per_step = check_positive_int("max_symbols_per_step", max_symbols_per_step)
    steps = None if durations is None else check_durations(durations)
    _check_joint(joint, vocabulary, steps)
    batch, frames, lengths = _checked_frames(encoder, lengths)
    encoder = ops.convert_to_tensor(encoder)
    labels, scores = [], []
    for row in range(batch):
        best = _beam_row(encoder[row], int(lengths[row]), predictor, joint, blank_id,
                         beam_width, steps, max_symbols_per_step)
        labels.append(list(best[0]))
        scores.append(best[1])
    return (labels, scores) if return_scores else labels


def _beam_row(frames, length, predictor, joint, blank_id, beam_width, steps, max_symbols):
    """(labels, score) of the best path the search finds over one row."""
    if length == 0:
        return (), 0.0
    vocabulary = predictor.vocabulary_size
    prediction, states = predictor.step(ops.full((1,), blank_id, "int32"))
    # A path: labels, frame, labels at this frame, score, its row in the
    # prediction/state tensors of its beam.
    paths = [((), 0, 0, 0.0, 0)]
    finished = None
    while paths:
        index = ops.convert_to_tensor([p[1] for p in paths], "int32")
        rows = ops.convert_to_tensor([p[4] for p in paths], "int32")
        pred = ops.take(prediction, rows, axis=0)
        logits = ops.convert_to_numpy(ops.cast(joint(
            ops.take(frames, index, axis=0)[:, None, :], pred[:, None, :])[:, 0, 0], "float32"))
        tokens = _log_softmax(logits[:, :vocabulary])
        moves = None if steps is None else _log_softmax(logits[:, vocabulary:])
        candidates = {}
        for i, (path_labels, frame, symbols, score, _) in enumerate(paths):
            for k in range(vocabulary):
                blank = k == blank_id
                if steps is None:
                    options = [(1 if blank else 0, 0.0)]
                else:
                    options = [(int(d), moves[i, j]) for j, d in enumerate(steps)
                               if not (blank and d == 0)]
                for move, move_score in options:
                    count = 0 if move > 0 else symbols + 1
                    if count >= max_symbols:
                        move, count = 1, 0
                    key = (path_labels if blank else path_labels + (k,), frame + move, count)
                    value = score + float(tokens[i, k]) + float(move_score)
                    if key not in candidates or value > candidates[key][0]:
                        candidates[key] = (value, i, None if blank else k)
        ranked = sorted(candidates.items(), key=lambda item: -item[1][0])
        kept = []
        for key, (value, parent, label) in ranked:
            if key[1] >= length:  # past the row's frames: a finished path
                if finished is None or value > finished[1]:
                    finished = (key[0], value)
            elif len(kept) < beam_width:
                kept.append((key, value, parent, label))
        if finished is not None:
            kept = [k for k in kept if k[1] > finished[1]]
        if not kept:
            break
        # The prediction network on each kept path's new label (from its
        # parent's state); a blank keeps its parent's.
        parents = ops.convert_to_tensor([paths[k[2]][4] for k in kept], "int32")
        tokens_in = ops.convert_to_tensor(
            [blank_id if k[3] is None else k[3] for k in kept], "int32")
        old_prediction = ops.take(prediction, parents, axis=0)
        old_states = [ops.take(s, parents, axis=0) for s in states]
        new_prediction, new_states = predictor.step(tokens_in, old_states)
        emitted = ops.convert_to_tensor(np.array([k[3] is not None for k in kept])[:, None])
        prediction = ops.where(emitted, new_prediction, old_prediction)
        states = [ops.where(emitted, new, old) for new, old in zip(new_states, old_states)]
        paths = [(key[0], key[1], key[2], value, j)
                 for j, (key, value, _, _) in enumerate(kept)]
    return finished


def _log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
