"""Each batch checked inside the `tf.data` pipeline, before it reaches a
compiled step: the same rules as the models' checks on concrete data (ids
and labels in range, masks boolean or 0/1, lengths up to the maximum) and,
for CTC, labels the utterance can emit. A bad batch stops the pipeline with
`tf.errors.InvalidArgumentError` whose message starts with `DATA_CHECK`
and names the input and the range (the command line prints it and exits
with status 2).

Cheap: a min and a max per input per batch, on the pipeline's own threads.
"""

import contextlib

from keras_attn._guard import IdSpec
from keras_attn._guard import MaskSpec
from keras_attn.errors import DataCheckError
from keras_attn._base.quiet_tensorflow import tensorflow_module
from keras_attn._base.quiet_tensorflow import traced_as_written

DATA_CHECK = "keras_attn data check:"


def _named(model, x):
    names = [tensor.name for tensor in model.inputs]
    if isinstance(x, dict):
        return {name: x[name] for name in names if name in x}
    if isinstance(x, (list, tuple)) and len(x) == len(names):
        return dict(zip(names, x))
    if len(names) == 1:
        return {names[0]: x}
    return {}


def _in_range(tf, name, value, spec):
    value = tf.cast(value, tf.int64)
    message = f"{DATA_CHECK} `{name}` must lie in [{spec.low}, {spec.high})"
    return [
        tf.debugging.assert_greater_equal(value, tf.constant(spec.low, tf.int64),
                                          message=message, summarize=8),
        tf.debugging.assert_less(value, tf.constant(spec.high, tf.int64),
                                 message=message, summarize=8),
    ]


def _ctc_frames_needed(tf, labels):
    """`keras_attn.models.conformer.ctc_frames_needed` in TensorFlow."""
    labels = tf.cast(labels, tf.int64)
    real = labels > 0
    repeats = tf.logical_and(real[:, 1:], tf.equal(labels[:, 1:], labels[:, :-1]))
    return (tf.reduce_sum(tf.cast(real, tf.int64), axis=1)
            + tf.reduce_sum(tf.cast(repeats, tf.int64), axis=1))


def check_batches(dataset, model):
    """`dataset` (of `(x, y)` or `(x, y, sample_weight)` batches for
    `model`) with every batch checked against what `model` accepts."""
    from keras_attn.layers.conv_subsampling import subsampled_length
    from keras_attn.layers.fast_conv_subsampling import fast_subsampled_length
    from keras_attn.models.conformer.conformer_config import feature_frames

    tf = tensorflow_module()

    specs = model.input_specs()
    max_length = model.max_length()
    label_specs = model.label_specs()

    def check(x, y=None, *rest):
        named = _named(model, x)
        assertions = []
        for name, spec in specs.items():
            if name not in named:
                continue
            value = named[name]
            if isinstance(spec, IdSpec):
                assertions += _in_range(tf, name, value, spec)
            elif isinstance(spec, MaskSpec):
                if value.dtype != tf.bool:
                    binary = tf.logical_or(tf.equal(value, 0), tf.equal(value, 1))
                    assertions.append(tf.debugging.assert_equal(
                        tf.reduce_all(binary), True,
                        message=f"{DATA_CHECK} `{name}` must be boolean or hold only 0 and 1"))
                if value.shape.rank == 2:
                    real = tf.reduce_any(tf.not_equal(tf.cast(value, tf.int32), 0), axis=1)
                    assertions.append(tf.debugging.assert_equal(
                        tf.reduce_all(real), True,
                        message=f"{DATA_CHECK} `{name}` has a row of padding only "
                                "(no real token): leave such rows out"))
        for name, limit in max_length.items():
            if name in named:
                assertions.append(tf.debugging.assert_less_equal(
                    tf.shape(named[name])[1], limit,
                    message=f"{DATA_CHECK} `{name}` is longer than max_sequence_length={limit}"))
        if y is not None and label_specs:
            if isinstance(y, dict):
                pairs = [(name, y[name]) for name in label_specs if name in y]
            else:
                pairs = [(next(iter(label_specs)), y)] if len(label_specs) == 1 else []
            for name, value in pairs:
                label = f"labels[{name!r}]" if name else "labels"
                assertions += _in_range(tf, label, value, label_specs[name])
        config = getattr(model, "conformer_config", None)
        if config is not None and y is not None and "waveform_length" in named:
            lengths = tf.cast(named["waveform_length"], tf.int64)
            assertions += [
                tf.debugging.assert_greater_equal(
                    lengths, tf.constant(0, tf.int64),
                    message=f"{DATA_CHECK} `waveform_length` must not be negative"),
                tf.debugging.assert_less_equal(
                    lengths, tf.cast(tf.shape(named["waveform"])[1], tf.int64),
                    message=f"{DATA_CHECK} `waveform_length` must be at most the padded length"),
            ]
            # The front end's feature frames (`1 + L // hop`, or Parakeet's `L // hop`).
            frames = feature_frames(config, lengths)
            fast = getattr(config, "subsampling", "conv") == "fast"
            # The FastConformer's 8x (`fast_subsampled_length`: only + and //).
            frames = fast_subsampled_length(frames) if fast else subsampled_length(
                frames, maximum=tf.maximum)
            real = tf.cast(y, tf.int64) > 0
            gaps = tf.logical_and(tf.logical_not(real[:, :-1]), real[:, 1:])
            assertions.append(tf.debugging.assert_equal(
                tf.reduce_any(gaps), False,
                message=f"{DATA_CHECK} `labels` must be each transcript ids followed by 0s "
                        "(a 0 inside a transcript)"))
            if getattr(model, "ctc_alignment", True):
                assertions.append(tf.debugging.assert_less_equal(
                    _ctc_frames_needed(tf, y), frames,
                    message=f"{DATA_CHECK} a CTC label sequence is longer than its utterance "
                            f"can emit after {8 if fast else 4}x subsampling (labels needed "
                            "vs frames)",
                    summarize=8))
            else:  # a transducer emits any number of labels at a frame: it needs one
                assertions.append(tf.debugging.assert_greater_equal(
                    frames, tf.constant(1, frames.dtype),
                    message=f"{DATA_CHECK} an utterance gives no frame after "
                            f"{8 if fast else 4}x subsampling (a transducer needs one)",
                    summarize=8))
        with tf.control_dependencies(assertions):
            x = tf.nest.map_structure(tf.identity, x)
        return (x,) + (() if y is None else (y,)) + tuple(rest)

    return dataset.map(traced_as_written(check), num_parallel_calls=tf.data.AUTOTUNE,
                       deterministic=True)


@contextlib.contextmanager
def data_check_errors():
    """Inside: a batch refused by `check_batches` (TensorFlow's
    `InvalidArgumentError`, wherever the pipeline ran) comes out as a
    `keras_attn.errors.DataCheckError` with the check's message, so that
    callers catch it by type."""
    try:
        yield
    except Exception as error:
        if not is_data_check_error(error):
            raise
        raise DataCheckError(data_check_message(error)) from error


def is_data_check_error(error):
    """Whether `error` (a `tf.errors.InvalidArgumentError`) is one of ours."""
    return DATA_CHECK in str(getattr(error, "message", error))


def data_check_message(error):
    """The first line of a data check's error: what failed and the values."""
    text = str(getattr(error, "message", error))
    start = text.index(DATA_CHECK)
    lines = text[start:].splitlines()
    return " ".join(line.strip() for line in lines[:3] if line.strip())
