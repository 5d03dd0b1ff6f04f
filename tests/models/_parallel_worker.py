"""Trains a tiny model of each family two steps on one device, then model
parallel on a (2 data x 4 model) mesh of 8 virtual JAX CPU devices.

Run as a subprocess by tests/models/test_parallel.py (the devices must exist
before JAX initialises):

    KERAS_BACKEND=jax XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
        python3 tests/models/_parallel_worker.py

Prints one JSON line: per family, both runs' losses, and for the model
parallel run every variable's sharding (the `PartitionSpec` of its JAX array),
its bytes in all and on the first device, and the sharding of the optimizer's
momentum of one attention kernel. Both runs start from the same weights (the
one-device model's, copied) and see the same batches; dropout and SpecAugment
are off, so the two steps are the same computation.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BATCH = 4
RNG = np.random.default_rng(3)


def _families():
    from keras_attn.models import BertSequenceClassifier
    from keras_attn.models import build_bert
    from keras_attn.models import build_conformer
    from keras_attn.models import build_transformer
    from keras_attn.models import build_vit
    from keras_attn.models import get_bert_config
    from keras_attn.models import get_conformer_config
    from keras_attn.models import get_transformer_config
    from keras_attn.models import get_vit_config

    bert = dict(vocabulary_size=64, num_layers=2, hidden_dim=32, num_heads=4,
                intermediate_dim=128, max_sequence_length=16, dropout=0.0,
                attention_dropout=0.0)
    vit = dict(image_size=16, patch_size=4, num_layers=2, hidden_dim=32, num_heads=4,
               intermediate_dim=128, num_classes=3)
    transformer = dict(vocabulary_size=64, hidden_dim=32, intermediate_dim=128, num_heads=4,
                       num_encoder_layers=1, num_decoder_layers=1, dropout=0.0)
    conformer = dict(vocabulary_size=7, num_layers=2, hidden_dim=32, num_heads=4,
                     num_mel_bins=20, dropout=0.0, freq_mask_count=0, time_mask_count=0)
    token_ids = RNG.integers(1, 64, (BATCH, 10)).astype("int32")
    padding = (np.arange(10)[None] < np.array([10, 7, 10, 4])[:, None]).astype("int32")
    source = RNG.integers(3, 64, (BATCH, 7)).astype("int32")
    target = RNG.integers(3, 64, (BATCH, 6)).astype("int32")
    source[1, 5:] = 0
    target[2, 4:] = 0
    return {
        # family: (config, build, x, y, compile arguments)
        "bert": (
            get_bert_config("bert_tiny", **bert),
            lambda: BertSequenceClassifier(build_bert("bert_tiny", **bert), num_classes=3,
                                           dropout=0.0),
            {"token_ids": token_ids * padding, "segment_ids": np.zeros_like(token_ids),
             "padding_mask": padding},
            np.array([0, 2, 1, 2]),
            {},
        ),
        "vit": (
            get_vit_config("vit_tiny_16", **vit),
            lambda: build_vit("vit_tiny_16", **vit),
            RNG.integers(0, 256, (BATCH, 16, 16, 3)).astype("uint8"),
            np.array([1, 0, 2, 1]),
            {"loss": "sparse_categorical_crossentropy_from_logits"},
        ),
        "transformer": (
            get_transformer_config("transformer_base", **transformer),
            lambda: build_transformer("transformer_base", **transformer),
            (source, target[:, :-1]),
            target[:, 1:],
            {},
        ),
        "conformer": (
            get_conformer_config("conformer_tiny", **conformer),
            lambda: build_conformer("conformer_tiny", **conformer),
            {"waveform": (RNG.standard_normal((BATCH, 4000)) * 0.1).astype("float32"),
             "waveform_length": np.array([4000, 3000, 3600, 2500], "int32")},
            np.array([[1, 2, 3, 0], [4, 5, 0, 0], [6, 1, 2, 3], [3, 0, 0, 0]], "int32"),
            {},
        ),
    }


def _compile(model, arguments):
    import keras

    arguments = dict(arguments)
    if arguments.get("loss") == "sparse_categorical_crossentropy_from_logits":
        arguments["loss"] = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    # SGD with momentum: the update is linear in the gradient (rounding
    # differences stay rounding-sized) and the momentum slots are variables
    # whose layout must follow their weight's.
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), metrics=[], **arguments)


def _two_steps(model, x, y):
    return [float(model.train_on_batch(x, y)) for _ in range(2)]


def _spec(variable):
    sharding = variable.value.sharding
    spec = getattr(sharding, "spec", None)
    if spec is None:
        return None
    return [None if axis is None else str(axis) for axis in spec] + [None] * (
        len(variable.shape) - len(spec)
    )


def main():
    import keras

    from keras_attn.training.distribute import model_parallel

    assert len(keras.distribution.list_devices()) == 8, keras.distribution.list_devices()
    report = {}
    for family, (config, build, x, y, arguments) in _families().items():
        keras.utils.set_random_seed(0)
        single = build()
        _compile(single, arguments)
        weights = single.get_weights()
        single_losses = _two_steps(single, x, y)
        with model_parallel((2, 4), config):
            model = build()
            _compile(model, arguments)
            model.set_weights(weights)
            losses = _two_steps(model, x, y)
            variables = {
                v.path: {
                    "spec": _spec(v),
                    "shape": list(v.shape),
                    "bytes": int(v.value.nbytes),
                    "first_device_bytes": int(v.value.addressable_shards[0].data.nbytes),
                }
                for v in model.weights
            }
            momentum = [
                _spec(v) for v in model.optimizer.variables
                if v.path.endswith("query_kernel_momentum")
            ]
        report[family] = {"single_losses": single_losses, "losses": losses,
                          "variables": variables, "query_momentum": momentum[:1]}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
