"""The tiny models of the saved-file fixtures, their data and their outputs.

Built from the public builders and constructor arguments only, so that
`make_fixtures.py` (today's code) and the test (any later code) build the
same architecture. Not the tiny models of tests/_families.py: the saved
fixtures hold weights of exactly these sizes, which must not follow the table.
"""

import keras
import numpy as np

V = 40


def _bert_backbone():
    from keras_attn.models.bert import build_bert

    return build_bert("bert_tiny", vocabulary_size=V, num_layers=1, hidden_dim=16,
                      num_heads=2, intermediate_dim=32, max_sequence_length=12)


def bert_sequence_classifier():
    from keras_attn.models.bert import BertSequenceClassifier

    return BertSequenceClassifier(_bert_backbone(), num_classes=3)


def bert_token_classifier():
    from keras_attn.models.bert import BertTokenClassifier

    return BertTokenClassifier(_bert_backbone(), num_classes=3)


def bert_pretrainer():
    from keras_attn.models.bert import BertPretrainer

    return BertPretrainer(_bert_backbone())


def _bert_inputs(rng, length=8):
    ids = rng.integers(1, V, (4, length)).astype("int32")
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids),
            "padding_mask": np.ones_like(ids)}


def bert_sequence_data():
    rng = np.random.default_rng(0)
    return _bert_inputs(rng), rng.integers(0, 3, (4,)).astype("int32")


def bert_token_data():
    rng = np.random.default_rng(0)
    return _bert_inputs(rng), rng.integers(0, 3, (4, 8)).astype("int32")


def bert_pretrainer_data():
    rng = np.random.default_rng(0)
    x = _bert_inputs(rng)
    x["mask_positions"] = np.tile(np.array([[1, 3]], "int32"), (4, 1))
    y = {"mlm": rng.integers(1, V, (4, 2)).astype("int32"),
         "nsp": rng.integers(0, 2, (4,)).astype("int32")}
    return x, y


def transformer():
    from keras_attn.models.transformer import build_transformer

    return build_transformer("transformer_base", vocabulary_size=V, hidden_dim=16,
                             intermediate_dim=32, num_heads=2, num_encoder_layers=1,
                             num_decoder_layers=1, max_sequence_length=16)


def transformer_untied():
    from keras_attn.models.transformer import build_transformer

    return build_transformer("transformer_base", vocabulary_size=V, target_vocabulary_size=30,
                             hidden_dim=16, intermediate_dim=32, num_heads=2,
                             num_encoder_layers=1, num_decoder_layers=1, norm_position="pre",
                             position_embedding="learned", max_sequence_length=16)


def transformer_data(vocabulary=V):
    rng = np.random.default_rng(0)
    source = rng.integers(1, V, (4, 7)).astype("int32")
    target = rng.integers(1, vocabulary, (4, 7)).astype("int32")
    return (source, target[:, :-1]), target[:, 1:]


def conformer():
    from keras_attn.models.conformer import build_conformer

    return build_conformer("conformer_tiny", vocabulary_size=5, num_layers=1,
                           hidden_dim=16, num_heads=2, intermediate_dim=32)


def conformer_data():
    rng = np.random.default_rng(0)
    x = {"waveform": (rng.normal(size=(4, 4000)) * 0.1).astype("float32"),
         "waveform_length": np.array([4000, 3000, 2500, 4000], "int32")}
    return x, rng.integers(1, 6, (4, 3)).astype("int32")


def vit():
    from keras_attn.models.vit import build_vit

    return build_vit("vit_tiny_16", num_classes=3, image_size=8, patch_size=4,
                     num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32)


def vit_data():
    rng = np.random.default_rng(0)
    return (rng.integers(0, 256, (4, 8, 8, 3)).astype("uint8"),
            rng.integers(0, 3, (4,)).astype("int32"))


MODELS = {
    "bert_sequence_classifier": (bert_sequence_classifier, bert_sequence_data),
    "bert_token_classifier": (bert_token_classifier, bert_token_data),
    "bert_pretrainer": (bert_pretrainer, bert_pretrainer_data),
    "transformer": (transformer, transformer_data),
    "transformer_untied": (transformer_untied, lambda: transformer_data(30)),
    "conformer": (conformer, conformer_data),
    "vit": (vit, vit_data),
}

COMPILE = {
    "bert_sequence_classifier": lambda: {"optimizer": "adam"},
    "bert_token_classifier": lambda: {"optimizer": "adam"},
    "bert_pretrainer": lambda: {"optimizer": "adam"},
    "transformer": lambda: {"optimizer": "adam"},
    "transformer_untied": lambda: {"optimizer": "adam"},
    "conformer": lambda: {"optimizer": "adam"},
    "vit": lambda: {"optimizer": "adam",
                    "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
}


def outputs(model, x):
    """Inference outputs as NumPy (a dict for dict-valued models)."""
    result = model(x, training=False)
    if isinstance(result, dict):
        return {key: keras.ops.convert_to_numpy(value) for key, value in result.items()}
    return keras.ops.convert_to_numpy(result)


def flat(prefix, value):
    """`{prefix: array}` or `{prefix.key: array}` for npz storage."""
    if isinstance(value, dict):
        return {f"{prefix}.{key}": np.asarray(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return {f"{prefix}.{i}": np.asarray(v) for i, v in enumerate(value)}
    return {prefix: np.asarray(value)}


def unflat(arrays, prefix):
    """The inverse of `flat` (a list when the keys are 0, 1, ...)."""
    if prefix in arrays:
        return arrays[prefix]
    keys = sorted(k[len(prefix) + 1:] for k in arrays if k.startswith(prefix + "."))
    if keys and all(k.isdigit() for k in keys):
        return [arrays[f"{prefix}.{k}"] for k in sorted(keys, key=int)]
    return {k: arrays[f"{prefix}.{k}"] for k in keys}
