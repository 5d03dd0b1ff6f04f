"""`rnnt_loss` against a float64 NumPy reference of the lattice recursion,
itself checked by summing every path of small lattices; a row's loss
independent of its padding and of the other rows; gradients against finite
differences of the reference. On every backend."""

import itertools

import keras
import numpy as np
import pytest

from keras_attn.training.transducer_loss import rnnt_loss
from test_case import to_numpy


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
    loss = to_numpy(rnnt_loss(target, logits, label_counts, frame_counts))
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
        to_numpy(rnnt_loss(noisy_target, noisy, label_counts, frame_counts)), loss, rtol=1e-6)
    for b in range(len(target)):
        alone = rnnt_loss(target[b:b + 1], logits[b:b + 1], label_counts[b:b + 1],
                          frame_counts[b:b + 1])
        np.testing.assert_allclose(to_numpy(alone), loss[b:b + 1], rtol=1e-6)


def test_another_blank_index():
    target, logits, label_counts, frame_counts = _batch(seed=2)
    target = np.where(target == 4, 1, target)  # the blank (4) is no label
    loss = to_numpy(rnnt_loss(target, logits, label_counts, frame_counts, blank_index=4))
    expected = [reference(target[b], logits[b], frame_counts[b], label_counts[b], blank=4)
                for b in range(len(target))]
    np.testing.assert_allclose(loss, expected, rtol=2e-5)


def _gradient(target, logits, label_counts, frame_counts):
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return np.asarray(jax.grad(lambda x: rnnt_loss(target, x, label_counts,
                                                       frame_counts).sum())(logits))
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


def test_a_target_that_does_not_fit_the_lattice_is_refused():
    target, logits, label_counts, frame_counts = _batch()
    with pytest.raises(ValueError, match=r"one more lattice position than `target` has "
                                         r"labels.*Received: target.shape=\(3, 2\)"):
        rnnt_loss(target[:, :2], logits, label_counts, frame_counts)
