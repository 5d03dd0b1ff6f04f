"""`rnnt_loss` and `tdt_loss` against float64 NumPy references of their
lattice recursions, each checked by summing every path of small lattices
(TDT's also against transformers' own `tdt_loss`, ported from NeMo); a
row's loss independent of its padding and of the other rows; gradients
against finite differences of the reference. On every backend."""

import functools
import itertools

import keras
import numpy as np
import pytest

from keras_attn.training.transducer_loss import rnnt_loss
from keras_attn.training.transducer_loss import tdt_loss
from test_case import to_numpy


def compiled(fn, **fixed):
    """`fn` with `fixed` arguments, one compiled program on JAX (called op
    by op, JAX compiles the loop's body and every op again at each call)."""
    fn = functools.partial(fn, **fixed)
    if keras.backend.backend() == "jax":
        import jax

        return jax.jit(fn)
    return fn


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def reference(target, logits, frames, labels, blank=0):
    """-log P(target) of one row: the (T, U + 1) lattice walked cell by
    cell in float64."""
    log_probs = _log_softmax(logits[:frames, : labels + 1].astype("float64"))
    alpha = np.full((frames, labels + 1), -np.inf)
    alpha[0, 0] = 0.0
    for t in range(frames):
        for u in range(labels + 1):
            if t > 0:
                alpha[t, u] = np.logaddexp(alpha[t, u], alpha[t - 1, u] + log_probs[t - 1, u, blank])
            if u > 0:
                alpha[t, u] = np.logaddexp(alpha[t, u],
                                           alpha[t, u - 1] + log_probs[t, u - 1, target[u - 1]])
    return -(alpha[frames - 1, labels] + log_probs[frames - 1, labels, blank])


def every_path(target, logits, frames, labels, blank=0):
    """-log of the summed probability of every alignment: the T blanks and
    U labels in each order that ends with a blank."""
    log_probs = _log_softmax(logits.astype("float64"))
    total = 0.0
    for places in itertools.combinations(range(frames + labels - 1), labels):
        t = u = 0
        log_p = 0.0
        for step in range(frames + labels - 1):
            if step in places:
                log_p += log_probs[t, u, target[u]]
                u += 1
            else:
                log_p += log_probs[t, u, blank]
                t += 1
        total += np.exp(log_p + log_probs[t, u, blank])
    return -np.log(total)


def _batch(seed=0, batch=3, frames=5, labels=3, vocabulary=5):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 2, (batch, frames, labels + 1, vocabulary)).astype("float32")
    target = rng.integers(1, vocabulary, (batch, labels)).astype("int32")
    frame_counts = np.array([frames, 2, 3][:batch], "int32")
    label_counts = np.array([labels, 1, 0][:batch], "int32")
    return target, logits, label_counts, frame_counts


def test_the_reference_is_the_sum_over_every_path():
    rng = np.random.default_rng(1)
    for frames, labels in [(1, 0), (1, 2), (3, 2), (4, 3)]:
        logits = rng.normal(0, 2, (frames, labels + 1, 4))
        target = rng.integers(1, 4, labels)
        np.testing.assert_allclose(reference(target, logits, frames, labels),
                                   every_path(target, logits, frames, labels), rtol=1e-10)


def test_each_rows_loss_is_the_reference_whatever_its_padding_and_batch():
    target, logits, label_counts, frame_counts = _batch()
    loss = to_numpy(compiled(rnnt_loss)(target, logits, label_counts, frame_counts))
    expected = [reference(target[b], logits[b], frame_counts[b], label_counts[b])
                for b in range(len(target))]
    np.testing.assert_allclose(loss, expected, rtol=2e-5)
    # Padding changed (frames past a row's length, labels past its count)
    # and each row alone: the same losses.
    noisy, noisy_target = logits.copy(), target.copy()
    for b, (frames, labels) in enumerate(zip(frame_counts, label_counts)):
        noisy[b, frames:] = 50.0
        noisy[b, :, labels + 1:] = -50.0
        noisy_target[b, labels:] = 0
    np.testing.assert_allclose(
        to_numpy(compiled(rnnt_loss)(noisy_target, noisy, label_counts, frame_counts)), loss, rtol=1e-6)
    for b in range(len(target)):
        alone = compiled(rnnt_loss)(target[b:b + 1], logits[b:b + 1], label_counts[b:b + 1],
                          frame_counts[b:b + 1])
        np.testing.assert_allclose(to_numpy(alone), loss[b:b + 1], rtol=1e-6)


def test_another_blank_index():
    target, logits, label_counts, frame_counts = _batch(seed=2)
    target = np.where(target == 4, 1, target)  # the blank (4) is no label
    loss = to_numpy(compiled(rnnt_loss, blank_index=4)(target, logits, label_counts,
                                                         frame_counts))
    expected = [reference(target[b], logits[b], frame_counts[b], label_counts[b], blank=4)
                for b in range(len(target))]
    np.testing.assert_allclose(loss, expected, rtol=2e-5)


def _gradient(target, logits, label_counts, frame_counts):
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return np.asarray(jax.jit(jax.grad(lambda x: rnnt_loss(target, x, label_counts,
                                                               frame_counts).sum()))(logits))
    if backend == "tensorflow":
        import tensorflow as tf

        x = tf.constant(logits)
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(rnnt_loss(target, x, label_counts, frame_counts))
        return tape.gradient(loss, x).numpy()
    import torch

    x = torch.tensor(logits, requires_grad=True)
    rnnt_loss(target, x, label_counts, frame_counts).sum().backward()
    return x.grad.numpy()


def test_gradients_are_the_references_finite_differences():
    target, logits, label_counts, frame_counts = _batch(seed=3, batch=2, frames=3, labels=2,
                                                        vocabulary=3)
    got = _gradient(target, logits, label_counts, frame_counts)
    assert np.isfinite(got).all()
    expected = np.zeros(logits.shape)
    step = 1e-5
    for index in np.ndindex(logits.shape):
        b = index[0]
        plus, minus = logits.astype("float64"), logits.astype("float64")
        plus[index] += step
        minus[index] -= step
        expected[index] = (reference(target[b], plus[b], frame_counts[b], label_counts[b])
                           - reference(target[b], minus[b], frame_counts[b],
                                       label_counts[b])) / (2 * step)
    np.testing.assert_allclose(got, expected, atol=2e-4)
    # The padding gets no gradient.
    assert not got[1, frame_counts[1]:].any()


@pytest.mark.parametrize("which", ["rnnt", "tdt"])
def test_a_row_out_of_range_is_nan_and_the_others_keep_their_loss(which):
    target, tokens, lengths, label_counts, frame_counts = _tdt_batch(seed=7, batch=3)
    if which == "rnnt":
        loss_fn = compiled(lambda t, l, u, f: rnnt_loss(t, l, u, f))
    else:
        loss_fn = compiled(lambda t, l, u, f: tdt_loss(t, l, lengths, u, f, DURATIONS))
    good = to_numpy(loss_fn(target, tokens, label_counts, frame_counts))
    bad_rows = [  # (target, label counts, frame counts) with row 1 out of range
        (np.where(np.arange(3) == 0, 9, target), label_counts, frame_counts),  # id past V
        (np.where(np.arange(3) == 0, 0, target), label_counts, frame_counts),  # the blank
        (target, np.array([3, 4, 0]), frame_counts),  # more labels than U
        (target, np.array([3, -1, 0]), frame_counts),
        (target, label_counts, np.array([5, 6, 3])),  # more frames than T
        (target, label_counts, np.array([5, 0, 3])),
    ]
    for bad_target, labels, frames in bad_rows:
        bad_target = np.where(np.arange(3)[:, None] == 1, bad_target, target).astype("int32")
        loss = to_numpy(loss_fn(bad_target, tokens, labels.astype("int32"),
                                frames.astype("int32")))
        assert np.isnan(loss[1]), (labels, frames, bad_target)
        np.testing.assert_allclose(loss[[0, 2]], good[[0, 2]], rtol=1e-6)
    # An id past a row's own count is padding, not an error.
    padded = target.copy()
    padded[2, label_counts[2]:] = 9
    np.testing.assert_allclose(to_numpy(loss_fn(padded, tokens, label_counts, frame_counts)),
                               good, rtol=1e-6)


def test_a_target_that_does_not_fit_the_lattice_is_refused():
    target, logits, label_counts, frame_counts = _batch()
    with pytest.raises(ValueError, match=r"one more lattice position than `target` has "
                                         r"labels.*Received: target.shape=\(3, 2\)"):
        rnnt_loss(target[:, :2], logits, label_counts, frame_counts)


# === TDT: tokens and durations ===

DURATIONS = [0, 1, 2]


def tdt_reference(target, tokens, lengths, frames, labels, durations, blank=0, sigma=0.0):
    """-log P(target) of one row under TDT, cell by cell in float64: a
    label of duration d from (t - d, u - 1), a blank of duration d >= 1 from
    (t - d, u); the end, a blank landing on frame T."""
    log_probs = _log_softmax(tokens.astype("float64")) - sigma
    log_d = _log_softmax(lengths.astype("float64"))
    alpha = np.full((frames, labels + 1), -np.inf)
    alpha[0, 0] = 0.0
    for t in range(frames):
        for u in range(labels + 1):
            for i, d in enumerate(durations):
                if t - d < 0:
                    continue
                if d > 0:
                    alpha[t, u] = np.logaddexp(alpha[t, u], alpha[t - d, u]
                                               + log_probs[t - d, u, blank] + log_d[t - d, u, i])
                if u > 0:  # d = 0 reads (t, u - 1): this row, already final
                    alpha[t, u] = np.logaddexp(alpha[t, u], alpha[t - d, u - 1]
                                               + log_probs[t - d, u - 1, target[u - 1]]
                                               + log_d[t - d, u - 1, i])
    end = -np.inf
    for i, d in enumerate(durations):
        if d > 0 and frames - d >= 0:
            end = np.logaddexp(end, alpha[frames - d, labels] + log_probs[frames - d, labels, blank]
                               + log_d[frames - d, labels, i])
    return -end


def tdt_every_path(target, tokens, lengths, frames, labels, durations, blank=0):
    """-log of the summed probability of every TDT path, enumerated by
    depth-first search over (t, u)."""
    log_probs = _log_softmax(tokens.astype("float64"))
    log_d = _log_softmax(lengths.astype("float64"))
    total = [0.0]

    def walk(t, u, log_p):
        for i, d in enumerate(durations):
            if d > 0 and t + d == frames and u == labels:  # the last blank
                total[0] += np.exp(log_p + log_probs[t, u, blank] + log_d[t, u, i])
            if d > 0 and t + d < frames:
                walk(t + d, u, log_p + log_probs[t, u, blank] + log_d[t, u, i])
            if u < labels and t + d < frames:
                walk(t + d, u + 1, log_p + log_probs[t, u, target[u]] + log_d[t, u, i])

    walk(0, 0, 0.0)
    return -np.log(total[0])


def _tdt_batch(seed=0, batch=3, frames=5, labels=3, vocabulary=5):
    target, tokens, label_counts, frame_counts = _batch(seed, batch, frames, labels, vocabulary)
    rng = np.random.default_rng(seed + 100)
    lengths = rng.normal(0, 1, tokens.shape[:3] + (len(DURATIONS),)).astype("float32")
    return target, tokens, lengths, label_counts, frame_counts


def test_the_tdt_reference_is_the_sum_over_every_path():
    rng = np.random.default_rng(4)
    for frames, labels, durations in [(1, 0, [0, 1]), (2, 1, [0, 1]), (4, 2, DURATIONS),
                                      (5, 3, [0, 1, 2, 3]), (4, 2, [1, 2])]:
        tokens = rng.normal(0, 2, (frames, labels + 1, 4))
        lengths = rng.normal(0, 1, (frames, labels + 1, len(durations)))
        target = rng.integers(1, 4, labels)
        np.testing.assert_allclose(
            tdt_reference(target, tokens, lengths, frames, labels, durations),
            tdt_every_path(target, tokens, lengths, frames, labels, durations), rtol=1e-10)


def test_tdt_loss_is_the_reference_whatever_the_padding():
    target, tokens, lengths, label_counts, frame_counts = _tdt_batch()
    loss_fn = compiled(tdt_loss, durations=DURATIONS, sigma=0.05)
    loss = to_numpy(loss_fn(target, tokens, lengths, label_counts, frame_counts))
    expected = [tdt_reference(target[b], tokens[b], lengths[b], frame_counts[b],
                              label_counts[b], DURATIONS, sigma=0.05)
                for b in range(len(target))]
    np.testing.assert_allclose(loss, expected, rtol=2e-5)
    noisy_tokens, noisy_lengths, noisy_target = tokens.copy(), lengths.copy(), target.copy()
    for b, (frames, labels) in enumerate(zip(frame_counts, label_counts)):
        noisy_tokens[b, frames:] = 50.0
        noisy_lengths[b, :, labels + 1:] = -50.0
        noisy_target[b, labels:] = 0
    np.testing.assert_allclose(to_numpy(loss_fn(noisy_target, noisy_tokens, noisy_lengths,
                                                label_counts, frame_counts)), loss, rtol=1e-6)


@pytest.mark.backend_independent
def test_the_tdt_reference_is_transformers_loss():
    # transformers' tdt_loss (NeMo's TDTLossPytorch, ported), on padded rows.
    import torch
    from transformers.loss.loss_tdt import tdt_loss as transformers_tdt_loss

    target, tokens, lengths, label_counts, frame_counts = _tdt_batch(seed=6)
    theirs = transformers_tdt_loss(torch.tensor(tokens), torch.tensor(lengths),
                                   torch.tensor(target), torch.tensor(frame_counts),
                                   torch.tensor(label_counts), blank_token_id=0,
                                   durations=DURATIONS, sigma=0.05, reduction="none")
    expected = [tdt_reference(target[b], tokens[b], lengths[b], frame_counts[b],
                              label_counts[b], DURATIONS, sigma=0.05)
                for b in range(len(target))]
    np.testing.assert_allclose(theirs.numpy(), expected, rtol=1e-5)


def _tdt_gradient(target, tokens, lengths, label_counts, frame_counts):
    backend = keras.backend.backend()

    def loss(x, y):
        return tdt_loss(target, x, y, label_counts, frame_counts, DURATIONS)

    if backend == "jax":
        import jax

        return [np.asarray(g) for g in jax.jit(jax.grad(lambda x, y: loss(x, y).sum(),
                                                        argnums=(0, 1)))(tokens, lengths)]
    if backend == "tensorflow":
        import tensorflow as tf

        x, y = tf.constant(tokens), tf.constant(lengths)
        with tf.GradientTape() as tape:
            tape.watch([x, y])
            total = tf.reduce_sum(loss(x, y))
        return [g.numpy() for g in tape.gradient(total, [x, y])]
    import torch

    x = torch.tensor(tokens, requires_grad=True)
    y = torch.tensor(lengths, requires_grad=True)
    loss(x, y).sum().backward()
    return [x.grad.numpy(), y.grad.numpy()]


def test_tdt_gradients_are_the_references_finite_differences():
    target, tokens, lengths, label_counts, frame_counts = _tdt_batch(
        seed=5, batch=2, frames=3, labels=2, vocabulary=3)
    got = _tdt_gradient(target, tokens, lengths, label_counts, frame_counts)
    step = 1e-5
    for which, array in enumerate((tokens, lengths)):
        expected = np.zeros(array.shape)
        for index in np.ndindex(array.shape):
            b = index[0]
            values = []
            for sign in (1, -1):
                moved = [tokens.astype("float64"), lengths.astype("float64")]
                moved[which][index] += sign * step
                values.append(tdt_reference(target[b], moved[0][b], moved[1][b],
                                            frame_counts[b], label_counts[b], DURATIONS))
            expected[index] = (values[0] - values[1]) / (2 * step)
        np.testing.assert_allclose(got[which], expected, atol=2e-4)


@pytest.mark.parametrize("durations", [[], [0], [1, 1], [0, -1], [0.5, 1], "01"])
def test_durations_that_cannot_make_a_path_are_refused(durations):
    target, tokens, lengths, label_counts, frame_counts = _tdt_batch()
    with pytest.raises(ValueError, match=r"argument `durations`.*Received: durations="):
        tdt_loss(target, tokens, lengths, label_counts, frame_counts, durations)
