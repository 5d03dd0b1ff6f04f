"""Model builders: configs, presets and functional `keras.Model`s, one
subpackage per family (importing this registers them all for loading)."""

from keras_attn.models import bert
from keras_attn.models import conformer
from keras_attn.models import transformer
from keras_attn.models import vit

__all__ = ["bert", "conformer", "transformer", "vit"]
