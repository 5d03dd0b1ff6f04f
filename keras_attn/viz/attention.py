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
    columns=2,
):
    """One heat map per head: row = query token, column = key token, on one
    colour scale for all heads (0 to the largest weight), with its colour bar.

    Args:
        scores: `(N, T, S)` probabilities of one example (slice a batch's
            `(B, N, T, S)` scores first), e.g. from
            `TransformerBlock(...)(x, return_attention_scores=True)`.
        query_tokens: T labels for the rows.
        key_tokens: S labels for the columns (default: `query_tokens`).
        path: where to write the PNG (None: only return the figure).
        title: figure title.
        columns: heads per row of the grid (2: four heads read as a 2 x 2
            grid at a page's width).

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
    # Sized to read at a page's width (~10 inches at 100 dpi, a README's
    # ~900 pixels): 0.2 inch per token leaves room for 8-point labels.
    size = 0.2 * max(len(query_tokens), len(key_tokens)) + 1.0
    figure, axes = plt.subplots(rows, columns, figsize=(size * columns + 1.0, size * rows + 0.4),
                                squeeze=False, layout="constrained")
    # One scale for every head, so that heads can be compared by colour.
    top = max(float(scores.max()), 1e-6)
    image = None
    for head, axis in enumerate(axes.flat):
        if head >= heads:
            axis.axis("off")
            continue
        image = axis.imshow(scores[head], cmap="viridis", vmin=0, vmax=top)
        axis.set_title(f"head {head}", fontsize=10)
        axis.set_xticks(range(len(key_tokens)), key_tokens, rotation=90, fontsize=8)
        axis.set_yticks(range(len(query_tokens)), query_tokens, fontsize=8)
        if head % columns == 0:  # one label per row and column of the grid
            axis.set_ylabel("query (attending)", fontsize=9)
        if head >= heads - columns:
            axis.set_xlabel("key (attended to)", fontsize=9)
    # Beside the grid, as tall as it (constrained layout keeps it attached).
    figure.colorbar(image, ax=axes, label="attention weight", fraction=0.04, pad=0.02)
    figure.suptitle(title, fontsize=11)
    save(figure, path, dpi=100)
    return figure
