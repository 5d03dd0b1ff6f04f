"""The Vision Transformer as a functional `keras.Model`.

```
images (B, H, W, C) uint8 or float pixels in [0, 255]
 -> Rescaling to [-1, 1] (or other stats)      "rescaling"
 -> P divides H and W (any-size models only)   "patch_size_check"
 -> Conv2D P x P, stride P                     "patch_embedding"   (B, H/P, W/P, D)
 -> Reshape                                    "patch_flatten"     (B, T, D)
 -> prepend [CLS] (pooling != "gap")           "class_token"       (B, 1 + T, D)
 -> + learned positions                        "position_embedding"
    (the grid resampled to H/P x W/P with `position_interpolation`)
 -> R registers after [CLS] (R > 0)            "register_tokens"   (B, 1 + R + T, D)
 -> Dropout                                    "embedding_dropout"
 -> L x pre-norm TransformerBlock (GELU)       "transformer_block_{i}"
    (or SwiGLU; LayerScale if layer_scale_init)
 -> LayerNorm                                  "final_layer_norm"
 -> [CLS] vector or mean of the patch tokens   "pooling"           (B, D)
    (or both, concatenated: "cls_gap", (B, 2 D))
 -> Dense (num_classes given)                  "classifier"        (B, K) logits
```
"""

import dataclasses
import numbers

import keras
from keras import ops

from keras_attn._checks import check_class_names
from keras_attn._guard import IdSpec
from keras_attn.models._config import ConfigModel
from keras_attn.models._config import config_arguments
from keras_attn._remat import remat_scope
from keras_attn.layers.class_token import ClassToken
from keras_attn.layers.position_embedding import PositionEmbedding
from keras_attn.layers.transformer_block import TransformerBlock
from keras_attn.models._guarded import GuardedModel
from keras_attn.models.vit.vit_config import PIXEL_STATISTICS
from keras_attn.models.vit.vit_config import ViTConfig
from keras_attn.models.vit.vit_config import get_vit_config
from keras_attn.models.vit.vit_config import DEFAULT_PRESET
from keras_attn.models.vit.vit_positions import resample_grid


class _Pooling(keras.layers.Layer):
    """The image vector: the [CLS] output, the mean over the patch tokens, or
    both concatenated; the `num_register_tokens` after [CLS] are in neither.

    Private: only `ViT` builds it, and `ViT.get_config` rebuilds it from the
    model's own arguments.
    """

    def __init__(self, pooling, num_register_tokens=0, **kwargs):
        super().__init__(**kwargs)
        self.pooling = pooling
        self.num_register_tokens = num_register_tokens

    def call(self, inputs):
        if self.pooling == "gap":
            return ops.mean(inputs, axis=1)  # (B, D)
        cls = inputs[:, 0, :]  # (B, D)
        if self.pooling == "cls":
            return cls
        patches = inputs[:, 1 + self.num_register_tokens:, :]  # (B, T, D)
        return ops.concatenate([cls, ops.mean(patches, axis=1)], axis=-1)  # (B, 2D)

    def compute_output_shape(self, inputs_shape):
        width = inputs_shape[2] * (2 if self.pooling == "cls_gap" else 1)
        return (inputs_shape[0], width)

    def get_config(self):
        config = super().get_config()
        config["pooling"] = self.pooling
        config["num_register_tokens"] = self.num_register_tokens
        return config


class _RegisterTokens(keras.layers.Layer):
    """Inserts `count` learned `(D,)` tokens after the [CLS] token:
    `(B, 1 + T, D)` -> `(B, 1 + count + T, D)` (Darcet et al., 2024).

    Private, as `_Pooling`: only `ViT` builds it.
    """

    def __init__(self, count, **kwargs):
        super().__init__(**kwargs)
        self.count = count

    def build(self, inputs_shape):
        # Zeros, as transformers' Dinov2WithRegisters starts them.
        self.tokens = self.add_weight(
            name="tokens", shape=(self.count, inputs_shape[-1]), initializer="zeros"
        )
        self.built = True

    def call(self, inputs):
        batch_size, width = ops.shape(inputs)[0], ops.shape(inputs)[-1]
        tokens = ops.cast(self.tokens, inputs.dtype)[None]  # (1, R, D)
        tokens = ops.broadcast_to(tokens, (batch_size, self.count, width))
        return ops.concatenate([inputs[:, :1], tokens, inputs[:, 1:]], axis=1)

    def compute_output_shape(self, inputs_shape):
        length = inputs_shape[1]
        length = None if length is None else length + self.count
        return (inputs_shape[0], length, inputs_shape[2])

    def get_config(self):
        config = super().get_config()
        config["count"] = self.count
        return config


class _InterpolatedPositionEmbedding(keras.layers.Layer):
    """The ViT's learned `(num_prefix_tokens + g * g, D)` position table,
    its patch rows resampled to the patch grid of each input.

    The table is the one `PositionEmbedding` holds (same weight name and
    shape), so the weights, checkpoints and parameter count are those of the
    fixed-size ViT; at the native `g x g` grid it returns the table as it is.
    The prefix row ([CLS]) has no place on the grid and is kept.

    Private, as `_RegisterTokens`: only `ViT` builds it.

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

    Private, as `_RegisterTokens`: only `ViT` builds it.
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


@keras.saving.register_keras_serializable(package="keras_attn")
class ViT(GuardedModel, ConfigModel, keras.Model):
    """Vision Transformer: images in, `(B, num_classes)` logits (or the
    pooled `(B, hidden_dim)` representation when `num_classes` is None) out.

    The input takes raw pixel values in [0, 255] (uint8 or float); the
    rescaling to [-1, 1] (the reference ViT and Hugging Face preprocessing,
    mean = std = 0.5) is the model's first layer, so an exported model takes
    raw pixels. With a head, `compile()` defaults to the sparse cross-entropy
    on the logits and accuracy. The arguments are the fields of `ViTConfig`
    and, for a model with a head, the optional `class_names` (the name of
    each class in output order, distinct strings: `save_hf` writes them as
    Hugging Face's `id2label`); prefer `build_vit("vit_base_16", num_classes=...)`.

    Example:

    >>> import numpy as np
    >>> model = ViT(image_size=32, patch_size=8, hidden_dim=16, num_layers=2,
    ...             num_heads=2, intermediate_dim=32, num_classes=10)
    >>> tuple(model(np.zeros((2, 32, 32, 3), "uint8")).shape)
    (2, 10)

    References:
        Dosovitskiy et al., "An Image is Worth 16x16 Words: Transformers for
        Image Recognition at Scale", ICLR 2021, section 3.1 and Table 1.
    """

    config_attribute = "vit_config"

    @config_arguments(ViTConfig, "ViT", extra=("class_names",))
    def __init__(self, config, dtype=None, class_names=None, **kwargs):
        if config.num_classes is None and class_names is not None:
            raise ValueError(
                "Invalid value for argument `class_names`: a ViT without a head "
                f"(num_classes=None) has no classes to name. Received: class_names={class_names!r}")
        class_names = check_class_names("class_names", class_names, config.num_classes)
        grid, width = config.grid_size, config.hidden_dim
        num_tokens = config.num_patches + (0 if config.pooling == "gap" else 1)
        any_size = config.position_interpolation is not None

        # === Layers ===
        if config.pixel_normalization == "half":
            scale, offset = 1.0 / 127.5, -1.0
        elif config.pixel_normalization == "custom":  # (x - mean) / std, per channel
            scale = [1.0 / s for s in config.pixel_std]
            offset = [-m / s for m, s in zip(config.pixel_mean, config.pixel_std)]
        else:  # (x / 255 - mean) / std, per channel
            mean, std = PIXEL_STATISTICS[config.pixel_normalization]
            scale = [1.0 / (255.0 * s) for s in std]
            offset = [-m / s for m, s in zip(mean, std)]
        rescaling = keras.layers.Rescaling(
            scale=scale, offset=offset, dtype=dtype, name="rescaling"
        )
        patch_embedding = keras.layers.Conv2D(
            width,
            kernel_size=config.patch_size,
            strides=config.patch_size,
            padding="valid",
            kernel_initializer="lecun_normal",
            dtype=dtype,
            name="patch_embedding",
        )
        patch_flatten = keras.layers.Reshape(
            (-1 if any_size else grid * grid, width), dtype=dtype, name="patch_flatten"
        )
        class_token = ClassToken(dtype=dtype, name="class_token")
        position_initializer = keras.initializers.RandomNormal(stddev=0.02)
        if any_size:
            # The same table (name, shape, initializer) resampled to each
            # input's patch grid: the weights are those of the fixed size.
            position_embedding = _InterpolatedPositionEmbedding(
                grid,
                num_tokens - config.num_patches,
                config.position_interpolation,
                initializer=position_initializer,
                dtype=dtype,
                name="position_embedding",
            )
        else:
            position_embedding = PositionEmbedding(
                num_tokens, initializer=position_initializer, dtype=dtype,
                name="position_embedding",
            )
        add_positions = keras.layers.Add(dtype=dtype, name="add_position_embedding")
        embedding_dropout = keras.layers.Dropout(
            config.dropout, dtype=dtype, name="embedding_dropout"
        )
        swiglu = config.feed_forward == "swiglu"
        block_names = [f"transformer_block_{i}" for i in range(config.num_layers)]
        with remat_scope(config.remat, block_names):
            blocks = [
                TransformerBlock(
                    num_heads=config.num_heads,
                    intermediate_dim=config.intermediate_dim,
                    norm_position="pre",
                    activation="silu" if swiglu else "gelu",
                    gated=swiglu,
                    dropout=config.dropout,
                    attention_dropout=config.attention_dropout,
                    layer_norm_epsilon=config.layer_norm_epsilon,
                    layer_scale_init=config.layer_scale_init,
                    dtype=dtype,
                    name=name,
                )
                for name in block_names
            ]
        final_layer_norm = keras.layers.LayerNormalization(
            epsilon=config.layer_norm_epsilon, dtype=dtype, name="final_layer_norm"
        )
        pool = _Pooling(config.pooling, config.num_register_tokens, dtype=dtype, name="pooling")

        # === Functional Model ===
        # Any dtype is accepted and cast to float by the rescaling layer; the
        # declared float32 keeps uint8 pixels exact.
        # With `position_interpolation`, the height and width are free (None):
        # one model, like transformers' ViT with `interpolate_pos_encoding=True`
        # and its DINOv2, takes every size at inference, and trains at the
        # native size as the fixed-size model does (see docs/vit.md).
        side = None if any_size else config.image_size
        images = keras.Input(shape=(side, side, config.num_channels), name="images")
        x = rescaling(images)
        if any_size:
            x = _PatchSizeCheck(config.patch_size, dtype=dtype, name="patch_size_check")(x)
        grid_tokens = patch_embedding(x)  # (B, H/P, W/P, D)
        x = patch_flatten(grid_tokens)  # (B, T, D), T = (H/P) * (W/P)
        if config.pooling != "gap":
            x = class_token(x)  # (B, 1 + T, D)
        positions = position_embedding(grid_tokens if any_size else x)  # (B, 1 + T, D)
        x = add_positions([x, positions])
        if config.num_register_tokens:
            x = _RegisterTokens(config.num_register_tokens, dtype=dtype,
                                name="register_tokens")(x)  # (B, 1 + R + T, D)
        x = embedding_dropout(x)
        for block in blocks:
            x = block(x)
        x = final_layer_norm(x)
        outputs = pool(x)  # (B, D)
        if config.num_classes is not None:
            outputs = keras.layers.Dense(
                config.num_classes,
                # A zero head (as in the reference code) starts training from
                # uniform predictions.
                kernel_initializer="zeros",
                dtype=dtype,
                name="classifier",
            )(outputs)
        # Keras would name the model "vi_t" after the class.
        kwargs.setdefault("name", "vit")
        super().__init__(inputs=images, outputs=outputs, dtype=dtype, **kwargs)

        # === Config ===
        self.vit_config = config
        self.class_names = class_names

    def get_config(self):
        return dict(super().get_config(), class_names=self.class_names)

    def label_specs(self):
        num_classes = self.vit_config.num_classes
        return {} if num_classes is None else {None: IdSpec(0, num_classes, "the classes")}

    def outputs_are_logits(self):
        return self.vit_config.num_classes is not None

    def compile(self, optimizer="adam", loss="auto", metrics="auto", **kwargs):
        """`keras.Model.compile`; with a classification head (`num_classes`
        set), "auto" is the sparse cross-entropy on the logits and accuracy,
        as for `BertSequenceClassifier`. The backbone (`num_classes=None`)
        has no default loss. A loss that expects probabilities
        (`"sparse_categorical_crossentropy"`) is refused: the outputs are
        logits."""
        head = self.vit_config.num_classes is not None
        if loss == "auto":
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True) if head else None
        if metrics == "auto":
            metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")] if head else None
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)


def build_vit(config=DEFAULT_PRESET, **overrides):
    """Builds a `ViT` from a `ViTConfig`, a preset name or a dict.

    Args:
        config: a `ViTConfig`, a name from `VIT_PRESETS` (`"vit_base_16"`) or a
            dict of `ViTConfig` fields.
        **overrides: `ViTConfig` fields to change (`num_classes=1000` for a
            classifier head, None for the backbone; `image_size=384`,
            `num_channels=1`; `dtype` is not a field: use
            `keras.config.set_dtype_policy`).

    Returns:
        A `ViT` (a functional `keras.Model`).

    Example:

    >>> model = build_vit("vit_tiny_16", num_classes=10, image_size=32,
    ...                   patch_size=8, num_layers=1)
    >>> model.output_shape
    (None, 10)
    """
    config = get_vit_config(config, **overrides)
    return ViT(**dataclasses.asdict(config))
