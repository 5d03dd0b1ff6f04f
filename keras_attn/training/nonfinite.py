"""The safety net of a compiled step: bad data that no Python check could
see (inside a `jit`-compiled step, a `tf.data` pipeline) makes the loss NaN
(`keras_attn.models._guarded.GuardedModel`), and then

- `SkipNonFiniteSteps` wraps the optimizer in the family models' `compile`:
  a step whose gradients are not all finite changes no weight and no
  optimizer state (its iteration count included);
- `StopOnNonFiniteLoss`, added to every `fit` of a family model (and to
  `ResumableTrainer`'s), ends training at the end of that step with
  `NonFiniteLossError`.

`LossScaleOptimizer`'s step hooks it overrides are reached through
`keras_attn._keras_compat`.
"""

import math

import keras
from keras import ops

from keras_attn._keras_compat import no_automatic_dependency_tracking
from keras_attn._keras_compat import overrides_loss_scale_hooks
from keras_attn.errors import NonFiniteLossError


@keras.saving.register_keras_serializable(package="keras_attn")
@overrides_loss_scale_hooks
class SkipNonFiniteSteps(keras.optimizers.LossScaleOptimizer):
    """Wraps an optimizer so that a step with a non-finite gradient is a
    no-op: no weight, moment or iteration count changes.

    Keras's `LossScaleOptimizer` already skips such steps on every backend
    (under `tf.distribute` too); this keeps its skipping and drops the loss
    scaling (the scale stays 1, nothing is multiplied). `skipped_steps`
    counts the steps skipped. The family models' `compile` wraps the
    optimizer in it, except under `mixed_float16`, where Keras wraps it in
    the `LossScaleOptimizer` it needs, which skips the same steps.

    Args:
        inner_optimizer: the optimizer that makes the updates.
        name: the optimizer's name.
    """

    def __init__(self, inner_optimizer, name=None, **kwargs):
        # A saved config of the parent class carries these two; they have
        # no meaning here.
        kwargs.pop("initial_scale", None)
        kwargs.pop("dynamic_growth_steps", None)
        inner_optimizer = keras.optimizers.get(inner_optimizer)
        super().__init__(inner_optimizer, initial_scale=1.0, name=name, **kwargs)

    @no_automatic_dependency_tracking
    def build(self, var_list):
        # Not the parent's `build`: one counter instead of its scale and
        # growth counter.
        self.skipped_steps = self.add_variable(
            shape=(),
            dtype="int",
            initializer=keras.initializers.Zeros(),
            aggregation="none",
            name="skipped_steps",
        )
        self.inner_optimizer.build(var_list)
        keras.optimizers.Optimizer.build(self, var_list)

    def scale_loss(self, loss):
        return loss

    def _stateful_handle_finite_grads(self, grads, trainable_variables):
        self.inner_optimizer.apply(grads, trainable_variables=trainable_variables)

    def _stateful_handle_non_finite_grads(self):
        self.skipped_steps.assign_add(1)

    def _stateless_handle_finite_grads(self, optimizer_variables, grads, trainable_variables):
        own = len(self._variables)
        new_trainable, new_inner = self.inner_optimizer.stateless_apply(
            list(optimizer_variables[own:]), grads, trainable_variables
        )
        return new_trainable, list(optimizer_variables[:own]) + list(new_inner)

    def _stateless_handle_non_finite_grads(self, optimizer_variables, trainable_variables):
        values = list(optimizer_variables)
        index = next(i for i, v in enumerate(self.variables) if v is self.skipped_steps)
        values[index] = values[index] + ops.ones_like(values[index])
        return list(trainable_variables), values

    def get_config(self):
        return {
            "name": self.name,
            "inner_optimizer": keras.saving.serialize_keras_object(self.inner_optimizer),
        }


def guard_optimizer(optimizer, dtype_policy):
    """The optimizer `compile` should use: wrapped in `SkipNonFiniteSteps`
    unless it already skips non-finite steps (a `LossScaleOptimizer`), or
    Keras will wrap it in one (`mixed_float16`)."""
    optimizer = keras.optimizers.get(optimizer)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer
    if getattr(dtype_policy, "name", None) == "mixed_float16":
        return optimizer
    return SkipNonFiniteSteps(optimizer)


class StopOnNonFiniteLoss(keras.callbacks.Callback):
    """Ends `fit` with `NonFiniteLossError` at the end of the first step
    whose loss is not finite. With `SkipNonFiniteSteps` that step has changed
    nothing, so the weights are those before it. At the end of an epoch it
    warns about steps skipped for non-finite gradients under a finite loss.

    Unlike Keras's `TerminateOnNaN`, which stops quietly, it raises: a run
    that ends early because of bad data must not look like a finished one.
    """

    def __init__(self, describe_inputs=None):
        super().__init__()
        self.describe_inputs = describe_inputs
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None:
            return
        loss = float(loss)
        if math.isfinite(loss):
            return
        self.model.stop_training = True
        expected = ""
        if self.describe_inputs:
            expected = f" This model expects: {self.describe_inputs}."
        raise NonFiniteLossError(
            f"Training stopped at step {batch + 1} of epoch {self._epoch + 1}: the "
            f"loss is {loss}. The update of that step was skipped, so the weights "
            "are those before it. keras_attn models make the loss NaN on purpose "
            "for bad data that cannot raise inside a compiled step (an id or label "
            "out of range, a sequence longer than max_sequence_length); call the "
            f"model on that batch eagerly to see which input.{expected}"
        )

    def on_epoch_end(self, epoch, logs=None):
        counter = getattr(self.model.optimizer, "skipped_steps", None)
        if counter is None:
            return
        # Through the Keras variable: under tf.distribute `.value` is a
        # mirrored variable NumPy cannot read.
        skipped = int(ops.convert_to_numpy(counter))
        if skipped:
            import warnings

            warnings.warn(
                f"{skipped} training step(s) so far were skipped because their "
                "gradients were not finite (the loss was finite).",
                stacklevel=2,
            )


def with_stop_callback(callbacks, describe_inputs=None):
    """`callbacks` with a `StopOnNonFiniteLoss` first (unless present), so
    that it runs before anything that would record the bad step."""
    callbacks = list(callbacks or [])
    if not any(isinstance(c, StopOnNonFiniteLoss) for c in callbacks):
        callbacks.insert(0, StopOnNonFiniteLoss(describe_inputs))
    return callbacks


# === The loss of a model whose outputs are logits ===
