"""Attention maps of every head."""

import math

import numpy as np
from keras import ops

from keras_attn.viz._figure import pyplot
from keras_attn.viz._figure import save


def plot_attention_heads(
    scores,
    query_tokens,
    key_tokens=None,
    path=None,
    title="Attention",
    columns=4,
):
    """One heat map per head: row = query token, column = key token.

    Args:
        scores: `(N, T, S)` probabilities of one example (slice a batch's
            `(B, N, T, S)` scores first), e.g. from
            `TransformerBlock(...)(x, return_attention_scores=True)`.
        query_tokens: T labels for the rows.
        key_tokens: S labels for the columns (default: `query_tokens`).
        path: where to write the PNG (None: only return the figure).
        title: figure title.
        columns: heads per row of the grid.

    Returns:
        The matplotlib Figure.
    """
    scores = np.asarray(ops.convert_to_numpy(ops.cast(scores, "float32")))
    key_tokens = query_tokens if key_tokens is None else key_tokens
    if scores.ndim != 3:
        raise ValueError(
            "`scores` must be (heads, queries, keys) for one example. "
            f"Received: scores.shape={scores.shape}"
        )
    if scores.shape[1:] != (len(query_tokens), len(key_tokens)):
        raise ValueError(
            f"`scores` of shape {scores.shape} do not match the tokens. Received: "
            f"len(query_tokens)={len(query_tokens)}, len(key_tokens)={len(key_tokens)}"
        )
    plt = pyplot()
    heads = scores.shape[0]
    columns = min(columns, heads)
    rows = math.ceil(heads / columns)
    size = 0.32 * max(len(query_tokens), len(key_tokens)) + 1.5
    figure, axes = plt.subplots(rows, columns, figsize=(size * columns, size * rows), squeeze=False)
    for head, axis in enumerate(axes.flat):
        if head >= heads:
            axis.axis("off")
            continue
        axis.imshow(scores[head], cmap="viridis", vmin=0, vmax=max(scores[head].max(), 1e-6))
        axis.set_title(f"head {head}")
        axis.set_xticks(range(len(key_tokens)), key_tokens, rotation=90, fontsize=7)
        axis.set_yticks(range(len(query_tokens)), query_tokens, fontsize=7)
    figure.suptitle(title)
    figure.tight_layout()
    save(figure, path)
    return figure
