"""Helpers for datasets whose every epoch is a pure function of
`(seed, epoch)`: what `keras_attn.training.resumable` needs to resume in the
middle of an epoch (`train_dataset_fn(epoch).skip(step)` must give the batches
the interrupted run would have seen)."""

import numpy as np


def epoch_permutation(count, seed, epoch):
    """The order of `count` examples in epoch `epoch`: a permutation keyed by
    `(seed, epoch)` only (NumPy's PCG64 seeded with both)."""
    return np.random.default_rng([int(seed), int(epoch)]).permutation(count)


def epoch_seed(seed, epoch):
    """A 31-bit integer seed for one epoch (for a seeded `Dataset.shuffle`
    with `reshuffle_each_iteration=False`), derived from `(seed, epoch)`."""
    return int(np.random.default_rng([int(seed), int(epoch)]).integers(2**31 - 1))


def bucket_batch_count(lengths, boundaries, batch_size):
    """How many batches `Dataset.bucket_by_sequence_length` makes of elements
    of these lengths (bucket i holds `boundaries[i-1] <= length <
    boundaries[i]`; each bucket ends with a partial batch). It does not
    depend on the order of the elements."""
    buckets = np.searchsorted(np.asarray(boundaries), np.asarray(lengths), side="right")
    members = np.bincount(buckets, minlength=len(boundaries) + 1)
    return int(np.sum(np.ceil(members / batch_size)))
