"""Checks that the packing tests of several families share."""

import keras
import numpy as np
import pytest
from keras import tree


def check_only_the_bad_row_is_nan_when_compiled(model, inputs, bad, row):
    """`model.predict_on_batch(bad)`, `inputs` with a bad packing in `row`:
    NaN in every float output of that row, the other rows' outputs those of
    `inputs`. PyTorch's predict runs eagerly: it raises, naming the
    segment ids."""
    if keras.backend.backend() == "torch":
        with pytest.raises(ValueError, match="segment_ids`"):
            model.predict_on_batch(bad)
        return
    clean = tree.flatten(model.predict_on_batch(inputs))
    got = tree.flatten(model.predict_on_batch(bad))
    for want, value in zip(clean, got):
        if not np.issubdtype(value.dtype, np.floating):  # lengths, ids
            continue
        others = [r for r in range(len(value)) if r != row]
        assert np.all(np.isnan(value[row]))
        np.testing.assert_allclose(value[others], want[others], atol=1e-5)


def check_fit_lowers_the_loss(model, inputs, labels, learning_rate, epochs=8):
    """`fit` on packed rows, one batch of them, trains on this backend
    (PyTorch traces the model on "meta" tensors first: the packing checks
    must run on them): finite losses that go down."""
    model.compile(optimizer=keras.optimizers.Adam(learning_rate))
    history = model.fit(inputs, labels, epochs=epochs, batch_size=len(labels),
                        shuffle=False, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0], losses
