"""Training recipes: load a recipe JSON, apply `--set` overrides, validate it
completely before anything trains, and fill in the defaults.

A recipe is `models/<family>/<name>.json`. `load_recipe(path, overrides)`
returns the *resolved* recipe: every key present, defaults filled in, the
dict that `keras-attn train` writes to `<run>/recipe.json`. Any problem is a
`ValueError` that names the dotted key and the value received, e.g.
"Recipe key `training.optimizer.name` must be one of ['adam', 'adamw'].
Received: training.optimizer.name='sgd'".

Schema (type, default; "required" has none; `|null` allows null)
=================================================================

Top level:
    name            str, required. Equal to the file's stem, unique in the zoo.
    family          str, required. vit | bert | transformer | conformer.
    task            str, required. The family's task: vit ->
                    image_classification, bert -> masked_lm, transformer ->
                    translation, conformer -> speech_ctc.
    description     str, "". One sentence.
    model           object, required:
        preset      str, required. A preset of the family (VIT_PRESETS, ...).
        overrides   object, {}. Fields of the family's config dataclass
                    (ViTConfig, BertConfig, TransformerConfig,
                    ConformerConfig), each of the field's type; e.g. remat
                    (bool, false: gradient checkpointing of the blocks,
                    `--set model.overrides.remat=true`). The task sets
                    some from the data, and they may not be overridden:
                    vit num_classes; bert, transformer and conformer
                    vocabulary_size;
                    transformer target_vocabulary_size and pad_id.
    data            object, required: `dataset` and the task's keys below.
        dataset     str, required. "embedded" (the family's offline data set)
                    or "tfds:<name>[/<config>]", a name that
                    `tfds.list_builders()` knows (checked without
                    downloading anything; see data.download below).
    training        object, required:
        batch_size  int >= 1, required. The global batch (all replicas).
        epochs      int >= 1, required.
        steps_per_epoch  int >= 1|null, null: one pass over the training
                    data (for tfds streams: examples // batch_size).
        optimizer   object, required:
            name          str, required. adam | adamw.
            learning_rate float > 0, 0.001. The peak rate of the schedule
                          (unused by the "transformer" schedule).
            beta_1        float in [0, 1), 0.9.
            beta_2        float in [0, 1), 0.999.
            epsilon       float > 0, 1e-7.
            weight_decay  float >= 0|null, null: the optimizer's default
                          (none for adam, 0.004 for adamw).
            clipnorm      float > 0|null, null.
        schedule    object, {"name": "constant"}:
            name          str, required. constant | cosine | linear | transformer.
                          constant: no other key.
                          cosine: linear warmup, then cosine decay to
                          alpha * learning_rate at the last step.
                          linear: linear warmup, then linear decay to 0.
                          transformer: the paper's
                          scale * d_model^-0.5 * min(step^-0.5,
                          step * warmup^-1.5).
            warmup_steps  number >= 0 (cosine, linear: 0; transformer:
                          4000). Below 1: a fraction of all training steps;
                          else a whole number of steps.
            alpha         float in [0, 1], 0.0 (cosine only).
            scale         float > 0, 1.0 (transformer only).
        precision   str, "float32". float32 | mixed_float16 | mixed_bfloat16.
        seed        int, 0. Weights, data order, augmentation and masking.
        checkpoint_every  int >= 1, 100. Optimizer steps between checkpoints
                    (there is always one at the end of each epoch too).
        jit_compile bool or "auto", "auto". Passed to `Model.compile`.
    evaluation      object, {}: `metric` and the task's keys below.
        metric      str, the task's first metric below. The headline number
                    of results.json.
    expected        object|null, null. What `keras-attn train` measured:
        metric, value, hardware, train_seconds, date: all required
        (str, number, str, number, str); metric equals evaluation.metric.
    paper           object|null, null. The published reference:
        parameters  int|null, null.
        result      str|null, null.
        source      str, required. "Author et al. year, Table n".

Task keys
=========

"embedded only" keys are refused with a tfds dataset and "tfds only" keys
with the embedded one. Every task also takes these tfds-only keys:
    data.data_dir             str|null, null. Where tfds keeps its data.
    data.download             bool, false. Let tfds download and prepare the
                    data set when it is not in data_dir (else it must be).

image_classification (vit). Embedded: scikit-learn's 1,797 8 x 8 digits,
resized to the model's image_size and repeated to its num_channels; tfds:
any image classification set (num_classes from its features).
    data.validation_fraction  float in [0, 1), 0.1. Share of the training
                    images held out for validation (tfds: when
                    validation_split is null, the end of train_split).
    data.test_fraction        float in (0, 1), 0.2. Embedded only: the
                    stratified test split (drawn with training.seed, as are
                    every task's splits).
    data.augmentation         object, {}: zoom (float in [0, 1), 0.0: at
                    most this share of the side cropped away), translation
                    (float in [0, 1), 0.0: shift share), flip (bool, false:
                    horizontal flips; wrong for digits). Stateless, keyed by
                    seed, epoch and batch.
    data.train_split          str, "train". tfds only.
    data.validation_split     str|null, null. tfds only.
    data.test_split           str, "test". tfds only.
    data.image_key            str, "image". tfds only.
    data.label_key            str, "label". tfds only.
    evaluation.metric         accuracy (test top-1, `Model.evaluate`).

masked_lm (bert; BERT pretraining, masked LM + next sentence). Embedded:
the English documentation inside CPython (`pydoc_data.topics`); tfds: any
text set, each example a document.
    data.sequence_length      int >= 8, 128. `[CLS] A [SEP] B [SEP]` length.
    data.vocabulary_size      int >= 16, 8000. WordPieces to learn from the
                    training documents (the model gets the learned size).
    data.mask_rate            float in (0, 1), 0.15.
    data.max_predictions      int >= 1|null, null: round(sequence_length *
                    mask_rate) + 4.
    data.test_documents       int >= 2, 8. Documents held out for the test
                    (the first ones).
    data.validation_documents int, 0 or >= 2, 4. The next ones, for
                    validation.
    data.split                str, "train". tfds only.
    data.text_key             str, "text". tfds only.
    data.max_documents        int >= 1|null, null: all. Read only the first
                    ones (quick experiments).
    evaluation.metric         mlm_loss | mlm_accuracy | mlm_perplexity |
                    nsp_accuracy (held-out documents, masks fixed by the seed).

translation (transformer). Embedded: English number words -> Japanese
numerals (num2words), numbers split at random; tfds: any translation set.
    data.vocabulary_size      int >= 8, 1000. The shared WordPiece vocabulary.
    data.bucket_boundaries    list of int, [8, 16, 32, 64]. Length buckets.
    data.num_train            int >= 1, 20000. Embedded only.
    data.num_validation       int >= 0, 500. Embedded only.
    data.num_test             int >= 1, 500. Embedded only.
    data.max_number           int >= 2, 99999. Embedded only.
    data.train_split          str, "train". tfds only.
    data.validation_split     str|null, "validation". tfds only.
    data.test_split           str, "test". tfds only.
    data.source_language      str, "en". tfds only.
    data.target_language      str|null, null: the other one. tfds only.
    data.vocabulary_examples  int >= 1, 10000. tfds only: pairs the
                    vocabulary is learned from.
    training.label_smoothing  float in [0, 0.99], 0.1. Epsilon of the
                    label-smoothed cross-entropy (the paper's section 5.4).
    evaluation.metric         bleu | exact_match (sacrebleu corpus BLEU and
                    the share of exact translations, on the test set).
    evaluation.beam_width     int >= 1|null, 4. null: greedy search.
    evaluation.alpha          float >= 0, 0.6. Length penalty.
    evaluation.tokenize       str, "13a". sacrebleu's tokenizer ("char" for
                    Japanese).
    evaluation.join_characters  bool|null, null: true for the embedded task
                    (Japanese is written without spaces), else false.
    evaluation.max_examples   int >= 1|null, null. Decode at most this many.

speech_ctc (conformer). Embedded: spoken digit strings synthesised offline
with eSpeak NG (the digits are the vocabulary; each digit is a word for the
WER); tfds: librispeech, speech_commands or any set with audio and text
(vocabulary a-z, apostrophe, space).
    data.utterances           int >= 3, 2000. Embedded only.
    data.test_size            int >= 1, 200. Embedded only: the first ones.
    data.validation_size      int >= 0, 100. Embedded only: the next ones.
    data.train_split          str, "train". tfds only.
    data.validation_split     str|null, "validation". tfds only.
    data.test_split           str, "test". tfds only.
    data.audio_key            str|null, null: "speech" or "audio". tfds only.
    data.text_key             str|null, null: "text" or "label". tfds only.
    evaluation.metric         wer | cer (corpus word / character error rate).
    evaluation.strategy       str, "greedy". greedy | beam_search.
    evaluation.beam_width     int >= 1, 8.
"""

import copy
import dataclasses
import functools
import json
import os

FAMILIES = {
    "vit": "image_classification",
    "bert": "masked_lm",
    "transformer": "translation",
    "conformer": "speech_ctc",
}
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("constant", "cosine", "linear", "transformer")
EMBEDDED = "embedded"
TFDS_PREFIX = "tfds:"
REQUIRED = object()


@dataclasses.dataclass(frozen=True)
class Field:
    """One recipe key: its type, default and limits.

    `kind`: "str", "int", "float" (ints accepted), "bool", "number" (int or
    float, kept as given), "int_list", "object" (`fields` gives the keys) or
    "any" (checked elsewhere). `only`: "embedded" / "tfds" for data keys of
    one kind of dataset.
    """

    kind: str
    default: object = REQUIRED
    nullable: bool = False
    choices: tuple = None
    minimum: float = None
    maximum: float = None
    exclusive: bool = False  # minimum and maximum excluded
    fields: dict = None
    only: str = None


def _f(kind, default=REQUIRED, **kwargs):
    return Field(kind, default, **kwargs)


_OPTIMIZER = {
    "name": _f("str", choices=OPTIMIZERS),
    "learning_rate": _f("float", 0.001, minimum=0.0, exclusive=True),
    "beta_1": _f("float", 0.9, minimum=0.0, maximum=1.0),
    "beta_2": _f("float", 0.999, minimum=0.0, maximum=1.0),
    "epsilon": _f("float", 1e-7, minimum=0.0, exclusive=True),
    "weight_decay": _f("float", None, nullable=True, minimum=0.0),
    "clipnorm": _f("float", None, nullable=True, minimum=0.0, exclusive=True),
}
_WARMUP = _f("number", 0, minimum=0.0)
# The keys each schedule takes besides `name`.
SCHEDULE_FIELDS = {
    "constant": {},
    "cosine": {"warmup_steps": _WARMUP, "alpha": _f("float", 0.0, minimum=0.0, maximum=1.0)},
    "linear": {"warmup_steps": _WARMUP},
    "transformer": {
        "warmup_steps": _f("number", 4000, minimum=0.0),
        "scale": _f("float", 1.0, minimum=0.0, exclusive=True),
    },
}
TRAINING_FIELDS = {
    "batch_size": _f("int", minimum=1),
    "epochs": _f("int", minimum=1),
    "steps_per_epoch": _f("int", None, nullable=True, minimum=1),
    "optimizer": _f("object", fields=_OPTIMIZER),
    "schedule": _f("any", {"name": "constant"}),  # keys depend on the name
    "precision": _f("str", "float32", choices=PRECISIONS),
    "seed": _f("int", 0),
    "checkpoint_every": _f("int", 100, minimum=1),
    "jit_compile": _f("any", "auto"),
}
_EXPECTED = {
    "metric": _f("str"),
    "value": _f("number"),
    "hardware": _f("str"),
    "train_seconds": _f("number", minimum=0.0),
    "date": _f("str"),
}
_PAPER = {
    "parameters": _f("int", None, nullable=True, minimum=1),
    "result": _f("str", None, nullable=True),
    "source": _f("str"),
}
_MODEL = {"preset": _f("str"), "overrides": _f("any", {})}
TOP_FIELDS = {
    "name": _f("str"),
    "family": _f("str", choices=tuple(FAMILIES)),
    "task": _f("str", choices=tuple(FAMILIES.values())),
    "description": _f("str", ""),
    "model": _f("object", fields=_MODEL),
    "data": _f("any"),  # keys depend on the task
    "training": _f("any"),  # TRAINING_FIELDS and the task's keys
    "evaluation": _f("any", {}),  # keys depend on the task
    "expected": _f("object", None, nullable=True, fields=_EXPECTED),
    "paper": _f("object", None, nullable=True, fields=_PAPER),
}

_TFDS_SOURCE = {  # every task
    "data_dir": _f("str", None, nullable=True, only="tfds"),
    "download": _f("bool", False, only="tfds"),
}


def _tfds_splits(validation):
    """The three split keys, with the validation split's default."""
    return {
        **_TFDS_SOURCE,
        "train_split": _f("str", "train", only="tfds"),
        "validation_split": _f("str", validation, nullable=True, only="tfds"),
        "test_split": _f("str", "test", only="tfds"),
    }


_FRACTION = dict(minimum=0.0, maximum=1.0, exclusive=True)

# Per task: the `data` keys besides `dataset`, the task's own `training` keys,
# the `evaluation` keys besides `metric`, and the metrics (the first is the
# default).
TASK_FIELDS = {
    "image_classification": {
        "data": {
            "validation_fraction": _f("float", 0.1, minimum=0.0, maximum=0.99),
            "test_fraction": _f("float", 0.2, only="embedded", **_FRACTION),
            "augmentation": _f("object", {}, fields={
                "zoom": _f("float", 0.0, minimum=0.0, maximum=0.99),
                "translation": _f("float", 0.0, minimum=0.0, maximum=0.99),
                "flip": _f("bool", False),
            }),
            **_tfds_splits(validation=None),
            "image_key": _f("str", "image", only="tfds"),
            "label_key": _f("str", "label", only="tfds"),
        },
        "evaluation": {},
        "metrics": ("accuracy",),
    },
    "masked_lm": {
        "data": {
            "sequence_length": _f("int", 128, minimum=8),
            "vocabulary_size": _f("int", 8000, minimum=16),
            "mask_rate": _f("float", 0.15, **_FRACTION),
            "max_predictions": _f("int", None, nullable=True, minimum=1),
            "test_documents": _f("int", 8, minimum=2),
            "validation_documents": _f("int", 4, minimum=0),
            **_TFDS_SOURCE,
            "split": _f("str", "train", only="tfds"),
            "text_key": _f("str", "text", only="tfds"),
            "max_documents": _f("int", None, nullable=True, minimum=1),
        },
        "evaluation": {},
        "metrics": ("mlm_loss", "mlm_accuracy", "mlm_perplexity", "nsp_accuracy"),
    },
    "translation": {
        "data": {
            "vocabulary_size": _f("int", 1000, minimum=8),
            "bucket_boundaries": _f("int_list", [8, 16, 32, 64]),
            "num_train": _f("int", 20_000, minimum=1, only="embedded"),
            "num_validation": _f("int", 500, minimum=0, only="embedded"),
            "num_test": _f("int", 500, minimum=1, only="embedded"),
            "max_number": _f("int", 99_999, minimum=2, only="embedded"),
            **_tfds_splits(validation="validation"),
            "source_language": _f("str", "en", only="tfds"),
            "target_language": _f("str", None, nullable=True, only="tfds"),
            "vocabulary_examples": _f("int", 10_000, minimum=1, only="tfds"),
        },
        "training": {
            "label_smoothing": _f("float", 0.1, minimum=0.0, maximum=0.99),
        },
        "evaluation": {
            "beam_width": _f("int", 4, nullable=True, minimum=1),
            "alpha": _f("float", 0.6, minimum=0.0),
            "tokenize": _f("str", "13a"),
            "join_characters": _f("bool", None, nullable=True),
            "max_examples": _f("int", None, nullable=True, minimum=1),
        },
        "metrics": ("bleu", "exact_match"),
    },
    "speech_ctc": {
        "data": {
            "utterances": _f("int", 2000, minimum=3, only="embedded"),
            "test_size": _f("int", 200, minimum=1, only="embedded"),
            "validation_size": _f("int", 100, minimum=0, only="embedded"),
            **_tfds_splits(validation="validation"),
            "audio_key": _f("str", None, nullable=True, only="tfds"),
            "text_key": _f("str", None, nullable=True, only="tfds"),
        },
        "evaluation": {
            "strategy": _f("str", "greedy", choices=("greedy", "beam_search")),
            "beam_width": _f("int", 8, minimum=1),
        },
        "metrics": ("wer", "cer"),
    },
}

# Config fields each task sets from its data: a recipe may not override them.
TASK_SET_FIELDS = {
    "vit": ("num_classes",),
    "bert": ("vocabulary_size",),
    "transformer": ("vocabulary_size", "target_vocabulary_size", "pad_id"),
    "conformer": ("vocabulary_size",),
}
# Documentation only: not part of a run's fingerprint.
DOCUMENTATION_KEYS = ("description", "expected", "paper")


def _error(key, expectation, value):
    return ValueError(f"Recipe key `{key}` {expectation}. Received: {key}={value!r}")


def _rephrase(key, value, error):
    """`error` (from a model config helper, ending in "Received: arg=...")
    as a recipe error naming the dotted key."""
    message = str(error).rsplit(" Received:", 1)[0]
    return ValueError(f"Invalid recipe key `{key}`: {message} Received: {key}={value!r}")


def _join(prefix, key):
    return f"{prefix}.{key}" if prefix else key


def _check_value(key, value, field):
    """`value` checked against `field`; returns it (ints made floats for
    "float" fields)."""
    if value is None:
        if field.nullable:
            return None
        raise _error(key, "may not be null", value)
    kind = field.kind
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if kind == "str" and not isinstance(value, str):
        raise _error(key, "must be a string", value)
    if kind == "bool" and not isinstance(value, bool):
        raise _error(key, "must be true or false", value)
    if kind == "int" and not is_int:
        raise _error(key, "must be an integer", value)
    if kind in ("float", "number"):
        if not (is_int or isinstance(value, float)):
            raise _error(key, "must be a number", value)
        if kind == "float":
            value = float(value)
    if kind == "int_list" and not (
        isinstance(value, list) and value
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
        and value == sorted(set(value))
    ):
        raise _error(key, "must be a non-empty increasing list of positive integers", value)
    if kind == "object":
        if not isinstance(value, dict):
            raise _error(key, "must be an object", value)
        return _check_object(key, value, field.fields)
    if field.choices is not None and value not in field.choices:
        raise _error(key, f"must be one of {list(field.choices)}", value)
    _check_range(key, value, field)
    return value


def _check_range(key, value, field):
    low, high = field.minimum, field.maximum
    if low is None and high is None:
        return
    if field.exclusive:
        bad = (low is not None and value <= low) or (high is not None and value >= high)
        bounds = f"in ({low}, {high})" if high is not None else f"> {low}"
    else:
        bad = (low is not None and value < low) or (high is not None and value > high)
        bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
    if bad:
        raise _error(key, f"must be {bounds}", value)


def _check_object(prefix, value, fields, dataset_kind=None):
    """Checks the keys of `value` against `fields`; returns a copy with the
    defaults filled in (keys `only` for the other kind of dataset left out)."""
    for key in value:
        if key not in fields:
            raise ValueError(
                f"Unknown recipe key `{_join(prefix, key)}`; valid keys "
                f"{'in `' + prefix + '` ' if prefix else ''}are {sorted(fields)}. "
                f"Received: {_join(prefix, key)}={value[key]!r}"
            )
    resolved = {}
    for key, field in fields.items():
        dotted = _join(prefix, key)
        if field.only is not None and field.only != dataset_kind:
            if key in value:
                raise _error(dotted, f"is for {field.only} datasets only", value[key])
            continue
        if key in value:
            resolved[key] = _check_value(dotted, value[key], field)
        elif field.default is REQUIRED:
            raise ValueError(
                f"Missing recipe key `{dotted}` (required). "
                f"Received: {prefix or 'recipe'}={value!r}"
            )
        else:
            default = copy.deepcopy(field.default)
            resolved[key] = (
                _check_value(dotted, default, field) if field.kind == "object" else default
            )
    return resolved


# === Parts that depend on other parts ===


def _family_module(family):
    """(config getter, config class) of a family."""
    from keras_attn import models

    config_class = {"vit": models.ViTConfig, "bert": models.BertConfig,
                    "transformer": models.TransformerConfig,
                    "conformer": models.ConformerConfig}[family]
    return getattr(models, f"get_{family}_config"), config_class


_FIELD_KINDS = {int: "int", float: "float", str: "str", bool: "bool"}


def _check_model(model, family):
    get_config, config_class = _family_module(family)
    try:
        config = get_config(model["preset"])
    except ValueError as error:
        raise _rephrase("model.preset", model["preset"], error) from None
    overrides = model["overrides"]
    if not isinstance(overrides, dict):
        raise _error("model.overrides", "must be an object of config fields", overrides)
    types = {field.name: field.type for field in dataclasses.fields(config_class)}
    defaults = dataclasses.asdict(config_class())
    for key, value in overrides.items():
        dotted = f"model.overrides.{key}"
        if key in TASK_SET_FIELDS[family]:
            raise _error(dotted, "is set by the task from its data and cannot be overridden",
                         value)
        try:
            get_config(config, **{key: value})
        except ValueError as error:
            raise _rephrase(dotted, value, error) from None
        kind = _FIELD_KINDS.get(types[key], "any")
        field = Field(kind, nullable=defaults[key] is None)
        if kind != "any":
            overrides[key] = _check_value(dotted, value, field)
    return {"preset": model["preset"], "overrides": overrides}


def dataset_kind(dataset):
    """"embedded" or "tfds" for a `data.dataset` value."""
    return EMBEDDED if dataset == EMBEDDED else "tfds"


@functools.lru_cache(maxsize=1)
def _tfds_builders():
    import tensorflow_datasets as tfds

    return frozenset(tfds.list_builders(with_community_datasets=False))


def check_tfds_name(dataset, key="data.dataset"):
    """`dataset` is "tfds:<name>[/<config>]" with a name (and config) that
    tensorflow-datasets knows; nothing is downloaded. Returns the tfds name
    (`"<name>[/<config>]"`)."""
    name = dataset[len(TFDS_PREFIX):]
    builder, _, config = name.partition("/")
    if not builder:
        raise _error(key, 'must be "embedded" or "tfds:<name>[/<config>]"', dataset)
    import tensorflow_datasets as tfds

    known = _tfds_builders()
    if builder not in known:
        raise _error(key, f"names a dataset that tensorflow-datasets does not know "
                          f"({len(known)} builders; see tfds.list_builders())", dataset)
    if config:
        configs = [c.name for c in (tfds.builder_cls(builder).BUILDER_CONFIGS or [])]
        if config not in configs:
            raise _error(key, f"names a config that {builder} does not have "
                              f"(configs: {configs[:20]})", dataset)
    return name


def _check_data(data, task):
    if not isinstance(data, dict):
        raise _error("data", "must be an object", data)
    if "dataset" not in data:
        raise ValueError(f"Missing recipe key `data.dataset` (required). Received: data={data!r}")
    dataset = _check_value("data.dataset", data["dataset"], _f("str"))
    if dataset != EMBEDDED:
        if not dataset.startswith(TFDS_PREFIX):
            raise _error("data.dataset", 'must be "embedded" or "tfds:<name>[/<config>]"',
                         dataset)
        check_tfds_name(dataset)
    fields = dict(dataset=_f("str"), **TASK_FIELDS[task]["data"])
    return _check_object("data", data, fields, dataset_kind(dataset))


def _check_evaluation(evaluation, task):
    if not isinstance(evaluation, dict):
        raise _error("evaluation", "must be an object", evaluation)
    metrics = TASK_FIELDS[task]["metrics"]
    fields = dict(metric=_f("str", metrics[0], choices=metrics),
                  **TASK_FIELDS[task]["evaluation"])
    return _check_object("evaluation", evaluation, fields)


def _check_schedule(schedule):
    if not isinstance(schedule, dict):
        raise _error("training.schedule", "must be an object", schedule)
    if "name" not in schedule:
        raise ValueError("Missing recipe key `training.schedule.name` (required). "
                         f"Received: training.schedule={schedule!r}")
    name = _check_value("training.schedule.name", schedule["name"],
                        _f("str", choices=SCHEDULES))
    fields = dict(name=_f("str"), **SCHEDULE_FIELDS[name])
    resolved = _check_object("training.schedule", schedule, fields)
    warmup = resolved.get("warmup_steps")
    if warmup is not None and warmup >= 1 and warmup != int(warmup):
        raise _error("training.schedule.warmup_steps",
                     "must be a fraction below 1 or a whole number of steps", warmup)
    if isinstance(warmup, float) and warmup >= 1:
        resolved["warmup_steps"] = int(warmup)
    return resolved


def _check_jit(value):
    if value != "auto" and not isinstance(value, bool):
        raise _error("training.jit_compile", 'must be true, false or "auto"', value)
    return value


def validate_recipe(recipe, name=None):
    """The resolved recipe (defaults filled in), or a `ValueError` naming the
    first wrong key and its value.

    Args:
        recipe: the recipe dict (as read from JSON).
        name: the recipe file's stem; the recipe's `name` must equal it.
    """
    if not isinstance(recipe, dict):
        raise _error("recipe", "must be a JSON object", recipe)
    # The keys that choose the schema of the others come first.
    for key in ("family", "task"):
        if key not in recipe:
            raise ValueError(f"Missing recipe key `{key}` (required). "
                             f"Received: keys {sorted(recipe)}")
        _check_value(key, recipe[key], TOP_FIELDS[key])
    family, task = recipe["family"], recipe["task"]
    if FAMILIES[family] != task:
        raise _error("task", f"must be {FAMILIES[family]!r} for family {family!r}", task)
    resolved = _check_object("", recipe, TOP_FIELDS)
    if name is not None and resolved["name"] != name:
        raise _error("name", f"must equal the file name's stem {name!r}", resolved["name"])
    resolved["model"] = _check_model(resolved["model"], family)
    resolved["data"] = _check_data(resolved["data"], task)
    if not isinstance(resolved["training"], dict):
        raise _error("training", "must be an object", resolved["training"])
    training = resolved["training"] = _check_object(
        "training", resolved["training"], {**TRAINING_FIELDS, **TASK_FIELDS[task].get("training", {})}
    )
    training["schedule"] = _check_schedule(training["schedule"])
    training["jit_compile"] = _check_jit(training["jit_compile"])
    resolved["evaluation"] = _check_evaluation(resolved["evaluation"], task)
    _check_sizes(resolved["data"], task)
    expected = resolved["expected"]
    if expected is not None and expected["metric"] != resolved["evaluation"]["metric"]:
        raise _error("expected.metric",
                     f"must be the evaluation metric {resolved['evaluation']['metric']!r}",
                     expected["metric"])
    return resolved


def _check_sizes(data, task):
    """Constraints between data keys."""
    if task == "masked_lm" and data["validation_documents"] == 1:
        raise _error("data.validation_documents", "must be 0 or at least 2 (next-sentence "
                     "negatives come from another document)", 1)
    if task == "translation" and "num_train" in data:
        used = data["num_train"] + data["num_validation"] + data["num_test"]
        if used > data["max_number"]:
            raise _error("data.num_train", "plus num_validation and num_test must be at "
                         f"most data.max_number={data['max_number']}", data["num_train"])
    if task == "speech_ctc" and "utterances" in data:
        if data["test_size"] + data["validation_size"] >= data["utterances"]:
            raise _error("data.utterances", "must exceed test_size + validation_size "
                         f"({data['test_size']} + {data['validation_size']})",
                         data["utterances"])


# === Overrides and files ===


def parse_override(text):
    """`"dotted.key=value"` -> `("dotted.key", value)`; the value is parsed as
    JSON (`3`, `0.5`, `true`, `null`, `[8, 16]`, `{"a": 1}`), else kept as a
    string (`adamw`, `tfds:cifar10`)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ValueError(f"An override is dotted.key=value. Received: --set {text!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key, value


def apply_overrides(recipe, overrides):
    """A copy of `recipe` with `overrides` (`"key=value"` strings or
    `(key, value)` pairs) applied. Missing objects on the way are created
    (`training.schedule.alpha=0.1`); replacing a non-object is an error."""
    recipe = copy.deepcopy(recipe)
    for item in overrides:
        key, value = parse_override(item) if isinstance(item, str) else item
        parts = key.split(".")
        node = recipe
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                prefix = ".".join(parts[: i + 1])
                raise _error(prefix, f"is not an object, so `{key}` cannot be set", child)
            node = child
        node[parts[-1]] = value
    return recipe


def read_recipe_file(path):
    """The JSON object in `path`, with a `ValueError` naming the file and
    the position for bad JSON."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except json.JSONDecodeError as error:
        raise ValueError(f"Recipe {path} is not valid JSON: {error}. "
                         f"Received: {os.fspath(path)}") from None


def load_recipe(path, overrides=()):
    """Reads, overrides and validates the recipe at `path`; returns the
    resolved recipe. Its `name` must equal the file's stem."""
    stem = os.path.splitext(os.path.basename(os.fspath(path)))[0]
    return validate_recipe(apply_overrides(read_recipe_file(path), overrides), name=stem)


# Model overrides that change neither the numbers nor the variables: a run
# may resume with them changed (say, remat turned on after running out of
# memory).
RUN_NEUTRAL_OVERRIDES = ("remat",)


def fingerprint(recipe):
    """What identifies a run: the resolved recipe without the documentation
    keys (a run resumes after `expected` is filled in) and without the
    run-neutral model overrides (`model.overrides.remat`)."""
    found = {k: v for k, v in recipe.items() if k not in DOCUMENTATION_KEYS}
    model = found.get("model")
    if isinstance(model, dict) and isinstance(model.get("overrides"), dict):
        overrides = {
            k: v for k, v in model["overrides"].items() if k not in RUN_NEUTRAL_OVERRIDES
        }
        found["model"] = {**model, "overrides": overrides}
    return found
