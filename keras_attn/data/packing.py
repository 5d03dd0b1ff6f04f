"""Packing variable-length examples into rows of a fixed length.

A padded batch spends its attention and feed-forward work on padding: on
Wikipedia-like data at length 512, more than half of the tokens. A packed row
holds several whole examples one after the other, then padding:

```
tokens       a a a b b b b b c c 0 0      (3 examples in a row of 12)
segment_ids  1 1 1 2 2 2 2 2 3 3 0 0      (0 = padding)
positions    0 1 2 0 1 2 3 4 0 1 0 0      (restart with each example)
```

The layers turn `segment_ids` into a block-diagonal attention mask and
`positions` into each example's own position vectors
(`keras_attn.layers.MultiHeadAttention(segment_ids=...)`,
`PositionEmbedding(positions=...)`), so that each example gets the outputs
and gradients it gets alone; docs/packing.md states the contract.

Neither Keras nor keras-hub packs across examples (checked in keras-hub
0.32): `MultiSegmentPacker` joins the segments of *one* example
(`[CLS] A [SEP] B [SEP]`), `StartEndPacker` pads one sequence and
`keras.utils.pad_sequences` pads. Hence this module, in pure NumPy (no
TensorFlow), run once per epoch on the lengths.

The algorithm is best-fit decreasing (BFD) over a shuffle buffer: the
examples of an epoch are shuffled, cut into buffers of `buffer_size`, and
each buffer is packed by taking its examples longest first and putting each
into the open row it leaves the least room in (a new row when none fits).
Krell et al., "Efficient Sequence Packing without Cross-contamination"
(Graphcore, 2021, arXiv:2107.02027) pack Wikipedia BERT data with a
histogram form of first-fit decreasing (SPFHP) to a fill above 99% and find
their optimal solver (NNLSHP) not worth its cost; FFD and BFD share the
11/9 bound of the optimum. The buffer keeps the packing a stream (memory
bounded by the buffer, examples mixed across the corpus) at a small cost in
fill (`tests/data/test_packing.py` measures it). For source-target pairs the
same search runs on two lengths at once: a row takes an example when both
its source and its target fit (vector bin packing), so that segment `i` of
the source row and of the target row are the same example.

The packing of an epoch is a pure function of `(seed, epoch, lengths)`
(NumPy's PCG64 keyed by them, then deterministic ties), so
`keras_attn.training.resumable` resumes mid-epoch by rebuilding the epoch
and skipping the batches already seen.
"""

import numbers

import numpy as np

from keras_attn._epochs import epoch_permutation


def _check_positive(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(
            f"Invalid value for argument `{name}`: it must be a positive integer. "
            f"Received: {name}={value!r}"
        )
    return int(value)


def _check_lengths(name, lengths, row_length):
    """`lengths` as int64 `(n,)`, each in `[1, row_length]`."""
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or (lengths.size and lengths.dtype.kind not in "iu"):
        raise ValueError(
            f"Invalid value for argument `{name}`: it must be a list of "
            f"sequence lengths (integers). Received: {name} of shape "
            f"{lengths.shape} and dtype {lengths.dtype}"
        )
    bad = np.flatnonzero((lengths < 1) | (lengths > row_length))
    if bad.size:
        raise ValueError(
            f"Invalid value for argument `{name}`: every example must hold 1 "
            f"to {row_length} steps to fit a row (truncate it first). "
            f"Received: {name}[{bad[0]}]={lengths[bad[0]]}"
        )
    return lengths.astype("int64")


def _check_shapes(name, examples):
    """Every example an array of at least one axis (time), all of the same
    shape past it (`(L,)` tokens, or `(L, F)` frames of one F): a packed row
    holds one shape, and NumPy's "could not broadcast" names no example."""
    shapes = [np.shape(example) for example in examples]
    for index, shape in enumerate(shapes):
        if len(shape) < 1 or shape[1:] != shapes[0][1:]:
            past = "".join(f", {size}" for size in shapes[0][1:])
            want = f"(L{past})" if past else "(L,)"
            raise ValueError(
                f"Invalid value for argument `{name}`: every example must have the shape "
                f"{want} of example 0 (a first axis of steps, the same axes past it). "
                f"Received: {name}[{index}] of shape {shape}"
            )


def _best_fit_decreasing(sizes, capacity, max_segments):
    """Rows (lists of indices into `sizes` `(n, d)`) packing every item into
    bins of `capacity` `(d,)`, at most `max_segments` items each.

    Items are taken longest first (largest fraction of a bin in any of the d
    dimensions; ties keep the given order, so the result is deterministic)
    and each goes to the open row where it leaves the least room (summed
    over dimensions as fractions of a bin; the first such row on ties).
    """
    order = np.argsort(-(sizes / capacity).max(axis=1), kind="stable")
    space = np.zeros_like(sizes)  # (rows, d): room left in each open row
    counts = np.zeros(len(sizes), "int64")
    rows = []
    for item in order:
        size = sizes[item]
        open_rows = space[: len(rows)]
        fits = np.all(open_rows >= size, axis=1) & (counts[: len(rows)] < max_segments)
        if fits.any():
            candidates = np.flatnonzero(fits)
            left = ((open_rows[candidates] - size) / capacity).sum(axis=1)
            row = int(candidates[np.argmin(left)])
        else:
            row = len(rows)
            rows.append([])
            space[row] = capacity
        space[row] -= size
        counts[row] += 1
        rows[row].append(int(item))
    return rows


def pack_rows(lengths, row_length, target_lengths=None, target_row_length=None,
              buffer_size=4096, seed=0, epoch=0, max_segments=None):
    """Which examples go into which row, for one epoch.

    Args:
        lengths: the number of steps of each example, `(n,)` integers.
        row_length: steps per packed row; each length must be at most this.
        target_lengths: for pairs (translation), the target's length of each
            example; its row has `target_row_length` steps (default
            `row_length`), and an example goes where both fit.
        target_row_length: see `target_lengths`.
        buffer_size: examples packed together (after the epoch's shuffle);
            larger packs tighter and mixes more.
        seed: the shuffle's seed.
        epoch: the epoch: each epoch is shuffled and packed anew, as a pure
            function of `(seed, epoch, lengths)`.
        max_segments: at most this many examples in a row (e.g. a fixed
            number of `[CLS]` heads); None for no limit.

    Returns:
        A list of rows, in the epoch's order, each a list of example indices
        in the order they sit in the row.

    Example:

    >>> pack_rows([5, 3, 8, 2, 6], row_length=8, buffer_size=8)
    [[4, 3], [0, 1], [2]]
    """
    row_length = _check_positive("row_length", row_length)
    lengths = _check_lengths("lengths", lengths, row_length)
    sizes, capacity = lengths[:, None], np.array([row_length])
    if target_lengths is not None:
        target_row_length = _check_positive(
            "target_row_length", row_length if target_row_length is None else target_row_length)
        target_lengths = _check_lengths("target_lengths", target_lengths, target_row_length)
        if len(target_lengths) != len(lengths):
            raise ValueError(
                "Invalid value for argument `target_lengths`: one per example. "
                f"Received: {len(lengths)} lengths and {len(target_lengths)} target_lengths"
            )
        sizes = np.stack([lengths, target_lengths], axis=1)
        capacity = np.array([row_length, target_row_length])
    elif target_row_length is not None:
        raise ValueError(
            "Invalid value for argument `target_row_length`: it sizes the rows "
            f"of `target_lengths`, which are missing. Received: target_row_length="
            f"{target_row_length!r}"
        )
    buffer_size = _check_positive("buffer_size", buffer_size)
    max_segments = len(lengths) if max_segments is None else _check_positive(
        "max_segments", max_segments)

    order = epoch_permutation(len(lengths), seed, epoch)
    rows = []
    for start in range(0, len(order), buffer_size):
        chosen = order[start:start + buffer_size]
        for row in _best_fit_decreasing(sizes[chosen], capacity, max_segments):
            rows.append([int(chosen[i]) for i in row])
    # Longest-first packing leaves the full rows of long examples first:
    # the epoch's rows are shuffled again (a stream of its own, keyed by the
    # same seed and epoch).
    shuffle = np.random.default_rng([int(seed), int(epoch), 1]).permutation(len(rows))
    return [rows[i] for i in shuffle]


def _aligned(length, alignment):
    return -(-length // alignment) * alignment


def _fill_rows(examples, rows, row_length, pad_value, alignment=1):
    """`(values, segment_ids, positions)` of the packed rows: `values`
    `(R, row_length, ...)` in the examples' dtype, the others int32. Each
    example starts at a multiple of `alignment` steps (padding between)."""
    first = np.asarray(examples[rows[0][0]]) if rows else np.zeros((0,), "int32")
    values = np.full((len(rows), row_length) + first.shape[1:], pad_value, first.dtype)
    segment_ids = np.zeros((len(rows), row_length), "int32")
    positions = np.zeros((len(rows), row_length), "int32")
    for r, row in enumerate(rows):
        start = 0
        for segment, index in enumerate(row, start=1):
            example = np.asarray(examples[index])
            end = start + len(example)
            values[r, start:end] = example
            segment_ids[r, start:end] = segment
            positions[r, start:end] = np.arange(len(example))
            start = start + _aligned(len(example), alignment)
    return values, segment_ids, positions


def pack_sequences(sequences, row_length, targets=None, target_row_length=None,
                   buffer_size=4096, seed=0, epoch=0, max_segments=None, pad_value=0):
    """Packs variable-length examples into rows with segment ids and
    restarted positions, for one epoch (see `pack_rows` for the arguments
    they share).

    Args:
        sequences: a list of examples, each an array whose first axis is time
            (token ids `(L,)`, or feature frames `(L, F)`).
        row_length: steps per row.
        targets: for pairs, a list of target sequences, packed in step with
            `sequences` into rows of `target_row_length`.
        target_row_length: steps per target row (default `row_length`).
        buffer_size, seed, epoch, max_segments: as in `pack_rows`.
        pad_value: the value of padding steps.

    Returns:
        A dict of NumPy arrays, one row each (R rows):
        `"inputs"` `(R, row_length, ...)`, `"segment_ids"` and `"positions"`
        `(R, row_length)` int32 (segment 0 = padding, positions restart at
        0 with each example), `"example_ids"` `(R, K)` int64: the index (into
        `sequences`) of segment `k + 1` of each row, -1 past its last
        (K = the most examples in a row). With `targets`, also `"targets"`,
        `"target_segment_ids"` and `"target_positions"`, the same example
        in segment `k` of both rows.

    Example:

    >>> packed = pack_sequences([[5, 6, 7], [8, 9], [4, 4, 4, 4]], row_length=5)
    >>> packed["inputs"].tolist()
    [[5, 6, 7, 8, 9], [4, 4, 4, 4, 0]]
    >>> packed["segment_ids"].tolist(), packed["positions"].tolist()
    ([[1, 1, 1, 2, 2], [1, 1, 1, 1, 0]], [[0, 1, 2, 0, 1], [0, 1, 2, 3, 0]])
    >>> packed["example_ids"].tolist()
    [[0, 1], [2, -1]]
    """
    _check_shapes("sequences", sequences)
    if targets is not None:
        _check_shapes("targets", targets)
    lengths = [len(s) for s in sequences]
    target_lengths = None if targets is None else [len(t) for t in targets]
    rows = pack_rows(lengths, row_length, target_lengths, target_row_length,
                     buffer_size=buffer_size, seed=seed, epoch=epoch, max_segments=max_segments)
    packed = dict(zip(("inputs", "segment_ids", "positions"),
                      _fill_rows(sequences, rows, row_length, pad_value)))
    if targets is not None:
        target_row_length = row_length if target_row_length is None else target_row_length
        packed.update(zip(("targets", "target_segment_ids", "target_positions"),
                          _fill_rows(targets, rows, target_row_length, pad_value)))
    width = max((len(row) for row in rows), default=0)
    packed["example_ids"] = np.array([row + [-1] * (width - len(row)) for row in rows],
                                     "int64").reshape(len(rows), width)
    return packed


def pack_utterances(features, row_length, labels=None, alignment=4, buffer_size=4096,
                    seed=0, epoch=0, max_segments=None, pad_value=0.0):
    """Packs utterances (feature frames) into rows for the Conformer, each
    utterance starting at a multiple of `alignment` frames, for one epoch.

    The Conformer's subsampling reads input frames `4t .. 4t + 6` for its
    output frame `t` (unpadded convolutions): an utterance that starts at a
    multiple of 4 gets exactly its output frames alone, and the frames that
    straddle two utterances become padding
    (`keras_attn.layers.conv_subsampling.subsampled_segment_ids`). The
    convolution module and the attention read each utterance's own frames
    only, so no longer gap is needed: an utterance takes its length rounded
    up to `alignment` frames of a row.

    Args:
        features: a list of utterances, each `(L, F)` frames (log-mel).
        row_length: frames per row, a multiple of `alignment`; each
            utterance's length rounded up to `alignment` must fit.
        labels: optional list of each utterance's token ids `(L_i,)` (1..V),
            packed per row as `(R, K, L)` with 0 padding.
        alignment: the subsampling factor (4 for `ConvSubsampling`).
        buffer_size, seed, epoch, max_segments: as in `pack_rows`.
        pad_value: the value of padding frames.

    Returns:
        A dict of NumPy arrays (R rows, K = the most utterances in a row):
        `"inputs"` `(R, row_length, F)`, `"segment_ids"` and `"positions"`
        `(R, row_length)` int32 (0 between and after the utterances),
        `"example_ids"` `(R, K)` as in `pack_sequences`, `"lengths"` `(R, K)`
        int32 frames of each utterance (0 past a row's last), and with
        `labels`, `"labels"` `(R, K, L)` int32 (L the longest transcript).

    Example:

    >>> frames = [np.ones((5, 2)), np.ones((3, 2)), np.ones((8, 2))]
    >>> packed = pack_utterances(frames, row_length=12, labels=[[1], [2, 3], [4]])
    >>> packed["segment_ids"].tolist()
    [[1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 0]]
    >>> packed["lengths"].tolist(), packed["labels"].tolist()
    ([[5, 0], [8, 3]], [[[1, 0], [0, 0]], [[4, 0], [2, 3]]])
    """
    alignment = _check_positive("alignment", alignment)
    row_length = _check_positive("row_length", row_length)
    if row_length % alignment:
        raise ValueError(
            "Invalid value for argument `row_length`: it must be a multiple of "
            f"alignment={alignment}. Received: row_length={row_length}"
        )
    _check_shapes("features", features)
    lengths = np.array([len(f) for f in features], "int64")
    aligned = _check_lengths(
        "features", _aligned(lengths, alignment) if len(lengths) else lengths, row_length)
    rows = pack_rows(aligned, row_length, buffer_size=buffer_size, seed=seed, epoch=epoch,
                     max_segments=max_segments)
    packed = dict(zip(("inputs", "segment_ids", "positions"),
                      _fill_rows(features, rows, row_length, pad_value, alignment)))
    width = max((len(row) for row in rows), default=0)
    ids = np.array([row + [-1] * (width - len(row)) for row in rows], "int64")
    packed["example_ids"] = ids.reshape(len(rows), width)
    packed["lengths"] = np.where(ids >= 0, lengths[ids], 0).astype("int32").reshape(
        len(rows), width)
    if labels is not None:
        if len(labels) != len(lengths):
            raise ValueError(
                "Invalid value for argument `labels`: one transcript per utterance. "
                f"Received: {len(lengths)} utterances and {len(labels)} labels"
            )
        longest = max((len(t) for t in labels), default=0)
        table = np.zeros((len(rows), width, longest), "int32")
        for r, row in enumerate(rows):
            for k, index in enumerate(row):
                table[r, k, :len(labels[index])] = labels[index]
        packed["labels"] = table
    return packed


def packing_fill(segment_ids):
    """The fraction of steps that hold a real token (segment id > 0): 1 for
    rows without padding."""
    segment_ids = np.asarray(segment_ids)
    return float(np.mean(segment_ids > 0)) if segment_ids.size else 0.0
