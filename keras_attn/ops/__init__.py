"""The attention ops, below the layers: pure tensor functions written with
`keras.ops` (masks, scaled dot-product attention, rotary position
embeddings) and the kernels, the one module that calls a backend's own fast
attention (`kernels.attend`). The layers import these; nothing here imports
the layers.

- `keras_attn.ops.masking`: causal, local and segment (packed-row) masks,
  mask checks, `merge_masks`, `nan_where`;
- `keras_attn.ops.attention`: `scaled_dot_product_attention` (the
  reference formula) and `fused_dot_product_attention`;
- `keras_attn.ops.local_attention`: `banded_attention`, local (sliding-window)
  self-attention on its band only, O(T x window);
- `keras_attn.ops.rotary`: `apply_rotary` and the positions of packed rows;
- `keras_attn.ops.kernels`: `attend`, `choose_kernel`, `padding_lengths`.
"""

# All five here, so that the registration below finds them whole whichever
# is imported first (Keras, loaded during their import, registers the
# layers, which import them).
from keras_attn.ops import attention  # noqa: F401
from keras_attn.ops import kernels  # noqa: F401
from keras_attn.ops import local_attention  # noqa: F401
from keras_attn.ops import masking  # noqa: F401
from keras_attn.ops import rotary  # noqa: F401

# The packages that register classes, once this one is whole.
from keras_attn._registration import register_all as _register_all  # noqa: E402

_register_all(__name__)
