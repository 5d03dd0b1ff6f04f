"""Model-parallel layouts for every family (Megatron style: Shoeybi et al.,
2019, "Megatron-LM: Training Multi-Billion Parameter Language Models Using
Model Parallelism").

    import keras
    from keras_attn.models import build_bert, get_bert_config, layout_map

    mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"),
                                         keras.distribution.list_devices())
    layouts = layout_map(get_bert_config("bert_large"), mesh)
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch"))
    model = build_bert("bert_large")   # every large variable made sharded

Keras gives the mechanism (`keras.distribution.LayoutMap`: variable paths to
`TensorLayout`s, applied when a variable is created under `ModelParallel`,
JAX backend); what it lacks is the plan for these models, and this module adds
it, with the divisibility checked before any variable exists:

| variables (path ends with) | shape | sharded over the model axis |
|---|---|---|
| `query`, `key`, `value`, `position` `/kernel` | (D, N, H) | heads N |
| `query`, `key`, `value` `/bias`, `content_bias`, `position_bias` | (N, H) | heads N |
| `attention_output/kernel` | (N, H, D) | heads N |
| `intermediate_dense/kernel`, `/bias` | (D, F), (F,) | inner width F |
| `feed_forward*/output_dense/kernel` | (F, D) | inner width F |
| `*token_embedding/embeddings` | (V, D) | vocabulary V (width D when V does not divide) |
| `output_projection/kernel`, `/bias` (untied Transformer) | (D, V), (V,) | vocabulary V (else replicated) |
| everything else: norms, output biases, position tables, patch and subsampling convolutions, the Conformer's convolution module, task heads | | replicated |

So each block needs one all-reduce after attention and one after the
feed-forward (the column-parallel input projections feed row-parallel output
projections), as in Megatron. The Conformer's convolution module stays
replicated: its GLU splits the pointwise output into two halves, which a
contiguous shard over the model axis would cut across; it is about 3 D^2 of a
block's 19 D^2 weights. Optimizer slots follow their variable's layout (Keras
copies it), so they are sharded the same way.
"""

import dataclasses
import re

import keras

from keras_attn.models.bert.bert_config import BertConfig
from keras_attn.models.transformer.transformer_config import TransformerConfig

MODEL_AXIS = "model"

# (path pattern matched with re.fullmatch, as LayoutMap does; the axes of the
# variable, "model" where it is sharded; the config field that sizes that axis)
_HEADS = (
    (r"(.*/)?(query|key|value|position)/kernel", (None, MODEL_AXIS, None)),
    (r"(.*/)?(query|key|value)/bias", (MODEL_AXIS, None)),
    (r"(.*/)?(content_bias|position_bias)", (MODEL_AXIS, None)),
    (r"(.*/)?attention_output/kernel", (MODEL_AXIS, None, None)),
)
_INNER = (
    (r"(.*/)?intermediate_dense/kernel", (None, MODEL_AXIS)),
    (r"(.*/)?intermediate_dense/bias", (MODEL_AXIS,)),
    (r"(.*/)?feed_forward(_\d+)?/output_dense/kernel", (MODEL_AXIS, None)),
)
_EMBEDDING = r"(.*/)?((source|target)_)?token_embedding/embeddings"
_OUTPUT_PROJECTION = (r"(.*/)?output_projection/kernel", r"(.*/)?output_projection/bias")


def _model_axis_size(device_mesh, model_axis):
    if not isinstance(device_mesh, keras.distribution.DeviceMesh):
        raise ValueError(
            "`device_mesh` must be a `keras.distribution.DeviceMesh`. "
            f"Received: device_mesh={device_mesh!r}"
        )
    names = list(device_mesh.axis_names)
    if model_axis not in names:
        raise ValueError(
            f"`device_mesh` has no axis named {model_axis!r} to shard the model "
            f"over (`model_axis`). Received: axis_names={names}"
        )
    return device_mesh.shape[names.index(model_axis)]


def _sizes(model_or_config):
    """The sizes the layouts depend on: heads, inner width, hidden width and
    every vocabulary with its own table, from a family config or a model."""
    if dataclasses.is_dataclass(model_or_config) and not isinstance(model_or_config, type):
        config = model_or_config
        fields = {f.name for f in dataclasses.fields(config)}
        if not {"num_heads", "hidden_dim", "intermediate_dim"} <= fields:
            raise ValueError(
                "`model_or_config` must be a model or the config of one of the "
                "families (BertConfig, ViTConfig, TransformerConfig, ConformerConfig). "
                f"Received: model_or_config={config!r}"
            )
        inner = config.intermediate_dim or 4 * config.hidden_dim  # the Conformer's default
        vocabularies = {}
        # Token embedding tables: BERT's and the Transformer's (the
        # Conformer's vocabulary sizes its replicated CTC head only).
        if isinstance(config, (BertConfig, TransformerConfig)):
            vocabularies["vocabulary_size"] = config.vocabulary_size
        if getattr(config, "target_vocabulary_size", None):
            vocabularies["target_vocabulary_size"] = config.target_vocabulary_size
        return config.num_heads, inner, config.hidden_dim, vocabularies
    if isinstance(model_or_config, keras.Model):
        return None
    raise ValueError(
        "`model_or_config` must be a Keras model or the config of one of the "
        "families (e.g. `get_bert_config('bert_large')`). "
        f"Received: model_or_config={model_or_config!r}"
    )


def _divides(what, size, devices, model_axis):
    if size % devices:
        raise ValueError(
            f"{what} does not divide over the {devices} devices of the "
            f"{model_axis!r} axis of the device mesh: each device would hold "
            f"{size / devices:g} of them. Choose a model axis that divides {size}."
        )


def layout_map(model_or_config, device_mesh, model_axis=MODEL_AXIS):
    """A `keras.distribution.LayoutMap` that shards a family's model over
    the `model_axis` of `device_mesh` (the table in the module docstring).

    Set it before the model is built (its variables take their layout when
    they are created):
    `keras.distribution.set_distribution(keras.distribution.ModelParallel(
    layout_map=layout_map(config, mesh), batch_dim_name="batch"))`, then
    build, compile and fit as usual: each batch is split over the other mesh
    axis, and the step computes the same loss as on one device. The Keras
    distribution API runs on the JAX backend.

    Args:
        model_or_config: the family config the model will be built from
            (`get_bert_config("bert_large")`, ...), checked by its sizes; or a
            model of the same configuration (e.g. built small or on another
            machine), checked variable by variable, task heads included.
        device_mesh: a `keras.distribution.DeviceMesh` with an axis named
            `model_axis` (e.g. shape `(2, 4)`, axes `("batch", "model")`).
        model_axis: the mesh axis the weights are sharded over.

    Returns:
        The `LayoutMap` (`layout_map[variable.path]` gives a variable's
        `TensorLayout`, or None when it is replicated).

    Raises:
        ValueError: when the mesh has no `model_axis`, when the head count or
            the feed-forward's inner width does not divide over the model axis
            (naming both numbers), or when `model_or_config` is neither a
            model nor a family config.
    """
    devices = _model_axis_size(device_mesh, model_axis)
    sizes = _sizes(model_or_config)
    layouts = keras.distribution.LayoutMap(device_mesh)

    def axes(spec):
        return tuple(model_axis if axis == MODEL_AXIS else None for axis in spec)

    for pattern, spec in _HEADS + _INNER:
        layouts[pattern] = axes(spec)

    if sizes is not None:
        heads, inner, width, vocabularies = sizes
        _divides(f"num_heads={heads}", heads, devices, model_axis)
        _divides(f"intermediate_dim={inner} (the feed-forward's inner width)", inner,
                 devices, model_axis)
        # A vocabulary that does not divide (BERT's 30522 over 4 or 8) is
        # sharded over the width instead: the table is still split.
        embedding_on_vocabulary = all(v % devices == 0 for v in vocabularies.values())
        if embedding_on_vocabulary or width % devices == 0:
            layouts[_EMBEDDING] = axes(
                (MODEL_AXIS, None) if embedding_on_vocabulary else (None, MODEL_AXIS)
            )
        target = vocabularies.get("target_vocabulary_size")
        if target and target % devices == 0:
            layouts[_OUTPUT_PROJECTION[0]] = axes((None, MODEL_AXIS))
            layouts[_OUTPUT_PROJECTION[1]] = axes((MODEL_AXIS,))
        return layouts

    # A model: choose the embedding and output layouts from its tables, then
    # check every variable that the map shards.
    model = model_or_config
    tables = [v for v in model.weights if re.fullmatch(_EMBEDDING, v.path)]
    on_vocabulary = all(v.shape[0] % devices == 0 for v in tables)
    on_width = all(v.shape[1] % devices == 0 for v in tables)
    if tables and (on_vocabulary or on_width):
        layouts[_EMBEDDING] = axes((MODEL_AXIS, None) if on_vocabulary else (None, MODEL_AXIS))
    projection = [v for v in model.weights if re.fullmatch(_OUTPUT_PROJECTION[0], v.path)]
    if projection and all(v.shape[1] % devices == 0 for v in projection):
        layouts[_OUTPUT_PROJECTION[0]] = axes((None, MODEL_AXIS))
        layouts[_OUTPUT_PROJECTION[1]] = axes((MODEL_AXIS,))
    for variable in model.weights:
        layout = layouts[variable.path]
        if layout is None:
            continue
        for size, axis in zip(variable.shape, layout.axes):
            if axis is not None:
                what = "num_heads" if any(
                    re.fullmatch(p, variable.path) for p, _ in _HEADS
                ) else "intermediate_dim"
                _divides(f"{what}={size} (variable {variable.path!r}, shape "
                         f"{tuple(variable.shape)})", size, devices, model_axis)
    return layouts

