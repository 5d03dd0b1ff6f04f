"""SavedModel export of a Transformer with beam search, reloaded in a fresh
interpreter (no keras_attn objects there)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from keras_attn.export import export_translator
from keras_attn.models.transformer import build_transformer
from keras_attn.models.transformer.decoding import transformer_beam_search
from test_case import to_numpy

pytestmark = pytest.mark.tf_only

RELOAD = """
import json, sys
import numpy as np
import tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
out = {}
for name, source in json.loads(sys.argv[2]).items():
    result = loaded.serve(tf.constant(source, tf.int32))
    out[name] = [result["tokens"].numpy().tolist(), result["scores"].numpy().tolist()]
print(json.dumps(out))
"""


@pytest.mark.large
def test_exported_translator_serves_beam_search(tmp_path):
    model = build_transformer(
        "transformer_base", vocabulary_size=15, hidden_dim=8, intermediate_dim=16,
        num_heads=2, num_encoder_layers=1, num_decoder_layers=1, max_sequence_length=9,
    )
    path = export_translator(model, tmp_path / "translator", start_id=1, end_id=2, beam_width=3)
    sources = {
        "batch": [[5, 6, 7, 2], [8, 9, 2, 0]],
        "single": [[3, 4, 5, 6, 7, 2]],
    }
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", RELOAD, str(path), json.dumps(sources)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    for name, source in sources.items():
        tokens, scores = transformer_beam_search(
            model, np.array(source, "int32"), 1, 2, beam_width=3, max_length=9
        )
        assert np.array(served[name][0]).shape == (len(source), 9)
        np.testing.assert_array_equal(served[name][0], to_numpy(tokens))
        np.testing.assert_allclose(served[name][1], to_numpy(scores), atol=1e-4)


def test_export_translator_rejects_other_models(tmp_path):
    import keras

    with pytest.raises(ValueError, match="Received: model=Sequential"):
        export_translator(keras.Sequential([keras.layers.Dense(2)]), tmp_path / "x", 1, 2)
