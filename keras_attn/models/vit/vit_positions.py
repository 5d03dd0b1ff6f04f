"""The resampling of a ViT's `(g, g, D)` grid of learned patch positions to
another patch grid, as transformers' `interpolate_pos_encoding` does (the ViT
of any input size calls it on every input: vit_model.py).

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
