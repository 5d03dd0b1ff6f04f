"""int8 on every family and variant (ModernBERT, DINOv2: tests/_families.py's
VARIANTS): `model.quantize("int8")` (Keras) reaches every
projection of every block, the quantized model stays close to the float one,
and its `.keras` file loads quantized with the same outputs: the families
record the quantized layers in their config (`dtype_policy_with_quantization`).
The model quantized is one loaded from a `.keras` file and never called, as a
deployment would have it."""

import gc

import keras
import numpy as np
import pytest

from _families import FAMILIES
from _families import NAMES
from _families import TABLE
from _families import VARIANT_NAMES
from _families import outputs
from keras_attn import _keras_compat

PROJECTIONS = (keras.layers.Dense, keras.layers.EinsumDense)


def _quantize(model):
    """`model.quantize("int8")` with the objects that exist before it frozen
    out of the garbage collector's sight: Keras runs a full `gc.collect()` for
    every float kernel it deletes (to free device buffers soon), and in a
    process that holds TensorFlow or JAX each one walks ~500k objects (~1 s on
    a loaded 2-core machine: 15 s for the Conformer's 24 kernels). What
    quantize computes is unchanged; the kernels it drops are still freed by
    reference counting, and cyclic garbage waits for a later collection."""
    gc.freeze()
    try:
        model.quantize("int8")
    finally:
        gc.unfreeze()


def _seeded(family):
    """`family.build()` with the same weights in every run (rounding errors depend
    on them: unseeded, they depended on the tests run before in the same
    worker), the task heads set to trained-looking values: the ViT's head
    starts at zero and would hide every other difference."""
    keras.utils.set_random_seed(0)
    model = family.build()
    rng = np.random.default_rng(0)
    for layer in _keras_compat.sublayers(model):
        if layer.name in family.heads:
            layer.kernel.assign(rng.normal(0, 0.5, layer.kernel.shape).astype("float32"))
    return model


@pytest.mark.slow
@pytest.mark.parametrize("family", NAMES + VARIANT_NAMES)
def test_int8_reaches_every_projection_and_survives_saving(family, tmp_path):
    inputs = TABLE[family].inputs()
    original = _seeded(TABLE[family])
    float_outputs = outputs(original, inputs)
    # A deployment loads model.keras and quantizes it without calling it
    # first: Keras refuses to quantize a layer that is not built (the
    # Conformer's MelSpectrogram was built only at its first call).
    original.save(tmp_path / "float.keras")
    model = keras.saving.load_model(tmp_path / "float.keras")
    _quantize(model)

    projections = [layer for layer in _keras_compat.sublayers(model) if isinstance(layer, PROJECTIONS)]
    assert projections and all(layer.quantization_mode == "int8" for layer in projections)
    kernels = [w for layer in projections for w in layer.weights if w.name == "kernel"]
    assert len(kernels) == len(projections) and all(w.dtype == "int8" for w in kernels)
    quantized = outputs(model, inputs)
    for got, want in zip(quantized, float_outputs, strict=True):
        if np.issubdtype(want.dtype, np.floating):
            # Relative to the outputs' norm: in these width-16 models int8 moves
            # the outputs by 0.5-6% (16 seeds per family, JAX); a wrong scale or
            # a layer left unquantized-but-rescaled moves them by ~100%.
            error = np.linalg.norm(got - want) / np.linalg.norm(want)
            assert error <= 0.1, (family, error)
        else:  # lengths
            np.testing.assert_array_equal(got, want)

    model.save(tmp_path / "int8.keras")
    reloaded = keras.saving.load_model(tmp_path / "int8.keras")
    again = [layer for layer in _keras_compat.sublayers(reloaded) if isinstance(layer, PROJECTIONS)]
    assert sorted(layer.path for layer in again if layer.quantization_mode == "int8") == sorted(
        layer.path for layer in projections)
    for got, want in zip(outputs(reloaded, inputs), quantized, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    # Saved again from the reloaded model: still quantized, the same layers
    # and weights as the file its outputs were checked on (an outputs pass
    # more would cost as much again on JAX, where int8 runs op by op).
    reloaded.save(tmp_path / "again.keras")
    twice = keras.saving.load_model(tmp_path / "again.keras")
    layers = [layer for layer in _keras_compat.sublayers(twice) if isinstance(layer, PROJECTIONS)]
    assert sorted(layer.path for layer in layers if layer.quantization_mode == "int8") == sorted(
        layer.path for layer in projections)
    assert [w.path for w in twice.weights] == [w.path for w in reloaded.weights]
    for got, want in zip(twice.weights, reloaded.weights, strict=True):
        assert got.dtype == want.dtype, got.path
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(got),
                                      keras.ops.convert_to_numpy(want), err_msg=got.path)


@pytest.mark.slow
@pytest.mark.tf_only
def test_an_int8_model_exports_as_a_saved_model(tmp_path):
    import tensorflow as tf

    from keras_attn.export import export_saved_model

    images = FAMILIES["vit"].inputs()
    model = _seeded(FAMILIES["vit"])
    _quantize(model)
    want = outputs(model, images)[0]
    loaded = tf.saved_model.load(str(export_saved_model(model, tmp_path / "saved")))
    np.testing.assert_allclose(loaded.serve(tf.constant(images, tf.float32)).numpy(), want, atol=1e-5)
