"""SavedModel export with serving signatures (TensorFlow only; import the
submodules, e.g. `keras_attn.export.image_classifier`)."""
