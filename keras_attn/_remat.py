"""Rematerialisation (gradient checkpointing) that works for the blocks.

A layer built inside `keras.RematScope(mode="list_of_layers",
layer_names=[...])` whose name is listed has its whole `call` wrapped in
`keras.remat` (`jax.checkpoint`, `tf.recompute_grad`, torch's checkpoint).
Applied as is to a block, that fails three ways:

- JAX traces every argument of the checkpointed function, so a Python flag
  such as `training=True` becomes a tracer and `if training:` raises.
- `tf.recompute_grad` refuses keyword arguments inside a `tf.function`,
  which is how `fit` runs (keras-team/keras#21207).
- The recomputation in the backward pass draws new dropout masks (the seed
  state has already moved on: TensorFlow, torch) or updates the seeds from
  inside the checkpoint (JAX: a leaked tracer), so the gradient is not the
  gradient of the loss that the forward pass computed.

`RematCall.rematerialized_call` keeps `RematScope` as the switch and
replaces the wrapping: only float tensors (the float inputs and the
trainable weights) are arguments of the rematerialised function, everything
else (masks, flags) is bound by closure; the non-trainable state (dropout
seeds, BatchNorm statistics) is read once, before the call, and handed in
through a `keras.StatelessScope`, so the recomputation replays exactly the
forward pass; the updated state comes out as outputs and is assigned once.
"""

import contextlib
import functools

import keras
from keras import ops

from keras_attn._keras_compat import get_keras_mask
from keras_attn._keras_compat import remat_mode
from keras_attn._keras_compat import set_keras_mask


def remat_scope(enabled, layer_names):
    """`keras.RematScope` rematerialising exactly the layers named
    `layer_names` (not their sublayers) made inside it, or, with `enabled`
    False, a scope that changes nothing."""
    if not enabled:
        return contextlib.nullcontext()
    return keras.RematScope(mode="list_of_layers", layer_names=list(layer_names))


def _is_float_tensor(x):
    return (
        x is not None
        and ops.is_tensor(x)
        and keras.backend.is_float_dtype(x.dtype)
    )


class RematCall:
    """Mix in before `keras.layers.Layer` to make `RematScope` work on a
    block whose call takes flags and masks and uses dropout or BatchNorm.

    Only the training call is rematerialised: without a gradient there are
    no activations to save, and decoding with caches and export stay the
    plain call.
    """

    def rematerialized_call(self, layer_call, *args, **kwargs):
        wrapped = super().rematerialized_call(layer_call, *args, **kwargs)
        # "activations" mode wraps the activation functions only: Keras's
        # own wrapper handles that.
        if wrapped is layer_call or remat_mode(self) == "activations":
            return wrapped
        training = kwargs.get("training")
        if training is None or training is False:
            return layer_call
        return functools.partial(_rematerialized, self, layer_call)


def _rematerialized(layer, layer_call, *args, **kwargs):
    leaves = keras.tree.flatten((args, kwargs))
    slots = [i for i, leaf in enumerate(leaves) if _is_float_tensor(leaf)]
    masks = [get_keras_mask(leaves[i]) for i in slots]
    weights = layer.trainable_variables
    state = layer.non_trainable_variables  # seeds, BatchNorm statistics
    # Copied before the call, so that the recomputation in the backward pass
    # sees the values of the forward pass (on TensorFlow and torch `.value`
    # is the live variable, and the seeds move on during the call).
    state_values = [ops.copy(variable.value) for variable in state]

    def forward(*tensors):
        inputs, weight_values = tensors[: len(slots)], tensors[len(slots) :]
        call_leaves = list(leaves)
        for i, tensor, mask in zip(slots, inputs, masks):
            if mask is not None:  # the implicit Keras mask, lost on the way in
                set_keras_mask(tensor, mask)
            call_leaves[i] = tensor
        call_args, call_kwargs = keras.tree.pack_sequence_as(
            (args, kwargs), call_leaves
        )
        mapping = list(zip(weights, weight_values)) + list(zip(state, state_values))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            outputs = layer_call(*call_args, **call_kwargs)
        return outputs, [scope.get_current_value(variable) for variable in state]

    # Inside the layer's autocast scope a float weight reads as the compute
    # dtype; the sublayers read it the same way, so their values are unchanged.
    tensors = [leaves[i] for i in slots] + [weight.value for weight in weights]
    outputs, new_state = keras.remat(forward)(*tensors)
    for variable, value in zip(state, new_state):
        variable.assign(value)
    return outputs

# The packages that register classes, once this module is whole.
from keras_attn._registration import register_all as _register_all  # noqa: E402

_register_all(__name__)
