"""Trains tiny package models on one device, then data parallel on two.

Run as a subprocess by tests/training/test_distribute.py, because the two
devices must exist before TensorFlow or JAX initialises:

    python3 tests/training/distribute_worker.py --engine tensorflow OUTPUT_DIR
    KERAS_BACKEND=jax XLA_FLAGS=--xla_force_host_platform_device_count=2 \
        python3 tests/training/distribute_worker.py --engine jax OUTPUT_DIR

(`tensorflow` splits the CPU into two logical devices itself.) Prints one JSON
line: per model, for the single-device and the `data_parallel` run, the
replica count, the loss of each step, on how many devices a weight lives, the
strategy / distribution in force inside and after the block, and for the
distributed run how far a reloaded `.keras` save is from the trained model.
Every run starts from the same seed, so both begin with the same weights.

With `--multi-worker` it is one process of a multi-worker job (TF_CONFIG or
KERAS_DISTRIBUTION_* set by the caller) and trains the distributed run only.
"""

import argparse
import json
import os
import sys

import numpy as np

# tests/, for the one table of tiny models (`_families`): run as a script,
# only this file's directory is on the path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STEPS = 4
GLOBAL_BATCH = 8
N = STEPS * GLOBAL_BATCH
# Models whose first batch is also evaluated in two halves, as two replicas
# see it: their loss is a mean over a count that differs between examples.
SPLIT_MODELS = ("bert_pretrainer", "transformer")


def _sgd():
    # SGD, not Adam: the update is linear in the gradient, so float rounding
    # differences between the runs stay rounding-sized (Adam's g / sqrt(v)
    # turns a rounding difference in a near-zero gradient into a full step).
    import keras

    return keras.optimizers.SGD(0.05)


def _sparse_ce():
    import keras

    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _token_ids(rng, length, vocabulary_size):
    """Ids padded with 0 after a length that differs between examples."""
    lengths = rng.integers(3, length + 1, N)
    real = np.arange(length)[None, :] < lengths[:, None]  # (N, T)
    return rng.integers(1, vocabulary_size, (N, length)).astype("int32") * real


def _vit(rng):
    from keras_attn.models.vit import build_vit

    model = build_vit(
        "vit_tiny_16", num_classes=3, image_size=8, patch_size=4, num_channels=1,
        hidden_dim=16, num_layers=1, num_heads=2, intermediate_dim=32,
    )
    model.compile(optimizer=_sgd(), loss=_sparse_ce())
    images = rng.integers(0, 256, (N, 8, 8, 1)).astype("uint8")
    return model, (images, rng.integers(0, 3, N).astype("int32"))


def _bert_pretrainer(rng):
    from _families import FAMILIES
    from keras_attn.models.bert import BertPretrainer

    # the 40-word vocabulary and the length 10 of the data below; dropout off
    backbone = FAMILIES["bert"].backbone(
        vocabulary_size=40, num_layers=1, max_sequence_length=10, dropout=0.0,
        attention_dropout=0.0,
    )
    model = BertPretrainer(backbone)
    model.compile(optimizer=_sgd())
    token_ids = _token_ids(rng, 10, 40)
    x = {
        "token_ids": token_ids,
        "segment_ids": ((np.arange(10)[None, :] >= 5) & (token_ids > 0)).astype("int32"),
        "padding_mask": (token_ids > 0).astype("int32"),
        "mask_positions": rng.integers(0, 3, (N, 3)).astype("int32"),
    }
    y = {"mlm": rng.integers(1, 40, (N, 3)).astype("int32"),
         "nsp": rng.integers(0, 2, N).astype("int32")}
    # 1 to 3 real predictions per example: the masked-LM loss is their mean,
    # so the replicas' halves of a batch hold different counts.
    real = np.arange(3)[None, :] < rng.integers(1, 4, N)[:, None]
    return model, (x, y, {"mlm": real.astype("float32"), "nsp": np.ones(N, "float32")})


def _transformer(rng):
    from keras_attn.models.transformer import build_transformer
    from keras_attn.training import LabelSmoothedCrossEntropy

    model = build_transformer(
        "transformer_base", vocabulary_size=20, hidden_dim=16, intermediate_dim=32,
        num_heads=2, num_encoder_layers=1, num_decoder_layers=1, dropout=0.0,
    )
    model.compile(optimizer=_sgd(), loss=LabelSmoothedCrossEntropy(0.1, pad_id=0))
    source, target = _token_ids(rng, 7, 20), _token_ids(rng, 6, 20)
    return model, ((source, target[:, :-1]), target[:, 1:])


def _conformer(rng):
    from keras_attn.models.conformer import build_conformer

    model = build_conformer(
        "conformer_tiny", vocabulary_size=5, num_layers=1, hidden_dim=16,
        num_heads=2, kernel_size=3, dropout=0.0, input_type="features",
        num_mel_bins=8, freq_mask_count=0, time_mask_count=0,
    )
    model.compile(optimizer=_sgd())

    def halves_alike(a):
        # The second half of every global batch repeats the first, so that a
        # replica's BatchNorm statistics (on tf.distribute: over its own half)
        # equal those of the global batch and only the loss scaling is tested.
        a = a.reshape((STEPS, 1, GLOBAL_BATCH // 2) + a.shape[1:])
        return np.concatenate([a, a], axis=1).reshape((N,) + a.shape[3:])

    lengths = rng.integers(12, 25, N // 2).astype("int32")
    features = rng.standard_normal((N // 2, 24, 8)).astype("float32")
    features *= np.arange(24)[None, :, None] < lengths[:, None, None]
    labels = rng.integers(1, 6, (N // 2, 2)).astype("int32")
    x = {"features": halves_alike(features), "feature_length": halves_alike(lengths)}
    return model, (x, halves_alike(labels))


MODELS = {
    "vit": _vit,
    "bert_pretrainer": _bert_pretrainer,
    "transformer": _transformer,
    "conformer": _conformer,
}


def _step_losses_callback(losses):
    """Appends each step's loss to `losses`, recovered from the running mean
    Keras logs (`mean_k = (l_1 + ... + l_k) / k`)."""
    import keras

    class StepLosses(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            k = len(losses) + 1
            previous_mean = sum(losses) / (k - 1) if losses else 0.0
            losses.append(k * float(logs["loss"]) - (k - 1) * previous_mean)

    return StepLosses()


def _placement(engine):
    """What is in force: the tf.distribute strategy or the Keras distribution."""
    if engine == "tensorflow":
        import tensorflow as tf

        return type(tf.distribute.get_strategy()).__name__
    import keras

    return type(keras.distribution.distribution()).__name__


def _devices_holding(variable, engine):
    if engine == "jax":
        return len(variable.value.sharding.device_set)
    return len(getattr(variable.value, "values", [variable.value]))


def _max_difference(a, b):
    from keras import tree

    return max(
        float(np.max(np.abs(np.asarray(u) - np.asarray(v))))
        for u, v in zip(tree.flatten(a), tree.flatten(b))
    )


def _train(name, engine, output_dir, distribute, multi_worker=False):
    """One epoch of `STEPS` global batches of `GLOBAL_BATCH` examples.

    On TensorFlow the one-device reference runs eagerly (`run_eagerly`):
    the same arithmetic op by op, without tracing a graph for 4 steps
    (measured: a third of the worker's CPU time). The distributed run is
    compiled, as users train. JAX keeps `jit` for both: op by op, each
    primitive compiles on its own, which costs more than the one program."""
    import keras
    import tensorflow as tf

    from keras_attn.training.distribute import data_parallel

    result = {}
    with data_parallel(enabled=distribute) as replicas:
        keras.utils.set_random_seed(0)
        model, data = MODELS[name](np.random.default_rng(1))
        model.run_eagerly = engine == "tensorflow" and not distribute
        dataset = tf.data.Dataset.from_tensor_slices(data).batch(
            GLOBAL_BATCH, drop_remainder=True
        )
        if name in SPLIT_MODELS and not distribute:
            # evaluate's loss over two batches of 4 is the mean of their losses.
            halves = dataset.take(1).unbatch().batch(GLOBAL_BATCH // 2)
            result["split_first_loss"] = model.evaluate(
                halves, verbose=0, return_dict=True
            )["loss"]
        losses = []
        model.fit(dataset, epochs=1, verbose=0, callbacks=[_step_losses_callback(losses)])
        result.update(
            replicas=replicas,
            losses=losses,
            inside=_placement(engine),
            weight_devices=_devices_holding(model.trainable_variables[0], engine),
        )
        if distribute:
            path = os.path.join(output_dir, f"{name}.keras")
            model.save(path)
    result["after"] = _placement(engine)
    if distribute:
        reloaded = keras.saving.load_model(path)
        first_batch = keras.tree.map_structure(lambda a: a[:GLOBAL_BATCH], data[0])
        result["reload_max_diff"] = _max_difference(
            _outputs_or_weights(model, first_batch, engine, multi_worker),
            _outputs_or_weights(reloaded, first_batch, engine, multi_worker),
        )
    return result


def _outputs_or_weights(model, x, engine, multi_worker):
    """The model's outputs on `x` (the first batch's inputs); its weights
    in a multi-worker job, where the weights span the processes. On
    TensorFlow the model is called eagerly (`predict` would trace a
    distributed program for one batch); on JAX `predict_on_batch` compiles
    one program (eagerly, every primitive would compile on its own)."""
    import keras

    if multi_worker:
        return [keras.ops.convert_to_numpy(v) for v in model.weights]
    if engine == "tensorflow":
        return keras.tree.map_structure(keras.ops.convert_to_numpy, model(x, training=False))
    return model.predict_on_batch(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engine", choices=["tensorflow", "jax"], required=True)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument(
        "--multi-worker", action="store_true",
        help="one process of a multi-worker job (TF_CONFIG or KERAS_DISTRIBUTION_* "
        "set): only the distributed run",
    )
    parser.add_argument("output_dir")
    args = parser.parse_args()

    if args.engine == "tensorflow" and "TF_CONFIG" not in os.environ:
        import tensorflow as tf

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2
        )
    import keras

    keras.config.disable_traceback_filtering()  # whole tracebacks in test failures
    if keras.backend.backend() != args.engine:
        raise SystemExit(f"KERAS_BACKEND is {keras.backend.backend()}, not {args.engine}")
    runs = [True] if args.multi_worker else [False, True]
    results = {
        name: {
            ("distributed" if distribute else "single"): _train(
                name, args.engine, args.output_dir, distribute, args.multi_worker
            )
            for distribute in runs
        }
        for name in args.models.split(",")
    }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
