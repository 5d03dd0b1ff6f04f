"""`ViTConfig` and the ViT presets.

The presets are the paper's variants at 224 x 224 (196 patches of 16 x 16,
49 of 32 x 32, 256 of 14 x 14). Parameter counts are those of the Keras model
with a 1000-class head (`build_vit(name, num_classes=1000).count_params()`);
the backbone alone is smaller by `1000 * (hidden_dim + 1)`.
"""

import dataclasses
import math
import numbers

from keras_attn.models._config import ModelConfig
from keras_attn.models._config import check_heads_divide
from keras_attn.models._config import field
from keras_attn.models._config import flag
from keras_attn.models._config import one_of
from keras_attn.models._config import optional_positive_int
from keras_attn.models._config import positive_float
from keras_attn.models._config import positive_int
from keras_attn.models._config import rate
from keras_attn.models._config import replace_fields
from keras_attn.models._config import resolve_config

POOLINGS = ("cls", "gap", "cls_gap")
FEED_FORWARDS = ("gelu", "swiglu")
PIXEL_NORMALIZATIONS = ("half", "imagenet", "custom")
# How a model of any input size resamples its position grid (vit_positions.py):
# "bicubic" as transformers' ViT (`interpolate_pos_encoding=True`),
# "bicubic_antialias" as transformers' DINOv2 (always).
POSITION_INTERPOLATIONS = ("bicubic", "bicubic_antialias")
# (mean, std) per channel of the pixels scaled to [0, 1].
PIXEL_STATISTICS = {
    "half": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    # torchvision's / timm's ImageNet statistics (DINOv2's image processor).
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}


def _non_negative_int(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(
            f"Invalid value for argument `{name}`: it must be an integer >= 0. "
            f"Received: {name}={value!r}"
        )
    return int(value)


def _optional_positive_float(name, value):
    return None if value is None else positive_float(name, value)


def _optional_floats(name, value):
    """None, or a tuple of finite floats (a list, as a saved config holds it,
    is made a tuple by `ViTConfig.__post_init__`)."""
    if value is None:
        return None
    if (not isinstance(value, tuple)
            or not all(isinstance(v, numbers.Real) and not isinstance(v, bool)
                       and math.isfinite(v) for v in value)):
        raise ValueError(
            f"Invalid value for argument `{name}`: it must be None or one finite number "
            f"per channel. Received: {name}={value!r}"
        )
    return value


def _optional_interpolation(name, value):
    if value is not None and value not in POSITION_INTERPOLATIONS:
        raise ValueError(
            f"Invalid value for argument `{name}`: it must be None or one of "
            f"{list(POSITION_INTERPOLATIONS)}. Received: {name}={value!r}"
        )
    return value


@dataclasses.dataclass(frozen=True)
class ViTConfig(ModelConfig):
    """ViT hyper-parameters; the fields are the arguments of `ViT` /
    `build_vit`, checked when a config is made.

    Attributes:
        image_size: height = width of the input images in pixels; with
            `position_interpolation`, the size the position table was
            trained for (the native grid).
        patch_size: side P of the square patches; must divide `image_size`.
        num_channels: channels of the input images (3 for RGB, 1 for grey).
        hidden_dim: model width D.
        num_layers: number of pre-norm encoder blocks L.
        num_heads: attention heads per block.
        intermediate_dim: MLP hidden width.
        dropout: rate after the position embeddings and on every sublayer
            output.
        attention_dropout: rate on the attention probabilities.
        layer_norm_epsilon: LayerNorm epsilon. 1e-6 as in the reference JAX
            code (`flax.linen.LayerNorm`, big_vision); Hugging Face's ViT
            checkpoints use 1e-12, which `keras_attn.convert` passes through.
            The difference is far below float32 noise for trained weights.
        pooling: `"cls"`: classify from the [CLS] token; `"gap"`: no [CLS]
            token, mean of the patch tokens (the paper's GAP variant, big_vision
            `pool_type="gap"`); `"cls_gap"`: the [CLS] vector concatenated
            with the mean of the patch tokens, `(B, 2 D)` (DINOv2's linear
            classifier; register tokens are in neither).
        num_classes: size of the classifier head; None for the backbone, which
            returns the pooled `(B, D)` representation.
        num_register_tokens: learned tokens inserted after the [CLS] token,
            after the position embeddings are added (they have none), and
            dropped by the pooling (Darcet et al., "Vision Transformers Need
            Registers", 2024). 0 for the plain ViT.
        layer_scale_init: None, or the initial value of LayerScale in every
            block (`TransformerBlock`'s `layer_scale_init`; DINOv2).
        feed_forward: `"gelu"`, the ViT MLP; `"swiglu"`, a gated MLP with a
            SiLU gate (`FeedForward(gated=True)`; DINOv2's giant model),
            `intermediate_dim` wide.
        pixel_normalization: what the first layer does to the [0, 255]
            pixels: `"half"`, `x / 127.5 - 1` (mean = std = 0.5, the
            reference ViT); `"imagenet"`, `(x / 255 - mean) / std` with the
            ImageNet statistics (DINOv2's image processor; RGB only);
            `"custom"`, `(x - pixel_mean) / pixel_std` per channel (any
            image processor's rescaling and normalisation:
            `keras_attn.convert` loads them from `preprocessor_config.json`).
        pixel_mean: with `pixel_normalization="custom"`, `num_channels`
            numbers subtracted from the input pixels, in the input's units
            (ImageNet's mean is `(123.675, 116.28, 103.53)` on [0, 255]);
            None otherwise.
        pixel_std: with `"custom"`, `num_channels` positive numbers the
            centred pixels are divided by, in the input's units; None
            otherwise.
        position_interpolation: None: the model takes `image_size` x
            `image_size` images only (its input shape says so, and another
            size is refused). `"bicubic"` or `"bicubic_antialias"`: it takes
            images of any height and width that `patch_size` divides (others
            are a `ValueError` naming `images`); the patch rows of the
            position table are resampled to each input's patch grid on the
            fly, as transformers' ViT with `interpolate_pos_encoding=True`
            (`"bicubic"`) and transformers' DINOv2 (`"bicubic_antialias"`)
            do, and equal theirs to float32 rounding on every backend. The
            weights, parameter count and native-size outputs are the same
            either way.
        remat: rematerialise each encoder block in training (gradient
            checkpointing): its activations are recomputed in the backward
            pass instead of stored. Less memory for about one more forward
            pass per step; the same weights give the same outputs and
            gradients either way.
    """

    image_size: int = field(224, positive_int)
    patch_size: int = field(16, positive_int)
    num_channels: int = field(3, positive_int)
    hidden_dim: int = field(768, positive_int)
    num_layers: int = field(12, positive_int)
    num_heads: int = field(12, positive_int)
    intermediate_dim: int = field(3072, positive_int)
    dropout: float = field(0.0, rate)
    attention_dropout: float = field(0.0, rate)
    layer_norm_epsilon: float = field(1e-6, positive_float)
    pooling: str = field("cls", one_of(POOLINGS))
    num_classes: int = field(None, optional_positive_int)
    remat: bool = field(False, flag)
    num_register_tokens: int = field(0, _non_negative_int)
    layer_scale_init: float = field(None, _optional_positive_float)
    feed_forward: str = field("gelu", one_of(FEED_FORWARDS))
    pixel_normalization: str = field("half", one_of(PIXEL_NORMALIZATIONS))
    pixel_mean: tuple = field(None, _optional_floats)
    pixel_std: tuple = field(None, _optional_floats)

    def __post_init__(self):
        # A saved config (JSON) holds the statistics as lists.
        for name in ("pixel_mean", "pixel_std"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        super().__post_init__()
        for name in ("pixel_mean", "pixel_std"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))
    position_interpolation: str = field(None, _optional_interpolation)

    def check_relations(self):
        custom = self.pixel_normalization == "custom"
        for name in ("pixel_mean", "pixel_std"):
            value = getattr(self, name)
            if custom and (value is None or len(value) != self.num_channels):
                raise ValueError(
                    f"`pixel_normalization=\"custom\"` needs `{name}` with one number per "
                    f"channel (num_channels={self.num_channels}). Received: {name}={value!r}"
                )
            if not custom and value is not None:
                raise ValueError(
                    f"`{name}` is read with `pixel_normalization=\"custom\"` only. Received: "
                    f"pixel_normalization={self.pixel_normalization!r}, {name}={value!r}"
                )
        if custom and min(self.pixel_std) <= 0:
            raise ValueError(
                "Invalid value for argument `pixel_std`: every channel's must be > 0. "
                f"Received: pixel_std={self.pixel_std!r}"
            )
        if self.num_register_tokens and self.pooling == "gap":
            raise ValueError(
                "Register tokens follow the [CLS] token: `pooling=\"gap\"` has none. "
                f"Received: pooling='gap', num_register_tokens={self.num_register_tokens}"
            )
        if self.pixel_normalization == "imagenet" and self.num_channels != 3:
            raise ValueError(
                "The ImageNet statistics are per RGB channel: `pixel_normalization="
                f"'imagenet'` needs num_channels=3. Received: num_channels={self.num_channels}"
            )
        if self.image_size % self.patch_size:
            raise ValueError(
                "`patch_size` must divide `image_size` (the image is cut into "
                "whole patches). Received: "
                f"image_size={self.image_size}, patch_size={self.patch_size}"
            )
        check_heads_divide(self)

    @property
    def grid_size(self):
        """Patches per side."""
        return self.image_size // self.patch_size

    @property
    def num_patches(self):
        return self.grid_size**2


def _variant(hidden_dim, num_layers, num_heads, intermediate_dim, patch_size):
    return ViTConfig(
        patch_size=patch_size,
        hidden_dim=hidden_dim,
        num_layers=num_layers,
        num_heads=num_heads,
        intermediate_dim=intermediate_dim,
    )


VIT_PRESETS = {
    # Ti/16: Touvron et al. (DeiT) Table 1, "DeiT-Ti". 5,717,416 parameters.
    "vit_tiny_16": _variant(192, 12, 3, 768, patch_size=16),
    # S/16: DeiT Table 1, "DeiT-S". 22,050,664 parameters.
    "vit_small_16": _variant(384, 12, 6, 1536, patch_size=16),
    # B/16: Dosovitskiy et al. (ViT) Table 1, "ViT-Base" (86M). 86,567,656.
    "vit_base_16": _variant(768, 12, 12, 3072, patch_size=16),
    # B/32: ViT Table 1, "ViT-Base" with 32 x 32 patches. 88,224,232.
    "vit_base_32": _variant(768, 12, 12, 3072, patch_size=32),
    # L/16: ViT Table 1, "ViT-Large" (307M). 304,326,632.
    "vit_large_16": _variant(1024, 24, 16, 4096, patch_size=16),
    # H/14: ViT Table 1, "ViT-Huge" (632M). 632,045,800.
    "vit_huge_14": _variant(1280, 32, 16, 5120, patch_size=14),
    # DINOv2 with registers, small (Darcet et al. 2024; the checkpoint
    # facebook/dinov2-with-registers-small): ViT-S/14 at 518 x 518 (37 x 37
    # patches), 4 registers, LayerScale, GELU MLP, ImageNet normalisation,
    # classifier on [CLS] and the mean patch token.
    # Backbone (num_classes=None): 22,057,728 parameters, transformers'
    # Dinov2WithRegistersModel of that config less its unused `mask_token`
    # (22,058,112 - 384).
    "dinov2_registers_small_14": ViTConfig(
        image_size=518,
        patch_size=14,
        hidden_dim=384,
        num_layers=12,
        num_heads=6,
        intermediate_dim=1536,
        num_register_tokens=4,
        layer_scale_init=1.0,
        pixel_normalization="imagenet",
        pooling="cls_gap",  # the head of Dinov2WithRegistersForImageClassification
    ),
}


DEFAULT_PRESET = "vit_base_16"


def get_vit_config(config=DEFAULT_PRESET, **overrides):
    """A `ViTConfig` from a config, a preset name or a dict of fields, with
    `overrides` (fields) applied; an unknown name or field is a `ValueError`."""
    return resolve_config(config, ViTConfig, VIT_PRESETS, "ViT", **overrides)


def replace_vit_config(config, **overrides):
    """`dataclasses.replace` that names an unknown field in its error."""
    return replace_fields(config, "ViT", **overrides)
