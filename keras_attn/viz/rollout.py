"""Attention rollout (Abnar & Zuidema, "Quantifying Attention Flow in
Transformers", 2020): where the [CLS] token of a ViT draws its information from."""

import numpy as np
from keras import ops

from keras_attn.viz._figure import pyplot
from keras_attn.viz._figure import save


def attention_rollout(scores, residual_weight=0.5):
    """Multiplies the head-averaged attention of successive blocks.

    Each block's map is mixed with the identity for its residual connection,
    `A' = w I + (1 - w) mean_heads(A)`, rows renormalised, and the rollout is
    `A'_L ... A'_2 A'_1`.

    Args:
        scores: a list, first block first, of `(B, N, T, T)` probabilities.
        residual_weight: the weight `w` of the identity.

    Returns:
        `(B, T, T)`: row `i` says how much each input token flows into token `i`.
    """
    if not scores:
        raise ValueError("`scores` must hold at least one block's attention. Received: scores=[]")
    rollout = None
    for block_scores in scores:
        attention = np.asarray(ops.convert_to_numpy(ops.cast(block_scores, "float32")))
        if attention.ndim != 4 or attention.shape[-1] != attention.shape[-2]:
            raise ValueError(
                "Each entry of `scores` must be self-attention (B, N, T, T). "
                f"Received: shape={attention.shape}"
            )
        mixed = attention.mean(axis=1)  # (B, T, T)
        mixed = residual_weight * np.eye(mixed.shape[-1]) + (1 - residual_weight) * mixed
        mixed = mixed / mixed.sum(-1, keepdims=True)
        rollout = mixed if rollout is None else mixed @ rollout
    return rollout


def _block_inputs_model(model, block_name_prefix):
    import keras

    blocks = [layer for layer in model.layers if layer.name.startswith(block_name_prefix)]
    if not blocks:
        raise ValueError(
            f"No layer named {block_name_prefix}* in the model. "
            f"Received: layers {[layer.name for layer in model.layers]}"
        )
    probe = keras.Model(model.inputs, [block.input for block in blocks])
    return probe, blocks


def vit_attention_rollout(model, images, block_name_prefix="transformer_block_"):
    """The [CLS] token's rollout over the patch grid of a ViT.

    Args:
        model: a model from `build_vit` (any functional model whose encoder
            blocks are `TransformerBlock`s named `transformer_block_<i>` with a
            [CLS] token first and a square patch grid after it).
        images: `(B, H, W, C)` as the model takes them.
        block_name_prefix: how the encoder blocks are named.

    Returns:
        `(B, g, g)` NumPy maps (g = patches per side), each summing to 1.
    """
    probe, blocks = _block_inputs_model(model, block_name_prefix)
    block_inputs = probe(images)
    if not isinstance(block_inputs, (list, tuple)):
        block_inputs = [block_inputs]
    scores = [
        block(x, return_attention_scores=True)[1] for block, x in zip(blocks, block_inputs)
    ]
    rollout = attention_rollout(scores)  # (B, T, T)
    cls_to_patches = rollout[:, 0, 1:]  # (B, g * g)
    grid = int(round(np.sqrt(cls_to_patches.shape[-1])))
    if grid * grid != cls_to_patches.shape[-1]:
        raise ValueError(
            "The tokens after [CLS] do not form a square patch grid. "
            f"Received: {cls_to_patches.shape[-1]} patch tokens"
        )
    maps = cls_to_patches.reshape(-1, grid, grid)
    return maps / maps.sum(axis=(1, 2), keepdims=True)


def plot_attention_rollout(images, maps, path=None, titles=None, alpha=0.55):
    """Each image with its rollout map laid over it (upsampled to the image).

    Args:
        images: `(B, H, W, C)` (uint8 or float; C = 1 or 3).
        maps: `(B, g, g)` from `vit_attention_rollout`.
        path: where to write the PNG (None: only return the figure).
        titles: optional B captions.
        alpha: opacity of the overlay.

    Returns:
        The matplotlib Figure.
    """
    images = np.asarray(ops.convert_to_numpy(images), dtype="float32")
    maps = np.asarray(maps, dtype="float32")
    if images.ndim != 4 or maps.ndim != 3 or len(images) != len(maps):
        raise ValueError(
            "`images` must be (B, H, W, C) and `maps` (B, g, g) with the same B. "
            f"Received: images.shape={images.shape}, maps.shape={maps.shape}"
        )
    plt = pyplot()
    count = len(images)
    figure, axes = plt.subplots(2, count, figsize=(2.2 * count, 4.6), squeeze=False)
    for i in range(count):
        image = images[i]
        image = (image - image.min()) / max(float(image.max() - image.min()), 1e-6)
        image = image[..., 0] if image.shape[-1] == 1 else image
        height, width = image.shape[:2]
        axes[0, i].imshow(image, cmap="gray" if image.ndim == 2 else None)
        axes[0, i].set_title(titles[i] if titles else f"image {i}", fontsize=9)
        axes[1, i].imshow(image, cmap="gray" if image.ndim == 2 else None)
        axes[1, i].imshow(
            maps[i], cmap="inferno", alpha=alpha, extent=(-0.5, width - 0.5, height - 0.5, -0.5),
            interpolation="bilinear",
        )
        axes[1, i].set_title("[CLS] rollout", fontsize=9)
        for axis in axes[:, i]:
            axis.axis("off")
    figure.tight_layout()
    save(figure, path)
    return figure
