"""Backend-specific fast attention, the one exception to "keras.ops only"
(docs/backends.md): `attend` dispatches between each kernel and the
`keras.ops` route it must equal (`keras_attn.kernels.attention`)."""

from keras_attn.kernels.attention import attend
from keras_attn.kernels.attention import choose_kernel
from keras_attn.kernels.attention import padding_lengths

__all__ = ["attend", "choose_kernel", "padding_lengths"]
