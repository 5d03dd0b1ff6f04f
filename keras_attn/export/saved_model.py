"""SavedModel export with a serving signature that takes any batch size and,
where the model allows it, any sequence length."""

import os
import shutil
import tempfile

from keras_attn._directories import DirectoryKind
from keras_attn._directories import check_replaceable
from keras_attn._directories import replace_directory
from keras_attn._base.quiet_tensorflow import tensorflow_module


def _spec(x, name=None):
    tf = tensorflow_module()

    return tf.TensorSpec((None,) + tuple(x.shape[1:]), x.dtype, name=name or x.name)


def _default_signature(model):
    """One spec per model input, batch dim free. A model that takes a dict
    (`BertBackbone`, the BERT tasks, `ConformerCTC`) gets one argument, a
    dict of specs named by its keys, as the model itself is called; any
    other model one positional spec per input, in `model.inputs` order."""
    structure = model.input
    if isinstance(structure, dict):
        return [{key: _spec(x, name=key) for key, x in structure.items()}]
    return [_spec(x) for x in model.inputs]


def _default_serving_fn(model):
    """The model's inference call on the endpoint's arguments: a dict as it
    is, positional tensors packed into the structure of the model's inputs
    (their flat order is `model.inputs`')."""
    import keras

    structure = model.input

    def serving_fn(*inputs):
        if len(inputs) == 1 and isinstance(inputs[0], dict):
            return model(inputs[0], training=False)
        if len(model.inputs) == 1:
            (x,) = inputs
            return model(x, training=False)
        return model(keras.tree.pack_sequence_as(structure, list(inputs)), training=False)

    return serving_fn


def named_outputs(logits, class_names):
    """The classifiers' `serving_default` outputs, by name (TensorFlow
    Serving answers with these keys): "logits" and "probabilities" `(B, K)`
    float32, and with `class_names` "label" `(B,)`, the most probable
    class's name, or "" (no class is named "") for a row the model answers
    NaN (bad input where nothing can raise): argmax would name a class."""
    tf = tensorflow_module()

    logits = tf.cast(logits, "float32")
    outputs = {"logits": logits, "probabilities": tf.nn.softmax(logits, axis=-1)}
    if class_names:
        label = tf.gather(tf.constant(class_names), tf.argmax(logits, axis=-1))
        broken = tf.reduce_any(tf.logical_not(tf.math.is_finite(logits)), axis=-1)
        outputs["label"] = tf.where(broken, tf.constant(""), label)
    return outputs


EMPTY_INPUT = "keras_attn: empty input:"


def require_tensorflow_backend(function):
    """Refuses to export from another backend, naming the way that works.

    The exporters trace TensorFlow graphs around the model (string
    tokenization, beam search, input checks): on JAX they would go through
    jax2tf, which cannot carry those, and PyTorch has no such route."""
    import keras

    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise RuntimeError(
            f"{function} traces a TensorFlow graph (a SavedModel, or what tf2onnx and "
            "the LiteRT converter convert) and needs the TensorFlow "
            f"backend; this process runs Keras on {backend!r}. Save the model "
            "(`model.save('model.keras')`: it loads on every backend) and export it "
            "from a process started with KERAS_BACKEND=tensorflow, or run "
            "`keras-attn export RUN_DIR`, which does that for a zoo run."
        )


def _refuse_empty(fn, signature):
    """`fn` behind a check of each input: an empty batch, or a sequence of
    length 0 (rank-2 numeric inputs: ids, masks, waveforms), stops the call
    with `InvalidArgumentError` whose message names the input, as the
    models' Python entry points raise `ValueError`, instead of failing deep
    inside a convolution or returning an empty answer in one family and not
    in another."""
    tf = tensorflow_module()

    def guarded(*inputs):
        checks = []
        flat_inputs = tf.nest.flatten(inputs)
        # (nested specs, a dict of them, flatten in the inputs' order)
        for index, (spec, x) in enumerate(zip(tf.nest.flatten(signature), flat_inputs)):
            name = getattr(spec, "name", None) or f"input {index}"
            rank = x.shape.rank
            if rank is not None and rank >= 1:
                checks.append(tf.debugging.assert_positive(
                    tf.shape(x)[0], message=f"{EMPTY_INPUT} `{name}` holds no example "
                                            "(a batch of 0)"))
            if rank == 2 and x.dtype != tf.string:
                checks.append(tf.debugging.assert_positive(
                    tf.shape(x)[1], message=f"{EMPTY_INPUT} `{name}` has length 0"))
        with tf.control_dependencies(checks):
            flat_inputs = [tf.identity(x) for x in flat_inputs]
        return fn(*tf.nest.pack_sequence_as(inputs, flat_inputs))

    return guarded


# The files `tf.saved_model.save` (Keras's `ExportArchive.write_out`) writes,
# and the run.json `keras-attn export` writes beside them (the run it came
# from: `keras_attn.zoo.runs.stamp_export`).
_SAVED_MODEL_FILES = ("saved_model.pb", "fingerprint.pb", "run.json")
_SAVED_MODEL_DIRECTORIES = ("variables", "assets")


def _plain_file(path):
    return os.path.isfile(path) and not os.path.islink(path)


def _saved_model_reason(path):
    entries = sorted(os.listdir(path))
    if "saved_model.pb" not in entries:
        return "it has no saved_model.pb"
    for entry in entries:
        full = os.path.join(path, entry)
        if entry in _SAVED_MODEL_FILES:
            if not _plain_file(full):
                return f"{entry!r} is not a plain file"
        elif entry in _SAVED_MODEL_DIRECTORIES:
            if os.path.islink(full) or not os.path.isdir(full):
                return f"{entry!r} is not a directory"
            for inner in sorted(os.listdir(full)):
                name = f"{entry}/{inner}"
                if entry == "variables" and not (
                        inner == "variables.index" or inner.startswith("variables.data-")):
                    return f"the export does not write {name!r}"
                if not _plain_file(os.path.join(full, inner)):
                    return f"{name!r} is not a plain file"
        else:
            return f"the export does not write {entry!r}"
    return None


# The ONNX / LiteRT contract and the files `export_portable` writes beside it
# (the model, a vocabulary); an export's serving.json also lists its files.
_CONTRACT = "serving.json"
_PORTABLE_FILES = ("model.onnx", "model.tflite", "vocab.txt")


def _portable_reason(path):
    import json

    entries = sorted(os.listdir(path))
    if _CONTRACT not in entries:
        return f"it has no {_CONTRACT}"
    try:
        with open(os.path.join(path, _CONTRACT), encoding="utf-8") as stream:
            contract = json.load(stream)
    except (OSError, ValueError) as error:
        return f"its {_CONTRACT} cannot be read as JSON ({error})"
    if not isinstance(contract, dict) or contract.get("format") not in ("onnx", "litert"):
        found = contract.get("format") if isinstance(contract, dict) else None
        return f"its {_CONTRACT} names no ONNX or LiteRT format (format: {found!r})"
    listed = contract.get("sha256")
    allowed = {_CONTRACT, *_PORTABLE_FILES, *(listed if isinstance(listed, dict) else ())}
    for entry in entries:
        if entry not in allowed:
            return f"the export does not write {entry!r}"
        if not _plain_file(os.path.join(path, entry)):
            return f"{entry!r} is not a plain file"
    return None


SAVED_MODEL = DirectoryKind("a SavedModel (saved_model.pb, fingerprint.pb, variables/, assets/, "
                            "run.json)",
                            _saved_model_reason)
PORTABLE_EXPORT = DirectoryKind("an ONNX or LiteRT export (serving.json and the files it "
                                "lists)", _portable_reason)


def export_saved_model(
    model,
    path,
    input_signature=None,
    endpoint_name="serve",
    serving_fn=None,
    extra_endpoints=None,
    track=(),
    assets=None,
):
    """Writes `model` as a TensorFlow SavedModel at `path`, atomically.

    The model is written into a temporary directory beside `path` and renamed
    into place, so a crash never leaves a half-written model where a server
    would load it; an existing SavedModel at `path` is replaced only once the
    new one is complete. Any other non-empty directory at `path` is refused
    and left as it is (`check_replaceable`).

    Args:
        model: a Keras model (functional models keep their input names).
        path: the SavedModel directory.
        input_signature: a list of `tf.TensorSpec`, one per model input,
            or (a model that takes a dict) a list of one dict of specs.
            Defaults to the model's inputs with the batch dim left free; dims
            that are None in the model's `keras.Input` (a sequence length)
            stay free too. A model called with a dict (`BertBackbone`, the
            BERT tasks, `ConformerCTC`) is served the same way:
            `loaded.serve({"token_ids": ..., "segment_ids": ...,
            "padding_mask": ...})`; the `serving_default` signature takes
            the same names as keyword arguments.
        endpoint_name: the serving function's name.
        serving_fn: what the endpoint computes, called with one tensor per
            spec of `input_signature`; defaults to the model's inference
            call. Use it to add pre- or post-processing (a softmax, a cast).
        extra_endpoints: more endpoints, `{name: (fn, input_signature)}`.
        track: more objects whose resources the endpoints use (a
            tokenizer's vocabulary tables).
        assets: `{file name: text}` written into the SavedModel's `assets/`
            (the classifiers' labels.txt), so that a copy of the directory
            carries them.

    Every endpoint refuses an empty batch and a sequence of length 0 with
    `InvalidArgumentError` naming the input (`EMPTY_INPUT`).

    Returns:
        `path`. Load it with `tf.saved_model.load(path)` and call
        `loaded.serve(...)` (or `loaded.signatures["serving_default"]`).

    Raises:
        RuntimeError: the Keras backend is not TensorFlow.
        ValueError: `path` is a file, a symbolic link, or a non-empty
            directory that is not a SavedModel (the message names what it
            holds; nothing is written).
    """
    import keras

    require_tensorflow_backend("export_saved_model")

    if input_signature is None:
        input_signature = _default_signature(model)
    path = os.path.abspath(os.fspath(path))
    check_replaceable(path, SAVED_MODEL)  # before the work, and again before replacing
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".export-", dir=parent)
    try:
        archive = keras.export.ExportArchive()
        archive.track(model)
        for resource in track:
            archive.track(resource)
        if serving_fn is None:
            serving_fn = _default_serving_fn(model)
        archive.add_endpoint(endpoint_name, _refuse_empty(serving_fn, input_signature),
                             input_signature=input_signature)
        for name, (fn, signature) in (extra_endpoints or {}).items():
            archive.add_endpoint(name, _refuse_empty(fn, signature), input_signature=signature)
        target = os.path.join(staging, "model")
        archive.write_out(target, verbose=False)
        for name, content in (assets or {}).items():
            os.makedirs(os.path.join(target, "assets"), exist_ok=True)
            with open(os.path.join(target, "assets", name), "w", encoding="utf-8") as stream:
                stream.write(content)
        replace_directory(target, path, SAVED_MODEL)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path
