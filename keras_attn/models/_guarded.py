"""Bad data never reaches the weights: the mixin every model family shares
(`GuardedModel`), which puts the checks and the safety net in place.

Three lines of defence, from the cheapest to the last resort:

1. Checks in Python whenever the data is concrete (eager calls, and `fit`,
   `evaluate`, `predict` on NumPy arrays, checked once before the first
   step): an id outside its range, a mask that is not boolean or 0/1, a
   sequence past `max_sequence_length` or a label outside its classes is a
   `ValueError` that names the input, the values seen and the range allowed
   (the checks: `keras_attn._guard`).
2. Inside the model, where no Python runs (a `jit`-compiled step, a
   `tf.data` pipeline, a SavedModel), an out-of-range id or position makes
   the outputs NaN (a gather would otherwise clamp silently under XLA) and
   an out-of-range label makes the loss NaN.
3. `SkipNonFiniteSteps` wraps the optimizer in `compile`: a step whose
   gradients are not all finite changes no weight and no optimizer state
   (its iteration count included), and `StopOnNonFiniteLoss`, added to every
   `fit`, ends training at the end of that step with `NonFiniteLossError`
   (both: `keras_attn.training.nonfinite`).

Layers and models use `keras.ops` only; backend specifics (telling a
concrete tensor from a traced one) are reached only through Keras's own
helpers, in `keras_attn._guard.concrete_value`.

The Keras seams the guard stands on, each public, and why each is needed:

- `compute_loss(x, y, y_pred, sample_weight, training)`: the hook for the
  loss that Keras 3 documents for subclasses (the guide "Customizing what
  happens in `fit()`", and `Model.compute_loss`'s docstring); the default
  `train_step` and `test_step` of every backend call it (through
  `Trainer._compute_loss`), inside `tf.function`, `jax.jit` and PyTorch's
  eager step alike. The label and input guards multiply the loss there.
  `train_step` / `test_step` / `predict_step` are not overridden: the
  defaults already call `compute_loss`, and steps of our own would be written
  once per backend (Keras's own differ: JAX's are stateless) and would have
  to copy what Keras does in them (loss scaling, metrics, distribution).
- `compile(optimizer, loss, ...)`, overridden as keras-hub's tasks do: the
  one moment the optimizer and the loss are given; the optimizer is wrapped
  in `SkipNonFiniteSteps` (a subclass of the public
  `keras.optimizers.LossScaleOptimizer`) and a loss that reads probabilities
  is refused for logits. `compile_from_config` then comes with it, as Keras's
  `Trainer.compile_from_config` asks of every model with a custom `compile`
  (else a reloaded model is left uncompiled).
- `keras.callbacks.Callback` (`StopOnNonFiniteLoss`): sees each step's loss
  and ends `fit` with `NonFiniteLossError`.
- `fit`, `evaluate`, `predict`: they stay because no public seam sees the
  data before the first compiled step (on TensorFlow and JAX `train_step`
  runs traced, where no check can raise), no other adds a callback to every
  `fit`, and Keras's JAX trainer leaves the variables detached when the
  first step fails. Each binds its arguments to Keras's own signature
  (`keras_arguments`: `inspect.signature(...).bind`), so an argument is found
  wherever the caller put it, and a Keras that renamed one is refused loudly.
  On TensorFlow `fit` also builds the step's optimizer and metric state
  before the step's first trace, as Keras does under a distribution strategy
  (`_keras_compat.build_before_first_trace`: the step is traced once, not
  twice; the numbers are the same to the bit).
- `__call__`: every call of the model passes through it (the default steps
  of TensorFlow and PyTorch call `self(x)`), whatever `call` the family
  defines (BERT's packed inputs take a path of their own); the inputs are
  found as Keras's `Layer.__call__` finds them (the first argument of
  `call`). JAX's steps run `call` traced through `stateless_call`, where
  no value could be checked anyway.
- `call`: the keys of a dict of inputs are structure, known while a step is
  traced, so `call` itself refuses a key the model does not read or a
  missing one (`check_input_keys`), on every backend (JAX's steps never pass
  through `__call__`); the family models whose `call` is their own (packed
  rows) do the same first.

The Keras internals the guard needs (telling a traced tensor from a concrete
one, the detached values of the JAX trainer, `LossScaleOptimizer`'s step
hooks, the early build of a TensorFlow step) are in `keras_attn._keras_compat`.
"""

import inspect

import keras
import numpy as np
from keras import ops

from keras_attn._guard import IdSpec
from keras_attn._guard import MaskSpec
from keras_attn._guard import check_ids
from keras_attn._guard import check_length
from keras_attn._guard import check_mask
from keras_attn._guard import check_mask_rows
from keras_attn._guard import check_not_empty
from keras_attn._guard import comparable_ids
from keras_attn._guard import concrete_value
from keras_attn._keras_compat import build_before_first_trace
from keras_attn._keras_compat import reattach_values
from keras_attn._keras_compat import variable_values
from keras_attn.training.nonfinite import guard_optimizer
from keras_attn.training.nonfinite import with_stop_callback

# Keras's cross-entropies, as functions (or their names), read probabilities:
# on logits they give a loss that does not train (a zero head's logits give
# log(K) at every step and never move).
_PROBABILITY_LOSSES = (
    "sparse_categorical_crossentropy",
    "categorical_crossentropy",
    "binary_crossentropy",
    "categorical_focal_crossentropy",
    "binary_focal_crossentropy",
)


def _reads_probabilities(loss):
    """True for a loss that expects probabilities: one of Keras's
    cross-entropies by name or as its function, or a loss object whose
    config says `from_logits=False` (`SparseCategoricalCrossentropy()`,
    `LabelSmoothedCrossEntropy(from_logits=False)`)."""
    if isinstance(loss, str):
        try:
            loss = keras.losses.get(loss)
        except (ValueError, TypeError):
            return False  # not a Keras name: Keras's compile says so
    if isinstance(loss, keras.losses.Loss):
        try:
            config = loss.get_config()
        except NotImplementedError:  # a custom loss without a config
            return False
        return config.get("from_logits") is False
    name = getattr(loss, "__name__", None)
    return name in _PROBABILITY_LOSSES and getattr(keras.losses, name, None) is loss


def _loss_name(loss):
    if isinstance(loss, str):
        return repr(loss)
    if isinstance(loss, keras.losses.Loss):
        return f"{type(loss).__name__}(from_logits=False)"
    return getattr(loss, "__name__", repr(loss))


def _each_loss(loss):
    """The losses in `loss`: one, or a dict or list of them (one per output)."""
    if isinstance(loss, dict):
        loss = list(loss.values())
    if isinstance(loss, (list, tuple)):
        for item in loss:
            yield from _each_loss(item)
    elif loss is not None:
        yield loss


def check_loss_reads_logits(loss, model_name):
    """`ValueError` when `loss` (a loss, or a dict or list of them, one per
    output) holds a loss that expects probabilities: the model's outputs are
    logits, and such a pair trains nothing while `fit` exits as usual."""
    for item in _each_loss(loss):
        if _reads_probabilities(item):
            raise ValueError(
                f"`loss={_loss_name(item)}` expects probabilities, but the outputs "
                f"of model {model_name!r} are logits (no softmax or sigmoid): "
                "compiled so, it would not train. Use the loss with "
                "`from_logits=True` (e.g. keras.losses.SparseCategoricalCrossentropy("
                "from_logits=True)), or leave `loss` out for the model's default. "
                f"Received: loss={_loss_name(item)}"
            )


# === The mixin of the family models ===



class GuardedModel:
    """What the four families share: input checks on concrete data, the
    label guard in the loss, and the guarded optimizer and stop callback.

    A subclass lists what it accepts in `input_specs()` (`{input name:
    IdSpec | MaskSpec}`), `max_length()` (`{input name: max length}`) and
    `label_specs()` (`{output name or None: IdSpec}`), the inputs a dict
    may hold beside the functional graph's in `optional_input_names()`, and
    may add checks that relate inputs in `check_arrays(named)`. A model
    whose outputs are logits says so in `outputs_are_logits()`; its
    `compile` then refuses a loss that reads probabilities. Mix it in first:
    `class ViT(GuardedModel, ConfigModel, keras.Model)`.
    """

    def input_specs(self):
        return {}

    def max_length(self):
        return {}

    def label_specs(self):
        return {}

    def check_arrays(self, named):
        """Checks between inputs (e.g. a length no larger than its array)."""

    def outputs_are_logits(self):
        """True when the model's outputs are logits (a classification or
        token head): `compile` then refuses a loss that expects
        probabilities. False for the backbones, whose outputs are features."""
        return False

    def optional_input_names(self):
        """The inputs a dict may hold beside the functional graph's, which
        the model reads by name itself (the packed rows' inputs,
        docs/packing.md); `check_input_keys` refuses any other key."""
        return ()

    def describe_inputs(self):
        parts = [spec.describe(name) for name, spec in self.input_specs().items()]
        parts += [f"{name} at most {n} long" for name, n in self.max_length().items()]
        for name, spec in self.label_specs().items():
            parts.append(spec.describe(f"labels[{name!r}]" if name else "labels"))
        return ", ".join(parts)

    # --- checks in Python ---

    def _input_names(self):
        return [tensor.name for tensor in self.inputs]

    def _named(self, x):
        """`{input name: array}` of the concrete parts of `x`."""
        names = self._input_names()
        if isinstance(x, dict):
            pairs = [(name, x[name]) for name in names if name in x]
        elif isinstance(x, (list, tuple)) and len(x) == len(names):
            pairs = list(zip(names, x))
        elif len(names) == 1:
            pairs = [(names[0], x)]
        else:
            pairs = []
        named = {}
        for name, value in pairs:
            array = concrete_value(value)
            if array is not None:
                named[name] = array
        return named

    def check_input_keys(self, inputs):
        """`ValueError` naming the keys when a dict of inputs holds a key the
        model does not read, or lacks one it needs.

        Keras's `Functional` reads a dict by its sorted keys, not by name: an
        extra key (an `attention_mask` beside `padding_mask`, a `labels`)
        would move the inputs after it into other inputs' places, a wrong
        answer with only a warning. An unknown key is refused, not ignored:
        a caller who sends `attention_mask` meaning the padding mask must
        learn that it is not read. The keys are structure, known while a
        step is traced, so this raises alike in an eager call and in a
        compiled `fit`, `evaluate` or `predict`.
        """
        if not isinstance(inputs, dict):
            return
        required = self._input_names()
        optional = [name for name in self.optional_input_names() if name not in required]
        unknown = sorted(str(key) for key in inputs if key not in required + optional)
        missing = [name for name in required if name not in inputs]
        if not unknown and not missing:
            return
        problems = []
        if unknown:
            problems.append(f"it does not read {unknown}")
        if missing:
            problems.append(f"{missing} missing")
        takes = f"{required}" + (f" and optionally {optional}" if optional else "")
        raise ValueError(
            f"Invalid value for argument `inputs`: model {self.name!r} takes the keys "
            f"{takes}; {' and '.join(problems)} (a key the model does not read is "
            "refused, never ignored or read as another input). Received: inputs with "
            f"keys {sorted(str(key) for key in inputs)}"
        )

    def check_inputs(self, x):
        """Raises `ValueError` for concrete inputs the model cannot read
        (and for a dict of inputs with keys it does not take, concrete or
        not: `check_input_keys`)."""
        self.check_input_keys(x)
        named = self._named(x)
        if not named:
            return
        specs = self.input_specs()
        for name, array in named.items():
            check_not_empty(name, array)
            spec = specs.get(name)
            if isinstance(spec, IdSpec):
                check_ids(name, array, spec)
            elif isinstance(spec, MaskSpec):
                check_mask(name, array)
                check_mask_rows(name, array)
        for name, limit in self.max_length().items():
            if name in named:
                check_length(name, named[name], limit)
        self.check_arrays(named)

    def check_labels(self, y):
        specs = self.label_specs()
        if y is None or not specs:
            return
        if isinstance(y, dict):
            pairs = [(name, y[name]) for name in specs if name in y]
        else:
            pairs = [(next(iter(specs)), y)] if len(specs) == 1 else []
        for name, value in pairs:
            array = concrete_value(value)
            if array is not None:
                check_ids(f"labels[{name!r}]" if name else "labels", array, specs[name])

    def _check_data(self, x, y=None):
        if _is_dataset_like(x):
            return
        self.check_inputs(x)
        self.check_labels(y)

    # --- the label guard, inside the compiled step ---

    def guard_labels(self, y):
        """`(labels, guard)`: `y` with every out-of-range label replaced by
        a valid one, and a factor for the loss: 1.0, or NaN when a label was
        out of range (tensors).

        The replaced labels keep the loss from raising on one backend
        (TensorFlow's sparse cross-entropy on a CPU) and from reading
        another class silently on another (a one-hot of an out-of-range
        label is all zeros); the factor, multiplying the loss, makes the
        loss and every gradient NaN on every backend (an added constant
        would leave the gradients finite), so `SkipNonFiniteSteps` drops
        the step.
        """
        specs = self.label_specs()
        if y is None or not specs:
            return y, 1.0
        guard = 1.0
        if isinstance(y, dict):
            names = [name for name in specs if name in y]
        else:
            names = [next(iter(specs))] if len(specs) == 1 else []
        clean = dict(y) if isinstance(y, dict) else y
        for name in names:
            spec = specs[name]
            raw = comparable_ids(y[name] if isinstance(y, dict) else y)
            # The range in the labels' own dtype: an int64 2**32 + 2 cast
            # first would wrap to a valid 2.
            valid = ops.logical_and(raw >= spec.low, raw < spec.high)
            value = ops.cast(raw, "int32")
            ok = ops.all(valid) if len(value.shape) else valid
            guard = guard * ops.where(ok, 1.0, float("nan"))
            value = ops.where(valid, value, spec.low)
            if isinstance(y, dict):
                clean[name] = value
            else:
                clean = value
        return clean, guard

    def guard_inputs(self, x):
        """A factor for the loss: 1.0, or NaN when an input id lies out of
        its range, a mask holds a value other than 0 and 1, or a sequence is
        longer than `max_length()` (tensors).

        The model already makes its outputs NaN for such inputs, but NaN does
        not survive every op under XLA (a ReLU of NaN is 0 there), so the loss
        checks the inputs itself.
        """
        named = self._named_tensors(x)
        guard = 1.0
        for name, spec in self.input_specs().items():
            if isinstance(spec, IdSpec) and name in named:
                value = comparable_ids(named[name])  # before any cast: an int64 would wrap
                ok = ops.all(ops.logical_and(value >= spec.low, value < spec.high))
                guard = guard * ops.where(ok, 1.0, float("nan"))
            elif isinstance(spec, MaskSpec) and name in named:
                value = named[name]
                if value.dtype != "bool":
                    # A mask value other than 0/1 (a 2, a 0.5) would read as True.
                    ok = ops.all(ops.logical_or(ops.equal(value, 0), ops.equal(value, 1)))
                    guard = guard * ops.where(ok, 1.0, float("nan"))
                if len(value.shape) == 2:  # a row of padding only
                    ok = ops.all(ops.any(ops.not_equal(ops.cast(value, "int32"), 0), axis=1))
                    guard = guard * ops.where(ok, 1.0, float("nan"))
        for name, limit in self.max_length().items():
            if name in named and len(named[name].shape) > 1:
                ok = ops.shape(named[name])[1] <= limit
                guard = guard * ops.where(ok, 1.0, float("nan"))
        return guard * self.guard_relations(named)

    def guard_relations(self, named):
        """`guard_inputs` for relations between inputs (tensors)."""
        return 1.0

    def _named_tensors(self, x):
        names = self._input_names()
        if isinstance(x, dict):
            return {name: x[name] for name in names if name in x}
        if isinstance(x, (list, tuple)) and len(x) == len(names):
            return dict(zip(names, x))
        if len(names) == 1 and x is not None:
            return {names[0]: x}
        return {}

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        y, guard = self.guard_labels(y)
        loss = super().compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training
        )
        return loss * ops.cast(guard * self.guard_inputs(x), loss.dtype)

    # --- Keras entry points (see the module docstring for why each) ---

    def call(self, inputs, training=None, mask=None):
        """The functional graph (`keras.Model.call`) after `check_input_keys`:
        JAX's compiled steps run `call` (through `stateless_call`), never
        `__call__`. A family whose `call` is its own checks there."""
        self.check_input_keys(inputs)
        return super().call(inputs, training=training, mask=mask)

    def __call__(self, *args, **kwargs):
        inputs = _first_argument(self.call, args, kwargs)
        if inputs is not None:
            self.check_inputs(inputs)
        return super().__call__(*args, **kwargs)

    def compile(self, *args, **kwargs):
        """`keras.Model.compile`, with the optimizer wrapped by `guard_optimizer`
        and, for a model whose outputs are logits, a loss that reads
        probabilities refused."""
        bound = keras_arguments(super().compile, args, kwargs, ("optimizer", "loss"))
        arguments = bound.arguments
        if self.outputs_are_logits():
            check_loss_reads_logits(arguments.get("loss"), self.name)
        optimizer = arguments.get("optimizer", bound.signature.parameters["optimizer"].default)
        arguments["optimizer"] = guard_optimizer(optimizer, self.dtype_policy)
        super().compile(*bound.args, **bound.kwargs)

    def compile_from_config(self, config):
        """Compiles a reloaded model as it was saved: the saved config holds
        the optimizer, losses and metrics `compile` resolved, so they are
        passed back as they are (Keras skips this for models whose `compile`
        is custom, which would leave a reloaded model uncompiled)."""
        config = keras.saving.deserialize_keras_object(config)
        self.compile(**config)
        if self.built:
            # Variables to load the saved optimizer state into.
            self.optimizer.build(self.trainable_variables)

    def fit(self, *args, **kwargs):
        """`keras.Model.fit`, with concrete data checked first,
        `StopOnNonFiniteLoss` among the callbacks, and on TensorFlow the
        step's state built before its first trace (`build_before_first_trace`)."""
        bound = keras_arguments(super().fit, args, kwargs,
                                ("x", "y", "sample_weight", "callbacks", "validation_data"))
        arguments = bound.arguments
        self._check_data(arguments.get("x"), arguments.get("y"))
        validation = arguments.get("validation_data")
        if isinstance(validation, (tuple, list)) and len(validation) >= 2:
            self._check_data(validation[0], validation[1])
        arguments["callbacks"] = with_stop_callback(
            arguments.get("callbacks"), self.describe_inputs())
        build_before_first_trace(self, arguments.get("x"), arguments.get("y"),
                                 arguments.get("sample_weight"))
        return self._keeping_variables(
            lambda: super(GuardedModel, self).fit(*bound.args, **bound.kwargs))

    def evaluate(self, *args, **kwargs):
        """`keras.Model.evaluate`, with concrete data checked first."""
        bound = keras_arguments(super().evaluate, args, kwargs, ("x", "y"))
        self._check_data(bound.arguments.get("x"), bound.arguments.get("y"))
        return self._keeping_variables(
            lambda: super(GuardedModel, self).evaluate(*bound.args, **bound.kwargs))

    def predict(self, *args, **kwargs):
        """`keras.Model.predict`, with concrete inputs checked first."""
        bound = keras_arguments(super().predict, args, kwargs, ("x",))
        self._check_data(bound.arguments.get("x"))
        return self._keeping_variables(
            lambda: super(GuardedModel, self).predict(*bound.args, **bound.kwargs))

    def _keeping_variables(self, call):
        """`call()`; on JAX, a call that fails leaves the model usable.

        Keras's JAX trainer detaches the variables' values for its loop and
        reattaches them from the last finished step; an error before the
        first step ends (a `ValueError` while tracing it) leaves them
        detached, and every later use of the model fails. The values from
        before the call are put back into the variables left empty (those a
        finished step updated are reattached by Keras itself); Keras has no
        public way to see a detached value (`_keras_compat.variable_values`).
        """
        if keras.backend.backend() != "jax":
            return call()
        variables = list(self.variables) + list(self.metrics_variables)
        optimizer = getattr(self, "optimizer", None)
        if optimizer is not None:
            variables += list(optimizer.variables)
        saved = variable_values(variables)
        try:
            return call()
        except BaseException:
            reattach_values(saved)
            raise


def _is_dataset_like(x):
    """A tf.data dataset, a generator or a `PyDataset`: checked batch by
    batch by the pipeline (or by the guard in the step), not here."""
    if x is None or isinstance(x, (np.ndarray, dict, list, tuple)):
        return False
    if isinstance(x, keras.utils.PyDataset):
        return True
    return hasattr(x, "__iter__") and not ops.is_tensor(x)


def keras_arguments(method, args, kwargs, names):
    """The arguments of a call of Keras's `method` (a bound `keras.Model`
    method), by name wherever the caller put them: `inspect.signature(method)
    .bind(*args, **kwargs)`. A call Keras would refuse is a `TypeError` here
    too. `names` are those the guard reads or sets: a Keras whose `method`
    lacks one is refused loudly rather than guarded silently wrong."""
    signature = inspect.signature(method)
    missing = [name for name in names if name not in signature.parameters]
    if missing:
        raise RuntimeError(
            f"keras_attn's guard reads the arguments {missing} of keras.Model."
            f"{method.__name__}, which Keras {keras.__version__} no longer has "
            f"(its parameters: {list(signature.parameters)}). keras_attn/_guard.py "
            "needs updating for this Keras version."
        )
    return signature.bind(*args, **kwargs)


def _first_argument(call, args, kwargs):
    """The value of the first parameter of `call` (the model's inputs) in a
    call `model(*args, **kwargs)`, as Keras's `Layer.__call__` passes it on,
    or None. A call that does not fit `call` is left to Keras to refuse."""
    if args:
        return args[0]
    parameters = list(inspect.signature(call).parameters)
    return kwargs.get(parameters[0]) if parameters else None

