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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BATCH = 4


def _families():
    from _families import FAMILIES

    # The table's tiny models, wide enough that heads, the feed-forward and
    # a 64-word vocabulary divide over 4 devices; dropout and SpecAugment off.
    # One block each (the Transformer: one encoder and one decoder block):
    # a block holds every kind of sharded variable, and tracing and
    # compiling the four models' steps twice is this report's cost (a second
    # block doubled it). The Conformer's feed-forward is 256 wide so that its
    # blocks still hold most of its weights (its convolutional front end is
    # replicated), as test_a_device_holds_a_model_shard_of_the_sharded_weights
    # expects of every family.
    sizes = dict(hidden_dim=32, num_heads=4, intermediate_dim=128, dropout=0.0, num_layers=1)
    overrides = {
        "bert": dict(sizes, vocabulary_size=64, attention_dropout=0.0),
        "vit": dict(sizes, dropout=0.0),
        "transformer": dict({k: v for k, v in sizes.items() if k != "num_layers"},
                            vocabulary_size=64),
        "conformer": dict(sizes, intermediate_dim=256, vocabulary_size=7, freq_mask_count=0,
                          time_mask_count=0),
    }
    compile_arguments = {"vit": {"loss": "sparse_categorical_crossentropy_from_logits"}}
    families = {}
    for name, kw in overrides.items():
        family = FAMILIES[name]
        x, y = family.batch(size=BATCH, seed=3, **kw)
        families[name] = (family.config(**kw), lambda family=family, kw=kw: family.build(**kw),
                          x, y, compile_arguments.get(name, {}))
    return families


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
    import functools

    import keras

    from keras_attn.models import layout_map
    from keras_attn.training.distribute import model_parallel

    assert len(keras.distribution.list_devices()) == 8, keras.distribution.list_devices()
    report = {}
    for family, (config, build, x, y, arguments) in _families().items():
        keras.utils.set_random_seed(0)
        single = build()
        _compile(single, arguments)
        weights = single.get_weights()
        single_losses = _two_steps(single, x, y)
        with model_parallel((2, 4), functools.partial(layout_map, config)):
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
