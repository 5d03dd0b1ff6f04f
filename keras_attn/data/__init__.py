"""tf.data pipelines and dataset loaders (TensorFlow only; import the
submodules, e.g. `keras_attn.data.images`, so that importing `keras_attn`
never imports TensorFlow)."""
