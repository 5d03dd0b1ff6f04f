"""LoRA fine-tuning for every family: low-rank adapters on chosen projections,
everything else frozen (Hu et al., 2021, "LoRA: Low-Rank Adaptation of Large
Language Models").

    from keras_attn.models import build_bert, BertSequenceClassifier, enable_lora
    classifier = BertSequenceClassifier(build_bert("bert_base"), num_classes=2)
    enable_lora(classifier, rank=8, train_also=("classifier",))
    classifier.compile(optimizer="adam")
    classifier.fit(...)
    save_lora_weights(classifier, "adapters.npz")     # the adapters and the head only
    deployed = merge_lora(classifier)                 # a plain model, adapters folded in

Keras gives every `Dense` and `EinsumDense` `enable_lora(rank, lora_alpha)`:
float32 adapters A (kernel input dims..., r) and B (r, output), added as
`alpha / r * x A B`, with B initialised to zero so that an adapted model starts
equal to its base. What Keras lacks, and this module adds: choosing the
projections of a whole model by name, freezing every other weight, folding the
adapters into a plain model for deployment, and a file of the adapters alone
that refuses a different base model and any edit of its own (a SHA-256 digest
of each tensor and of the header, which lists the tensors' digests).
"""

import fnmatch
import hashlib
import json
import os
import tempfile
import zipfile

import keras
import numpy as np

from keras_attn import _keras_compat

DEFAULT_TARGETS = ("query", "value")
FILE_FORMAT = "keras_attn.lora"
FILE_VERSION = 2  # 2: digests of the header and of every tensor
_PROJECTIONS = (keras.layers.Dense, keras.layers.EinsumDense)
_META = "__lora_metadata__"


def _patterns(name, value, allow_empty=False):
    if isinstance(value, str):
        value = (value,)
    try:
        value = tuple(value)
    except TypeError:
        value = None
    if value is None or not (value or allow_empty) or not all(isinstance(p, str) and p for p in value):
        raise ValueError(
            f"`{name}` must be a layer name pattern or a sequence of them "
            f"(e.g. ('query', 'value') or ('*attention_output',)). Received: {name}={value!r}"
        )
    return value


def _matches(layer, pattern):
    """A pattern (shell style, `fnmatch`) matches a layer's name or its whole
    path inside the model (`transformer_layer_0/self_attention/query`)."""
    path = getattr(layer, "path", None) or layer.name
    return fnmatch.fnmatchcase(layer.name, pattern) or fnmatch.fnmatchcase(path, pattern)


def _select(layers, patterns, name, kind):
    chosen = []
    for pattern in patterns:
        hits = [layer for layer in layers if _matches(layer, pattern)]
        if not hits:
            names = sorted({layer.name for layer in layers})
            raise ValueError(
                f"`{name}` pattern {pattern!r} matches no {kind} of the model; the names "
                f"there are {names}. Received: {name}={patterns!r}"
            )
        chosen += [layer for layer in hits if not any(layer is c for c in chosen)]
    return chosen


def lora_layers(model):
    """The sublayers of `model` that have LoRA adapters."""
    return [layer for layer in _keras_compat.sublayers(model)
            if isinstance(layer, _PROJECTIONS) and layer.lora_enabled]


def _check_rank(rank, alpha):
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"`rank` must be a positive integer. Received: rank={rank!r}")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float))
                              or not alpha > 0):
        raise ValueError(f"`alpha` must be a positive number or None (= rank). Received: alpha={alpha!r}")


def _refuse_built_optimizer(model, function):
    """A `ValueError` when `model`'s optimizer has taken a step: its state
    (and, with Keras, the list of variables it updates) was made for the
    weights trainable then, so after LoRA is enabled it would go on training
    the frozen base and never the adapters."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and optimizer.built:
        raise ValueError(
            "Enable LoRA before the optimizer has taken a step (its state is made for the "
            f"weights trainable then): call {function}, then compile. Received: "
            f"model={model.name!r} with a built optimizer"
        )


def enable_lora(model, rank, targets=DEFAULT_TARGETS, alpha=None, train_also=()):
    """Adds rank-`rank` LoRA adapters to the projections of `model` that
    `targets` name, and freezes every other weight.

    Args:
        model: a built model of any family (backbone or task model).
        rank: the adapters' rank r.
        targets: name patterns (`fnmatch`) of the `Dense` / `EinsumDense`
            sublayers to adapt, matched against a layer's name or its path in
            the model. The default, `("query", "value")`, adapts the query and
            value projections of every attention layer, as the LoRA paper does;
            `("query", "key", "value", "attention_output", "intermediate_dense",
            "output_dense")` adapts every projection of every block.
        alpha: the scale numerator: the update is `alpha / rank * x A B`.
            None means `rank` (a scale of 1).
        train_also: name patterns of layers whose weights stay trainable in
            full, such as a new task head (`("classifier",)`).

    Returns:
        The adapted layers. Only their adapters and the `train_also` layers'
        weights are trainable afterwards; the adapters are float32 under any
        dtype policy. Call it before `compile`, or compile again after it.
        BatchNorm statistics (the Conformer) still update in training.
    """
    _check_rank(rank, alpha)
    targets = _patterns("targets", targets)
    train_also = _patterns("train_also", train_also, allow_empty=True)
    if not model.built:
        raise ValueError(f"`model` must be built before LoRA is enabled. Received: model={model.name!r}")
    _refuse_built_optimizer(model, "enable_lora")
    already = lora_layers(model)
    if already:
        raise ValueError(
            f"`model` already has LoRA adapters on {[layer.path for layer in already]}. "
            f"Received: model={model.name!r}"
        )
    sublayers = _keras_compat.sublayers(model)
    projections = [layer for layer in sublayers if isinstance(layer, _PROJECTIONS)]
    chosen = _select(projections, targets, "targets", "Dense or EinsumDense layer")
    heads = _select(sublayers, train_also, "train_also", "layer") if train_also else []
    _enable(model, chosen, rank, alpha, {id(v) for layer in heads for v in layer.trainable_weights})
    return chosen


def _enable(model, layers, rank, alpha, also_trainable):
    """LoRA on `layers`; every trainable weight but the adapters and the
    variables whose ids are in `also_trainable` frozen."""
    for layer in layers:
        layer.enable_lora(rank, lora_alpha=alpha)
    keep = {id(v) for layer in layers for v in (layer.lora_kernel_a, layer.lora_kernel_b)}
    keep |= set(also_trainable)
    for variable in model.trainable_weights:
        if id(variable) not in keep:
            variable.trainable = False


def _lora_metadata(model):
    layers = lora_layers(model)
    if not layers:
        raise ValueError(f"`model` has no LoRA adapters (see enable_lora). Received: model={model.name!r}")
    ranks = {(layer.lora_rank, float(layer.lora_alpha)) for layer in layers}
    if len(ranks) != 1:
        raise ValueError(f"The adapters must share one rank and alpha to be saved. Received: {sorted(ranks)}")
    (rank, alpha), = ranks
    return layers, rank, alpha


def _base_fingerprint(layers):
    """sha256 of the frozen base kernels under the adapters (path, shape and
    bytes, in path order): it tells the base the adapters were trained on
    from any other."""
    digest = hashlib.sha256()
    for layer in sorted(layers, key=lambda layer: layer.path):
        (kernel,) = [w for w in layer.weights if w.name == "kernel"]
        value = np.ascontiguousarray(keras.ops.convert_to_numpy(kernel))
        digest.update(f"{layer.path}:{value.dtype}:{value.shape};".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def _tensor_digest(name, array):
    """sha256 of one tensor: its name, dtype, shape and bytes."""
    array = np.ascontiguousarray(array)
    digest = hashlib.sha256(f"{name}:{array.dtype.str}:{array.shape};".encode())
    digest.update(array.tobytes())
    return digest.hexdigest()


def _header_digest(metadata):
    """sha256 of the header (every field but the digest itself, canonical
    JSON): it covers the layout, alpha, and the tensors' digests."""
    fields = {k: v for k, v in metadata.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _non_finite(array):
    return np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all()


def save_lora_weights(model, path):
    """Writes the adapters and every other trainable weight (a `train_also`
    head) of `model` to `path` (`.npz`, atomically), with the LoRA layout and a
    fingerprint of the frozen base weights, and digests of the header and of
    every tensor (`load_lora_weights` refuses a file edited after this).
    A weight that is not finite (NaN or infinite) is a `ValueError`."""
    layers, rank, alpha = _lora_metadata(model)
    path = os.fspath(path)
    if not path.endswith(".npz"):
        raise ValueError(f"`path` must end in .npz. Received: path={path!r}")
    trainable = model.trainable_weights
    arrays = {v.path: keras.ops.convert_to_numpy(v) for v in trainable}
    if len(arrays) != len(trainable) or _META in arrays:
        raise ValueError("Two trainable weights of `model` share a path; name its layers "
                         f"uniquely. Received: {sorted(v.path for v in trainable)}")
    broken = sorted(name for name, value in arrays.items() if _non_finite(value))
    if broken:
        raise ValueError(f"Weights of `model` are not finite (NaN or infinite), so the adapters "
                         f"are not saved: {broken}. Received: path={path!r}")
    metadata = {
        "format": FILE_FORMAT, "version": FILE_VERSION, "rank": rank, "alpha": alpha,
        "layers": [layer.path for layer in layers], "trainable": sorted(arrays),
        "base_sha256": _base_fingerprint(layers),
        "tensor_sha256": {name: _tensor_digest(name, value) for name, value in arrays.items()},
    }
    metadata["sha256"] = _header_digest(metadata)
    arrays[_META] = np.frombuffer(json.dumps(metadata).encode(), dtype=np.uint8)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=directory, suffix=".npz.tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            np.savez(stream, **arrays)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    return path


def _read(path):
    """(metadata, {variable path: array}) of an adapter file, or a
    ValueError saying what is wrong with it."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"No LoRA adapter file at `path`. Received: path={path!r}")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
        metadata = json.loads(arrays.pop(_META).tobytes().decode())
    except (zipfile.BadZipFile, KeyError, ValueError, OSError, EOFError, UnicodeDecodeError) as error:
        raise ValueError(
            f"`path` is not a LoRA adapter file written by save_lora_weights, or it is "
            f"truncated or corrupt ({type(error).__name__}: {error}). Received: path={path!r}"
        ) from None
    if not isinstance(metadata, dict) or metadata.get("format") != FILE_FORMAT:
        raise ValueError(f"`path` is not a keras_attn LoRA adapter file. Received: path={path!r}")
    if metadata.get("version") != FILE_VERSION:
        older = (" (written without digests, so it cannot be checked: save the adapters "
                 "again)" if metadata.get("version") == 1 else "")
        raise ValueError(f"`path` is a LoRA file of version {metadata.get('version')!r}; this "
                         f"keras_attn reads version {FILE_VERSION}{older}. Received: path={path!r}")
    if metadata.get("sha256") != _header_digest(metadata):
        raise ValueError(f"`path` was edited: its header (layers, rank, alpha, the weights' "
                         f"digests) does not match the digest save_lora_weights wrote. "
                         f"Received: path={path!r}")
    if sorted(arrays) != sorted(metadata.get("trainable", ())):
        raise ValueError(f"`path` is truncated or edited: its weights are not the ones its header "
                         f"lists. Received: path={path!r}")
    digests = metadata.get("tensor_sha256")
    if not isinstance(digests, dict) or sorted(digests) != sorted(arrays):
        raise ValueError(f"`path` is edited: its header has no digest for each of its weights. "
                         f"Received: path={path!r}")
    for name in sorted(arrays):
        if _non_finite(arrays[name]):
            raise ValueError(f"`path` holds non-finite values (NaN or infinite) in weight "
                             f"{name!r}. Received: path={path!r}")
        if _tensor_digest(name, arrays[name]) != digests[name]:
            raise ValueError(f"`path` was edited: weight {name!r} does not match its digest. "
                             f"Received: path={path!r}")
    rank, alpha, layers = metadata.get("rank"), metadata.get("alpha"), metadata.get("layers")
    try:
        _check_rank(rank, alpha)
        if alpha is None:
            raise ValueError(f"`alpha` must be a positive number. Received: alpha={alpha!r}")
    except ValueError as error:
        raise ValueError(f"`path` has an invalid header: {error}. Received: path={path!r}") from None
    if (not isinstance(layers, list) or not layers or not all(isinstance(p, str) for p in layers)
            or not isinstance(metadata.get("base_sha256"), str)):
        raise ValueError(f"`path` has an invalid header: 'layers' must list layer paths and "
                         f"'base_sha256' be a digest. Received: path={path!r}")
    return metadata, arrays


def load_lora_weights(model, path):
    """Loads the adapters (and head) that `save_lora_weights` wrote onto
    `model`: the same base model with LoRA not enabled yet (it is enabled on
    the same layers with the same rank and alpha, and everything else frozen
    as before), or a model already adapted the same way.

    Refused with a `ValueError` naming `path` (and the weight where one is
    at fault), before any weight changes: a file that is not an adapter file,
    or is truncated or corrupt; a file edited after `save_lora_weights` (its
    header or a weight no longer matches the digests written with it); a
    weight that is not finite; a model without one of the file's layers or
    weights, or with other shapes; a base model whose kernels under the
    adapters differ from those the adapters were trained on; a model without
    LoRA whose optimizer has already taken a step (as `enable_lora`: load the
    adapters, then compile).
    """
    metadata, arrays = _read(path)
    rank, alpha = metadata["rank"], metadata["alpha"]
    by_path = {layer.path: layer for layer in _keras_compat.sublayers(model)
               if isinstance(layer, _PROJECTIONS)}
    missing = [p for p in metadata["layers"] if p not in by_path]
    if missing:
        raise ValueError(f"`model` has no projection layers {missing} that the adapters in "
                         f"`path` belong to. Received: path={os.fspath(path)!r}")
    layers = [by_path[p] for p in metadata["layers"]]
    adapted = lora_layers(model)
    if not adapted:
        _refuse_built_optimizer(model, "load_lora_weights")
    if adapted:
        layout = sorted(layer.path for layer in adapted), {(l.lora_rank, float(l.lora_alpha)) for l in adapted}
        if layout != (sorted(metadata["layers"]), {(rank, float(alpha))}):
            raise ValueError(
                f"`model` has other LoRA adapters (layers {layout[0]}, rank and alpha "
                f"{sorted(layout[1])}) than `path` (layers {sorted(metadata['layers'])}, rank "
                f"{rank}, alpha {alpha}). Received: path={os.fspath(path)!r}"
            )
    if _base_fingerprint(layers) != metadata["base_sha256"]:
        raise ValueError(
            "The adapters in `path` were trained on another base model: the kernels they "
            f"adapt differ from `model`'s. Received: path={os.fspath(path)!r}"
        )
    # Every weight named in the file, with its shape, before anything changes.
    variables = {v.path: v for v in model.weights}
    expected = {}
    for layer in layers:
        (kernel,) = [w for w in layer.weights if w.name == "kernel"]
        expected[f"{layer.path}/lora_kernel_a"] = tuple(kernel.shape[:-1]) + (rank,)
        expected[f"{layer.path}/lora_kernel_b"] = (rank, kernel.shape[-1])
    for name in arrays:
        if name not in expected:
            if name not in variables:
                raise ValueError(f"`model` has no weight {name!r} that `path` holds. "
                                 f"Received: path={os.fspath(path)!r}")
            expected[name] = tuple(variables[name].shape)
        if tuple(arrays[name].shape) != tuple(expected[name]):
            raise ValueError(f"Weight {name!r} has shape {tuple(expected[name])} in `model` and "
                             f"{tuple(arrays[name].shape)} in `path`. Received: path={os.fspath(path)!r}")
    if not adapted:
        heads = {id(variables[name]) for name in arrays if name in variables}
        _enable(model, layers, rank, alpha, heads)
        variables = {v.path: v for v in model.weights}
    for name, value in arrays.items():
        variables[name].assign(value)
    return layers


def _without_lora(config):
    if isinstance(config, dict):
        return {k: _without_lora(v) for k, v in config.items() if k not in ("lora_rank", "lora_alpha")}
    if isinstance(config, list):
        return [_without_lora(v) for v in config]
    return config


def merge_lora(model):
    """A new model equal to `model` with the adapters folded into the kernels
    (`W + alpha / r * A B`, in the kernel's dtype) and no LoRA weights: what to
    save, export or serve. `model` is left as it was."""
    _lora_metadata(model)
    merged = model.__class__.from_config(_without_lora(model.get_config()))
    with tempfile.TemporaryDirectory() as directory:
        # Keras writes an adapted layer's kernel merged (its own save path),
        # and the plain model reads it like any other weights file.
        weights = os.path.join(directory, "merged.weights.h5")
        model.save_weights(weights)
        merged.load_weights(weights)
    return merged
