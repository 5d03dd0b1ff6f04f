"""The exporters refuse another backend at the call, saying what works."""

import keras
import pytest

from keras_attn import export


@pytest.mark.parametrize("name", [n for n in export.__all__ if n.startswith("export_")])
def test_every_exporter_refuses_a_backend_other_than_tensorflow(name, monkeypatch, tmp_path):
    if keras.backend.backend() == "tensorflow":  # the same check, seen from JAX
        monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    backend = keras.backend.backend()
    exporter = getattr(export, name)
    arguments = {"export_text_classifier": (None, None, tmp_path / "out"),
                 "export_translator": (None, tmp_path / "out", 2, 3),
                 "export_portable": (None, tmp_path / "out", "onnx"),
                 "export_streaming": (None, tmp_path / "out", "litert")}.get(
        name, (None, tmp_path / "out"))
    with pytest.raises(RuntimeError, match=rf"{name} .*runs Keras on '{backend}'.*keras-attn export"):
        exporter(*arguments)
    assert not (tmp_path / "out").exists()
