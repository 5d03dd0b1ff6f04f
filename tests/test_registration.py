"""`import keras_attn` alone registers every class a saved model needs."""

import os
import subprocess
import sys
import textwrap

from _families import FAMILIES


def test_saved_models_of_every_family_load_after_import_keras_attn_alone(tmp_path):
    # the table's tiny task models: BERT's sequence classifier, the
    # Transformer, the ViT classifier, the Conformer's CTC model
    models = {name: FAMILIES[name].build() for name in ("bert", "transformer", "vit", "conformer")}
    for name, model in models.items():
        model.compile(optimizer="adam")  # the saved optimizer is the guarded one
        model.save(str(tmp_path / f"{name}.keras"))
    script = textwrap.dedent(
        """
        import sys
        import keras
        import keras_attn
        for path in sys.argv[1:]:
            model = keras.saving.load_model(path)
            assert type(model.optimizer).__name__ == "SkipNonFiniteSteps", path
            print(type(model).__name__)
        """
    )
    paths = [str(tmp_path / f"{name}.keras") for name in models]
    result = subprocess.run(
        [sys.executable, "-c", script, *paths], capture_output=True, text=True,
        timeout=600, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == [
        "BertSequenceClassifier", "Transformer", "ViT", "ConformerCTC"
    ]
