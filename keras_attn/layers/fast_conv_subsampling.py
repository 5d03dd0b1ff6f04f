"""The FastConformer's front end: depthwise-separable convolutions that
shorten speech features 8x in time."""

import keras
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


def fast_subsampled_length(length, subsampling_factor=8):
    """Frames left after `FastConvSubsampling` from `length` frames: each
    stride-2 stage (kernel 3, one zero frame padded on each side) keeps
    `ceil(L / 2)`. An int, a NumPy array or a tensor of any framework
    (only `+` and `//`).

    >>> [fast_subsampled_length(n) for n in (0, 1, 8, 9, 100)]
    [0, 1, 1, 2, 13]
    """
    for _ in range(_stages(subsampling_factor)):
        length = (length + 1) // 2  # floor((L + 2 - 3) / 2) + 1, and 0 for L = 0
    return length


def _stages(subsampling_factor):
    return int(subsampling_factor).bit_length() - 1


def _check_factor(value):
    check_positive_int("subsampling_factor", value)
    if value < 2 or value & (value - 1):
        raise ValueError(
            "`subsampling_factor` must be a power of two, at least 2 (one "
            f"stride-2 stage per factor of 2). Received: subsampling_factor={value}"
        )
    return value


def _pad_time_and_frequency(x):
    """One zero frame and one zero bin on each side: (B, T, F, C) ->
    (B, T + 2, F + 2, C), the symmetric padding of the checkpoints (Keras's
    "same" would pad a stride-2 convolution on the right only)."""
    return ops.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))


def _pad_frequency(x):
    """One zero bin on each side, none in time: a streamed stage's frames
    carry their own time context (`FastConvSubsampling.stream_step`)."""
    return ops.pad(x, ((0, 0), (0, 0), (1, 1), (0, 0)))


@keras.saving.register_keras_serializable(package="keras_attn")
class FastConvSubsampling(SpecFromCall, keras.layers.Layer):
    """The FastConformer's subsampling: `log2(subsampling_factor)` stride-2
    3x3 stages over (time, frequency), the first a full convolution from
    one channel to `filters`, the others depthwise-separable (a depthwise
    3x3 stride-2 convolution, then a 1x1 convolution), ReLU after each
    stage, then a linear projection of the flattened channels and bins:
    `(B, T, F)` -> `(B, ceil(T / factor), hidden_dim)`.

    ```
    x (B, T, F, 1) -> pad 1 -> Conv2D(C, 3, stride 2) -> ReLU
      -> [pad 1 -> DepthwiseConv2D(3, stride 2) -> Conv2D(C, 1) -> ReLU] x (stages - 1)
      -> (B, T', C, F') flattened channel-major -> Dense(hidden_dim)
    ```

    Each stage pads one zero frame and one zero bin on both sides (as
    NeMo's and transformers' checkpoints do), so a stage keeps `ceil(L / 2)`
    frames (`fast_subsampled_length`). Padding-safe: the frames past each
    utterance's length are zeroed before every stage, so an utterance's
    outputs are those it gets alone, whatever the padding holds; the output
    mask is `t < fast_subsampled_length(L)`.

    Streaming: output frame `t` of a stage reads its input frames `2t - 1 ..
    2t + 1` (frame -1 and the frames past the end are the zeros padded
    around the utterance). `stream_step` carries, per stage, the input
    frames a later output still needs (one or two, a zero frame before the
    first chunk: the left padding) and `final=True` adds the right padding,
    so a stream gives exactly the outputs of the whole-utterance call. With
    the factor 8, output `t` reads input frames `8t - 7 .. 8t + 7`: nothing
    past its own eight, so it comes out as soon as they have arrived.

    Args:
        hidden_dim: output width.
        filters: channels of every convolution (`subsampling_conv_channels`
            of transformers' Parakeet); defaults to `hidden_dim`.
        subsampling_factor: a power of two, one stage per factor of 2.
        kernel_initializer: initializer of the kernels.
        **kwargs: base layer arguments.

    Call arguments:
        inputs: `(B, T, F)` features (e.g. log-mel), padding at the end.
        padding_mask: `(B, T)`; defaults to the implicit Keras mask.

    Returns:
        `(B, T', hidden_dim)`.

    Example:

    >>> import numpy as np
    >>> tuple(FastConvSubsampling(16, filters=4)(np.ones((2, 100, 80), "float32")).shape)
    (2, 13, 16)

    References:
        Rekesh et al., "Fast Conformer with Linearly Scalable Attention for
        Efficient Speech Recognition", 2023, section 3.1.
    """

    def __init__(self, hidden_dim, filters=None, subsampling_factor=8,
                 kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.hidden_dim = check_positive_int("hidden_dim", hidden_dim)
        self.filters = check_positive_int("filters", filters, allow_none=True)
        self.subsampling_factor = _check_factor(subsampling_factor)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True

    def build(self, inputs_shape):
        if len(inputs_shape) != 3 or inputs_shape[-1] is None:
            raise ValueError(
                "`inputs` must be (B, T, F) with a known F. "
                f"Received: inputs.shape={tuple(inputs_shape)}"
            )
        filters = self.filters or self.hidden_dim
        batch, time, bins = inputs_shape[0], inputs_shape[1], inputs_shape[2]
        self._features = bins

        def initializer(name):
            return for_sublayer(self.kernel_initializer, name)

        def padded(length):
            return None if length is None else length + 2

        self.conv_1 = keras.layers.Conv2D(
            filters, 3, strides=2, kernel_initializer=initializer("conv_1"),
            dtype=self.dtype_policy, name="conv_1",
        )
        self.conv_1.build((batch, padded(time), bins + 2, 1))
        self.depthwise_convs, self.pointwise_convs = [], []
        for stage in range(2, _stages(self.subsampling_factor) + 1):
            time, bins = fast_subsampled_length(time, 2) if time is not None else None, (bins + 1) // 2
            depthwise = keras.layers.DepthwiseConv2D(
                3, strides=2, depthwise_initializer=initializer(f"depthwise_conv_{stage}"),
                dtype=self.dtype_policy, name=f"depthwise_conv_{stage}",
            )
            depthwise.build((batch, padded(time), bins + 2, filters))
            pointwise = keras.layers.Conv2D(
                filters, 1, kernel_initializer=initializer(f"pointwise_conv_{stage}"),
                dtype=self.dtype_policy, name=f"pointwise_conv_{stage}",
            )
            pointwise.build((batch, None, (bins + 1) // 2, filters))
            self.depthwise_convs.append(depthwise)
            self.pointwise_convs.append(pointwise)
        self._flat = filters * fast_subsampled_length(inputs_shape[2], self.subsampling_factor)
        self.projection = keras.layers.Dense(
            self.hidden_dim, kernel_initializer=initializer("projection"),
            dtype=self.dtype_policy, name="projection",
        )
        self.projection.build((batch, None, self._flat))
        self.built = True

    def call(self, inputs, padding_mask=None):
        if padding_mask is None:
            padding_mask = get_keras_mask(inputs)
        padding_mask, bad_padding = checked_mask(padding_mask, "padding_mask")
        lengths = None
        if padding_mask is not None:
            lengths = ops.sum(ops.cast(padding_mask, "int32"), axis=1)  # (B,)

        def zero_padding(x, lengths):
            # Frames past each utterance's length read as the zeros padded
            # around an utterance alone.
            if lengths is None:
                return x
            frames = ops.expand_dims(ops.arange(ops.shape(x)[1]), 0)  # (1, T)
            valid = ops.less(frames, ops.expand_dims(lengths, 1))  # (B, T)
            return ops.where(ops.expand_dims(valid, (2, 3)), x, ops.zeros_like(x))

        x = ops.expand_dims(inputs, -1)  # (B, T, F, 1)
        x = ops.relu(self.conv_1(_pad_time_and_frequency(zero_padding(x, lengths))))
        for depthwise, pointwise in zip(self.depthwise_convs, self.pointwise_convs):
            lengths = None if lengths is None else fast_subsampled_length(lengths, 2)
            x = depthwise(_pad_time_and_frequency(zero_padding(x, lengths)))
            x = ops.relu(pointwise(x))  # (B, T', F', C)
        # Channel-major flattening, (C, F') per frame: the checkpoints' layout.
        x = ops.transpose(x, (0, 1, 3, 2))  # (B, T', C, F')
        shape = ops.shape(x)
        x = ops.reshape(x, (shape[0], shape[1], self._flat))
        return nan_where(bad_padding, self.projection(x))

    # === Streaming ===

    def _stage_widths(self):
        """`(bins, channels)` of each stage's input frames."""
        filters = self.filters or self.hidden_dim
        widths, bins = [(self._features, 1)], self._features
        for _ in self.depthwise_convs:
            bins = (bins + 1) // 2
            widths.append((bins, filters))
        return widths

    def initial_state(self, batch_size):
        """The streaming state before the first frame: per stage `i` (1 ..),
        `frames_<i>` `(B, 1, bins, channels)`, the zero frame padded before
        the utterance, and `mask_<i>` `(B, 1)` (False: padding)."""
        check_built(self)
        state = {}
        for stage, (bins, channels) in enumerate(self._stage_widths(), 1):
            state[f"frames_{stage}"] = ops.zeros((batch_size, 1, bins, channels),
                                                 self.compute_dtype)
            state[f"mask_{stage}"] = ops.zeros((batch_size, 1), "bool")
        return state

    def check_state(self, state, batch_size, prefix=""):
        """A ValueError naming the entry of `state` that does not fit."""
        check_built(self)
        widths = self._stage_widths()
        names = {f"{entry}_{stage}" for stage in range(1, len(widths) + 1)
                 for entry in ("frames", "mask")}
        if not isinstance(state, dict) or set(state) != names:
            raise ValueError(
                f"Invalid value for argument `state`: a dict of {sorted(names)}, as "
                "`initial_state` returns. Received: state="
                f"{sorted(state) if isinstance(state, dict) else type(state).__name__}"
            )
        for stage, (bins, channels) in enumerate(widths, 1):
            check_state_tensor(f"{prefix}frames_{stage}", state[f"frames_{stage}"],
                               (batch_size, None, bins, channels), self.compute_dtype)
            check_state_tensor(f"{prefix}mask_{stage}", state[f"mask_{stage}"],
                               (batch_size, None), "bool")

    def stream_step(self, inputs, state, padding_mask=None, final=False):
        """The outputs that the frames received so far complete.

        Args:
            inputs: `(B, t, F)`, the next feature frames (any `t`, 0 included).
            state: the previous step's state (`initial_state` at the start).
            padding_mask: `(B, t)`, True = real frame (default: all); the
                real frames of a row come before its padding.
            final: the end of the stream: each stage adds the zero frame
                padded after the utterance and gives its last outputs.

        Returns:
            `(outputs (B, m, hidden_dim), output_mask (B, m), new_state)`:
            the next `m` output frames of the whole-utterance call and their
            mask; `state` is not changed. The shapes depend only on the
            shapes given (a fixed-shape step can be traced).
        """
        batch = inputs.shape[0]
        self.check_state(state, batch)
        if padding_mask is None:
            padding_mask = ops.ones(tuple(ops.shape(inputs)[:2]), "bool")
        check_static_shape("padding_mask", padding_mask, tuple(inputs.shape[:2]), "(B, t)")
        x = ops.expand_dims(ops.cast(inputs, self.compute_dtype), -1)  # (B, t, F, 1)
        mask = ops.cast(padding_mask, "bool")
        new_state = {}
        convs = [None, *zip(self.depthwise_convs, self.pointwise_convs)]
        for stage, conv in enumerate(convs, 1):
            frames = ops.concatenate([state[f"frames_{stage}"], x], axis=1)
            held = ops.concatenate([state[f"mask_{stage}"], mask], axis=1)
            if final:  # the zero frame padded after the utterance
                frames = ops.pad(frames, ((0, 0), (0, 1), (0, 0), (0, 0)))
                held = ops.concatenate([held, ops.zeros((batch, 1), "bool")], axis=1)
            # Output s reads frames 2s .. 2s + 2 of the held ones (the first
            # held frame is the left padding or a frame already read).
            steps = max((frames.shape[1] - 1) // 2, 0)
            # Frames past each utterance's end read as zeros, as offline.
            frames = ops.where(ops.expand_dims(held, (2, 3)), frames, ops.zeros_like(frames))
            new_state[f"frames_{stage}"] = frames[:, 2 * steps:]
            new_state[f"mask_{stage}"] = held[:, 2 * steps:]
            # Output s is real when the frame at its centre (2s + 1) is.
            mask = held[:, 1::2][:, :steps]
            if steps == 0:  # nothing complete yet: no frames for the next stage
                widths = self._stage_widths()
                bins, channels = widths[stage] if stage < len(widths) else widths[-1]
                x = ops.zeros((batch, 0, bins, channels), self.compute_dtype)
                continue
            window = _pad_frequency(frames[:, :2 * steps + 1])
            if conv is None:
                x = ops.relu(self.conv_1(window))
            else:
                depthwise, pointwise = conv
                x = ops.relu(pointwise(depthwise(window)))
        outputs = x
        steps = outputs.shape[1]
        if steps == 0:
            outputs = ops.zeros((batch, 0, self.hidden_dim), self.compute_dtype)
        else:
            outputs = ops.transpose(outputs, (0, 1, 3, 2))  # (B, m, C, F')
            outputs = self.projection(ops.reshape(outputs, (batch, steps, self._flat)))
        return outputs, mask, new_state

    def compute_output_shape(self, inputs_shape):
        length = inputs_shape[1]
        return (inputs_shape[0],
                None if length is None else fast_subsampled_length(length, self.subsampling_factor),
                self.hidden_dim)

    def compute_mask(self, inputs, mask=None):
        return None if mask is None else self.output_padding_mask(mask)

    def output_padding_mask(self, padding_mask):
        """The `(B, T')` mask of the output for a `(B, T)` input mask."""
        lengths = ops.sum(ops.cast(padding_mask, "int32"), axis=1)  # (B,)
        steps = fast_subsampled_length(ops.shape(padding_mask)[1], self.subsampling_factor)
        return ops.less(ops.expand_dims(ops.arange(steps), 0),
                        ops.expand_dims(fast_subsampled_length(lengths, self.subsampling_factor),
                                        1))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "hidden_dim": self.hidden_dim,
                "filters": self.filters,
                "subsampling_factor": self.subsampling_factor,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
