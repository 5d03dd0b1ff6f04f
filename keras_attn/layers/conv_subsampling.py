"""Convolutional front end that shortens speech features 4x in time."""

import numbers

import keras
import numpy as np
from keras import ops

from keras_attn._keras_compat import SpecFromCall
from keras_attn._clone import for_sublayer
from keras_attn._checks import check_positive_int
from keras_attn._checks import check_static_shape
from keras_attn.ops.masking import checked_mask
from keras_attn.ops.masking import get_keras_mask
from keras_attn.ops.masking import nan_where
from keras_attn.layers.streaming import check_built
from keras_attn.layers.streaming import check_state_tensor


def subsampled_length(length, maximum=None):
    """Frames left after `ConvSubsampling` from `length` frames: an int, a
    NumPy array (the data checks), or a tensor of the Keras backend.
    `maximum`: the elementwise maximum for a tensor of another framework
    (`tf.maximum` inside a `tf.data` map on any backend).

    >>> [int(subsampled_length(n)) for n in (6, 7, 10, 100)]
    [0, 1, 1, 24]
    >>> subsampled_length(np.array([0, 6, 7, 100])).tolist()
    [0, 0, 1, 24]
    """
    if maximum is None:
        if isinstance(length, numbers.Integral):
            maximum = max
        elif isinstance(length, (np.ndarray, np.generic)):
            maximum = np.maximum
        else:
            maximum = ops.maximum
    for _ in range(2):
        # kernel 3, stride 2, no padding: floor((L - 3) / 2) + 1, and 0 if L < 3
        length = maximum((length - 3) // 2 + 1, 0)
    return length


# Output frame t reads input frames 4t .. 4t + 6 (two unpadded 3-tap,
# stride-2 convolutions in time).
SUBSAMPLING = 4
RECEPTIVE_FIELD = 7


def subsampled_segment_ids(segment_ids):
    """The segment ids `(B, T')` of `ConvSubsampling`'s output frames for
    packed input rows' `(B, T)` (1..k for the k utterances of a row, 0 for
    padding): output frame `t` belongs to an utterance when every input
    frame it reads (`4t .. 4t + 6`) does, else it is padding (0).

    The convolutions are unpadded in time, so an utterance that starts at an
    input frame `4m` gets output frames `m .. m + subsampled_length(L) - 1`,
    exactly its frames alone, whatever its neighbours: no gap between
    utterances is needed beyond that alignment (`pack_utterances` aligns
    them).

    >>> ids = [[1] * 8 + [2] * 12 + [0] * 4]
    >>> ops.convert_to_numpy(subsampled_segment_ids(ids)).tolist()
    [[1, 0, 2, 2, 0]]
    """
    segment_ids = ops.convert_to_tensor(segment_ids)
    steps = subsampled_length(ops.shape(segment_ids)[1])
    first = segment_ids[:, ::SUBSAMPLING][:, :steps]  # (B, T')
    last = segment_ids[:, RECEPTIVE_FIELD - 1 :: SUBSAMPLING][:, :steps]  # (B, T')
    return ops.where(ops.equal(first, last), first, ops.zeros_like(first))


@keras.saving.register_keras_serializable(package="keras_attn")
class ConvSubsampling(SpecFromCall, keras.layers.Layer):
    """Two 3x3 convolutions with stride 2 over (time, frequency), ReLU after
    each, then a linear projection: `(B, T, F)` -> `(B, T', hidden_dim)` with
    `T' = subsampled_length(T)` (10 ms frames become 40 ms frames).

    The output mask is exact: output frame `t` is valid when the last input
    frame of its receptive field (`4t + 6`) is, i.e. `t < subsampled_length(L)`
    for an utterance of `L` valid frames. Keras propagates it to the next layer.

    Streaming: the convolutions are unpadded in time, so output frame `t`
    reads input frames `4t .. 4t + 6` and nothing else; `stream_step` carries
    the input frames a later output still needs (at most 6) and gives exactly
    the outputs of the whole-utterance call.

    Args:
        hidden_dim: output width.
        filters: channels of both convolutions; defaults to `hidden_dim`.
        kernel_initializer: initializer of the kernels.
        **kwargs: base layer arguments.

    Call arguments:
        inputs: `(B, T, F)` features (e.g. log-mel), padding at the end.
        padding_mask: `(B, T)`; defaults to the implicit Keras mask.

    Returns:
        `(B, T', hidden_dim)`.

    Example:

    >>> import numpy as np
    >>> tuple(ConvSubsampling(16)(np.ones((2, 100, 80), "float32")).shape)
    (2, 24, 16)

    References:
        Gulati et al., "Conformer", 2020, Figure 1.
    """

    def __init__(self, hidden_dim, filters=None, kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.hidden_dim = check_positive_int("hidden_dim", hidden_dim)
        self.filters = check_positive_int("filters", filters, allow_none=True)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True

    def build(self, inputs_shape):
        if len(inputs_shape) != 3 or inputs_shape[-1] is None:
            raise ValueError(
                "`inputs` must be (B, T, F) with a known F. "
                f"Received: inputs.shape={tuple(inputs_shape)}"
            )
        features = self._features = inputs_shape[-1]
        if subsampled_length(features) < 1:
            raise ValueError(
                "Two stride-2 3x3 convolutions need at least 7 feature bins. "
                f"Received: F={features}"
            )
        filters = self.filters or self.hidden_dim
        self.conv_1 = keras.layers.Conv2D(
            filters, 3, strides=2, activation="relu",
            kernel_initializer=for_sublayer(self.kernel_initializer, "conv_1"),
            dtype=self.dtype_policy, name="conv_1",
        )
        self.conv_1.build((inputs_shape[0], inputs_shape[1], features, 1))
        time_1 = None if inputs_shape[1] is None else subsampled_length(inputs_shape[1])
        self.conv_2 = keras.layers.Conv2D(
            filters, 3, strides=2, activation="relu",
            kernel_initializer=for_sublayer(self.kernel_initializer, "conv_2"),
            dtype=self.dtype_policy, name="conv_2",
        )
        freq_1 = (features - 3) // 2 + 1
        self.conv_2.build((inputs_shape[0], None, freq_1, filters))
        self._flat = subsampled_length(features) * filters
        self.projection = keras.layers.Dense(
            self.hidden_dim, kernel_initializer=for_sublayer(self.kernel_initializer, "projection"),
            dtype=self.dtype_policy, name="projection",
        )
        self.projection.build((inputs_shape[0], time_1, self._flat))
        self.built = True

    def call(self, inputs, padding_mask=None):
        length = inputs.shape[1]
        if isinstance(length, numbers.Integral) and subsampled_length(length) < 1:
            raise ValueError(
                f"ConvSubsampling needs at least 7 frames. Received: T={length}"
            )
        if padding_mask is None:
            padding_mask = get_keras_mask(inputs)
        padding_mask, bad_padding = checked_mask(padding_mask, "padding_mask")
        x = inputs
        if padding_mask is not None:
            x = ops.where(ops.expand_dims(padding_mask, -1), x, ops.zeros_like(x))
        x = self.conv_1(ops.expand_dims(x, -1))  # (B, T1, F1, C)
        x = self.conv_2(x)  # (B, T', F', C)
        shape = ops.shape(x)
        x = ops.reshape(x, (shape[0], shape[1], self._flat))
        return nan_where(bad_padding, self.projection(x))

    def initial_state(self, batch_size):
        """The streaming state before the first frame: no buffered input
        frames (`frames` `(B, 0, F)`, `mask` `(B, 0)`)."""
        check_built(self)
        return {
            "frames": ops.zeros((batch_size, 0, self._features), self.compute_dtype),
            "mask": ops.zeros((batch_size, 0), "bool"),
        }

    def check_state(self, state, batch_size, prefix=""):
        """A ValueError naming the entry of `state` that does not fit."""
        if not isinstance(state, dict) or set(state) != {"frames", "mask"}:
            raise ValueError(
                "Invalid value for argument `state`: a dict of 'frames' and 'mask', "
                "as `initial_state` returns. Received: state="
                f"{sorted(state) if isinstance(state, dict) else type(state).__name__}"
            )
        check_state_tensor(prefix + "frames", state["frames"],
                           (batch_size, None, self._features), self.compute_dtype)
        check_state_tensor(prefix + "mask", state["mask"], (batch_size, None), "bool")

    def stream_step(self, inputs, state, padding_mask=None):
        """The outputs that the frames received so far complete.

        Args:
            inputs: `(B, t, F)`, the next feature frames (any `t`, 0 included).
            state: the previous step's state (`initial_state` at the start).
            padding_mask: `(B, t)`, True = real frame (default: all).

        Returns:
            `(outputs (B, m, hidden_dim), output_mask (B, m), new_state)`:
            the next `m` output frames of the whole-utterance call and their
            mask; `state` is not changed.
        """
        batch = inputs.shape[0]
        self.check_state(state, batch)
        if padding_mask is None:
            padding_mask = ops.ones(tuple(ops.shape(inputs)[:2]), "bool")
        check_static_shape("padding_mask", padding_mask, tuple(inputs.shape[:2]), "(B, t)")
        frames = ops.concatenate([state["frames"], ops.cast(inputs, state["frames"].dtype)], 1)
        mask = ops.concatenate([state["mask"], ops.cast(padding_mask, "bool")], axis=1)
        total = frames.shape[1]
        steps = subsampled_length(total)
        if steps == 0:
            outputs = ops.zeros((batch, 0, self.hidden_dim), self.compute_dtype)
        else:
            outputs = self(frames, padding_mask=mask)
        # Output t is real when the last frame it reads (4t + 6) is.
        output_mask = mask[:, 6::4][:, :steps]
        consumed = 4 * steps  # the next output starts at input frame 4 * steps
        new_state = {"frames": frames[:, consumed:], "mask": mask[:, consumed:]}
        return outputs, output_mask, new_state

    def compute_output_shape(self, inputs_shape):
        length = inputs_shape[1]
        return (inputs_shape[0], None if length is None else subsampled_length(length),
                self.hidden_dim)

    def compute_mask(self, inputs, mask=None):
        return None if mask is None else self.output_padding_mask(mask)

    def output_padding_mask(self, padding_mask):
        """The `(B, T')` mask of the output for a `(B, T)` input mask."""
        lengths = ops.sum(ops.cast(padding_mask, "int32"), axis=1)  # (B,)
        steps = subsampled_length(ops.shape(padding_mask)[1])
        # ops.less, not `<`: the left operand may be a backend tensor and
        # the right a symbolic KerasTensor (Keras calls compute_mask with those).
        return ops.less(ops.expand_dims(ops.arange(steps), 0),
                        ops.expand_dims(subsampled_length(lengths), 1))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "hidden_dim": self.hidden_dim,
                "filters": self.filters,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
