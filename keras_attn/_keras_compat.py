"""Every use of Keras internals (`keras.src`) in keras_attn, in one place.

Each name below is something the public Keras API does not offer; the comment
says what we need it for. `setup.cfg` caps keras below the next minor version
that this module has not been tested with: when Keras moves one of these, the
fix is here and nowhere else. A fallback is given where a safe one exists.
"""

import contextlib

import keras

# --- Implicit masks (`tensor._keras_mask`): Keras 3 propagates masks through
# these two functions and keeps them out of `keras.*`; a layer that builds a
# new tensor must carry its input's mask on by hand (`keras_attn.ops.masking`).
try:
    from keras.src.backend import get_keras_mask
    from keras.src.backend import set_keras_mask
except ImportError:  # pragma: no cover - reorganised Keras

    def get_keras_mask(x):
        return getattr(x, "_keras_mask", None)

    def set_keras_mask(x, mask):
        try:
            x._keras_mask = mask
        except AttributeError:
            pass


# --- Optimizer state created outside Keras's tracking: the decorator Keras's
# own `LossScaleOptimizer.build` uses, so that the step guard's counters do not
# become tracked (and saved) attributes twice (`keras_attn.training.nonfinite`).
try:
    from keras.src.utils.tracking import no_automatic_dependency_tracking
except ImportError:  # pragma: no cover - reorganised Keras

    def no_automatic_dependency_tracking(fn):
        return fn


# --- `keras.optimizers.LossScaleOptimizer`'s step hooks: it checks each step's
# gradients and calls one of these (stateful on TensorFlow and PyTorch, inside
# tf.distribute's merge call too; stateless on JAX).
# `keras_attn.training.nonfinite.SkipNonFiniteSteps` overrides them to skip a step without scaling its loss; Keras has no public
# hook for that. A Keras without them is refused at import, not run with the
# parent's loss scaling instead.
LOSS_SCALE_STEP_HOOKS = (
    "_stateful_handle_finite_grads",
    "_stateful_handle_non_finite_grads",
    "_stateless_handle_finite_grads",
    "_stateless_handle_non_finite_grads",
)


def overrides_loss_scale_hooks(cls):
    """Class decorator: `cls` overrides every `LOSS_SCALE_STEP_HOOKS`, and this
    Keras's `LossScaleOptimizer` still has each (else `ImportError`)."""
    parent = keras.optimizers.LossScaleOptimizer
    missing = [name for name in LOSS_SCALE_STEP_HOOKS if not callable(getattr(parent, name, None))]
    if missing:
        raise ImportError(
            f"Keras {keras.__version__}'s LossScaleOptimizer has no {missing}, which "
            f"{cls.__name__} overrides to skip non-finite steps: keras_attn/_keras_compat.py "
            "needs updating for this Keras version."
        )
    not_overridden = [name for name in LOSS_SCALE_STEP_HOOKS if name not in vars(cls)]
    if not_overridden:
        raise TypeError(f"{cls.__name__} must override {not_overridden}")
    return cls


def in_tf_graph():
    """True inside a `tf.function` trace, where no tensor has a value (no
    public Keras function says so; `keras_attn._guard.concrete_value`)."""
    from keras.src.utils.backend_utils import in_tf_graph as _in_tf_graph

    return _in_tf_graph()


def is_in_jax_tracing_scope(x):
    """True for a tensor being traced by `jax.jit` (as above, for JAX)."""
    from keras.src.utils.jax_utils import is_in_jax_tracing_scope as _tracing

    return _tracing(x)


# --- The global seed generator that `keras.random` creates lazily. Exact
# resume must save and restore its state, and Keras exposes neither the
# generator nor the dtype of a seed state (`keras_attn.training.resumable`).
from keras.src.backend import random_seed_dtype  # noqa: E402
from keras.src.backend.common import global_state  # noqa: E402

GLOBAL_SEED_GENERATOR = "global_seed_generator"  # keras.src.random.seed_generator


def get_global_seed_generator():
    """The generator behind unseeded `keras.random` calls, or None."""
    return global_state.get_global_attribute(GLOBAL_SEED_GENERATOR)


def set_global_seed_generator(generator):
    global_state.set_global_attribute(GLOBAL_SEED_GENERATOR, generator)


def remat_mode(layer):
    """The `keras.RematScope` mode active when `layer` was made (Keras stores
    it as `Operation._remat_mode` and offers no public reader), or None."""
    mode = getattr(layer, "_remat_mode", None)
    return None if mode is None else mode.mode


def sublayers(layer, recursive=True):
    """Every layer inside `layer`, depth first, without `layer` itself (with
    `recursive=False`, its direct sublayers only). Keras tracks sublayers for
    its own walks (`Layer._flatten_layers`) but offers no public one; LoRA
    picks projections from the whole model (`keras_attn.models.lora`), the
    converters and exporters find layers by name or type."""
    flatten = getattr(layer, "_flatten_layers", None)
    if flatten is not None:
        return list(flatten(include_self=False, recursive=recursive))
    found, stack = [], list(getattr(layer, "_layers", []))  # pragma: no cover - fallback
    while stack:
        child = stack.pop(0)
        found.append(child)
        if recursive:
            stack[:0] = list(getattr(child, "_layers", []))
    return found


def variable_values(variables):
    """`(variable, value)` of each variable: the array it holds, or None
    when Keras's JAX trainer has detached it for its loop. Keras keeps it in
    the private `_value` and has no public way to see a detached value
    (`variable.value` of a detached variable is not it)."""
    return [(variable, getattr(variable, "_value", None)) for variable in variables]


def reattach_values(saved):
    """Puts the values of `variable_values` back (with the public
    `variable.assign`) into the variables that are detached now, as
    Keras's JAX trainer does itself after a finished step."""
    for variable, value in saved:
        if value is not None and getattr(variable, "_value", None) is None:
            variable.assign(value)


def resolve_policy_maps(model):
    """Gives each layer inside `model` built with a `DTypePolicyMap` its own
    policy from the map. Keras 3.15 resolves a map by the layer's path in
    `quantization_mode` but not in `Dense/EinsumDense._get_kernel_with_merged_lora`
    (it reads `dtype_policy.quantization_mode`, the map's default): a quantized
    model loaded with a map could not be saved again ("Invalid dtype: object").
    The setter `layer.dtype_policy = ...` writes into the map instead, hence
    the private attribute."""
    from keras.dtype_policies import DTypePolicyMap

    for layer in sublayers(model):
        policies = getattr(layer, "_dtype_policy", None)
        if isinstance(policies, DTypePolicyMap) and layer.path:
            layer._dtype_policy = policies[layer.path]


class SpecFromCall:
    """Mixin: `compute_output_spec` traces `call`, as Keras does for a layer
    without `compute_output_shape`, with the float inputs first cast to the
    compute dtype as `Layer.__call__` casts them.

    A layer of keras_attn declares `compute_output_shape` (a Keras user calls
    it), which makes Keras's `Layer.compute_output_spec` answer from shapes
    alone: one dtype for every output (wrong for masks, lengths, caches) and
    no trace of `call` (its mask handling and shape checks). Called directly
    under `mixed_float16`, the plain trace mixed float32 inputs with float16
    weights (a TypeError on TensorFlow). `Operation.compute_output_spec` is
    the trace itself, and `_maybe_build` the build a call does first: Keras
    offers neither under a public name."""

    def compute_output_spec(self, *args, **kwargs):
        from keras.src.ops.operation import Operation

        def convert(x):
            if not isinstance(x, keras.KerasTensor):
                return x
            mask = get_keras_mask(x)
            y = self.dtype_policy.convert_input(x, self.autocast, self.input_dtype)
            if mask is not None and y is not x:
                set_keras_mask(y, mask)
            return y

        args, kwargs = keras.tree.map_structure(convert, (args, kwargs))
        if not self.built:  # as `Layer.__call__` builds before its trace
            from keras.src.layers.layer import CallSpec

            with self._open_name_scope():
                self._maybe_build(
                    CallSpec(self._call_signature, self._call_context_args, args, kwargs)
                )
        spec = Operation.compute_output_spec(self, *args, **kwargs)

        # A float output is in the compute dtype, as a call returns it (the
        # PyTorch backend's trace can lose the cast of an op with no float16
        # kernel on its meta device); masks, lengths and ids keep theirs.
        def in_compute_dtype(x):
            if isinstance(x, keras.KerasTensor) and "float" in str(x.dtype):
                return keras.KerasTensor(x.shape, dtype=self.compute_dtype)
            return x

        return keras.tree.map_structure(in_compute_dtype, spec)


__all__ = [
    "GLOBAL_SEED_GENERATOR",
    "build_before_first_trace",
    "LOSS_SCALE_STEP_HOOKS",
    "SpecFromCall",
    "get_global_seed_generator",
    "get_keras_mask",
    "in_tf_graph",
    "is_in_jax_tracing_scope",
    "no_automatic_dependency_tracking",
    "overrides_loss_scale_hooks",
    "random_seed_dtype",
    "remat_mode",
    "resolve_policy_maps",
    "set_global_seed_generator",
    "set_keras_mask",
    "sublayers",
]


# --- `Model.fit` / `evaluate` under a MultiWorkerMirroredStrategy of several
# TensorFlow workers, which Keras 3 does not support (keras-team/keras#20585):
# two module functions of its TensorFlow trainer replaced for a block
# (`keras_attn.training.distribute.data_parallel`).
@contextlib.contextmanager
def tensorflow_multi_worker_fit():
    """Within the block, `Model.fit` and `evaluate` run under a
    MultiWorkerMirroredStrategy of several workers. Keras 3 fails there in two
    places (keras-team/keras#20585; the same code in Keras 3.15 and on its
    main branch in August 2026), both in how it reads values, not in the step:
    `_maybe_symbolic_build` passes the first batch, a tuple of per-replica
    values, to `strategy.reduce`, which takes one value (the batch is read for
    its shapes only: this replica's part is given instead, what the
    single-worker path builds from); `reduce_per_replica` averages each log
    over axis 0, which scalar logs lack (they are averaged over the replicas,
    as a single worker's MirroredStrategy does). The two are patched for the
    block only and put back after it."""
    from keras import tree
    from keras.src.backend.tensorflow import trainer

    build, reduce = trainer.TensorFlowTrainer._maybe_symbolic_build, trainer.reduce_per_replica

    def symbolic_build(self, iterator=None, data_batch=None):
        local = self.distribute_strategy.experimental_local_results
        # This replica's part of the first batch.
        for _, _, batches in iterator if iterator is not None else ():
            data_batch = tree.map_structure(lambda value: local(value)[0], next(batches))
            break
        return build(self, data_batch=data_batch)

    def reduce_logs(values, strategy, reduction):
        if reduction not in ("auto", "mean"):
            return reduce(values, strategy, reduction)
        return tree.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)

    trainer.TensorFlowTrainer._maybe_symbolic_build = symbolic_build
    trainer.reduce_per_replica = reduce_logs
    try:
        yield
    finally:
        trainer.TensorFlowTrainer._maybe_symbolic_build = build
        trainer.reduce_per_replica = reduce


# --- The state a TensorFlow train step creates, built before its first trace.
# Without a distribution strategy, Keras's TensorFlow trainer leaves the
# optimizer's slots and the compiled metrics' variables to be created inside
# the first trace of its step (`_maybe_symbolic_build` returns early; with a
# strategy, and always on JAX, it builds them first with `_symbolic_build`).
# `tf.function` then wraps each of those initialisers in a `cond` and traces
# the whole step a second time, the one that runs: measured on a tiny ViT
# classifier, `fit` 20.4 s -> 8.4 s (the same losses and metrics to the bit);
# the 63M-parameter Transformer's first step spent 168 of its 455 s building
# those conds. Keras has no public way to ask for the early build.
def build_before_first_trace(model, x, y=None, sample_weight=None):
    """Builds `model`'s optimizer and compiled metrics and loss as Keras does
    under a distribution strategy, from the shapes of `x`, `y` and
    `sample_weight` (arrays, tensors, nested structures of them, or a
    `tf.data.Dataset` whose element spec gives them). Only on TensorFlow
    outside a strategy, and only where Keras would build the same state in
    the step's first trace; where the shapes cannot be read, or a symbolic
    build fails, the step builds it as before (its own trace raises the
    error, if any)."""
    if keras.backend.backend() != "tensorflow" or not model.compiled:
        return
    if getattr(model, "_distribute_strategy", None) is not None:
        return  # Keras builds it itself (`_maybe_symbolic_build`)
    import tensorflow as tf

    if tf.distribute.has_strategy():
        return
    try:  # a data layout Keras would refuse is left to its trace to refuse
        if isinstance(x, tf.data.Dataset):
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(x.element_spec)
        batch = (x, y, sample_weight)
        if x is None or not all(value is None or hasattr(value, "shape")
                                and hasattr(value, "dtype") for value in keras.tree.flatten(batch)):
            return
        model._symbolic_build(data_batch=batch)
    except Exception:  # noqa: BLE001 - the traced step builds (and raises) as before
        if model.built and model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)


# --- tf2onnx as Keras's ONNX export prepares it (keras_attn.export.portable
# converts with tf2onnx itself; Keras offers its patch only inside model.export).
def patch_tf2onnx():
    """`tf2onnx`, patched as Keras's own ONNX export patches it before
    converting (for NumPy 2: `np.object` and tf2onnx's constant folding);
    `keras_attn.export.portable` calls tf2onnx itself, on a function of the
    inputs and the weights (Keras's `model.export` freezes the weights into
    the graph tf2onnx rewrites, which copies them at every pass)."""
    import warnings

    with warnings.catch_warnings():
        # The patch module asks NumPy for the removed `np.object` when
        # imported: a FutureWarning about Keras's code, not the model's.
        warnings.filterwarnings("ignore", message=".*np.object.*", category=FutureWarning)
        from keras.src.export.tf2onnx_lib import patch_tf2onnx as _patch

        _patch()
        import tf2onnx
    return tf2onnx


# The packages that register classes, once this module is whole.
from keras_attn._registration import register_all as _register_all  # noqa: E402

_register_all(__name__)
