"""The one table of tiny models per family, for every test in tests/ (the
directories import it as `from _families import FAMILIES`: tests/conftest.py
puts tests/ on `sys.path`; a subprocess script inserts it itself). A test
that needs a tiny model takes it from here rather than writing its own sizes:
the checks run on each family (the model harness `run_model_test`, LoRA,
int8, remat, bad input, model parallel, the template's checks) and every
other test of a tiny model (saving, export, conversion, data checks, tasks).

A family's tiny model is its preset shrunk by `Family.tiny`, then by the
test's own overrides (a vocabulary whose size an error message names,
dropout off for a deterministic training pass, sizes that divide over four
devices):

    bert = FAMILIES["bert"]
    model = bert.build(num_layers=1)        # the task model (a classifier)
    x, y = bert.batch(size=4, length=8)     # a batch that fits it, labels
    alone = bert.crop(x, 1)                 # example 1 alone, unpadded

`FAMILIES` (`NAMES`) holds the four families and ModernBERT, whose code is
its own (every shared check runs on it); `VARIANTS` holds the variants whose
code is a family's (DINOv2 with registers: ViT's), which only the deployment
checks run (LoRA, int8, the exports; `NAMES` leaves them out); `TABLE` is
both, by name.
"""

import dataclasses
from typing import Callable

import keras
import numpy as np

from keras_attn.models import BertSequenceClassifier
from keras_attn.models import ModernBertSequenceClassifier
from keras_attn.models import build_bert
from keras_attn.models import build_conformer
from keras_attn.models import build_modernbert
from keras_attn.models import build_transformer
from keras_attn.models import build_vit
from keras_attn.models import get_bert_config
from keras_attn.models import get_conformer_config
from keras_attn.models import get_modernbert_config
from keras_attn.models import get_transformer_config
from keras_attn.models import get_vit_config
from test_case import to_numpy

NUM_CLASSES = 3  # the classifiers' (BERT, ViT)


@dataclasses.dataclass(frozen=True)
class Family:
    """One family's tiny model and the data that fits it.

    `make_batch(config, size, length, rng, fill)` returns `(x, y)`: `size`
    examples whose row i is `i * length // (2 * size)` steps shorter than
    `length` (row 0 unpadded), padding filled with zeros or, where the
    inputs allow it (the mask is an input), with noise (`fill="noise"`).
    `crop_example(config, x, i)` is example i alone at its own length: the
    harness checks that its outputs are those of row i of the batch.
    """

    name: str
    preset: str
    tiny: dict
    heads: tuple  # the task head's layer names ((): none)
    get_config: Callable
    build_backbone: Callable  # config -> model (the BERT backbone; the model elsewhere)
    build_task: Callable  # config -> the family's task model
    make_batch: Callable
    crop_example: Callable
    default_length: int

    def config(self, **overrides):
        return self.get_config(self.preset, **{**self.tiny, **overrides})

    def build(self, **overrides):
        return self.build_task(self.config(**overrides))

    def backbone(self, **overrides):
        return self.build_backbone(self.config(**overrides))

    def batch(self, size=2, length=None, seed=0, padded=True, fill="noise", **overrides):
        """`(x, y)` for the model `build(**overrides)` builds."""
        length = self.default_length if length is None else length
        lengths = [length - (i * length // (2 * size) if padded else 0) for i in range(size)]
        return self.make_batch(self.config(**overrides), lengths, np.random.default_rng(seed),
                               fill)

    def inputs(self, **kwargs):
        return self.batch(**kwargs)[0]

    def crop(self, x, i, **overrides):
        """Example i of `x` alone, at its own length."""
        return self.crop_example(self.config(**overrides), x, i)


def _padding(lengths, width=None):
    width = max(lengths) if width is None else width
    return (np.arange(width)[None] < np.asarray(lengths)[:, None]).astype("int32")


def _filled(values, mask, rng, fill, low, high):
    """`values` where `mask`, else zeros or random values in [low, high)."""
    noise = rng.integers(low, high, values.shape) if fill == "noise" else 0
    return np.where(mask == 1, values, noise).astype(values.dtype)


# === BERT: a sequence classifier on the backbone ===


def _bert_batch(config, lengths, rng, fill):
    mask = _padding(lengths)
    ids = rng.integers(1, config.vocabulary_size, mask.shape).astype("int32")
    segments = (np.arange(mask.shape[1]) >= mask.shape[1] // 2)[None].repeat(len(lengths), 0)
    x = {"token_ids": _filled(ids, mask, rng, fill, 1, config.vocabulary_size),
         "segment_ids": _filled(segments.astype("int32"), mask, rng, fill, 0, 2),
         "padding_mask": mask}
    return x, rng.integers(0, NUM_CLASSES, len(lengths)).astype("int32")


def _bert_crop(config, x, i):
    n = int(np.sum(x["padding_mask"][i]))
    return {k: v[i:i + 1, :n] for k, v in x.items()}


# === ViT: images (no padding) ===


def _vit_batch(config, lengths, rng, fill):
    shape = (len(lengths), config.image_size, config.image_size, config.num_channels)
    return (rng.integers(0, 256, shape).astype("uint8"),
            rng.integers(0, config.num_classes or NUM_CLASSES, len(lengths)).astype("int32"))


def _vit_crop(config, x, i):
    return x[i:i + 1]


# === Transformer: source and target ids, padded with pad_id ===


def _transformer_batch(config, lengths, rng, fill):
    """Sources of the given lengths, targets one token shorter (the decoder
    reads target[:-1] and predicts target[1:]); pad_id marks padding, so the
    padding cannot be noise."""
    vocabulary = config.vocabulary_size
    source = _padding(lengths) * rng.integers(1, vocabulary, (len(lengths), max(lengths)))
    target_mask = _padding([n - 1 for n in lengths], max(lengths))
    target = target_mask * rng.integers(1, vocabulary, target_mask.shape)
    source, target = (np.where(a == 0, config.pad_id, np.where(a == config.pad_id, 1, a))
                      .astype("int32") for a in (source, target))
    return [source, target[:, :-1]], target[:, 1:]


def _transformer_crop(config, x, i):
    source, target = x
    source_length = int(np.sum(source[i] != config.pad_id))
    target_length = int(np.sum(target[i] != config.pad_id))
    return [source[i:i + 1, :source_length], target[i:i + 1, :target_length]]


# === Conformer: waveforms and their lengths, CTC labels ===

SAMPLES_PER_STEP = 500  # `length` counts steps of 500 samples (~3 frames)


def _conformer_batch(config, lengths, rng, fill):
    samples = [n * SAMPLES_PER_STEP for n in lengths]
    mask = _padding(samples)
    speech = rng.standard_normal(mask.shape) * 0.1
    noise = rng.standard_normal(mask.shape) * 0.5 if fill == "noise" else 0.0
    x = {"waveform": np.where(mask == 1, speech, noise).astype("float32"),
         "waveform_length": np.asarray(samples, "int32")}
    labels = rng.integers(1, config.vocabulary_size + 1, (len(lengths), 3))
    labels[1::2, 2] = 0  # every other transcript is 2 labels long
    return x, labels.astype("int32")


def _conformer_crop(config, x, i):
    n = int(x["waveform_length"][i])
    return {"waveform": x["waveform"][i:i + 1, :n], "waveform_length": x["waveform_length"][i:i + 1]}


def _modernbert_batch(config, lengths, rng, fill):
    mask = _padding(lengths)
    ids = rng.integers(1, config.vocabulary_size, mask.shape).astype("int32")
    x = {"token_ids": _filled(ids, mask, rng, fill, 1, config.vocabulary_size),
         "padding_mask": mask}
    return x, rng.integers(0, NUM_CLASSES, len(lengths)).astype("int32")


def _modernbert_classifier(config):
    return ModernBertSequenceClassifier(build_modernbert(config), num_classes=NUM_CLASSES,
                                        dropout=config.dropout)


def _bert_classifier(config):
    return BertSequenceClassifier(build_bert(config), num_classes=NUM_CLASSES,
                                  dropout=config.dropout)


FAMILIES = {
    "bert": Family(
        "bert", "bert_tiny",
        dict(vocabulary_size=40, num_layers=2, hidden_dim=16, num_heads=2, intermediate_dim=32,
             max_sequence_length=16),
        ("classifier",), get_bert_config, build_bert, _bert_classifier,
        _bert_batch, _bert_crop, default_length=9),
    "vit": Family(
        "vit", "vit_tiny_16",
        dict(image_size=16, patch_size=4, num_layers=2, hidden_dim=16, num_heads=2,
             intermediate_dim=32, num_classes=NUM_CLASSES),
        ("classifier",), get_vit_config, build_vit, build_vit,
        _vit_batch, _vit_crop, default_length=1),
    "transformer": Family(
        "transformer", "transformer_base",
        dict(vocabulary_size=30, hidden_dim=16, intermediate_dim=32, num_heads=2,
             num_encoder_layers=1, num_decoder_layers=1),
        (), get_transformer_config, build_transformer, build_transformer,
        _transformer_batch, _transformer_crop, default_length=6),
    "conformer": Family(
        "conformer", "conformer_tiny",
        dict(vocabulary_size=6, num_layers=2, hidden_dim=16, num_heads=2, intermediate_dim=32,
             num_mel_bins=20, freq_mask_width=8),
        ("ctc_logits",), get_conformer_config, build_conformer, build_conformer,
        _conformer_batch, _conformer_crop, default_length=8),
    # Two blocks: block 0 global without its attention LayerNorm, block 1
    # local (a window of 4, shorter than the default batch's 9 tokens).
    "modernbert": Family(
        "modernbert", "modernbert_base",
        dict(vocabulary_size=40, num_layers=2, hidden_dim=16, num_heads=2, intermediate_dim=32,
             local_window=4, max_sequence_length=16, pad_id=0),
        ("head_dense", "classifier"), get_modernbert_config, build_modernbert,
        _modernbert_classifier, _modernbert_batch, _bert_crop, default_length=9),
}
NAMES = sorted(FAMILIES)


# === Variants (issue 58): other architectures of a family's kind, checked
# where a family's deployment is (LoRA, int8, the exports), not by every
# family-wide test: NAMES leaves them out. (ModernBERT, a variant too, has
# its own code paths -- local attention, RoPE, a packed MLM -- so it is in
# FAMILIES and gets every shared check, issue 69.) ===


VARIANTS = {
    # DINOv2 with registers: the preset's registers, LayerScale, [CLS] +
    # mean-patch head and ImageNet normalisation, with SwiGLU (DINOv2
    # giant's MLP, the zoo recipe's); LayerScale 0.5, not a value of 1
    # that would hide a LayerScale left out.
    "dinov2": Family(
        "dinov2", "dinov2_registers_small_14",
        dict(image_size=16, patch_size=4, num_layers=2, hidden_dim=16, num_heads=2,
             intermediate_dim=32, num_classes=NUM_CLASSES, num_register_tokens=2,
             layer_scale_init=0.5, feed_forward="swiglu"),
        ("classifier",), get_vit_config, build_vit, build_vit,
        _vit_batch, _vit_crop, default_length=1),
}
VARIANT_NAMES = sorted(VARIANTS)
TABLE = {**FAMILIES, **VARIANTS}  # every tiny model, by name


def outputs(model, inputs):
    """Every output of `model` on `inputs` (inference), as NumPy arrays.

    On JAX through `predict_on_batch` (one compiled program): called op by
    op, JAX compiles every primitive of the model on its first call, which
    made these tests ~2x slower there. Elsewhere a plain call."""
    if keras.backend.backend() == "jax":
        return [to_numpy(o) for o in keras.tree.flatten(model.predict_on_batch(inputs))]
    return [to_numpy(o) for o in keras.tree.flatten(model(inputs, training=False))]


def unallocated(build, *args, **kwargs):
    """`build(*args, **kwargs)` with every variable given its shape and no
    value: `keras.StatelessScope` defers the initializers, and this one never
    runs them (`keras.backend.clear_session()` drops the deferred list).
    Enough for `count_params()`, which reads shapes only: a full-size model
    counted without drawing its 100M-300M random weights."""
    with keras.StatelessScope(initialize_variables=False):
        return build(*args, **kwargs)


def with_value(x, name, index, value):
    """`x` (a dict of arrays) with `x[name][index] = value`, a copy."""
    x = dict(x)
    x[name] = x[name].copy()
    x[name][index] = value
    return x
