"""Learning curves: the loss and every metric per epoch, training and
validation, from a Keras history."""

from keras_attn.viz._figure import pyplot
from keras_attn.viz._figure import save


def plot_learning_curves(history, path=None, title=None):
    """One panel per quantity of `history` (`loss`, `accuracy`, ...), with
    the training curve and, where logged, the validation one (`val_<name>`).

    Args:
        history: `{name: [value per epoch]}` (`History.history`, or what
            `ResumableTrainer.fit` returns).
        path: where to write the PNG (atomically); None for none.
        title: the figure's title.

    Returns:
        The matplotlib figure.

    Example:

    >>> figure = plot_learning_curves({"loss": [2.0, 1.0], "val_loss": [2.1, 1.4]})
    >>> [axis.get_title() for axis in figure.axes]
    ['loss']
    """
    names = [name for name in history if not name.startswith("val_")]
    names += [name[4:] for name in history if name.startswith("val_") and name[4:] not in history]
    names.sort(key=lambda name: name != "loss")  # the loss first, then as logged
    if not names:
        raise ValueError(f"`history` has no curve to plot. Received: history={history!r}")
    plt = pyplot()
    from matplotlib import ticker

    columns = min(3, len(names))
    rows = -(-len(names) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows),
                                squeeze=False)
    for axis, name in zip(axes.flat, names):
        for key, label in ((name, "train"), (f"val_{name}", "validation")):
            values = history.get(key)
            if values:
                axis.plot(range(1, len(values) + 1), values, marker="." if len(values) < 30 else None,
                          label=label)
        axis.set_title(name)
        axis.set_xlabel("epoch")
        axis.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
        axis.legend()
    for axis in list(axes.flat)[len(names):]:
        axis.axis("off")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    save(figure, path)
    plt.close(figure)
    return figure
