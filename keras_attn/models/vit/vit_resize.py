"""Running a ViT at another image size: position embeddings resampled in 2-D.

Every weight but the position table is independent of the number of patches.
The table's patch rows form a `(g, g, D)` grid that is resized to the new grid
like an image (Dosovitskiy et al., section 3.2, "Fine-tuning and higher
resolution"); the [CLS] row has no place on the grid and is kept as it is.
"""

import dataclasses

from keras import ops

from keras_attn._checks import check_choice
from keras_attn.models.vit.vit_model import ViT

INTERPOLATIONS = ("bilinear", "bicubic", "bicubic_antialias")


def _cubic(x, a=-0.5):
    """Keys' cubic convolution kernel (a = -0.5, PIL's and torch's
    antialiased bicubic)."""
    x = abs(x)
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    if x < 2.0:
        return (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return 0.0


def antialiased_bicubic_matrix(in_size, out_size):
    """The `(out_size, in_size)` matrix of the separable antialiased bicubic
    resampling of PIL and of `torch.nn.functional.interpolate(mode="bicubic",
    antialias=True, align_corners=False)` (what transformers' DINOv2 uses on
    its position grid): half-pixel centres, the kernel widened by the scale
    when shrinking, taps outside the input dropped and each row's weights
    renormalised to sum to 1 (no edge padding)."""
    import numpy as np

    scale = in_size / out_size
    support = 2.0 * max(scale, 1.0)
    inverse = 1.0 / max(scale, 1.0)
    matrix = np.zeros((out_size, in_size), "float64")
    for i in range(out_size):
        center = scale * (i + 0.5)
        first = max(int(center - support + 0.5), 0)
        last = min(int(center + support + 0.5), in_size)
        taps = [_cubic((j - center + 0.5) * inverse) for j in range(first, last)]
        total = sum(taps)
        matrix[i, first:last] = [t / total for t in taps] if total else taps
    return matrix


def interpolate_position_embeddings(
    table, grid_size, new_grid_size, num_prefix_tokens=1, interpolation="bilinear"
):
    """Resamples a `(num_prefix_tokens + g * g, D)` position table.

    Args:
        table: the table; its first `num_prefix_tokens` rows ([CLS]) are
            copied, the rest are the patch grid in row-major order.
        grid_size: g, patches per side of `table`.
        new_grid_size: patches per side wanted.
        num_prefix_tokens: 1 with a [CLS] token, 0 without (`pooling="gap"`).
        interpolation: `"bilinear"` or `"bicubic"` (half-pixel centres, as
            `keras.ops.image.resize`), or `"bicubic_antialias"`, the resampling
            of transformers' DINOv2 (`antialiased_bicubic_matrix`), the same on
            every backend.

    Returns:
        The `(num_prefix_tokens + new_grid_size**2, D)` table.
    """
    check_choice("interpolation", interpolation, INTERPOLATIONS)
    expected = num_prefix_tokens + grid_size * grid_size
    if tuple(table.shape)[0] != expected:
        raise ValueError(
            f"The table must have num_prefix_tokens + grid_size**2 = {expected} "
            f"rows. Received: table.shape={tuple(table.shape)}"
        )
    if new_grid_size == grid_size:
        return table
    prefix = table[:num_prefix_tokens]  # (1, D) or (0, D)
    width = tuple(table.shape)[-1]
    if interpolation == "bicubic_antialias":
        grid = ops.reshape(table[num_prefix_tokens:], (grid_size, grid_size, width))
        matrix = ops.convert_to_tensor(
            antialiased_bicubic_matrix(grid_size, new_grid_size), grid.dtype)
        # Rows, then columns: (g', g) x (g, g, D) x (g', g) -> (g', g', D).
        grid = ops.einsum("ih,hwd,jw->ijd", matrix, grid, matrix)
        grid = ops.reshape(grid, (new_grid_size * new_grid_size, width))
        return ops.concatenate([ops.cast(prefix, grid.dtype), grid], axis=0)
    grid = ops.reshape(table[num_prefix_tokens:], (1, grid_size, grid_size, width))
    grid = ops.image.resize(
        grid,
        (new_grid_size, new_grid_size),
        interpolation=interpolation,
        data_format="channels_last",
    )  # (1, g', g', D)
    grid = ops.reshape(grid, (new_grid_size * new_grid_size, width))
    return ops.concatenate([ops.cast(prefix, grid.dtype), grid], axis=0)


def resize_vit(model, image_size, interpolation="bilinear"):
    """A new `ViT` for `image_size` with the weights of `model`.

    Args:
        model: a `ViT` (from `build_vit`).
        image_size: the new image side; `model`'s patch size must divide it.
        interpolation: how the position grid is resampled, see
            `interpolate_position_embeddings`.

    Returns:
        A `ViT` that equals `model` at the same size; at another size the
        patch position embeddings are interpolated, the [CLS] row kept.
    """
    if not isinstance(model, ViT):
        raise ValueError(
            "`model` must be a keras_attn ViT (from build_vit). "
            f"Received: model={type(model).__name__}"
        )
    check_choice("interpolation", interpolation, INTERPOLATIONS)
    old_config = model.vit_config
    config = dataclasses.replace(old_config, image_size=image_size)
    new_model = ViT(**dataclasses.asdict(config), class_names=model.class_names,
                    dtype=model.dtype_policy)
    for layer in new_model.layers:
        if not layer.weights:
            continue
        weights = model.get_layer(layer.name).get_weights()
        if layer.name == "position_embedding":
            table = interpolate_position_embeddings(
                weights[0],
                old_config.grid_size,
                config.grid_size,
                num_prefix_tokens=0 if config.pooling == "gap" else 1,
                interpolation=interpolation,
            )
            weights = [ops.convert_to_numpy(table)]
        layer.set_weights(weights)
    return new_model
