"""The positional-encoding table as a picture."""

import numpy as np
from keras import ops

from keras_attn.viz._figure import pyplot
from keras_attn.viz._figure import save


def plot_positional_encoding(table, path=None, title="Sinusoidal positional encoding", dims=None):
    """Heat map of a `(positions, depth)` table, and a few of its columns as curves.

    Args:
        table: `(T, D)` array, e.g. `sinusoidal_positional_encoding(100, 512)`
            or a learned `PositionEmbedding`'s weights.
        path: where to write the PNG (None: only return the figure).
        title: figure title.
        dims: depth indices drawn as curves over position; by default four
            sine columns from fast to slow (0, D/16, D/8, D/4, rounded even).

    Returns:
        The matplotlib Figure.
    """
    table = np.asarray(ops.convert_to_numpy(table), dtype="float32")
    if table.ndim != 2:
        raise ValueError(
            f"`table` must be (positions, depth). Received: table.shape={table.shape}"
        )
    if dims is None:
        depth = table.shape[1]
        dims = sorted({2 * (depth // d // 2) for d in (16, 8, 4)} | {0})
    plt = pyplot()
    figure, (heat, curves) = plt.subplots(
        1, 2, figsize=(14, 4.5), gridspec_kw={"width_ratios": [1.6, 1]}, layout="constrained"
    )
    image = heat.imshow(table, aspect="auto", cmap="RdBu", vmin=-1, vmax=1, interpolation="nearest")
    heat.set_xlabel("depth index i (sin at even i, cos at odd i)")
    heat.set_ylabel("position")
    heat.set_title(title)
    figure.colorbar(image, ax=heat)
    for dim in dims:
        if dim < table.shape[1]:
            curves.plot(table[:, dim], label=f"dim {dim}")
    curves.set_xlabel("position")
    curves.set_title("columns of the table")
    # Beside the curves, never over them (they fill the whole [-1, 1] band).
    curves.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    save(figure, path)
    return figure
