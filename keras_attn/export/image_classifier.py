"""Export an image classifier (a ViT) that serves raw pixels: a SavedModel,
ONNX or LiteRT.

The SavedModel's signature `serve` takes uint8 images `(B, S, S, C)` of the model's own
size and returns the class probabilities `(B, K)` (softmax of the logits); its
`serving_default` signature (TensorFlow Serving's) answers by name: "logits",
"probabilities" and, exported with `class_names`, "label" (the top class's name);
the pixel rescaling is inside the model. Needs the TensorFlow backend (a
model trained on JAX or PyTorch: save it as `.keras` and export it there).

>>> # export_image_classifier(build_vit(...), "/tmp/vit_savedmodel")
>>> # tf.saved_model.load("/tmp/vit_savedmodel").serve(images)  # (B, K)
"""

from keras_attn.export.saved_model import export_saved_model
from keras_attn.export.saved_model import named_outputs
from keras_attn.export.saved_model import require_tensorflow_backend
from keras_attn._base.quiet_tensorflow import tensorflow_module


def export_image_classifier(model, path, format="saved_model", precision="float32",
                            class_names=None):
    """Writes `model` to `path`: uint8 images in, class probabilities out.

    Args:
        model: a Keras model from images `(B, S, S, C)` to logits `(B, K)`,
            e.g. `build_vit(..., num_classes=K)`.
        path: the directory to write (atomically).
        format: `"saved_model"` (a `serve` endpoint), `"onnx"` or
            `"litert"` (`model.onnx` / `model.tflite` with `serving.json`;
            input "images" uint8 `(B, S, S, C)`, any batch; output
            "probabilities" float32 `(B, K)`); see `keras_attn.export.portable`.
        precision: `"float32"`, `"float16"` (weights) or `"int8"` (dynamic-range:
            int8 weights; ONNX through onnxruntime's `quantize_dynamic`).
        class_names: the name of each class, in output order (K strings),
            carried inside the export: `assets/labels.txt` of the SavedModel
            (line i names probability i), `"labels"` of `serving.json`.

    Returns:
        `path`.
    """
    from keras_attn.export.portable import check_class_names
    from keras_attn.export.portable import check_format
    from keras_attn.export.portable import labels_text

    check_format(format, precision)
    require_tensorflow_backend("export_image_classifier")

    input_shape = tuple(model.input_shape)
    if len(input_shape) != 4 or None in input_shape[1:]:
        raise ValueError(
            "The model must take images of a fixed size, (B, S, S, C). "
            f"Received: model.input_shape={input_shape}"
        )
    output_shape = tuple(model.output_shape)
    if len(output_shape) != 2:
        raise ValueError(
            "The model must return logits (B, K). "
            f"Received: model.output_shape={output_shape}"
        )
    # A ViT backbone also returns (B, D): its pooled features, not logits.
    vit_config = getattr(model, "vit_config", None)
    if vit_config is not None and vit_config.num_classes is None:
        raise ValueError(
            "The ViT has no classifier head; build it with `num_classes`. "
            f"Received: num_classes={vit_config.num_classes}"
        )

    class_names = check_class_names(class_names, output_shape[-1])
    if format != "saved_model":
        return _export_portable(model, path, format, precision, input_shape, class_names)
    tf = tensorflow_module()

    def serve(images):
        logits = model(tf.cast(images, "float32"), training=False)
        return tf.nn.softmax(tf.cast(logits, "float32"), axis=-1)

    def named(images):
        return named_outputs(model(tf.cast(images, "float32"), training=False), class_names)

    signature = [tf.TensorSpec((None,) + input_shape[1:], tf.uint8, name="images")]
    return export_saved_model(model, path, input_signature=signature, serving_fn=serve,
                              extra_endpoints={"serving_default": (named, signature)},
                              assets=class_names and {"labels.txt": labels_text(class_names)})


def _export_portable(model, path, format, precision, input_shape, class_names=None):
    import keras

    from keras_attn.export.portable import export_portable

    images = keras.Input(input_shape[1:], dtype="uint8", name="images")
    logits = model(keras.ops.cast(images, "float32"), training=False)
    probabilities = keras.ops.softmax(keras.ops.cast(logits, "float32"), axis=-1)
    serving = keras.Model(images, {"probabilities": probabilities},
                          name="image_classifier_serving")
    return export_portable(
        serving, path, format, precision,
        preprocessing={"images": "uint8 pixels, 0-255, of the model's size, made that size "
                                 "as \"resize\" says; the rescaling is inside the model",
                       "resize": image_resize(input_shape[1], input_shape[2])},
        extra=class_names and {"labels": class_names})


def image_resize(height, width):
    """How an image is made `height` x `width` for the model, as
    `keras_attn.data`'s image loaders (the zoo's) do for training and
    evaluation: the whole image stretched to the size (no crop, the aspect
    ratio not kept), bilinear with half-pixel centers and no antialiasing
    (`tf.image.resize(image, (height, width), "bilinear")`), then rounded to
    uint8, the served dtype (the file loaders train on the unrounded values,
    at most 0.5 away). `serving.json`'s `preprocessing["resize"]`, so that a
    server's own preprocessing matches the training's."""
    return {
        "size": [int(height), int(width)],
        "method": "bilinear",
        "antialias": False,
        "half_pixel_centers": True,
        "keep_aspect_ratio": False,
        "crop": None,
        "rounding": "to the nearest integer, clipped to 0-255 (the served uint8)",
        "grey_to_channels": "a grey image's channel repeated to the model's channels",
        "same_as": f"tf.image.resize(image, ({int(height)}, {int(width)}), method=\"bilinear\", "
                   f"antialias=False)",
    }
