"""ViT position embeddings for images of any size: the `(g, g, D)` grid of
learned patch positions resampled to the input's patch grid on every call,
as transformers' `interpolate_pos_encoding` does.

torch's bicubic (`F.interpolate(mode="bicubic", align_corners=False)`, what
transformers' ViT uses) is cubic convolution with a = -0.75 and border
indices clamped; `keras.ops.image.resize` (TensorFlow, JAX) uses Keys'
a = -0.5 and differs by ~0.2 on a random 4 x 4 grid. So the resampling here
is written out: two small matrix products, `(h, g) x (g, g, D) x (w, g)`,
each `(out, in)` matrix built with `keras.ops` from the sizes (which are
tensors when a TensorFlow graph leaves them unknown), in float32, in the
order of torch's CPU kernel: equal to torch's to float32 rounding on every
backend.
"""

import numbers

import keras
from keras import ops


def _cubic_near(x, a):
    """torch's `cubic_convolution1`, for |x| <= 1."""
    return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0


def _cubic_far(x, a):
    """torch's `cubic_convolution2`, for 1 < |x| < 2."""
    return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a


def _bicubic_matrix(in_size, out_size):
    """torch's `upsample_bicubic2d` (align_corners=False, output size given)
    along one axis: source `scale * (i + 0.5) - 0.5` (scale = in / out), four
    taps around its floor with a = -0.75, indices clamped to the border.
    Returns `(out_size, in_size)` float32."""
    scale = ops.cast(in_size, "float32") / ops.cast(out_size, "float32")
    source = scale * (ops.arange(out_size, dtype="float32") + 0.5) - 0.5  # (out,)
    floor = ops.minimum(ops.floor(source), float(in_size - 1))
    t = ops.clip(source - floor, 0.0, 1.0)[:, None]  # (out, 1)
    a = -0.75
    weights = ops.concatenate(
        [_cubic_far(t + 1.0, a), _cubic_near(t, a), _cubic_near(1.0 - t, a),
         _cubic_far(2.0 - t, a)], axis=1)  # (out, 4)
    taps = ops.cast(floor, "int32")[:, None] + ops.arange(-1, 3, dtype="int32")[None]
    taps = ops.clip(taps, 0, in_size - 1)  # (out, 4)
    one_hot = ops.one_hot(taps, in_size, dtype="float32")  # (out, 4, in)
    return ops.sum(one_hot * weights[:, :, None], axis=1)  # (out, in)


def _antialiased_bicubic_matrix(in_size, out_size):
    """torch's antialiased bicubic (`antialias=True`, as PIL): Keys' kernel
    (a = -0.5) centred on `scale * (i + 0.5)`, widened by the scale when
    shrinking, the taps outside the input dropped and each row renormalised
    to sum to 1. Written over every input index: the kernel is 0 outside
    torch's window. Returns `(out_size, in_size)` float32."""
    scale = ops.cast(in_size, "float32") / ops.cast(out_size, "float32")
    inverse = 1.0 / ops.maximum(scale, 1.0)
    center = scale * (ops.arange(out_size, dtype="float32") + 0.5)  # (out,)
    source = ops.arange(in_size, dtype="float32")  # (in,)
    x = ops.abs((source[None, :] - center[:, None] + 0.5) * inverse)  # (out, in)
    a = -0.5
    weights = ops.where(x < 1.0, _cubic_near(x, a),
                        ops.where(x < 2.0, _cubic_far(x, a), ops.zeros_like(x)))
    return weights / ops.sum(weights, axis=1, keepdims=True)


def resampling_matrix(in_size, out_size, interpolation):
    """The `(out_size, in_size)` float32 matrix of torch's 1-D resampling,
    `"bicubic"` or `"bicubic_antialias"`; `in_size` an int,
    `out_size` an int or a scalar tensor."""
    if interpolation == "bicubic":
        return _bicubic_matrix(in_size, out_size)
    return _antialiased_bicubic_matrix(in_size, out_size)


def resample_grid(grid, height, width, interpolation):
    """A `(g, g, D)` grid resampled to `(height, width, D)` in float32, as
    `F.interpolate` on the `(1, D, g, g)` grid with `size=(height, width)`."""
    grid_size = tuple(grid.shape)[0]
    rows = resampling_matrix(grid_size, height, interpolation)  # (h, g)
    columns = resampling_matrix(grid_size, width, interpolation)  # (w, g)
    grid = ops.einsum("ih,hwd->iwd", rows, ops.cast(grid, "float32"))  # (h, g, D)
    return ops.einsum("jw,iwd->ijd", columns, grid)  # (h, w, D)


class _InterpolatedPositionEmbedding(keras.layers.Layer):
    """The ViT's learned `(num_prefix_tokens + g * g, D)` position table,
    its patch rows resampled to the patch grid of each input.

    The table is the one `PositionEmbedding` holds (same weight name and
    shape), so the weights, checkpoints and parameter count are those of the
    fixed-size ViT; at the native `g x g` grid it returns the table as it is.
    The prefix row ([CLS]) has no place on the grid and is kept.

    Private to the ViT: only `ViT` builds it, from its config.

    Args:
        grid_size: g, the patches per side the table was trained for.
        num_prefix_tokens: 1 with a [CLS] token, 0 without.
        interpolation: `"bicubic"` or `"bicubic_antialias"`.
        initializer: initializer of the table.

    Call arguments:
        inputs: the patch embeddings `(B, h, w, D)`.

    Returns:
        `(B, num_prefix_tokens + h * w, D)`, to add to the flattened patches
        (with [CLS] first).
    """

    def __init__(self, grid_size, num_prefix_tokens, interpolation, initializer="zeros",
                 **kwargs):
        super().__init__(**kwargs)
        self.grid_size = grid_size
        self.num_prefix_tokens = num_prefix_tokens
        self.interpolation = interpolation
        self.initializer = keras.initializers.get(initializer)

    def build(self, inputs_shape):
        self.position_embeddings = self.add_weight(
            name="embeddings",
            shape=(self.num_prefix_tokens + self.grid_size**2, inputs_shape[-1]),
            initializer=self.initializer,
            trainable=True,
        )
        self.built = True

    @property
    def max_sequence_length(self):
        """The rows of the table (`PositionEmbedding`'s name for it)."""
        return self.num_prefix_tokens + self.grid_size**2

    def call(self, inputs):
        batch, height, width, dim = ops.shape(inputs)
        table = self.position_embeddings
        native = all(isinstance(n, numbers.Integral) and n == self.grid_size
                     for n in (height, width))
        if not native:
            g, prefix = self.grid_size, self.num_prefix_tokens
            grid = ops.reshape(table[prefix:], (g, g, dim))
            grid = resample_grid(grid, height, width, self.interpolation)  # (h, w, D)
            grid = ops.reshape(ops.cast(grid, table.dtype), (-1, dim))  # (h * w, D)
            table = ops.concatenate([table[:prefix], grid], axis=0)
        table = ops.cast(table, self.compute_dtype)[None]  # (1, prefix + h * w, D)
        return ops.broadcast_to(table, (batch, ops.shape(table)[1], dim))

    def compute_output_shape(self, inputs_shape):
        batch, height, width, dim = inputs_shape
        length = None if height is None or width is None else height * width
        length = None if length is None else self.num_prefix_tokens + length
        return (batch, length, dim)

    def get_config(self):
        config = super().get_config()
        config.update({
            "grid_size": self.grid_size,
            "num_prefix_tokens": self.num_prefix_tokens,
            "interpolation": self.interpolation,
            "initializer": keras.initializers.serialize(self.initializer),
        })
        return config


class _PatchSizeCheck(keras.layers.Layer):
    """Passes images whose height and width are whole multiples of the patch
    size, and refuses the others: a `ValueError` naming `images` when the
    size is known while tracing (eager calls, `jax.jit`, torch); NaN outputs
    when only a TensorFlow graph knows it at run time, where no error can be
    raised. transformers' patch convolution would drop the pixels past the
    last whole patch without a word.

    Private to the ViT, as `_InterpolatedPositionEmbedding`.
    """

    def __init__(self, patch_size, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = patch_size

    def call(self, inputs):
        shape = ops.shape(inputs)
        height, width, p = shape[1], shape[2], self.patch_size
        if isinstance(height, numbers.Integral) and isinstance(width, numbers.Integral):
            if height % p or width % p or not (height and width):
                raise ValueError(
                    f"Invalid value for argument `images`: the patch size {p} must divide "
                    "the height and width of the images (the model cuts whole patches). "
                    f"Received: images.shape={tuple(inputs.shape)}")
            return inputs
        fits = ops.logical_and(ops.equal(height % p, 0), ops.equal(width % p, 0))
        fits = ops.logical_and(fits, ops.greater(height * width, 0))
        return ops.where(fits, inputs, ops.full_like(inputs, float("nan")))

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)

    def get_config(self):
        config = super().get_config()
        config["patch_size"] = self.patch_size
        return config
