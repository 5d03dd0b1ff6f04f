import numpy as np
import pytest

from keras_attn import layers
from keras_attn import viz


def _png_size(path):
    with open(path, "rb") as handle:
        header = handle.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")


@pytest.mark.backend_independent
def test_positional_encoding_plot(tmp_path):
    path = tmp_path / "pe.png"
    figure = viz.plot_positional_encoding(layers.sinusoidal_positional_encoding(50, 32), path=path)
    width, height = _png_size(path)
    assert width > 400 and height > 200
    heat = figure.axes[0].images[0].get_array()
    np.testing.assert_allclose(heat, layers.sinusoidal_positional_encoding(50, 32), atol=1e-6)
    # The legend sits beside the curves' axes, not over them.
    curves = figure.axes[1]
    figure.canvas.draw()
    legend, box = curves.get_legend().get_window_extent(), curves.get_window_extent()
    assert legend.x0 >= box.x1 and len(curves.get_legend().get_texts()) == 4


@pytest.mark.backend_independent
def test_attention_heads_plot(tmp_path):
    block = layers.TransformerBlock(num_heads=3, intermediate_dim=8)
    _, scores = block(np.random.rand(1, 4, 6).astype("float32"), return_attention_scores=True)
    path = tmp_path / "heads.png"
    figure = viz.plot_attention_heads(scores[0], ["a", "b", "c", "d"], path=path)
    assert _png_size(path)[0] > 200
    heads = [axis for axis in figure.axes if axis.images]
    assert [axis.get_title() for axis in heads] == ["head 0", "head 1", "head 2"]
    np.testing.assert_allclose(heads[1].images[0].get_array(), np.asarray(scores[0, 1]), atol=1e-6)
    # Tokens on both axes, the axes named, and one colour bar on one shared scale.
    assert [t.get_text() for t in heads[0].get_xticklabels()] == ["a", "b", "c", "d"]
    # A 2-column grid: each column's bottom head names the keys, each row's
    # first head the queries; the image reads at a page's width.
    assert heads[2].get_xlabel().startswith("key") and heads[2].get_ylabel().startswith("query")
    assert heads[1].get_xlabel().startswith("key") and heads[0].get_ylabel().startswith("query")
    assert heads[0].get_xlabel() == "" and heads[1].get_ylabel() == ""
    assert _png_size(path)[0] <= 1000
    colorbars = [axis for axis in figure.axes if axis.get_label() == "<colorbar>"]
    assert len(colorbars) == 1 and "attention weight" in colorbars[0].get_ylabel()
    assert {axis.images[0].get_clim() for axis in heads} == {(0, float(np.max(scores[0])))}


@pytest.mark.backend_independent
def test_attention_plot_rejects_mismatched_tokens():
    with pytest.raises(ValueError, match=r"Received: len\(query_tokens\)=2"):
        viz.plot_attention_heads(np.ones((2, 3, 3)) / 3, ["a", "b"])


@pytest.mark.backend_independent
def test_attention_plot_rejects_a_batch():
    with pytest.raises(ValueError, match=r"Received: scores.shape=\(1, 2, 3, 3\)"):
        viz.plot_attention_heads(np.ones((1, 2, 3, 3)) / 3, ["a", "b", "c"])


@pytest.mark.backend_independent
def test_learning_curves_plot_train_and_validation(tmp_path):
    history = {"accuracy": [0.2, 0.5, 0.7], "loss": [2.0, 1.5, 1.0],
               "val_loss": [2.1, 1.7, 1.4], "val_accuracy": [0.1, 0.4, 0.6]}
    path = tmp_path / "curves.png"
    figure = viz.plot_learning_curves(history, path=path, title="run")
    assert _png_size(path)[0] > 400
    panels = [axis for axis in figure.axes if axis.lines]
    assert [axis.get_title() for axis in panels] == ["loss", "accuracy"]
    train, validation = panels[1].lines
    np.testing.assert_allclose(train.get_ydata(), history["accuracy"])
    np.testing.assert_allclose(validation.get_ydata(), history["val_accuracy"])
    with pytest.raises(ValueError, match=r"Received: history=\{\}"):
        viz.plot_learning_curves({})
