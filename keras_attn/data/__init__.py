"""tf.data pipelines and dataset loaders (TensorFlow only; import the
submodules, e.g. `keras_attn.data.images`, so that importing `keras_attn`
never imports TensorFlow). Packing is NumPy only and exported here."""

from keras_attn.data.packing import pack_rows
from keras_attn.data.packing import pack_sequences
from keras_attn.data.packing import packing_fill

__all__ = ["pack_rows", "pack_sequences", "packing_fill"]
