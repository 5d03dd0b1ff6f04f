"""`import keras_attn` alone registers every class a saved model needs."""

import os
import subprocess
import sys
import textwrap

from keras_attn.models.bert import BertSequenceClassifier
from keras_attn.models.bert import build_bert
from keras_attn.models.conformer import build_conformer
from keras_attn.models.transformer import build_transformer
from keras_attn.models.vit import build_vit


def test_saved_models_of_every_family_load_after_import_keras_attn_alone(tmp_path):
    bert = BertSequenceClassifier(
        build_bert("bert_tiny", vocabulary_size=30, num_layers=1, max_sequence_length=8),
        num_classes=2,
    )
    models = {
        "bert": bert,
        "transformer": build_transformer(
            "transformer_base", vocabulary_size=30, hidden_dim=8, intermediate_dim=16,
            num_heads=2, num_encoder_layers=1, num_decoder_layers=1),
        "vit": build_vit("vit_tiny_16", num_classes=3, image_size=8, patch_size=4,
                         num_layers=1, hidden_dim=8, num_heads=2, intermediate_dim=16),
        "conformer": build_conformer("conformer_tiny", vocabulary_size=5, num_layers=1),
    }
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
