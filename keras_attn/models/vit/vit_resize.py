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
from keras_attn.models.vit.vit_positions import resample_grid

INTERPOLATIONS = ("bilinear", "bicubic", "bicubic_antialias")


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
        interpolation: `"bilinear"` (half-pixel centres, as
            `keras.ops.image.resize`); `"bicubic"`, torch's bicubic (a =
            -0.75, borders clamped: transformers' ViT with
            `interpolate_pos_encoding=True`); `"bicubic_antialias"`, torch's
            antialiased bicubic (transformers' DINOv2). The bicubic ones are
            torch's on every backend (`keras.ops.image.resize`'s bicubic is
            Keys' a = -0.5 on TensorFlow and JAX: another answer).

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
    if interpolation != "bilinear":
        grid = ops.reshape(table[num_prefix_tokens:], (grid_size, grid_size, width))
        grid = resample_grid(grid, new_grid_size, new_grid_size, interpolation)  # (g', g', D)
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
