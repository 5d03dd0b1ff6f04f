"""The one generic layer test every public layer goes through.

`run_layer_test` checks, for a layer built with the given (non-default)
arguments: config round trip and JSON serialization, that every constructor
argument is kept in the config, symbolic == eager output shapes, the exact
trainable-weight count, one `fit` step with a finite loss (under XLA on
TensorFlow and JAX, `jit_compile=True`: what Keras's "auto" gives on JAX and
on a TensorFlow GPU, not on a CPU-only TensorFlow, where "auto" runs plain
graphs; eager on PyTorch, Keras's "auto" there),
mixed_float16 / mixed_bfloat16 (compute dtype outputs, float32 variables on
every sublayer), that every randomly initialised weight is its own draw (no
two projections start equal: `assert_distinct_draws`), and `.keras` save /
reload with equal outputs.

`run_model_test` does the same for a family's tiny model (what keras-hub's
`run_backbone_test` / `run_task_test` do for its models): config round trip,
`.keras` reload, mixed precision, one `fit` step, bad input refused, and an
example's outputs independent of its batch mates and its padding.
"""

import inspect
import json
import os

import keras
import numpy as np
import pytest
from keras import ops

BASE_CONFIG_KEYS = {"name", "trainable", "dtype"}

def jax_cpu_devices_flags(count):
    """XLA_FLAGS for a JAX subprocess that splits the CPU into `count`
    devices. XLA aborts the process when one device reaches a collective (the
    gradients' all-reduce) 40 s after another; on a loaded 2-core CI machine
    that happened once (a fresh-clone run, 2026-11-24), so the tests give it
    15 min. This process's own XLA flags (conftest's faster compile) come
    first."""
    own = [flag for flag in os.environ.get("XLA_FLAGS", "").split()
           if not flag.startswith("--xla_force_host_platform_device_count")]
    return (" ".join(own) + f" --xla_force_host_platform_device_count={count}"
            " --xla_cpu_collective_call_terminate_timeout_seconds=900"
            " --xla_cpu_collective_call_warn_stuck_timeout_seconds=300")


TWO_JAX_CPU_DEVICES = jax_cpu_devices_flags(2)


def to_numpy(x):
    return ops.convert_to_numpy(x)


def redraw_transducer(model, seed):
    """Every weight of a `ConformerTransducer` drawn by NumPy, so that a
    test is the same on every backend (each backend's initializers draw
    other numbers, and a transducer's walk follows them): the encoder's
    random weights at their fan-in scale, its constant ones (norms' scales,
    biases) and its non-trainable ones (BatchNorm statistics, the log-mel
    matrices) kept; the prediction network's and the joint's far from their
    initial values (small joint logits make near ties that a 1e-5
    difference between frameworks can flip)."""
    rng = np.random.default_rng(seed)
    decoder = {id(weight) for weight in model.predictor.weights + model.joint.weights}
    for weight in model.trainable_weights:
        value = to_numpy(weight)
        if id(weight) in decoder:
            scale = 0.5
        elif value.size and np.all(value == value.flat[0]):
            continue
        else:
            scale = 1.0 / np.sqrt(np.prod(value.shape[:-1]) or 1)
        weight.assign(rng.normal(0, scale, value.shape).astype(value.dtype))
    return model


def _as_tuple(outputs):
    return tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)


def _symbolic_inputs(input_data):
    return {
        name: keras.Input(
            shape=np.shape(value)[1:],
            batch_size=np.shape(value)[0],
            dtype="bool" if np.asarray(value).dtype == bool else str(np.asarray(value).dtype),
            name=name,
        )
        for name, value in input_data.items()
    }


def _is_float(x):
    return "float" in str(getattr(x, "dtype", ""))


def _check_config(layer_cls, init_kwargs, layer):
    config = layer.get_config()
    accepted = set(inspect.signature(layer_cls.__init__).parameters) - {"self", "kwargs"}
    unknown = set(config) - accepted - BASE_CONFIG_KEYS
    assert not unknown, f"get_config keys the constructor does not take: {unknown}"
    for key, value in init_kwargs.items():
        kept = config.get(key)
        if isinstance(value, str) and isinstance(kept, dict):
            # "he_normal" is serialized as {"class_name": "HeNormal", ...}
            kept = kept.get("class_name", "").lower()
            value = value.replace("_", "").lower()
        if isinstance(value, (bool, int, float, str)) or value is None:
            assert kept == value, (
                f"argument {key}={value!r} is not kept in the config "
                f"(config has {config.get(key)!r})"
            )
    revived = layer_cls.from_config(config)
    assert revived.get_config() == config

    serialized = keras.saving.serialize_keras_object(layer)
    restored = keras.saving.deserialize_keras_object(json.loads(json.dumps(serialized)))
    assert type(restored) is layer_cls
    assert restored.get_config() == config


def assert_distinct_draws(weights, min_size=16):
    """No two randomly initialised weights of `weights` start from the same
    draw.

    A weight of at most two distinct values (a constant initializer: zeros,
    ones; an LSTM's bias, zeros with ones for the forget gate) is left out,
    and so is one of fewer than `min_size` values. Two weights
    are the same draw when their flattened values, over the length of the
    shorter, are perfectly correlated: that catches equal kernels (W_Q ==
    W_K) and kernels of other shapes drawn from one seed (a feed-forward
    network's (D, F) and (F, D) kernels, equal in flattened order). Two
    independent draws of >= 16 values correlate above 0.999 with negligible
    probability.
    """
    drawn = []
    for variable in weights:
        values = np.asarray(to_numpy(variable), "float64").ravel()
        if values.size < min_size or len(np.unique(values)) <= 2:
            continue
        drawn.append((variable.path, values))
    for i, (name_a, a) in enumerate(drawn):
        for name_b, b in drawn[i + 1:]:
            n = min(a.size, b.size)
            r = np.corrcoef(a[:n], b[:n])[0, 1]
            assert not abs(r) > 0.999, (
                f"{name_a} and {name_b} start from the same random draw "
                f"(correlation {r:.6f} over their first {n} values)"
            )


def _float32_specs(input_data):
    """KerasTensors of `input_data`'s shapes, float inputs as float32."""
    return {
        name: keras.KerasTensor(
            np.shape(value),
            dtype="float32" if np.asarray(value).dtype.kind == "f" else str(np.asarray(value).dtype),
        )
        for name, value in input_data.items()
    }


def _check_output_shape(layer, input_data, output):
    """`compute_output_shape` of the tensor inputs' shapes (Keras's names:
    `query` -> `query_shape`) is the first output's shape."""
    accepted = inspect.signature(layer.compute_output_shape).parameters
    shapes = {f"{name}_shape": np.shape(value) for name, value in input_data.items()
              if f"{name}_shape" in accepted}
    if not shapes:  # a one-input layer: `inputs_shape` or `input_shape`
        (value,) = [v for k, v in input_data.items() if not k.endswith("mask")][:1]
        shapes = {next(iter(accepted)): np.shape(value)}
    got = tuple(layer.compute_output_shape(**shapes))
    assert got == tuple(output.shape), f"compute_output_shape gave {got}, the call {output.shape}"


def _build_model(layer, input_data, call_kwargs):
    inputs = _symbolic_inputs(input_data)
    outputs = layer(**inputs, **call_kwargs)
    return keras.Model(inputs, outputs), inputs


def call_at_once(layer, call, tensors):
    """`call(layer, tensors)`, a call through `Layer.__call__` (its input
    casts and masks); on JAX inside one `jax.jit` over the layer's variables
    and `tensors` (arrays, or a structure of arrays), as a compiled model calls
    it. Eagerly, JAX compiles every op for every dtype it meets (~20-30 ms
    each here): a mixed precision call of a block was hundreds of small
    programs where this is one. The float32 eager calls of the harnesses stay
    eager."""
    if keras.backend.backend() != "jax":
        return call(layer, tensors)
    import jax

    if not layer.built:  # a call builds first; a symbolic one compiles nothing
        call(layer, keras.tree.map_structure(
            lambda x: keras.KerasTensor(np.shape(x), dtype=np.asarray(x).dtype.name), tensors))
    variables = layer.variables

    def stateless(values, tensors):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return call(layer, tensors)

    return jax.jit(stateless)([v.value for v in variables], tensors)


def run_layer_test(
    layer_cls,
    init_kwargs,
    input_data,
    expected_output_shape,
    expected_num_trainable_weights,
    call_kwargs=None,
    tmp_path=None,
):
    """Runs the generic checks.

    Args:
        layer_cls: the layer class.
        init_kwargs: constructor arguments; use non-default values.
        input_data: dict of call argument name -> NumPy array (batch first).
        expected_output_shape: a shape, or a tuple of shapes for a layer that
            returns several tensors.
        expected_num_trainable_weights: the exact count.
        call_kwargs: non-tensor call arguments.
        tmp_path: a directory for the `.keras` file.
    """
    call_kwargs = call_kwargs or {}
    if not isinstance(expected_output_shape[0], (tuple, list)):
        expected_output_shape = (expected_output_shape,)
    expected_output_shape = tuple(tuple(s) for s in expected_output_shape)

    # Config round trip and JSON serialization.
    layer = layer_cls(**init_kwargs)
    _check_config(layer_cls, init_kwargs, layer)

    # Eager call: shapes and weights.
    eager = _as_tuple(layer(**input_data, **call_kwargs))
    assert tuple(tuple(o.shape) for o in eager) == expected_output_shape
    assert len(layer.trainable_weights) == expected_num_trainable_weights, (
        f"{len(layer.trainable_weights)} trainable weights, expected "
        f"{expected_num_trainable_weights}"
    )
    _check_config(layer_cls, init_kwargs, layer)  # a built layer too
    assert_distinct_draws(layer.weights)
    _check_output_shape(layer, input_data, eager[0])

    # Symbolic call: same shapes.
    model, _ = _build_model(layer_cls(**init_kwargs), input_data, call_kwargs)
    symbolic = _as_tuple(model.outputs)
    assert tuple(tuple(o.shape) for o in symbolic) == expected_output_shape

    # One fit step gives a finite loss: under XLA on TensorFlow and JAX (asked
    # for: Keras's "auto" turns XLA off on a CPU-only TensorFlow and under
    # tf.distribute, but one GPU gets it), eager on PyTorch (Keras's "auto"
    # there). jit_compile=True on PyTorch is torch.compile: 10-83 s a layer
    # here, and not claimed by the README.
    model, _ = _build_model(layer_cls(**init_kwargs), input_data, call_kwargs)
    first = _as_tuple(model.outputs)[0]
    train_model = keras.Model(model.inputs, first)
    train_model.compile(optimizer="adam", loss="mse",
                        jit_compile=keras.backend.backend() != "torch")
    target = np.zeros(expected_output_shape[0], "float32")
    history = train_model.fit(input_data, target, epochs=1, batch_size=len(target), verbose=0)
    loss = history.history["loss"][-1]
    assert np.isfinite(loss), f"loss={loss}"

    # Mixed precision: compute dtype out, float32 variables everywhere; the
    # output spec of float32 inputs too (Keras casts them, as a call does).
    for policy in ("mixed_float16", "mixed_bfloat16"):
        specs = _as_tuple(layer_cls(**init_kwargs, dtype=policy).compute_output_spec(
            **_float32_specs(input_data), **call_kwargs))
        assert tuple(tuple(s.shape) for s in specs) == expected_output_shape
        mixed = layer_cls(**init_kwargs, dtype=policy)
        outputs = _as_tuple(call_at_once(
            mixed, lambda layer, tensors: layer(**tensors, **call_kwargs), input_data))
        compute_dtype = policy.split("_")[1]
        for output in outputs + specs:
            if _is_float(output):
                assert keras.backend.standardize_dtype(output.dtype) == compute_dtype, (
                    policy, output.dtype)
        for sublayer in mixed._flatten_layers():
            assert sublayer.dtype_policy.name == policy, (
                f"sublayer {sublayer.name!r} has policy {sublayer.dtype_policy.name}"
            )
            for variable in sublayer.weights:
                if _is_float(variable):
                    assert variable.dtype == "float32", (sublayer.name, variable.path)

    # .keras save and reload: same outputs.
    if tmp_path is not None:
        model, _ = _build_model(layer_cls(**init_kwargs), input_data, call_kwargs)
        expected = [to_numpy(o) for o in _as_tuple(model(input_data))]
        path = os.path.join(str(tmp_path), "layer.keras")
        model.save(path)
        reloaded = keras.saving.load_model(path)
        got = [to_numpy(o) for o in _as_tuple(reloaded(input_data))]
        for a, b in zip(expected, got):
            np.testing.assert_allclose(a, b, atol=1e-6)
    return eager


def _outputs(model, inputs, training=False):
    return [to_numpy(o) for o in keras.tree.flatten(model(inputs, training=training))]


def _compiled_outputs(model, inputs, training=False):
    """`_outputs` through `call_at_once`: one compiled program per shape on JAX."""
    outputs = call_at_once(model, lambda model, x: model(x, training=training), inputs)
    return [to_numpy(o) for o in keras.tree.flatten(outputs)]


def _assert_same_outputs(expected, got, atol, what):
    assert len(expected) == len(got), what
    for i, (a, b) in enumerate(zip(expected, got)):
        assert a.shape == b.shape and a.dtype == b.dtype, (what, i, a.shape, b.shape)
        np.testing.assert_allclose(b, a, atol=atol, rtol=0, err_msg=f"{what}: output #{i}")


def _config_values(config):
    """Every (key, value) of a model's config, nested models' configs too."""
    for key, value in config.items():
        yield key, value
        if isinstance(value, dict):
            yield from _config_values(value.get("config", value))


def _check_model_config(model, inputs, expected_config, atol):
    config = model.get_config()
    found = {}
    for key, value in _config_values(config):
        found.setdefault(key, value)
    for key, value in expected_config.items():
        assert found.get(key, "<missing>") == value, (
            f"{key}={value!r} is not kept in the config (found {found.get(key, '<missing>')!r})")
    clone = type(model).from_config(config)
    assert clone.get_config() == config
    restored = keras.saving.deserialize_keras_object(
        json.loads(json.dumps(keras.saving.serialize_keras_object(model))))
    assert type(restored) is type(model) and restored.get_config() == config
    # A field that get_config drops would come back as its default: the
    # same weights would then answer differently.
    for other in (clone, restored):
        other.set_weights(model.get_weights())
        _assert_same_outputs(_outputs(model, inputs), _outputs(other, inputs), atol,
                             "from_config with the same weights")


def _check_keras_file(model, inputs, tmp_path, atol):
    path = os.path.join(str(tmp_path), "model.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path)
    assert type(reloaded) is type(model)
    assert reloaded.get_config() == model.get_config()
    _assert_same_outputs(_outputs(model, inputs), _outputs(reloaded, inputs), atol,
                         "reloaded from .keras")


def _check_mixed_precision(build, inputs):
    for policy in ("mixed_float16", "mixed_bfloat16"):
        keras.config.set_dtype_policy(policy)
        try:
            model = build()
        finally:
            keras.config.set_dtype_policy("float32")
        compute_dtype = policy.split("_")[1]
        outputs = call_at_once(model, lambda model, inputs: model(inputs), inputs)
        for i, output in enumerate(keras.tree.flatten(outputs)):
            if _is_float(output):
                assert keras.backend.standardize_dtype(output.dtype) == compute_dtype, (
                    policy, i, output.dtype)
                assert np.isfinite(to_numpy(ops.cast(output, "float32"))).all(), (policy, i)
        for layer in model._flatten_layers():
            if layer.weights and not isinstance(layer, keras.Model):
                assert layer.dtype_policy.name == policy, (policy, layer.name)
        float_weights = [w for w in model.weights if _is_float(w)]
        assert float_weights and all(w.dtype == "float32" for w in float_weights), policy


def _check_fit_step(build, inputs, labels):
    """Two epochs of one batch: the second epoch's loss is measured after
    one update, so it must be lower (dropout is off, so nothing else moves
    it); the weights have changed."""
    model = build()
    model.compile(optimizer=keras.optimizers.Adam(1e-3))  # the family's default loss
    before = [to_numpy(w).copy() for w in model.trainable_weights]
    losses = model.fit(inputs, labels, epochs=2, batch_size=len(labels), shuffle=False,
                       verbose=0).history["loss"]
    assert np.isfinite(losses).all() and losses[1] < losses[0], losses
    changed = [not np.array_equal(a, to_numpy(w)) for a, w in zip(before, model.trainable_weights)]
    assert sum(changed) > len(changed) // 2, f"{sum(changed)} of {len(changed)} weights trained"


def _check_refused(build, inputs, labels, bad_inputs, bad_labels):
    """Every bad input is one ValueError in every entry point (a call,
    predict, evaluate, fit), every bad label set in evaluate and fit; an
    empty batch is refused too."""
    model = build()
    model.compile(optimizer="adam")
    empty = keras.tree.map_structure(lambda a: a[:0], inputs)
    cases = [(x, labels, message, True) for x, message in bad_inputs]
    cases += [(empty, labels[:0], "holds no example", True)]
    cases += [(inputs, y, message, False) for y, message in bad_labels]
    for x, y, message, call_too in cases:
        entry_points = [lambda: model.evaluate(x, y, verbose=0),
                        lambda: model.fit(x, y, verbose=0)]
        if call_too:
            entry_points += [lambda: model(x), lambda: model.predict(x, verbose=0)]
        for call in entry_points:
            with pytest.raises(ValueError, match=message):
                call()


def _check_batching(model, batches, crop, modes, atol):
    """Example i alone (`crop(batch, i)`: unpadded, batch of one) gives the
    outputs of row i of the batch (over the example's own length). On JAX
    each call is one compiled program (`call_at_once`), as predict runs it:
    every example is a new shape, which eagerly meant every op compiled
    again (the four families' harness tests, cold cache: 47 -> 36 s)."""
    for batch in batches:
        size = len(keras.tree.flatten(batch)[0])
        for training in modes:
            together = _compiled_outputs(model, batch, training)
            for i in range(size):
                alone = _compiled_outputs(model, crop(batch, i), training)
                for j, (a, b) in enumerate(zip(alone, together)):
                    row = b[i:i + 1][tuple(slice(0, n) for n in a.shape)]
                    assert row.shape == a.shape, (i, j, a.shape, b.shape)
                    np.testing.assert_allclose(
                        row, a, atol=atol, rtol=0,
                        err_msg=f"example {i}, output #{j}, training={training}")


def run_model_test(build, inputs, labels, *, crop, tmp_path, bad_inputs=(), bad_labels=(),
                   expected_config=None, more_batches=(), training_modes=(False, True),
                   atol=1e-5):
    """The generic checks of a family's tiny model.

    Args:
        build: returns a fresh model with dropout (and any other randomness
            of training) off, so that a training-mode pass is deterministic.
        inputs: a batch of examples of different lengths, padded (noise in
            the padding where the inputs allow it).
        labels: labels for `inputs`, for the family's default loss.
        crop: `crop(inputs, i)` is example i alone, at its own length.
        tmp_path: a directory for the `.keras` file.
        bad_inputs: `(inputs, message)` pairs: each must be refused with a
            ValueError matching `message` by a call, predict, evaluate, fit.
        bad_labels: `(labels, message)` pairs, refused by evaluate and fit.
        expected_config: config fields the model was built with: each must
            be kept (in its config or a nested model's).
        more_batches: other batches (other padding) for the batching check.
        training_modes: the modes in which an example's outputs must not
            depend on its batch mates (a model with BatchNorm normalises with
            the batch's statistics in training: `(False,)`).
        atol: the tolerance of every comparison of outputs.
    """
    model = build()
    _check_model_config(model, inputs, expected_config or {}, atol)
    _check_keras_file(model, inputs, tmp_path, atol)
    _check_batching(model, (inputs, *more_batches), crop, training_modes, atol)
    _check_mixed_precision(build, inputs)
    _check_fit_step(build, inputs, labels)
    _check_refused(build, inputs, labels, bad_inputs, bad_labels)


def training_step_results(model, inputs, loss_fn):
    """One training-mode forward and backward pass, compiled as `fit`
    compiles it (`tf.function` on TensorFlow, `jax.jit` on JAX).

    Returns NumPy arrays: the outputs (flattened), the gradients of
    `loss_fn(outputs)` for `model.trainable_variables` (zeros where a weight
    gets none) and the non-trainable state after the call (dropout seeds,
    BatchNorm statistics).
    """
    backend = keras.backend.backend()
    trainable = model.trainable_variables
    if backend == "jax":
        import jax

        def compute(trainable_values, state_values):
            outputs, state = model.stateless_call(
                trainable_values, state_values, inputs, training=True
            )
            return loss_fn(outputs), (outputs, state)

        (_, (outputs, state)), grads = jax.jit(
            jax.value_and_grad(compute, has_aux=True)
        )(
            [v.value for v in trainable],
            [v.value for v in model.non_trainable_variables],
        )
    elif backend == "tensorflow":
        import tensorflow as tf

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                outputs = model(inputs, training=True)
                loss = loss_fn(outputs)
            return outputs, tape.gradient(loss, trainable)

        outputs, grads = step()
        state = model.non_trainable_variables
    else:
        import torch

        # Unseeded dropout draws from torch's global generator: fix it.
        keras.utils.set_random_seed(0)
        outputs = model(inputs, training=True)
        grads = torch.autograd.grad(
            loss_fn(outputs), [v.value for v in trainable], allow_unused=True
        )
        state = model.non_trainable_variables
    grads = [
        np.zeros(v.shape, "float32") if g is None else to_numpy(g)
        for v, g in zip(trainable, grads)
    ]
    return (
        [to_numpy(o) for o in keras.tree.flatten(outputs)],
        grads,
        [to_numpy(s) for s in state],
    )


def assert_all_close(expected, got, atol, what):
    """Two lists of arrays equal within `atol`, naming the first that is not."""
    assert len(expected) == len(got), what
    for i, (a, b) in enumerate(zip(expected, got)):
        np.testing.assert_allclose(
            np.asarray(a, "float64"), np.asarray(b, "float64"), rtol=0, atol=atol,
            err_msg=f"{what} #{i}",
        )


def checkpoint_count(jaxpr):
    """The checkpoint (remat) equations of a JAX `jaxpr`, nested ones included."""
    count = 0
    for eqn in jaxpr.eqns:
        count += "checkpoint" in eqn.primitive.name or "remat" in eqn.primitive.name
        for param in eqn.params.values():
            for item in param if isinstance(param, (list, tuple)) else [param]:
                inner = getattr(item, "jaxpr", item)  # a ClosedJaxpr holds a Jaxpr
                if hasattr(inner, "eqns"):
                    count += checkpoint_count(inner)
    return count


def values_and_grads(fns, q, k, v):
    """For each `fn` of `fns`: `fn(q, k, v)` and the gradient of
    `sum(fn * w)` w.r.t. q, k, v."""
    shape = (q.shape[0], q.shape[1], q.shape[2], v.shape[3])  # (B, T, N, Hv)
    w = np.random.default_rng(9).normal(size=shape).astype("float32")
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        def one(fn):
            def loss(q, k, v):
                out = fn(q, k, v)
                return (out * w).sum(), out

            return jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)

        # One compiled program per length for every function: op-by-op JAX
        # would compile every primitive again for each of the 70 lengths.
        results = jax.jit(lambda q, k, v: [one(fn)(q, k, v) for fn in fns])(q, k, v)
        results = [(out, grads) for (_, out), grads in results]
    elif backend == "tensorflow":
        import tensorflow as tf

        q, k, v = (tf.convert_to_tensor(a) for a in (q, k, v))
        results = []
        for fn in fns:
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                out = fn(q, k, v)
                loss = tf.reduce_sum(out * w)
            results.append((out, tape.gradient(loss, [q, k, v])))
    else:
        import torch

        results = []
        for fn in fns:
            leaves = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
            out = fn(*leaves)
            (out * torch.tensor(w)).sum().backward()
            results.append((out, [leaf.grad for leaf in leaves]))
    return [(ops.convert_to_numpy(out), [ops.convert_to_numpy(g) for g in grads])
            for out, grads in results]
