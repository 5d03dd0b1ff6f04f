"""ONNX and LiteRT export: a serving model converted by tf2onnx (from a
function of its inputs and weights, the weights then written as the ONNX
initializers: `_convert_onnx`) or by Keras's own
`model.export(format="litert")` (the TensorFlow Lite converter), into a
directory that also holds `serving.json`, the contract
a server needs: each input's name, dtype and shape (-1 where any size is
accepted), each output's, the precision, and the task's pre-processing
(for a text classifier, the tokenizer's settings beside its `vocab.txt`).

    <path>/model.onnx | model.tflite
    <path>/serving.json
    <path>/vocab.txt            (text classifiers)

A classifier exported with its `class_names` carries them in `serving.json`
(`"labels"`: the name of each output index; `Artifact.labels`), so that a
copy of the directory still names its answers.

The serving model is a Keras model whose call is the whole computation
from the served inputs (uint8 pixels, token ids) to the served outputs
(probabilities), in `keras.ops`, so that the converters see one graph. The
formats cannot carry TensorFlow's string ops (tokenization) or its CTC and
FFT kernels: which task goes to which format is checked by the task
exporters (`export_image_classifier`, `export_text_classifier`).

`serving.json` also records the sha256 of every file it describes
(`"sha256": {file: digest}`), which `Artifact` checks before it loads the
model (a flipped bit in a model file otherwise serves quietly wrong
answers), and names the axes that inputs share (`"axes"`: "batch", and
for the text classifier "length"), which `Artifact` checks with each
input's dtype, rank and fixed sizes before the runtime sees a call.

The directory is written beside `path` and renamed into place (a crash
never leaves half a model where a server loads it). Conversion runs on the
TensorFlow backend, like the SavedModel.
"""

import hashlib
import json
import os
import shutil
import tempfile

FORMATS = ("saved_model", "onnx", "litert")
PORTABLE_FORMATS = ("onnx", "litert")
FILES = {"onnx": "model.onnx", "litert": "model.tflite"}
CONTRACT = "serving.json"
# float16 weights and dynamic-range int8 weights are the TensorFlow Lite
# converter's post-training options; tf2onnx has none: an ONNX float16
# model is the float32 one with its weights stored in float16 (as LiteRT's;
# `_onnx_to_float16`), an ONNX int8 model onnxruntime's dynamic
# quantization of it (`_onnx_to_int8`).
PRECISIONS = {"saved_model": ("float32",), "onnx": ("float32", "float16", "int8"),
              "litert": ("float32", "float16", "int8")}
EXTRAS = {"onnx": ("tf2onnx", "onnx"), "litert": ()}


def check_format(format, precision="float32", onnx_int8=True):
    """`ValueError` naming an unknown format, or a precision the format's
    converter does not offer (with `onnx_int8=False`, ONNX's int8: the
    exporters whose int8 ONNX answers are not tested yet, the speech
    recognizer's, the streaming step's and the translator's, refuse it)."""
    if format not in FORMATS:
        raise ValueError(f"`format` must be one of {FORMATS}. Received: format={format!r}")
    allowed = PRECISIONS[format]
    if format == "onnx" and not onnx_int8:
        allowed = tuple(p for p in allowed if p != "int8")
    if precision not in allowed:
        raise ValueError(
            f"`precision` must be one of {allowed} for format={format!r}. "
            f"Received: precision={precision!r}"
        )


def check_class_names(class_names, num_classes):
    """`class_names` as a list of `num_classes` distinct non-empty strings
    without a line break (each one line of labels.txt, the name of an output
    index), or None; `ValueError` naming the argument otherwise."""
    from keras_attn._checks import check_class_names as check

    return check("class_names", class_names, num_classes)


def labels_text(class_names):
    """labels.txt: the name of output index i on line i."""
    return "".join(name + "\n" for name in class_names)


def _require_packages(format, precision="float32"):
    import importlib.util

    # onnxruntime quantizes an int8 ONNX export.
    needed = EXTRAS[format] + (("onnxruntime",) if (format, precision) == ("onnx", "int8") else ())
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(
            f"The {format} export needs {', '.join(missing)}: "
            f"`pip install keras-attn[{format}]`."
        )


def _rename_onnx_outputs(model, names):
    """tf2onnx names the graph outputs after TensorFlow tensors
    ("Identity:0"); a server reads them by name, so they get the model's
    output names (in the order of the flattened outputs)."""
    outputs = list(model.graph.output)
    if len(outputs) != len(names):
        raise RuntimeError(f"Expected {len(names)} ONNX outputs, the graph has {len(outputs)}")
    if [output.name for output in outputs] == list(names):
        return  # a dict of outputs: tf2onnx kept its keys
    renames = {output.name: name for output, name in zip(outputs, names)}
    for node in model.graph.node:
        node.output[:] = [renames.get(name, name) for name in node.output]
        node.input[:] = [renames.get(name, name) for name in node.input]
    for output in outputs:
        output.name = renames[output.name]


def _served_inputs(serving):
    """`[(name, KerasTensor)]` of the served inputs: a model called with a
    dict (the BERT backbone) serves each input under its key, in sorted
    key order as Keras flattens the dict; other models under their inputs'
    names."""
    if isinstance(serving.input, dict):
        return sorted(serving.input.items())
    return [(x.name, x) for x in serving.inputs]


def _input_signature(serving):
    """The `input_signature` of Keras's `model.export` for `serving`: the
    structure its call takes (a dict for a dict-input model, whose call
    refuses a list; a list for several inputs; the spec for one)."""
    import keras

    specs = {name: keras.InputSpec(shape=x.shape, dtype=x.dtype, name=name)
             for name, x in _served_inputs(serving)}
    if isinstance(serving.input, dict):
        return [specs]
    if len(specs) == 1:
        return list(specs.values())
    return [list(specs.values())]


def _describe(tensor, name):
    import keras

    return {"name": name, "dtype": keras.backend.standardize_dtype(tensor.dtype),
            "shape": [-1 if dim is None else int(dim) for dim in tensor.shape]}


def _default_axes(shape):
    """The first axis of every served input is the batch (all of them take
    one example per row); other free axes are the input's own unless the
    exporter names them."""
    return ["batch" if shape and shape[0] == -1 else None] + [None] * (len(shape) - 1)


def _contract(serving, format, precision, preprocessing, axes=None):
    from keras_attn._version import __version__

    # Keras flattens a dict of outputs in sorted key order, as tf2onnx does.
    names = sorted(serving.output) if isinstance(serving.output, dict) else ["probabilities"]
    outputs = [serving.output[name] for name in names] if isinstance(serving.output, dict) \
        else serving.outputs
    inputs = [_describe(x, name) for name, x in _served_inputs(serving)]
    for spec in inputs:
        named = (axes or {}).get(spec["name"])
        if named is None:
            named = _default_axes(spec["shape"])
        if len(named) != len(spec["shape"]) or any(
                name is not None and size != -1 for name, size in zip(named, spec["shape"])):
            raise ValueError(
                f"`axes` must name the free axes of input `{spec['name']}` (shape "
                f"{spec['shape']}), one entry per axis. Received: axes={list(named)!r}")
        spec["axes"] = list(named)
    return {
        "format": format,
        "file": FILES[format],
        "precision": precision,
        "inputs": inputs,
        "outputs": [_describe(y, name) for y, name in zip(outputs, names)],
        "preprocessing": preprocessing,
        "keras_attn": __version__,
    }


def export_portable(serving, path, format, precision="float32", preprocessing=None,
                    files=None, verbose=False, axes=None, extra=None):
    """Writes the functional Keras model `serving` as ONNX or LiteRT into
    the directory `path` with `serving.json` (atomically).

    Args:
        serving: a functional `keras.Model` from named `keras.Input`s (a
            list, or a dict such as the BERT backbone's: each served under
            its key) to one output (named "probabilities" in the contract)
            or a dict of outputs (their names); batch and length dims that
            are None in its inputs stay free in the artifact.
        path: the directory to write.
        format: `"onnx"` or `"litert"`.
        precision: `"float32"`, `"float16"` (weights stored in float16,
            arithmetic in float32) or `"int8"`: dynamic-range int8 (int8
            weights; LiteRT's converter option, onnxruntime's
            `quantize_dynamic` for ONNX: activations quantized per call, the
            products in int8; answers close to the float model's, not equal).
        preprocessing: JSON-able dict written into the contract.
        files: `{name: bytes or str}` written beside the model (a vocabulary).
        axes: `{input name: [axis name or None, ...]}`: free axes that must
            have the same size in every input naming them (the text
            classifier's "length"). Default: axis 0 of each input is
            "batch".
        extra: JSON-able `{key: value}` added to the contract (the
            streaming step's state layout); a key it already has is refused.

    Returns:
        `path`.

    Raises:
        ValueError: an unknown format or precision; an op the format cannot
            hold (the LiteRT converter is restricted to builtin ops: an
            artifact needing TensorFlow's Flex delegate would fail in
            `ai_edge_litert`, so it fails here instead); a model quantized
            with `model.quantize(...)` to LiteRT; a `path` that is a file, a
            symbolic link, or a non-empty directory that is not an earlier
            ONNX or LiteRT export (nothing is written then).
        ImportError: the format's converter is not installed (the extra).
    """
    from keras_attn.export.saved_model import PORTABLE_EXPORT
    from keras_attn._directories import check_replaceable
    from keras_attn._directories import replace_directory
    from keras_attn.export.saved_model import require_tensorflow_backend

    if format not in PORTABLE_FORMATS:
        raise ValueError(f"`format` must be one of {PORTABLE_FORMATS}. Received: format={format!r}")
    check_format(format, precision)
    require_tensorflow_backend("export_portable")
    _require_packages(format, precision)
    if format == "litert":
        _refuse_quantized(serving)
    contract = _contract(serving, format, precision, preprocessing or {}, axes)
    taken = sorted(set(extra or {}) & (set(contract) | {"sha256", "run"}))
    if taken:
        raise ValueError(f"`extra` must not replace the contract's own keys. Received: {taken}")
    contract.update(extra or {})

    path = os.path.abspath(os.fspath(path))
    # A file, a link, or a directory that is not an earlier ONNX / LiteRT
    # export is refused before the conversion, and again before replacing.
    check_replaceable(path, PORTABLE_EXPORT)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".export-", dir=parent)
    try:
        target = os.path.join(staging, "model")
        os.makedirs(target)
        file = os.path.join(target, FILES[format])
        signature = _input_signature(serving)
        if format == "onnx":
            graph, weights = _convert_onnx(serving, signature)
            _refuse_unconverted_ops(graph)
            _rename_onnx_outputs(graph, [o["name"] for o in contract["outputs"]])
            if precision == "float16":
                weights = _onnx_to_float16(graph, weights)
            _write_onnx(graph, weights, file)
            del graph, weights
            if precision == "int8":
                _onnx_to_int8(file)
            if precision == "float16":
                import onnx

                onnx.checker.check_model(file)
        else:
            if not isinstance(serving.output, dict):
                # The converter names a lone output "output_0": a dict gives it
                # the contract's name, as the ONNX outputs are renamed.
                import keras

                serving = keras.Model(serving.input, {"probabilities": serving.output})
            serving.export(file, format="litert", input_signature=signature, verbose=verbose,
                           **_litert_options(precision))
        for name, content in (files or {}).items():
            mode = "wb" if isinstance(content, bytes) else "w"
            with open(os.path.join(target, name), mode) as stream:
                stream.write(content)
        contract["sha256"] = {name: sha256_file(os.path.join(target, name))
                              for name in [FILES[format], *(files or {})]}
        with open(os.path.join(target, CONTRACT), "w") as stream:
            json.dump(contract, stream, indent=2)
            stream.write("\n")
        replace_directory(target, path, PORTABLE_EXPORT)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def _convert_onnx(serving, signature):
    """`(model, weights)`: `serving` converted by tf2onnx into an ONNX
    `ModelProto` without its weights, and `[(name, value)]`, the
    initializers `_write_onnx` adds to it (`value()` reads one weight).

    tf2onnx converts a function of the served inputs *and of the weights*
    (`serving.stateless_call`), so the graphs it freezes, folds and rewrites
    hold no weight. Converted as Keras's `model.export` converts (the
    weights frozen into constants), BERT-base's export grew past 11 GB:
    grappler folds a frozen copy of every weight, and each of tf2onnx's
    ~12 optimizer passes copies every constant into its node protos again,
    copies that protobuf's C runtime (upb) keeps until the whole node is
    freed. onnxruntime folds what the graph computes from the initializers
    alone (a transposed kernel) when it loads the model, as tf2onnx would
    have folded it."""
    import keras
    import tensorflow as tf

    from keras_attn._keras_compat import patch_tf2onnx

    tf2onnx = patch_tf2onnx()
    specs = keras.tree.map_structure(
        lambda spec: tf.TensorSpec(spec.shape, spec.dtype, name=spec.name), signature)
    trainable, non_trainable = serving.trainable_variables, serving.non_trainable_variables
    variables = {f"{WEIGHT_PREFIX}{i}": variable
                 for i, variable in enumerate(trainable + non_trainable)}
    # Each weight's shape is set inside the function, not by its input:
    # grappler (which tf2onnx runs twice) feeds every input of a known shape
    # a tensor of zeros of that shape, a copy of the weights each time.
    weight_specs = [tf.TensorSpec([None] * len(variable.shape), variable.dtype, name=name)
                    for name, variable in variables.items()]
    shapes = [variable.shape for variable in variables.values()]
    count = len(trainable)

    def call(*args):
        inputs = args[:-1]
        values = [tf.ensure_shape(value, shape) for value, shape in zip(args[-1], shapes)]
        outputs, _ = serving.stateless_call(values[:count], values[count:], *inputs,
                                            training=False)
        return outputs

    function = tf.function(call, input_signature=[*specs, weight_specs], autograph=False)
    model, _ = tf2onnx.convert.from_function(function, [*specs, weight_specs])
    graph = model.graph
    served = [x for x in graph.input if not x.name.startswith(WEIGHT_PREFIX)]
    del graph.input[:]
    graph.input.extend(served)
    used = _consumed_names(graph)  # a variable the call never reads is left out
    weights = [(name, _reader(variable)) for name, variable in variables.items()
               if name in used]
    return model, weights


def _refuse_unconverted_ops(model):
    """`ValueError` naming the TensorFlow ops tf2onnx left in `model` (it
    logs "Unsupported ops" and writes them into the ONNX graph as they are:
    a file onnxruntime refuses to load, found here rather than by the
    server)."""
    import onnx

    left, graphs = set(), [model.graph]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type):
                left.add(node.op_type)
            graphs.extend(attribute.g for attribute in node.attribute
                          if attribute.type == onnx.AttributeProto.GRAPH)
    if left:
        raise ValueError(
            f"tf2onnx could not convert the ops {sorted(left)} of the model to ONNX: the "
            f"file would not load in onnxruntime. Export to LiteRT, or compute them with "
            f"ops ONNX has. Received: a model whose graph holds {sorted(left)}")


# The names of the weights while tf2onnx converts (graph inputs), then of
# their initializers.
WEIGHT_PREFIX = "keras_attn_weight_"


def _reader(variable):
    import keras
    import numpy as np

    return lambda: np.asarray(keras.ops.convert_to_numpy(variable.value))


def _consumed_names(graph):
    """The names every node of `graph` and of its subgraphs (loop bodies)
    reads."""
    import onnx

    names, graphs = set(), [graph]
    while graphs:
        current = graphs.pop()
        names.update(y.name for y in current.output)
        for node in current.node:
            names.update(node.input)
            graphs.extend(attribute.g for attribute in node.attribute
                          if attribute.type == onnx.AttributeProto.GRAPH)
    return names


def _write_onnx(model, weights, file):
    """Writes `model` with `weights` (`[(name, value)]`, `value()` an array)
    added as initializers of its main graph, one weight in memory at a time:
    two serialized ONNX models written one after the other parse as one
    model, their fields merged (protobuf's rule for a message field that
    occurs twice), so each weight is written as a model of a graph that
    holds only that initializer. `onnx.save` would serialize the whole model
    into one string beside the model's own copy of every weight."""
    import onnx
    from onnx import numpy_helper

    with open(file, "wb") as stream:
        stream.write(model.SerializeToString())
        for name, value in weights:
            tensor = numpy_helper.from_array(value(), name)
            stream.write(onnx.ModelProto(graph=onnx.GraphProto(initializer=[tensor]))
                         .SerializeToString())
            del tensor


def _onnx_to_float16(model, weights):
    """Stores the ONNX model's float32 weights in float16, each followed by
    a Cast back to float32: the file holds half the bytes and the
    arithmetic stays float32, which is what LiteRT's float16 option does
    (onnxruntime folds the casts when it loads the model). Changes `model`'s
    initializers in place and returns `weights` (`_convert_onnx`'s) with
    their new names and values.

    Written here: onnxconverter-common converts the arithmetic to float16
    as well, which ran over 10 minutes without finishing on the speech
    recognizer's graph (a scan of the graph per node it keeps in float32),
    writes Cast nodes onnxruntime refuses to load, and
    would put a log-mel power spectrum through float16 (the failure the
    float16 Conformer once had). A weight with a value float16 cannot
    hold (a -1e9 mask constant) stays float32."""
    import numpy as np
    import onnx
    from onnx import helper
    from onnx import numpy_helper

    count = 0

    def stored_name(value):
        """The float16 weight's name, or None for a weight kept as it is."""
        nonlocal count
        if (value.dtype != np.float32 or value.size < 16
                or not np.isfinite(value.astype("float16")).all()):
            return None
        # Short names: tf2onnx's run to ~100 characters, a tiny model's
        # graph would grow by as much as its weights shrink.
        count += 1
        return f"keras_attn_f16/{count}"

    def cast(stored, name):
        return helper.make_node("Cast", [stored], [name], to=onnx.TensorProto.FLOAT)

    converted, casts = [], []
    for name, value in weights:  # each read once here, once when written
        stored = stored_name(value())
        if stored is None:
            converted.append((name, value))
            continue
        converted.append((stored, lambda value=value: value().astype("float16")))
        casts.append(cast(stored, name))
    graphs = [(model.graph, casts)]
    while graphs:
        graph, casts = graphs.pop()
        kept = []
        for initializer in graph.initializer:
            value = numpy_helper.to_array(initializer)
            stored = None if initializer.data_type != onnx.TensorProto.FLOAT \
                else stored_name(value)
            if stored is None:
                kept.append(initializer)
                continue
            kept.append(numpy_helper.from_array(value.astype("float16"), stored))
            casts.append(cast(stored, initializer.name))
        del graph.initializer[:]
        graph.initializer.extend(kept)
        nodes = casts + list(graph.node)  # the casts first: the order stays topological
        del graph.node[:]
        graph.node.extend(nodes)
        for node in graph.node:  # loop bodies (the translator's search)
            graphs.extend((attribute.g, []) for attribute in node.attribute
                          if attribute.type == onnx.AttributeProto.GRAPH)
    return converted


def _onnx_to_int8(file):
    """Replaces the float ONNX model `file` by onnxruntime's dynamic int8
    quantization of it (`quantize_dynamic`: int8 weights per output
    channel, activations quantized per call, each token with its own scale:
    `_quantize_activations_per_row`). Convolutions stay float (the ViT's
    patch embedding: onnxruntime would quantize its input with one scale
    for the whole batch).

    `quantize_dynamic` quantizes a MatMul or Gemm only where the weight is
    an initializer, and a Gemm not at all; tf2onnx gives the attention
    projections (einsums) as Gemm of a Reshape of the weight. So the model
    is first folded by onnxruntime's basic graph optimizations (the
    reshaped and transposed weights become initializers) and each Gemm of
    a constant weight written as the MatMul (+ Add) it computes: every
    projection is then quantized (BERT-base: 74 of 74, where the model as
    converted gave 26)."""
    import onnx
    import onnxruntime
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic

    folded = file + ".folded.onnx"
    try:
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = folded
        onnxruntime.InferenceSession(file, options, providers=["CPUExecutionProvider"])
        model = onnx.load(folded)
        _gemm_to_matmul(model.graph)
        onnx.save(model, folded)
        del model
        # The products of MatMuls (and the embeddings' Gather, weights only);
        # a convolution's int8 input would take one scale for the whole batch.
        # reduce_range: 7-bit weights. On a CPU without VNNI (AVX2 alone)
        # onnxruntime's uint8 x int8 kernel sums pairs of products in int16,
        # which saturates with full-range weights (255 * 127 * 2 > 32767): a
        # tiny BERT's probabilities moved 0.05 (0.0025 with VNNI); the products
        # of 7-bit weights fit on every x86 CPU.
        quantize_dynamic(folded, file, weight_type=QuantType.QInt8, per_channel=True,
                         reduce_range=True, op_types_to_quantize=["MatMul", "Gather"])
        model = onnx.load(file)
        _quantize_activations_per_row(model.graph)
        onnx.save(model, file)
    finally:
        if os.path.exists(folded):
            os.remove(folded)


def _quantize_activations_per_row(graph):
    """Rewrites each `DynamicQuantizeLinear` of `graph` (one scale for the
    whole activation tensor: an example's int8 answer then depended on the
    other examples of its batch and on its padding's values, 4e-3 apart on a
    tiny BERT) as a symmetric quantization of each row (each token: its own
    scale `max|x| / 127` over the last axis), the way LiteRT's dynamic-range
    kernels quantize their inputs. The rows are stored as uint8 around a
    zero point of 128 (one scalar: onnxruntime's fast uint8 x int8 product;
    int8 rows took 3-4x the float model's time). The scale keeps its
    consumers (the product of the two scales broadcasts over the rows)."""
    import numpy as np
    import onnx
    from onnx import helper
    from onnx import numpy_helper

    prefix = "keras_attn_per_row/"
    constants = {"zero": np.array(128, np.uint8), "tiny": np.array(1e-30, np.float32),
                 "high": np.array(127.0, np.float32), "low": np.array(-127.0, np.float32),
                 "offset": np.array(128.0, np.float32)}
    nodes, rewritten = [], 0
    for node in graph.node:
        if node.op_type != "DynamicQuantizeLinear":
            nodes.append(node)
            continue
        rewritten += 1
        (x,), (y, scale, zero_point), name = node.input, node.output, prefix + node.name
        nodes += [
            helper.make_node("Abs", [x], [name + "/abs"]),
            # axes as an attribute: the opset-15 form (tf2onnx writes opset 15).
            helper.make_node("ReduceMax", [name + "/abs"], [name + "/max"], axes=[-1],
                             keepdims=1),
            helper.make_node("Max", [name + "/max", prefix + "tiny"], [name + "/max_safe"]),
            helper.make_node("Div", [name + "/max_safe", prefix + "high"], [scale]),
            helper.make_node("Div", [x, scale], [name + "/scaled"]),
            helper.make_node("Round", [name + "/scaled"], [name + "/rounded"]),
            helper.make_node("Clip", [name + "/rounded", prefix + "low", prefix + "high"],
                             [name + "/clipped"]),
            helper.make_node("Add", [name + "/clipped", prefix + "offset"], [name + "/shifted"]),
            helper.make_node("Cast", [name + "/shifted"], [y], to=onnx.TensorProto.UINT8),
            helper.make_node("Identity", [prefix + "zero"], [zero_point]),
        ]
    if rewritten:
        graph.initializer.extend(numpy_helper.from_array(value, prefix + key)
                                 for key, value in constants.items())
    # quantize_dynamic rescales each product as `Cast(MatMulInteger) *
    # (a_scale * b_scale)`; onnxruntime fuses that pattern into one op
    # that reads a_scale as one number (a per-row scale gave answers 0.02
    # off on a ViT at its default optimization level, 0.003 without it).
    # Each product is rescaled by the weights' scale, then by its rows'.
    row_scales = {node.output[1] for node in graph.node
                  if node.op_type == "DynamicQuantizeLinear"}
    producers = {output: node for node in nodes for output in node.output}
    fixed, replaced = [], set()
    for node in nodes:
        product = producers.get(node.input[1]) if node.op_type == "Mul" else None
        if (product is None or product.op_type != "Mul"
                or not row_scales & set(product.input)):
            fixed.append(node)
            continue
        replaced.add(product.output[0])
        row_scale = next(name for name in product.input if name in row_scales)
        weight_scale = next(name for name in product.input if name != row_scale)
        partial = node.output[0] + "/by_weight_scale"
        fixed += [helper.make_node("Mul", [node.input[0], weight_scale], [partial],
                                   name=node.name + "/weights"),
                  helper.make_node("Mul", [partial, row_scale], list(node.output),
                                   name=node.name + "/rows")]
    read = {name for node in fixed for name in node.input}
    del graph.node[:]
    graph.node.extend(node for node in fixed
                      if not (set(node.output) & replaced and not set(node.output) & read))


def _gemm_to_matmul(graph):
    """Rewrites in `graph` each `Gemm(A, B, C)` whose B is an initializer
    (alpha 1, A not transposed) as `MatMul(A, B')` (B' = B transposed when
    the Gemm transposes it) followed by `Add(., beta * C)` where it has a
    bias: the same products, in the op `quantize_dynamic` quantizes."""
    import numpy as np
    from onnx import helper
    from onnx import numpy_helper

    initializers = {tensor.name: tensor for tensor in graph.initializer}
    readers = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    nodes = []
    for node in graph.node:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (node.op_type != "Gemm" or node.input[1] not in initializers
                or attributes.get("alpha", 1.0) != 1.0 or attributes.get("transA", 0)):
            nodes.append(node)
            continue
        weight = node.input[1]
        if attributes.get("transB", 0):
            value = numpy_helper.to_array(initializers[weight]).T
            name = weight if readers[weight] == 1 else f"{weight}/transposed/{node.name}"
            tensor = numpy_helper.from_array(np.ascontiguousarray(value), name)
            if name == weight:
                initializers[weight].CopyFrom(tensor)
            else:
                graph.initializer.append(tensor)
            weight = name
        beta = attributes.get("beta", 1.0)
        bias = node.input[2] if len(node.input) > 2 and node.input[2] and beta != 0 else None
        product = node.output[0] if bias is None else f"{node.output[0]}/matmul"
        nodes.append(helper.make_node("MatMul", [node.input[0], weight], [product],
                                      name=f"{node.name}/matmul"))
        if bias is not None:
            if beta != 1.0:
                if bias not in initializers:
                    raise ValueError(f"Gemm {node.name!r}: a bias scaled by beta={beta} must be "
                                     "a constant")
                scaled = numpy_helper.to_array(initializers[bias]) * beta
                bias = f"{bias}/beta/{node.name}"
                graph.initializer.append(numpy_helper.from_array(scaled, bias))
            nodes.append(helper.make_node("Add", [product, bias], [node.output[0]],
                                          name=f"{node.name}/bias"))
    del graph.node[:]
    graph.node.extend(nodes)


def _litert_options(precision):
    import tensorflow as tf

    # Builtin ops only: an artifact that needs the Flex delegate (TensorFlow
    # ops inside LiteRT) does not run in `ai_edge_litert`'s interpreter, and
    # the error would come at serving time. Keras's default allows them.
    options = {"target_spec": {"supported_ops": [tf.lite.OpsSet.TFLITE_BUILTINS]}}
    if precision == "float16":
        options["optimizations"] = [tf.lite.Optimize.DEFAULT]
        options["target_spec"]["supported_types"] = [tf.float16]
    elif precision == "int8":
        options["optimizations"] = [tf.lite.Optimize.DEFAULT]
    return options


def _refuse_quantized(serving):
    """The TensorFlow Lite converter cannot take Keras's quantized layers
    (their int8 kernels go into a BatchMatMul it refuses, a raw MLIR
    `ConverterError`): named here, before the conversion."""
    from keras_attn._keras_compat import sublayers

    for layer in sublayers(serving):
        mode = getattr(layer, "quantization_mode", None) or getattr(
            getattr(layer, "dtype_policy", None), "quantization_mode", None)
        if mode:
            raise ValueError(
                f"A Keras model quantized with `model.quantize({mode!r})` cannot be converted "
                "to LiteRT (the TensorFlow Lite converter refuses its quantized matmuls). "
                "Export the float model with precision='int8' instead (the converter's "
                "dynamic-range int8 weights), or export the quantized model with "
                f"format='onnx'. Received: layer {layer.name!r} with quantization_mode="
                f"{mode!r}, format='litert'")


def sha256_file(path):
    """The hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_contract(path):
    """`serving.json` of the export directory `path`, checked to be one:
    `ValueError` naming the file when it is missing, not JSON, or lacks a
    key a server reads."""
    file = os.path.join(os.fspath(path), CONTRACT)
    if not os.path.isfile(file):
        raise ValueError(f"{file} does not exist: {path} is not an ONNX or LiteRT export. "
                         f"Received: path={os.fspath(path)!r}")
    try:
        with open(file, encoding="utf-8") as stream:
            contract = json.load(stream)
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{file} is not valid JSON ({error}): export the model again. "
                         f"Received: path={os.fspath(path)!r}") from None
    keys = ("format", "file", "inputs", "outputs", "sha256")
    missing = [key for key in keys if not isinstance(contract, dict) or key not in contract]
    if missing:
        raise ValueError(
            f"{file} lacks {', '.join(missing)} (written by another program, or by "
            "keras_attn before it recorded the files' sha256): export the model again. "
            f"Received: path={os.fspath(path)!r}")
    for kind in ("inputs", "outputs"):
        specs = contract[kind]
        if (not isinstance(specs, list) or not specs or not all(
                isinstance(spec, dict) and isinstance(spec.get("name"), str)
                and isinstance(spec.get("dtype"), str) and isinstance(spec.get("shape"), list)
                for spec in specs)):
            raise ValueError(f"{file}: `{kind}` must be a list of {{name, dtype, shape}}. "
                             f"Received: {kind}={specs!r}")
    if contract["format"] not in PORTABLE_FORMATS:
        raise ValueError(f"{file}: `format` must be one of {PORTABLE_FORMATS}. "
                         f"Received: format={contract['format']!r}")
    if contract["file"] != FILES[contract["format"]]:
        raise ValueError(f"{file}: a {contract['format']} export's model is "
                         f"{FILES[contract['format']]}. Received: file={contract['file']!r}")
    return contract


def verify_files(path, contract):
    """`ValueError` naming each file of the export that is missing or whose
    sha256 is not the one `serving.json` recorded (a damaged or replaced
    file)."""
    digests = contract["sha256"]
    if not isinstance(digests, dict) or contract["file"] not in digests:
        raise ValueError(f"{os.path.join(path, CONTRACT)} records no sha256 of "
                         f"{contract['file']}. Received: sha256={digests!r}")
    for name, expected in digests.items():
        file = os.path.join(path, name)
        if os.path.basename(name) != name:
            raise ValueError(f"{os.path.join(path, CONTRACT)}: sha256 names a file outside "
                             f"the export. Received: {name!r}")
        if not os.path.isfile(file):
            raise ValueError(f"{file} does not exist ({CONTRACT} describes it): copy the "
                             f"whole export directory. Received: path={path!r}")
        got = sha256_file(file)
        if got != expected:
            raise ValueError(
                f"{file} is damaged or was replaced: its sha256 is {got}, {CONTRACT} "
                f"recorded {expected}. Export the model again. Received: path={path!r}")


class Artifact:
    """An exported ONNX or LiteRT directory, run in its own runtime
    (onnxruntime's `InferenceSession`, ai_edge_litert's `Interpreter`):
    neither TensorFlow nor Keras is imported. `num_threads`: the runtime's
    intra-op threads (None: its default).

    Loading checks the directory against `serving.json`: every file's
    sha256, and the model's input and output names. Each call is checked
    against the contract before the runtime sees it (the inputs' names,
    dtypes, ranks and fixed sizes, no axis of size 0, the same batch and
    the same size of each shared axis in every input): a `ValueError`
    naming the input and the shape received. The runtimes do not all fail
    cleanly on such calls: LiteRT's interpreter, resized to a wrong shape
    once, corrupts its heap on the next call.

    >>> # artifact = Artifact("exported/vit_onnx")
    >>> # artifact(images=uint8_batch)["probabilities"]   # (B, K)
    """

    def __init__(self, path, num_threads=None):
        path = os.fspath(path)
        self.contract = read_contract(path)
        self.format = self.contract["format"]
        verify_files(path, self.contract)
        file = os.path.join(path, self.contract["file"])
        try:
            if self.format == "onnx":
                import onnxruntime

                options = onnxruntime.SessionOptions()
                if num_threads is not None:
                    options.intra_op_num_threads = int(num_threads)
                self._session = onnxruntime.InferenceSession(
                    file, options, providers=["CPUExecutionProvider"])
                inputs = [x.name for x in self._session.get_inputs()]
                outputs = [y.name for y in self._session.get_outputs()]
            else:
                from ai_edge_litert.interpreter import Interpreter

                self._interpreter = Interpreter(model_path=file, num_threads=num_threads)
                # Resizes the inputs to each call's shapes.
                self._runner = self._interpreter.get_signature_runner()
                inputs = list(self._runner.get_input_details())
                outputs = list(self._runner.get_output_details())
        except Exception as error:  # the runtime's own types (InvalidProtobuf, ...)
            raise ValueError(f"{file} does not load in the {self.format} runtime "
                             f"({type(error).__name__}: {error}). Received: path={path!r}") \
                from None
        for kind, names in (("inputs", inputs), ("outputs", outputs)):
            described = [spec["name"] for spec in self.contract[kind]]
            if sorted(names) != sorted(described):
                raise ValueError(
                    f"{os.path.join(path, CONTRACT)} describes the {kind} {described}; "
                    f"{file} has {sorted(names)}. Export the model again. "
                    f"Received: path={path!r}")

    @property
    def labels(self):
        """The class name of each output index (`serving.json`'s
        `"labels"`), or None where the export was written without them."""
        return self.contract.get("labels")

    @property
    def input_names(self):
        return [spec["name"] for spec in self.contract["inputs"]]

    def check_inputs(self, inputs):
        """`inputs` as NumPy arrays, each checked against `serving.json`;
        `ValueError` naming the input and what was received."""
        import numpy as np

        names = self.input_names
        missing = [name for name in names if name not in inputs]
        unexpected = sorted(name for name in inputs if name not in names)
        if missing or unexpected:
            raise ValueError(
                f"The inputs must be {names}. Received: {sorted(inputs)} (missing "
                f"{missing}, unexpected {unexpected})")
        arrays, shared = {}, {}
        for spec in self.contract["inputs"]:
            name, shape = spec["name"], spec["shape"]
            value = np.asarray(inputs[name])
            received = f"Received: {name}.shape={value.shape}, dtype={value.dtype}"
            if value.dtype != np.dtype(spec["dtype"]):
                raise ValueError(f"Input `{name}` must be {spec['dtype']}. {received}")
            if value.ndim != len(shape):
                raise ValueError(f"Input `{name}` must have rank {len(shape)} (shape "
                                 f"{_shape_text(shape)}). {received}")
            axes = spec.get("axes") or _default_axes(shape)
            for axis, (size, fixed, axis_name) in enumerate(zip(value.shape, shape, axes)):
                if fixed != -1 and size != fixed:
                    raise ValueError(f"Input `{name}` must have shape {_shape_text(shape)}: "
                                     f"{fixed} on axis {axis}. {received}")
                if size < 1:
                    what = "a batch of 0" if axis_name == "batch" else f"size 0 on axis {axis}"
                    raise ValueError(f"Input `{name}` is empty ({what}). {received}")
                if axis_name is not None:
                    first = shared.setdefault(axis_name, (name, axis, value.shape))
                    if first[2][first[1]] != size:
                        raise ValueError(
                            f"Inputs `{first[0]}` and `{name}` must have the same {axis_name} "
                            f"(axis {first[1]} and axis {axis}). Received: {first[0]}.shape="
                            f"{first[2]}, {name}.shape={value.shape}")
            arrays[name] = value
        return arrays

    def __call__(self, **inputs):
        inputs = self.check_inputs(inputs)
        if self.format == "onnx":
            names = [output["name"] for output in self.contract["outputs"]]
            return dict(zip(names, self._session.run(names, inputs)))
        return dict(self._runner(**inputs))


def _shape_text(shape):
    return "(" + ", ".join("B" if size == -1 and axis == 0 else "any" if size == -1 else
                           str(size) for axis, size in enumerate(shape)) + ")"
