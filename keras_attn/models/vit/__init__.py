"""Vision Transformer (Dosovitskiy et al., 2021): config, presets, builder."""

from keras_attn.models.vit.vit_config import VIT_PRESETS
from keras_attn.models.vit.vit_config import ViTConfig
from keras_attn.models.vit.vit_config import get_vit_config
from keras_attn.models.vit.vit_config import replace_vit_config
from keras_attn.models.vit.vit_model import ViT
from keras_attn.models.vit.vit_model import build_vit
from keras_attn.models.vit.vit_resize import interpolate_position_embeddings
from keras_attn.models.vit.vit_resize import resize_vit

__all__ = [
    "VIT_PRESETS",
    "ViT",
    "ViTConfig",
    "build_vit",
    "get_vit_config",
    "interpolate_position_embeddings",
    "replace_vit_config",
    "resize_vit",
]
