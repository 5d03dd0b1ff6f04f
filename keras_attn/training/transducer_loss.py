"""The transducer losses in `keras.ops`, on every backend: RNN-T (Graves,
"Sequence Transduction with Recurrent Neural Networks", 2012) and TDT (Xu
et al., "Efficient Sequence Transduction by Jointly Predicting Tokens and
Durations", 2023: `tdt_loss`).

A transducer's joint network gives, for each encoder frame t and each count
u of labels already emitted, a distribution over the vocabulary and the
blank: `output[b, t, u]`. A path through the `(T, U + 1)` lattice starts at
(0, 0); a blank moves to the next frame (t + 1, u), the next label
`target[u]` to (t, u + 1); it ends with a blank from (T - 1, U). The loss
is minus the log of the summed probability of every path:

    alpha(0, 0) = 0
    alpha(t, u) = logaddexp(alpha(t - 1, u) + blank(t - 1, u),
                            alpha(t, u - 1) + label(t, u - 1))
    loss = -(alpha(T - 1, U) + blank(T - 1, U))

with `blank(t, u) = log_softmax(output[t, u])[blank_index]` and
`label(t, u) = log_softmax(output[t, u])[target[u]]`.

No Keras library has them (keras.ops has `ctc_loss` only; torchaudio's
`rnnt_loss` and NeMo's losses are PyTorch's alone), so they are written
here. The recursion runs
over the lattice's anti-diagonals (t + u = n): every cell of one diagonal
depends only on the diagonal before, so each of the T + U steps is one
vector operation over u (`keras.ops.fori_loop`, differentiable on each
backend), after the two `(B, T, U + 1)` log-probability tables are skewed
once so that step n reads its diagonal as a row.
"""

from keras import ops

# The log of an impossible cell: finite, so that logaddexp of two of them
# and its gradient stay finite (-inf - -inf is NaN).
_IMPOSSIBLE = -1e30


def _checked(target, target_length, output_length, frames, vocabulary, blank_index):
    """`(target, target_length, output_length, invalid)`: the arguments
    clipped into range for the gathers, and `(B,)` True for a row whose
    lengths or labels are out of range (a frame count outside 1..T, a
    label count outside 0..U, a label id outside [0, V) or the blank among
    its first `target_length`). Its loss is NaN: a compiled step cannot
    raise, and NaN never reaches the weights (the guarded optimizer skips
    the step) where a clamped id would train on a wrong label."""
    labels = ops.shape(target)[1]
    invalid = (output_length < 1) | (output_length > frames) | (target_length < 0) \
        | (target_length > labels)
    real = ops.arange(labels, dtype="int32")[None, :] < target_length[:, None]
    bad_id = real & ((target < 0) | (target >= vocabulary) | (target == blank_index))
    invalid = invalid | ops.any(bad_id, axis=1)
    return (ops.clip(target, 0, vocabulary - 1), ops.clip(target_length, 0, labels),
            ops.clip(output_length, 1, frames), invalid)


def _differ(labels, positions, extra):
    """Whether a static label count and lattice width do not match (sizes
    unknown until the call runs are checked by the shapes' use)."""
    return labels is not None and positions is not None and labels + extra != positions


def rnnt_loss(target, output, target_length, output_length, blank_index=0):
    """The RNN-T negative log-likelihood of each row (the module docstring).

    Mirrors `keras.ops.ctc_loss(target, output, target_length,
    output_length, mask_index)`: one loss per row, each depending only on
    that row's first `output_length` frames and `target_length` labels (the
    padding beyond them, and the other rows, change nothing).

    Args:
        target: `(B, U)` int label ids (the blank never among a row's first
            `target_length`).
        output: `(B, T, U + 1, V)` joint-network logits (before the
            softmax; computed in float32).
        target_length: `(B,)` int, labels of each row (0 to U).
        output_length: `(B,)` int, frames of each row (1 to T).
        blank_index: the blank's id in the vocabulary.

    Returns:
        `(B,)` float32 losses; NaN for a row whose lengths or labels are out
        of range (`output_length` outside 1..T, `target_length` outside
        0..U, a label outside [0, V) or the blank), the other rows as
        they are.

    >>> import numpy as np
    >>> # One frame, no label: the path is the blank alone.
    >>> logits = np.log(np.array([[[[0.25, 0.75]]]], "float32"))
    >>> loss = rnnt_loss(np.zeros((1, 0), "int32"), logits, np.array([0]), np.array([1]))
    >>> round(float(np.asarray(loss)[0]), 4) == round(float(-np.log(0.25)), 4)
    True
    """
    output = ops.cast(output, "float32")
    target = ops.cast(target, "int32")
    target_length = ops.cast(target_length, "int32")
    output_length = ops.cast(output_length, "int32")
    # Sizes unknown until the call runs (a tf.data batch of any width in a
    # tf.function) are tensors: the lattice loop's bounds are then too.
    batch, frames, positions = ops.shape(output)[:3]
    labels = positions - 1
    if _differ(target.shape[1], output.shape[2], 1):
        raise ValueError(
            "`output` must have one more lattice position than `target` has labels: "
            f"(B, T, U + 1, V) for (B, U). Received: target.shape={tuple(target.shape)}, "
            f"output.shape={tuple(output.shape)}")
    target, target_length, output_length, invalid = _checked(
        target, target_length, output_length, frames, output.shape[-1], blank_index)
    log_probs = ops.log_softmax(output, axis=-1)
    blank = log_probs[..., blank_index]  # (B, T, U + 1)
    # The label emitted from (t, u) is target[u]; from (t, U) none (its
    # column is never read: the lattice ends there).
    index = ops.concatenate([target, ops.zeros((batch, 1), "int32")], axis=1)
    index = ops.broadcast_to(index[:, None, :, None], (batch, frames, positions, 1))
    label = ops.take_along_axis(log_probs, index, axis=-1)[..., 0]  # (B, T, U + 1)

    # Skewed: row n holds the diagonal t + u = n (t = n - u), cells off
    # the lattice impossible.
    steps = frames + labels
    n = ops.arange(steps, dtype="int32")[:, None]
    u = ops.arange(positions, dtype="int32")[None, :]
    t = n - u  # (N, U + 1)
    on_lattice = (t >= 0) & (t < frames)
    gather = ops.broadcast_to(ops.clip(t, 0, frames - 1)[None], (batch, steps, positions))

    def skew(table):
        return ops.where(on_lattice[None], ops.take_along_axis(table, gather, axis=1),
                         _IMPOSSIBLE)

    blank_diagonals, label_diagonals = skew(blank), skew(label)
    # Each row ends at the diagonal of its last cell (T_b - 1, U_b).
    last = output_length - 1 + target_length  # (B,)
    at_end = ops.one_hot(target_length, positions, dtype="float32")  # (B, U + 1)

    first = ops.concatenate([ops.zeros((batch, 1)),
                             ops.full((batch, labels), _IMPOSSIBLE)], axis=1)
    impossible_column = ops.full((batch, 1), _IMPOSSIBLE)

    def body(step, carry):
        alpha, total = carry  # alpha: the diagonal step - 1
        # From the cell above (t - 1, u) by a blank, from the cell to the
        # left (t, u - 1) by a label: both on the previous diagonal.
        by_blank = alpha + ops.take(blank_diagonals, step - 1, axis=1)
        by_label = ops.concatenate(
            [impossible_column, (alpha + ops.take(label_diagonals, step - 1, axis=1))[:, :-1]],
            axis=1)
        alpha = ops.where(ops.take(on_lattice, step, axis=0)[None],
                          ops.logaddexp(by_blank, by_label), _IMPOSSIBLE)
        total = ops.where(ops.equal(last, step)[:, None], alpha, total)
        return alpha, total

    total = ops.where(ops.equal(last, 0)[:, None], first, ops.full((batch, positions),
                                                                   _IMPOSSIBLE))
    _, total = ops.fori_loop(1, steps, body, (first, total))
    end = ops.sum(total * at_end, axis=1)  # alpha(T_b - 1, U_b)
    final_blank = ops.take_along_axis(
        ops.take_along_axis(blank, ops.broadcast_to((output_length - 1)[:, None, None],
                                                    (batch, 1, positions)), axis=1)[:, 0],
        target_length[:, None], axis=1)[:, 0]
    return ops.where(invalid, float("nan"), -(end + final_blank))


def _skewed(table, frames, steps, positions):
    """`table` `(B, T, U + 1, ...)` re-indexed by diagonal: `[b, n, u]` is
    the cell (n - u, u), `_IMPOSSIBLE` off the lattice; and the mask of the
    cells on it `(N, U + 1)`."""
    n = ops.arange(steps, dtype="int32")[:, None]
    u = ops.arange(positions, dtype="int32")[None, :]
    t = n - u
    on_lattice = (t >= 0) & (t < frames)
    extra = len(table.shape) - 3
    index = ops.reshape(ops.clip(t, 0, frames - 1), (1, steps, positions) + (1,) * extra)
    index = ops.broadcast_to(index, (ops.shape(table)[0], steps, positions) + tuple(
        table.shape[3:]))
    mask = ops.reshape(on_lattice, (1, steps, positions) + (1,) * extra)
    return ops.where(mask, ops.take_along_axis(table, index, axis=1), _IMPOSSIBLE), on_lattice


def tdt_loss(target, token_output, duration_output, target_length, output_length,
             durations, blank_index=0, sigma=0.0):
    """The TDT (token-and-duration transducer) negative log-likelihood of
    each row, as NVIDIA's Parakeet-TDT checkpoints are trained.

    Every arc of the `(T, U + 1)` lattice also draws a duration `d` from
    `durations` (the joint's duration head): the next label `target[u]`
    moves from (t, u) to (t + d, u + 1) (d may be 0), a blank from (t, u)
    to (t + d, u) (d at least 1); a path ends with a blank that lands on
    frame T exactly. Token log-probabilities are `log_softmax - sigma`
    (the paper's logit under-normalisation), durations' `log_softmax`.
    One loss per row, each depending only on that row's first
    `output_length` frames and `target_length` labels.

    Args:
        target: `(B, U)` int label ids.
        token_output: `(B, T, U + 1, V)` token logits, the blank among them.
        duration_output: `(B, T, U + 1, len(durations))` duration logits.
        target_length: `(B,)` int, labels of each row (0 to U).
        output_length: `(B,)` int, frames of each row (1 to T).
        durations: the duration of each duration logit, distinct
            non-negative ints with at least one above 0 (Parakeet-TDT:
            `[0, 1, 2, 3, 4]`).
        blank_index: the blank's id among the tokens.
        sigma: the under-normalisation constant (0 in transformers'
            loss; NeMo's recipes train with 0.02 or 0.05).

    Returns:
        `(B,)` float32 losses; NaN for a row out of range, as `rnnt_loss`.

    >>> import numpy as np
    >>> # One frame, no label: a blank of duration 1 (probability 0.25 x 0.5).
    >>> tokens = np.log(np.array([[[[0.25, 0.75]]]], "float32"))
    >>> lengths = np.log(np.array([[[[0.5, 0.5]]]], "float32"))     # durations 0 and 1
    >>> loss = tdt_loss(np.zeros((1, 0), "int32"), tokens, lengths, np.array([0]),
    ...                 np.array([1]), durations=[0, 1])
    >>> round(float(np.asarray(loss)[0]), 4) == round(float(-np.log(0.125)), 4)
    True
    """
    if isinstance(durations, (str, bytes)) or not durations or any(
            isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in durations) \
            or len(set(durations)) != len(durations) or max(durations) < 1:
        raise ValueError("Invalid value for argument `durations`: distinct non-negative ints, "
                         f"one at least 1 (a blank must move). Received: durations={durations!r}")
    durations = [int(d) for d in durations]
    token_output = ops.cast(token_output, "float32")
    duration_output = ops.cast(duration_output, "float32")
    target = ops.cast(target, "int32")
    target_length = ops.cast(target_length, "int32")
    output_length = ops.cast(output_length, "int32")
    batch, frames, positions = ops.shape(token_output)[:3]
    labels = positions - 1
    if _differ(target.shape[1], token_output.shape[2], 1) or \
            duration_output.shape[-1] != len(durations):
        raise ValueError(
            "`token_output` must have one more lattice position than `target` has labels, and "
            "`duration_output` one logit per duration: (B, T, U + 1, V), (B, U) and "
            f"(B, T, U + 1, {len(durations)}). Received: target.shape={tuple(target.shape)}, "
            f"token_output.shape={tuple(token_output.shape)}, "
            f"duration_output.shape={tuple(duration_output.shape)}")
    target, target_length, output_length, invalid = _checked(
        target, target_length, output_length, frames, token_output.shape[-1], blank_index)
    log_probs = ops.log_softmax(token_output, axis=-1) - sigma
    blank = log_probs[..., blank_index]
    index = ops.concatenate([target, ops.zeros((batch, 1), "int32")], axis=1)
    index = ops.broadcast_to(index[:, None, :, None], (batch, frames, positions, 1))
    label = ops.take_along_axis(log_probs, index, axis=-1)[..., 0]
    duration = ops.log_softmax(duration_output, axis=-1)  # (B, T, U + 1, D)

    steps = frames + labels
    blank_d, on_lattice = _skewed(blank, frames, steps, positions)
    label_d, _ = _skewed(label, frames, steps, positions)
    duration_d, _ = _skewed(duration, frames, steps, positions)  # (B, N, U + 1, D)
    # history[k]: the diagonal step - 1 - k (a blank of duration d comes
    # from diagonal step - d, a label of duration d from step - d - 1).
    depth = max(durations) + 1
    impossible = ops.full((batch, positions), _IMPOSSIBLE)
    first = ops.concatenate([ops.zeros((batch, 1)), ops.full((batch, labels), _IMPOSSIBLE)],
                            axis=1)
    impossible_column = ops.full((batch, 1), _IMPOSSIBLE)
    end_at = ops.one_hot(target_length, positions, dtype="float32")  # (B, U + 1)

    def read(table, step):  # the diagonal `step` of a skewed table, impossible before 0
        row = ops.take(table, ops.maximum(step, 0), axis=1)
        return ops.where(step >= 0, row, _IMPOSSIBLE)

    def ending(alpha, step, total):
        # A blank of duration d from (T_b - d, U_b), on diagonal T_b - d + U_b.
        at_end = ops.sum(alpha * end_at, axis=1)
        for i, d in enumerate(durations):
            if d == 0:
                continue
            arc = at_end + ops.sum((read(blank_d, step) + read(duration_d, step)[..., i])
                                   * end_at, axis=1)
            here = ops.equal(output_length - d + target_length, step)
            total = ops.where(here, ops.logaddexp(total, arc), total)
        return total

    def body(step, carry):
        history, total = carry
        candidates = []
        for i, d in enumerate(durations):
            if d > 0:  # a blank, from (t - d, u) on diagonal step - d
                candidates.append(history[d - 1] + read(blank_d, step - d)
                                  + read(duration_d, step - d)[..., i])
            # a label, from (t - d, u - 1) on diagonal step - d - 1
            source = history[d] + read(label_d, step - d - 1) + read(duration_d,
                                                                     step - d - 1)[..., i]
            candidates.append(ops.concatenate([impossible_column, source[:, :-1]], axis=1))
        alpha = ops.logsumexp(ops.stack(candidates, axis=0), axis=0)
        alpha = ops.where(ops.take(on_lattice, step, axis=0)[None], alpha, _IMPOSSIBLE)
        history = ops.concatenate([alpha[None], history[:-1]], axis=0)
        return history, ending(alpha, step, total)

    history = ops.concatenate([first[None]] + [impossible[None]] * (depth - 1), axis=0)
    total = ending(first, 0, ops.full((batch,), _IMPOSSIBLE))
    _, total = ops.fori_loop(1, steps, body, (history, total))
    return ops.where(invalid, float("nan"), -total)
