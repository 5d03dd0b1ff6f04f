"""The RNN-T loss (Graves, "Sequence Transduction with Recurrent Neural
Networks", 2012) in `keras.ops`, on every backend.

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

No Keras library has it (keras.ops has `ctc_loss` only; torchaudio's
`rnnt_loss` is PyTorch's alone), so it is written here. The recursion runs
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
        `(B,)` float32 losses.

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
    batch, frames, positions = ops.shape(output)[0], output.shape[1], output.shape[2]
    labels = positions - 1
    if target.shape[1] != labels:
        raise ValueError(
            "`output` must have one more lattice position than `target` has labels: "
            f"(B, T, U + 1, V) for (B, U). Received: target.shape={tuple(target.shape)}, "
            f"output.shape={tuple(output.shape)}")
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
    return -(end + final_blank)
