"""keras-hub <-> keras_attn: the same BERT or ViT in the other package, its
weights copied, without retraining.

    import keras_hub
    from keras_attn.convert import from_keras_hub, to_keras_hub

    hub_backbone = keras_hub.models.BertBackbone.from_preset("path/to/local_preset")
    backbone = from_keras_hub(hub_backbone)           # a keras_attn BertBackbone
    ...                                               # fine-tune, LoRA, export
    to_keras_hub(backbone).save_to_preset("path/to/out")

| keras-hub | keras_attn |
|---|---|
| `BertBackbone` | `BertBackbone` (`activation="gelu_approximate"`: keras-hub's BERT computes GELU's tanh approximation) |
| `BertTextClassifier` (no preprocessor) | `BertSequenceClassifier` |
| `ViTBackbone` | `ViT` with `num_classes=None` (its output is the pooled `(B, D)`: keras-hub's `[:, 0]`, or the mean of the tokens for `use_class_token=False`) |
| `ViTImageClassifier` (no preprocessor) | `ViT` with a classifier (`pooling="token"` <-> `"cls"`, `"gap"` <-> `"gap"`) |

Both packages build these models from Keras's `EinsumDense`, `Dense`,
`LayerNormalization` and embedding layers with the same weight layouts, so
every weight is copied as it is (only the class token is reshaped). Every
weight of both models must be paired, with the same shape, before any is
assigned; a setting one package cannot express (an exact-GELU BERT into
keras-hub, a keras-hub ViT with a pre-logits layer, two dropout rates into
keras-hub's one) is a `ValueError` that names it.

Inputs: keras-hub's `ViTBackbone` takes images already scaled by its
preprocessor; keras_attn's ViT takes [0, 255] pixels and scales them to
[-1, 1] itself, so `vit(x)` equals `hub_vit(x / 127.5 - 1)` (what the
keras-hub presets' converter does when its scale is 1 / 127.5 and its offset
-1; a preset that normalises with ImageNet's mean and deviation needs its
images scaled that way before keras_attn's rescaling).
"""

from keras_attn._keras_compat import sublayers
from keras_attn.convert._checkpoint import layer_weights

_HUB_BERT_EPSILON = 1e-12  # keras-hub's BertBackbone fixes it


def _keras_hub():
    try:
        import keras_hub
    except ImportError:  # pragma: no cover - keras-nlp installs it
        raise ImportError("The keras-hub converters need keras-hub (installed with keras-nlp).")
    return keras_hub


def _bert_pairs(num_layers):
    """(keras_attn path, keras-hub path) of every BERT backbone weight."""
    pairs = [(f"{name}/embeddings", f"{name}/embeddings")
             for name in ("token_embedding", "segment_embedding", "position_embedding")]
    pairs += [(f"embeddings_layer_norm/{w}", f"embeddings_layer_norm/{w}")
              for w in ("gamma", "beta")]
    for i in range(num_layers):
        ours, theirs = f"transformer_block_{i}/", f"transformer_layer_{i}/"
        for name in ("query", "key", "value", "attention_output"):
            for w in ("kernel", "bias"):
                pairs.append((f"{ours}self_attention/{name}/{w}",
                              f"{theirs}self_attention_layer/{name}/{w}"))
        for w in ("gamma", "beta"):
            pairs.append((f"{ours}self_attention_layer_norm/{w}",
                          f"{theirs}self_attention_layer_norm/{w}"))
            pairs.append((f"{ours}feed_forward_layer_norm/{w}",
                          f"{theirs}feedforward_layer_norm/{w}"))
        for w in ("kernel", "bias"):
            pairs.append((f"{ours}feed_forward/intermediate_dense/{w}",
                          f"{theirs}feedforward_intermediate_dense/{w}"))
            pairs.append((f"{ours}feed_forward/output_dense/{w}",
                          f"{theirs}feedforward_output_dense/{w}"))
    pairs += [(f"pooled_dense/{w}", f"pooled_dense/{w}") for w in ("kernel", "bias")]
    return pairs


def _vit_pairs(num_layers, class_token):
    """(keras_attn path, keras-hub path) of every ViT backbone weight."""
    embed = "vit_patching_and_embedding/"
    pairs = [(f"patch_embedding/{w}", f"{embed}patch_embedding/{w}") for w in ("kernel", "bias")]
    if class_token:
        pairs.append(("class_token/token", f"{embed}class_token"))
    pairs.append(("position_embedding/embeddings", f"{embed}position_embedding/embeddings"))
    for i in range(num_layers):
        ours, theirs = f"transformer_block_{i}/", f"vit_encoder/transformer_block_{i + 1}/"
        for name in ("query", "key", "value", "attention_output"):
            for w in ("kernel", "bias"):
                pairs.append((f"{ours}self_attention/{name}/{w}", f"{theirs}mha/{name}/{w}"))
        for w in ("gamma", "beta"):
            pairs.append((f"{ours}self_attention_layer_norm/{w}", f"{theirs}ln_1/{w}"))
            pairs.append((f"{ours}feed_forward_layer_norm/{w}", f"{theirs}ln_2/{w}"))
        for w in ("kernel", "bias"):
            pairs.append((f"{ours}feed_forward/intermediate_dense/{w}", f"{theirs}mlp/dense_1/{w}"))
            pairs.append((f"{ours}feed_forward/output_dense/{w}", f"{theirs}mlp/dense_2/{w}"))
    pairs += [(f"final_layer_norm/{w}", f"vit_encoder/ln/{w}") for w in ("gamma", "beta")]
    return pairs


def _check_plain(model):
    """Every layer float and without adapters (`layer_weights` says why not)."""
    for layer in sublayers(model):
        if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
            layer_weights(layer, len(layer.weights))


def _copy(source, target, pairs, source_is_ours):
    """Assigns `source`'s weights to `target`'s along `pairs`, after checking
    that the pairs cover every weight of both with equal sizes."""
    import numpy as np
    from keras import ops

    ours_model, theirs_model = (source, target) if source_is_ours else (target, source)
    ours = {w.path: w for w in ours_model.weights}
    theirs = {w.path: w for w in theirs_model.weights}
    plan = []
    for our_path, their_path in pairs:
        if our_path not in ours or their_path not in theirs:
            side = "keras_attn" if our_path not in ours else "keras-hub"
            raise ValueError(  # a layout this converter does not know
                f"The {side} model has no weight "
                f"{our_path if side == 'keras_attn' else their_path!r}; the converter "
                "expects the layout of keras-hub 0.32 (the version it is tested with). "
                f"Received: {side} weights={sorted(ours if side == 'keras_attn' else theirs)[:6]}..."
            )
        a, b = ours[our_path], theirs[their_path]
        src, dst = (a, b) if source_is_ours else (b, a)
        if int(np.prod(src.shape)) != int(np.prod(dst.shape)):
            raise ValueError(
                f"Weight {their_path!r} has shape {tuple(b.shape)} in keras-hub but "
                f"{our_path!r} has {tuple(a.shape)} in keras_attn. Received: "
                f"{tuple(src.shape)}"
            )
        plan.append((dst, np.asarray(ops.convert_to_numpy(src)).reshape(dst.shape)))
    paired = {id(ours[o]) for o, _ in pairs} | {id(theirs[t]) for _, t in pairs}
    unpaired = [w.path for w in ours_model.weights + theirs_model.weights if id(w) not in paired]
    if unpaired:  # a weight of either model the layout does not know
        raise ValueError(f"Weights with no counterpart. Received: unpaired={unpaired}")
    for variable, array in plan:
        variable.assign(array)
    return target


def from_keras_hub(model):
    """The keras_attn model equal to a keras-hub BERT or ViT model (the table
    in this module's docstring), with its weights.

    Args:
        model: a `keras_hub.models.BertBackbone`, `BertTextClassifier`,
            `ViTBackbone` or `ViTImageClassifier` (for example from
            `from_preset` on a local directory).

    Returns:
        The keras_attn model, in `model`'s dtype policy; its outputs equal
        `model`'s (see the module docstring for the ViT's inputs).

    Raises:
        ValueError: another model, or a setting keras_attn cannot express
            (a classifier with a pre-logits layer or an activation, a ViT's
            dropout before its classifier, non-square or channels-first
            images, a ViT without biases).
    """
    models = _keras_hub().models
    if isinstance(model, models.BertTextClassifier):
        from keras_attn.models.bert import BertSequenceClassifier

        _check_logits(model)
        backbone = _bert_like(model.backbone)
        ours = BertSequenceClassifier(backbone, num_classes=model.num_classes,
                                      dropout=model.dropout)
        pairs = _bert_pairs(backbone.bert_config.num_layers) + [
            (f"classifier/{w}", f"logits/{w}") for w in ("kernel", "bias")]
        return _copy(model, ours, pairs, source_is_ours=False)
    if isinstance(model, models.BertBackbone):
        ours = _bert_like(model)
        return _copy(model, ours, _bert_pairs(model.num_layers), source_is_ours=False)
    if isinstance(model, models.ViTImageClassifier):
        _check_logits(model)
        if model.intermediate_dim is not None:
            raise ValueError(
                "keras_attn's ViT classifier is one Dense on the pooled token (no pre-logits "
                f"layer). Received: intermediate_dim={model.intermediate_dim!r}"
            )
        if model.dropout:
            raise ValueError(
                "keras_attn's ViT has no dropout before its classifier. "
                f"Received: dropout={model.dropout!r}"
            )
        backbone = model.backbone
        if model.pooling != ("token" if backbone.use_class_token else "gap"):
            raise ValueError(
                "keras_attn's ViT pools the class token when it has one, the mean of the "
                f"patches when not. Received: pooling={model.pooling!r}, "
                f"use_class_token={backbone.use_class_token}"
            )
        ours = _vit_like(backbone, model.num_classes)
        pairs = _vit_pairs(backbone.num_layers, backbone.use_class_token) + [
            (f"classifier/{w}", f"predictions/{w}") for w in ("kernel", "bias")]
        return _copy(model, ours, pairs, source_is_ours=False)
    if isinstance(model, models.ViTBackbone):
        ours = _vit_like(model, None)
        return _copy(model, ours, _vit_pairs(model.num_layers, model.use_class_token),
                     source_is_ours=False)
    raise ValueError(
        "`model` must be a keras_hub.models.BertBackbone, BertTextClassifier, ViTBackbone "
        f"or ViTImageClassifier. Received: model={type(model).__name__}"
    )


def _check_logits(model):
    import keras

    activation = model.activation
    if activation is not None and keras.activations.get(activation) is not keras.activations.linear:
        raise ValueError(
            "keras_attn's classifiers output logits (no activation). "
            f"Received: activation={model.activation!r}"
        )


def _bert_like(backbone):
    """A keras_attn BertBackbone of a keras-hub one's configuration."""
    from keras_attn.models.bert import BertBackbone

    return BertBackbone(
        vocabulary_size=backbone.vocabulary_size, num_layers=backbone.num_layers,
        num_heads=backbone.num_heads, hidden_dim=backbone.hidden_dim,
        intermediate_dim=backbone.intermediate_dim, dropout=backbone.dropout,
        attention_dropout=backbone.dropout, max_sequence_length=backbone.max_sequence_length,
        num_segments=backbone.num_segments, layer_norm_epsilon=_HUB_BERT_EPSILON,
        activation="gelu_approximate", dtype=backbone.dtype_policy.name,
    )


def _vit_like(backbone, num_classes):
    """A keras_attn ViT of a keras-hub ViTBackbone's configuration."""
    from keras_attn.models.vit import ViT

    if backbone.data_format == "channels_first":
        raise ValueError(
            "keras_attn's ViT takes channels-last images. Received: data_format='channels_first'"
        )
    height, width, channels = tuple(backbone.image_shape)
    patch = backbone.patch_size
    patch = tuple(patch) if isinstance(patch, (tuple, list)) else (patch, patch)
    if height != width or patch[0] != patch[1]:
        raise ValueError(
            "keras_attn's ViT takes square images cut into square patches. Received: "
            f"image_shape={tuple(backbone.image_shape)}, patch_size={backbone.patch_size!r}"
        )
    for name in ("use_mha_bias", "use_mlp_bias", "use_patch_bias"):
        if not getattr(backbone, name):
            raise ValueError(f"keras_attn's ViT has these biases. Received: {name}=False")
    return ViT(
        image_size=height, patch_size=patch[0], num_channels=channels,
        hidden_dim=backbone.hidden_dim, num_layers=backbone.num_layers,
        num_heads=backbone.num_heads, intermediate_dim=backbone.mlp_dim,
        dropout=backbone.dropout_rate, attention_dropout=backbone.attention_dropout,
        layer_norm_epsilon=backbone.layer_norm_epsilon,
        pooling="cls" if backbone.use_class_token else "gap",
        num_classes=num_classes, dtype=backbone.dtype_policy.name,
    )


def to_keras_hub(model):
    """The keras-hub model equal to a keras_attn BERT or ViT model (the table
    in this module's docstring), with its weights; `save_to_preset` writes
    it as a keras-hub preset.

    Args:
        model: a keras_attn `BertBackbone`, `BertSequenceClassifier` or
            `ViT`, float (not quantized) and without LoRA adapters
            (`keras_attn.models.merge_lora` folds them in).

    Returns:
        A `keras_hub.models.BertBackbone`, `BertTextClassifier` (no
        preprocessor), `ViTBackbone` or `ViTImageClassifier` (no
        preprocessor).

    Raises:
        ValueError: another model, or a setting keras-hub cannot express: a
            BERT with another activation than `"gelu_approximate"` (keras-hub
            computes GELU's tanh approximation; the exact GELU of a
            keras_attn BERT would change its outputs by ~1e-3), another
            LayerNorm epsilon than 1e-12, or two dropout rates.
    """
    models = _keras_hub().models
    kind = type(model).__name__
    config = getattr(model, "vit_config", None)
    if kind not in ("BertBackbone", "BertSequenceClassifier") and config is None:
        raise ValueError(
            "`model` must be a keras_attn BertBackbone, BertSequenceClassifier or ViT. "
            f"Received: model={kind}"
        )
    _check_plain(model)
    if kind in ("BertBackbone", "BertSequenceClassifier"):
        backbone = model if kind == "BertBackbone" else model.backbone
        config = backbone.bert_config
        for name, value, wanted in (
                ("padding_id", config.padding_id, None),  # RoBERTa's positions
                ("activation", config.activation, "gelu_approximate"),
                ("layer_norm_epsilon", config.layer_norm_epsilon, _HUB_BERT_EPSILON),
                ("attention_dropout", config.attention_dropout, config.dropout)):
            if value != wanted:
                raise ValueError(
                    f"keras-hub's BertBackbone cannot express {name}={value!r}: it has "
                    f"{name}={wanted!r} (with dropout={config.dropout!r}). "
                    f"Received: {name}={value!r}"
                )
        hub = models.BertBackbone(
            vocabulary_size=config.vocabulary_size, num_layers=config.num_layers,
            num_heads=config.num_heads, hidden_dim=config.hidden_dim,
            intermediate_dim=config.intermediate_dim, dropout=config.dropout,
            max_sequence_length=config.max_sequence_length, num_segments=config.num_segments,
            dtype=backbone.dtype_policy.name,
        )
        pairs = _bert_pairs(config.num_layers)
        if kind == "BertSequenceClassifier":
            hub = models.BertTextClassifier(hub, num_classes=model.num_classes,
                                            preprocessor=None, dropout=model.dropout)
            pairs += [(f"classifier/{w}", f"logits/{w}") for w in ("kernel", "bias")]
        return _copy(model, hub, pairs, source_is_ours=True)
    dino = {"num_register_tokens": (config.num_register_tokens, 0),
            "layer_scale_init": (config.layer_scale_init, None),
            "feed_forward": (config.feed_forward, "gelu"),
            "pixel_normalization": (config.pixel_normalization, "half")}
    for name, (value, wanted) in dino.items():
        if value != wanted or config.pooling == "cls_gap":
            raise ValueError(
                "keras-hub's ViTBackbone has no register tokens, LayerScale, SwiGLU, "
                "ImageNet pixel normalisation or [CLS] + mean-patch head (DINOv2's options). "
                f"Received: {name}={value!r}, pooling={config.pooling!r}"
            )
    class_token = config.pooling == "cls"
    hub = models.ViTBackbone(
        image_shape=(config.image_size, config.image_size, config.num_channels),
        patch_size=config.patch_size, num_layers=config.num_layers,
        num_heads=config.num_heads, hidden_dim=config.hidden_dim,
        mlp_dim=config.intermediate_dim, dropout_rate=config.dropout,
        attention_dropout=config.attention_dropout,
        layer_norm_epsilon=config.layer_norm_epsilon, use_class_token=class_token,
        data_format="channels_last", dtype=model.dtype_policy.name,
    )
    pairs = _vit_pairs(config.num_layers, class_token)
    if config.num_classes is not None:
        hub = models.ViTImageClassifier(hub, num_classes=config.num_classes, preprocessor=None,
                                        pooling="token" if class_token else "gap")
        pairs += [(f"classifier/{w}", f"predictions/{w}") for w in ("kernel", "bias")]
    return _copy(model, hub, pairs, source_is_ours=True)
