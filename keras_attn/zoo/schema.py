"""The recipe schema, declared once with pydantic.

What every recipe shares is declared here (`Recipe`, `Model`, `Data`,
`Training` with its `Optimizer` and `Schedule`, `Evaluation`, `Expected`,
`Paper`); each task adapter (`keras_attn/zoo/tasks/<task>.py`) subclasses
`Data`, `Training` and `Evaluation` with its own keys, and `recipe_model`
puts a task's recipe together. From the same declaration come the
validation (`keras_attn.zoo.recipe.validate_recipe`), the JSON Schema that
editors use (`models/recipe.schema.json`) and the key reference
(`models/RECIPES.md`); `keras_attn.zoo.reference` writes both
(`python -m keras_attn.zoo.reference`).

Why pydantic: it is the standard library for this (typed fields with
defaults and limits, refusing unknown keys, discriminated unions for the
per-task and per-schedule keys, JSON Schema output), widely used and kept.
What it lacks is written here: errors phrased with the recipe's dotted key
and the value received (`recipe_error`), keys for one kind of dataset only
(`only=`), and a model's `overrides` declared from the family's config
dataclass.
"""

import dataclasses
import functools
import os
import re
import typing
from typing import Annotated
from typing import ClassVar
from typing import Literal
from typing import Optional
from typing import Union

import pydantic
import pydantic_core
from pydantic import ConfigDict
from pydantic import Field
from keras_attn.errors import RecipeError

EMBEDDED = "embedded"
TFDS_PREFIX = "tfds:"
FILES_PREFIX = "files:"
KINDS = (EMBEDDED, "tfds", "files")
SCHEMA_FILE = "recipe.schema.json"
# What every zoo recipe's "$schema" says (the recipes are models/<family>/).
SCHEMA_REFERENCE = f"../{SCHEMA_FILE}"

# Generous ceilings, far above any model or run this package trains, so that
# a typo (a width of 2**40, 10**6 layers, a batch of 1e20) is refused by name
# before anything is built, written or locked.
MAX_BATCH = 2**20
MAX_EPOCHS = 10**6
MAX_STEPS = 10**9  # steps per epoch, between checkpoints, of warmup
MAX_LAYERS = 1000  # a model config's `num_layers`, `num_*_layers`
MAX_WIDTH = 65536  # a model config's `*_dim`, `num_heads`; LoRA's rank
MAX_SIZE = 2**20  # every other integer of a model config: vocabularies, lengths, rates;
# and of a task's data and evaluation keys: counts of examples, sizes
MAX_BEAM = 1024  # a beam search's width
# A list's integers (length buckets, chunk sizes) under the same ceiling.
PositiveSize = Annotated[int, Field(ge=1, le=MAX_SIZE)]
# NumPy and scikit-learn take seeds in [0, 2**32 - 1] only.
MAX_SEED = 2**32 - 1


class Section(pydantic.BaseModel):
    """An object of the recipe: unknown keys refused, no type coercion
    (a "64" is not a batch size; integers are accepted where floats are;
    no number is infinite or NaN, which JSON cannot hold either)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def field(default=..., *, description, only=None, **limits):
    """A recipe key: its default (none: required), what it means, and its
    limits (`ge`, `gt`, `le`, `lt`); `only="embedded"` / `"tfds"` /
    `"files"` for data keys of one kind of dataset (`"tfds or files"`: of
    two)."""
    extra = {"only": only} if only else None
    return Field(default, description=description, json_schema_extra=extra, **limits)


def packing_in_memory():
    """A `Data` validator (assign it in the class body) refusing
    `packing: true` on a tfds dataset: a task packs a data set it holds in
    memory (embedded or files), and a tfds split is streamed."""

    def check(data):
        if getattr(data, "packing", False) and dataset_kind(data.dataset) == "tfds":
            raise key_error("packing", "is for embedded and files datasets (a tfds split is "
                                       "streamed, not packed yet)", True)
        return data

    return pydantic.model_validator(mode="after")(check)


def key_error(key, expectation, value):
    """A validation error for `key` (dotted, relative to the object being
    validated; "" for the object itself): "Recipe key `key` <expectation>.
    Received: key=<value>"."""
    return pydantic_core.PydanticCustomError(
        "recipe_key", "{expectation}", {"key": key, "expectation": expectation, "value": value}
    )


def _keep_int(value, handler):
    value_as_float = handler(value)
    return value if isinstance(value, int) else value_as_float


# A number kept as given: 4000 stays an int, 0.1 a float (a warmup is either).
Number = Annotated[float, pydantic.WrapValidator(_keep_int)]


def is_number(info):
    """Whether a field is a `Number` (pydantic keeps its validator in the
    field's metadata, not in the annotation)."""
    return any(getattr(item, "func", None) is _keep_int for item in info.metadata)


def dataset_kind(dataset):
    """"embedded", "files" or "tfds" for a `data.dataset` value."""
    if dataset == EMBEDDED:
        return EMBEDDED
    return "files" if dataset.startswith(FILES_PREFIX) else "tfds"


def files_path(dataset):
    """The path of a "files:<path>" `data.dataset`."""
    return dataset[len(FILES_PREFIX):]


@functools.lru_cache(maxsize=1)
def _tfds_builders():
    import tensorflow_datasets as tfds

    return frozenset(tfds.list_builders(with_community_datasets=False))


def check_tfds_name(dataset, key="data.dataset"):
    """`dataset` is "tfds:<name>[/<config>]" with a name (and config) that
    tensorflow-datasets knows; nothing is downloaded. Returns the tfds name
    (`"<name>[/<config>]"`); a `ValueError` naming `key` otherwise."""
    try:
        return _tfds_name(dataset)
    except pydantic_core.PydanticCustomError as error:
        context = error.context
        raise ValueError(f"Recipe key `{key}` {context['expectation']}. "
                         f"Received: {key}={context['value']!r}") from None


def _tfds_name(dataset):
    name = dataset[len(TFDS_PREFIX):]
    builder, _, config = name.partition("/")
    if not dataset.startswith(TFDS_PREFIX) or not builder:
        raise key_error("", 'must be "embedded", "tfds:<name>[/<config>]" or "files:<path>"',
                        dataset)
    import tensorflow_datasets as tfds

    known = _tfds_builders()
    if builder not in known:
        raise key_error("", f"names a dataset that tensorflow-datasets does not know "
                            f"({len(known)} builders; see tfds.list_builders())", dataset)
    if config:
        configs = [c.name for c in (tfds.builder_cls(builder).BUILDER_CONFIGS or [])]
        if config not in configs:
            raise key_error("", f"names a config that {builder} does not have "
                                f"(configs: {configs[:20]})", dataset)
    return name


def check_files(dataset, check, *args):
    """`check(path, *args)` (a `keras_attn.data.files` check) on a
    "files:<path>" dataset, its `ValueError` a recipe error of
    `data.dataset`; what `check` returns. For a task's `Data` validator."""
    try:
        return check(files_path(dataset), *args)
    except ValueError as error:
        problem = str(error).rsplit(" Received:", 1)[0].rstrip(".")
        raise key_error("dataset", f"gives files the task cannot read: {problem}",
                        dataset) from None


def only_for(info):
    """"embedded" / "tfds" / "files" / "tfds or files" for a key of some
    kinds of dataset, else None."""
    extra = info.json_schema_extra if info is not None else None
    return extra.get("only") if isinstance(extra, dict) else None


def for_kind(info, kind):
    """Whether a key (its field `info`) applies to datasets of `kind`."""
    only = only_for(info)
    return only is None or kind in only.split(" or ")


def _one_kind_of_dataset(schema, cls):
    """JSON Schema: the keys of the other kinds of dataset are refused
    (for each kind, `if` the dataset is of that kind `then` none of the
    keys of the others), so that an editor flags them as pydantic does."""
    matches = {EMBEDDED: {"const": EMBEDDED}, "tfds": {"pattern": f"^{TFDS_PREFIX}"},
               "files": {"pattern": f"^{FILES_PREFIX}"}}
    rules = []
    for kind in KINDS:
        names = [name for name, info in cls.model_fields.items() if not for_kind(info, kind)]
        if names:
            rules.append({
                "if": {"properties": {"dataset": matches[kind]}, "required": ["dataset"]},
                "then": {"not": {"anyOf": [{"required": [name]} for name in names]}},
            })
    if rules:
        schema["allOf"] = rules


# === Data ===


class Data(Section):
    """The keys of every task's `data`."""

    model_config = ConfigDict(json_schema_extra=_one_kind_of_dataset)
    # A task whose data reads "files:<path>" sets it (and checks the files).
    takes_files: ClassVar[bool] = False

    dataset: str = field(
        description='"embedded" (the task\'s offline data set), "tfds:<name>[/<config>]", a '
                    "name that `tfds.list_builders()` knows (checked without downloading "
                    'anything; see `data.download`), or "files:<path>", your own files (a '
                    "path relative to the working directory, or absolute): a CSV / JSON Lines "
                    "file or a folder, as the task's data says (docs/your_data.md); checked "
                    "before anything trains.",
        pattern=r"^(embedded|tfds:[^/]+(/.+)?|files:.+)$",
    )
    data_dir: Optional[str] = field(None, only="tfds",
                                    description="Where tfds keeps its data (null: its default).")
    download: bool = field(False, only="tfds",
                           description="Let tfds download and prepare the data set when it is "
                                       "not in `data_dir` (else it must be).")

    @pydantic.model_validator(mode="before")
    @classmethod
    def _known_dataset_and_its_keys(cls, value):
        if isinstance(value, dict) and isinstance(value.get("dataset"), str):
            dataset = value["dataset"]
            kind = dataset_kind(dataset)
            if kind == "tfds":
                try:
                    _tfds_name(dataset)
                except pydantic_core.PydanticCustomError as error:
                    raise key_error("dataset", error.context["expectation"], dataset) from None
            if kind == "files" and not cls.takes_files:
                raise key_error("dataset", "is files:<path>, which this task does not read "
                                           "(image_classification, text_classification, "
                                           "token_classification, speech_ctc and translation "
                                           "do; docs/your_data.md)", dataset)
            if kind == "files" and not os.path.exists(files_path(dataset)):
                raise key_error("dataset", "names no file or folder (a path relative to the "
                                           "working directory, or absolute)", dataset)
            if "packing" in value and "packing" not in cls.model_fields:
                raise key_error("packing", "is not taken by this task: packed rows train "
                                           "the masked_lm, translation and speech_ctc tasks "
                                           "only "
                                           "(docs/packing.md)", value["packing"])
            for key, info in cls.model_fields.items():
                if not for_kind(info, kind) and key in value:
                    raise key_error(key, f"is for {only_for(info)} datasets only", value[key])
        return value

    @pydantic.model_serializer(mode="wrap")
    def _without_the_other_kind(self, handler):
        kind = dataset_kind(self.dataset)
        fields = type(self).model_fields
        # `packing: false` (the tasks that pack) and masked_lm's
        # `next_sentence: true` are left out: recipes without them resolve
        # as before (the same fingerprint: their runs resume).
        return {key: value for key, value in handler(self).items()
                if (key not in fields or for_kind(fields[key], kind))
                and not (key == "packing" and value is False)
                and not (key == "next_sentence" and value is True)}


class TfdsSplits(Data):
    """`Data` with the three tfds split keys."""

    train_split: str = field("train", only="tfds", description="The training split.")
    validation_split: Optional[str] = field(
        "validation", only="tfds", description="The validation split (null: none).")
    test_split: str = field("test", only="tfds", description="The test split.")


# === Training ===


class Optimizer(Section):
    name: Literal["adam", "adamw"] = field(description="The optimizer.")
    learning_rate: float = field(
        0.001, gt=0,
        description='The peak rate of the schedule (unused by the "transformer" schedule).')
    beta_1: float = field(0.9, ge=0, le=1, description="Adam's beta_1.")
    beta_2: float = field(0.999, ge=0, le=1, description="Adam's beta_2.")
    epsilon: float = field(1e-7, gt=0, description="Adam's epsilon.")
    weight_decay: Optional[float] = field(
        None, ge=0, description="null: the optimizer's default (none for adam, 0.004 for adamw).")
    clipnorm: Optional[float] = field(None, gt=0, description="Clip each gradient to this norm.")


_WARMUP = "Below 1: a fraction of all training steps; else a whole number of steps."


class _Warmup(Section):
    @pydantic.field_validator("warmup_steps", check_fields=False)
    @classmethod
    def _whole_steps(cls, value):
        if value >= 1 and value != int(value):
            raise key_error("", "must be a fraction below 1 or a whole number of steps", value)
        return int(value) if isinstance(value, float) and value >= 1 else value


class ConstantSchedule(Section):
    """The learning rate stays `optimizer.learning_rate`."""

    name: Literal["constant"] = field(description="The schedule.")


class CosineSchedule(_Warmup):
    """Linear warmup, then cosine decay to `alpha * learning_rate` at the last step."""

    name: Literal["cosine"] = field(description="The schedule.")
    warmup_steps: Number = field(0, ge=0, le=MAX_STEPS, description=_WARMUP)
    alpha: float = field(0.0, ge=0, le=1, description="The final rate's share of the peak.")


class LinearSchedule(_Warmup):
    """Linear warmup, then linear decay to 0."""

    name: Literal["linear"] = field(description="The schedule.")
    warmup_steps: Number = field(0, ge=0, le=MAX_STEPS, description=_WARMUP)


class TransformerSchedule(_Warmup):
    """The paper's `scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`."""

    name: Literal["transformer"] = field(description="The schedule.")
    warmup_steps: Number = field(4000, ge=0, le=MAX_STEPS, description=_WARMUP)
    scale: float = field(1.0, gt=0, description="A factor on the whole schedule.")


SCHEDULES = (ConstantSchedule, CosineSchedule, LinearSchedule, TransformerSchedule)
Schedule = Annotated[Union[SCHEDULES], Field(discriminator="name")]


class Lora(Section):
    """LoRA fine-tuning of a trained model (`keras_attn.models.enable_lora`)."""

    base: str = field(description="The trained model to adapt: a run directory (its "
                                  "model.keras; its recipe must build the same model) or a "
                                  ".keras file.")
    rank: int = field(ge=1, le=MAX_WIDTH, description="The adapters' rank r.")
    alpha: Optional[float] = field(None, gt=0, description="The adapters' scale is alpha / r "
                                                          "(null: alpha = r, scale 1).")
    targets: list[str] = field(["query", "value"], description="Projections to adapt: layer "
                               "name or path patterns (shell style, e.g. \"query\", "
                               "\"*attention_output\").")
    train_also: list[str] = field([], description="Layers trained in full beside the adapters "
                                  "(a new head, e.g. \"classifier\").")

    @pydantic.field_validator("targets")
    @classmethod
    def _some_targets(cls, value):
        if not value or not all(value):
            raise key_error("", "must name at least one projection pattern", value)
        return value


class Training(Section):
    """The keys of every task's `training`."""

    batch_size: int = field(ge=1, le=MAX_BATCH,
                            description="The global batch (all replicas; at most 2**20).")
    epochs: int = field(ge=1, le=MAX_EPOCHS,
                        description="Passes over `steps_per_epoch` batches (at most 10**6).")
    steps_per_epoch: Optional[int] = field(
        None, ge=1, le=MAX_STEPS,
        description="null: one pass over the training data (for tfds streams: "
                    "examples // batch_size).")
    optimizer: Optimizer = field(description="The optimizer and its settings.")
    schedule: Schedule = field(
        ConstantSchedule(name="constant"),
        description='The learning-rate schedule, chosen by its `name` (a key of its own '
                    'below; default: {"name": "constant"}).')
    precision: Literal["float32", "mixed_float16", "mixed_bfloat16"] = field(
        "float32", description="The Keras dtype policy.")
    seed: int = field(0, ge=0, le=MAX_SEED,
                      description="Weights, data order, augmentation and masking (0 to "
                                  "2**32 - 1, the seeds NumPy and scikit-learn take).")
    checkpoint_every: int = field(100, ge=1, le=MAX_STEPS, description="Optimizer steps between checkpoints "
                                                         "(there is one at each epoch's end too).")
    jit_compile: Union[bool, Literal["auto"]] = field(
        "auto", description="Passed to `Model.compile`.")
    lora: Optional[Lora] = field(
        None, description="null: train every weight. An object: LoRA-adapt a trained model "
                          "instead; the run's model.keras is the merged model, adapters.npz "
                          "the adapters and trained layers alone.")

    # Optional keys left out of the resolved recipe while null: recipes
    # without them (LoRA, a task's `pretrained` added later) resolve as
    # before (same fingerprint: their runs resume).
    null_left_out: ClassVar[tuple] = ("lora",)

    @pydantic.model_serializer(mode="wrap")
    def _without_null_keys(self, handler):
        dumped = handler(self)
        for key in self.null_left_out:
            if key in dumped and dumped[key] is None:
                dumped.pop(key)
        return dumped

    @pydantic.field_validator("jit_compile", mode="before")
    @classmethod
    def _bool_or_auto(cls, value):
        if value != "auto" and not isinstance(value, bool):
            raise key_error("", 'must be true, false or "auto"', value)
        return value


# === Evaluation and documentation ===


class Evaluation(Section):
    """The keys of every task's `evaluation`; a task declares `metric` as a
    `Literal` of its metrics, the first the default."""

    metric: str = field(description="The headline number of results.json.")


class Expected(Section):
    """What `keras-attn train` measured."""

    metric: str = field(description="Equals `evaluation.metric`.")
    value: Number = field(description="The metric's value.")
    hardware: str = field(description="Where it was measured.")
    train_seconds: Number = field(ge=0, description="Training time.")
    date: str = field(description="When (YYYY-MM-DD).")


class Paper(Section):
    """The published reference."""

    parameters: Optional[int] = field(None, ge=1, le=10**13, description="The paper's parameter count.")
    result: Optional[str] = field(None, description="The paper's number, in words.")
    source: str = field(description='"Author et al. year, Table n".')


# === The model: a preset of the task's family and overrides of its config ===


def family_api(family):
    """(config getter, presets, config class) of a model family."""
    from keras_attn import models

    get_config = getattr(models, f"get_{family}_config")
    return get_config, getattr(models, f"{family.upper()}_PRESETS"), type(get_config())


def _attribute_docs(config_class):
    """{field: its text} from the "Attributes:" section of the docstring."""
    docs, name = {}, None
    text = (config_class.__doc__ or "").split("Attributes:", 1)[-1]
    for line in text.splitlines():
        match = re.match(r"^\s{8}(\w+): (.*)$", line)
        if match:
            name = match.group(1)
            docs[name] = match.group(2).strip()
        elif name and line.startswith(" " * 12):
            docs[name] += " " + line.strip()
        elif line.strip():
            name = None
    return docs


def _rephrased(error):
    """A model config helper's message without its "Received: ..." part."""
    return str(error).rsplit(" Received:", 1)[0].rstrip(".")


def _config_error(get_config, config, overrides):
    """The error of `config` with `overrides` applied, or None."""
    try:
        get_config(config, **overrides)
    except (ValueError, TypeError) as error:
        return error
    return None


def _wrong_override(get_config, config, overrides, error):
    """The override to name for `error`, the error of `config` with all of
    `overrides` (checked together, so that two fields changed together, a
    width and the heads that divide it, are not refused one at a time), and
    the error to give: the override without which the rest is valid; else
    the first that is invalid on its own, with its own error; else None
    (only together are they wrong)."""
    for key in overrides:
        rest = {k: v for k, v in overrides.items() if k != key}
        if _config_error(get_config, config, rest) is None:
            return key, error
    for key, value in overrides.items():
        own = _config_error(get_config, config, {key: value})
        if own is not None:
            return key, own
    return None, error


def _ceiling(name, annotation):
    """The largest value a model config's integer field `name` may be
    overridden with (None: not an integer)."""
    if annotation not in (int, "int"):
        return None
    if name == "num_layers" or name.endswith("_layers"):
        return MAX_LAYERS
    if name.endswith("_dim") or name == "num_heads":
        return MAX_WIDTH
    return MAX_SIZE


class Overrides(Section):
    """Config fields to change; only the fields given are kept."""

    @pydantic.model_serializer(mode="wrap")
    def _only_the_given(self, handler):
        return {key: value for key, value in handler(self).items()
                if key in self.model_fields_set}


@functools.lru_cache(maxsize=None)
def model_section(family, set_fields):
    """The `model` object of a task of `family`: `preset` and `overrides`,
    declared from the family's config dataclass (the fields in `set_fields`
    come from the task's data and may not be overridden)."""
    get_config, presets, config_class = family_api(family)
    docs = _attribute_docs(config_class)
    fields = {}
    for config_field in dataclasses.fields(config_class):
        name = config_field.name
        if name in set_fields:
            continue
        default = config_field.default
        annotation = config_field.type if default is not None else Optional[config_field.type]
        fields[name] = (annotation, Field(default, description=docs.get(name),
                                          le=_ceiling(name, config_field.type)))
    overrides_model = pydantic.create_model(
        f"{config_class.__name__}Overrides", __base__=Overrides,
        __doc__=f"Fields of `{config_class.__name__}`.", **fields)

    def valid_for_the_family(cls, value):
        # The config's own checks (a known preset and field, each field's
        # value, the fields together, a field that moved) with its words:
        # the config is made here, before any data loads.
        if not isinstance(value, dict) or not isinstance(value.get("preset"), str):
            return value
        try:
            config = get_config(value["preset"])
        except ValueError as error:
            raise key_error("preset", f"is invalid: {_rephrased(error)}",
                            value["preset"]) from None
        given = value.get("overrides", {})
        given = dict(given) if isinstance(given, dict) else {}
        for key, override in given.items():
            if key in set_fields:
                raise key_error(f"overrides.{key}", "is set by the task from its data "
                                "and cannot be overridden", override)
        error = _config_error(get_config, config, given)
        if error is not None:
            key, error = _wrong_override(get_config, config, given, error)
            raise key_error(join_keys("overrides", key), f"is invalid: {_rephrased(error)}",
                            given[key] if key else given) from None
        return value

    return pydantic.create_model(
        f"{config_class.__name__.removesuffix('Config')}Model",
        __base__=Section,
        __doc__=f"A preset of the {family} family and overrides of its config.",
        __validators__={"valid_for_the_family": pydantic.model_validator(mode="before")(
            classmethod(valid_for_the_family))},
        preset=(str, Field(description=f"A preset of the family ({family.upper()}_PRESETS).",
                           json_schema_extra={"enum": sorted(presets)})),
        overrides=(overrides_model, Field(
            default_factory=overrides_model,
            description=f"Fields of `{config_class.__name__}` (the task sets "
                        f"{', '.join(set_fields)} from its data). Integers have generous "
                        f"ceilings that catch typos before anything is built: layers "
                        f"{MAX_LAYERS}, widths (`*_dim`, `num_heads`) {MAX_WIDTH}, any other "
                        f"2**20.")),
    )


# === A task's recipe ===


class Recipe(Section):
    """The keys of every recipe."""

    model_config = ConfigDict(populate_by_name=True)

    schema_reference: Optional[str] = Field(
        None, alias="$schema", exclude=True,
        description=f'The JSON Schema of recipes, for editors ("{SCHEMA_REFERENCE}").')
    name: str = field(description="Equal to the file's stem, unique in the zoo.")
    # The task's recipe model (`recipe_model`) narrows these five.
    family: str = field(description="The model family.")
    task: str = field(description="The task.")
    description: str = field("", description="One sentence.")
    model: Section = field(description="A preset of the family and overrides of its config.")
    data: Data = field(description="The data set and the task's data keys.")
    training: Training = field(description="Batching, optimizer, schedule, precision.")
    evaluation: Evaluation = field(description="The test metric and its settings.")
    expected: Optional[Expected] = field(None, description="What `keras-attn train` measured.")
    paper: Optional[Paper] = field(None, description="The published reference.")

    @pydantic.model_validator(mode="after")
    def _expected_is_the_metric(self):
        if self.expected is not None and self.expected.metric != self.evaluation.metric:
            raise key_error("expected.metric",
                            f"must be the evaluation metric {self.evaluation.metric!r}",
                            self.expected.metric)
        return self


@functools.lru_cache(maxsize=None)
def recipe_model(task, family=None):
    """The pydantic model of a recipe of `task` (a `Task` subclass) with a
    model of `family` (None: the task's own `family`; another of its
    `other_families`)."""
    family = task.family if family is None else family
    set_fields = task.family_fields()[family]
    evaluation = task.evaluation_class(family)
    own = family == task.family
    # A task whose model has parts beside the family's config (a
    # transducer's decoder) declares them as its `Decoder` section.
    extra = {}
    if getattr(task, "Decoder", None) is not None:
        extra["decoder"] = (task.Decoder, Field(default_factory=task.Decoder,
                                                description=" ".join(task.Decoder.__doc__.split())))
    return pydantic.create_model(
        f"{task.__name__}Recipe" if own else f"{task.__name__}{family.title()}Recipe",
        __base__=Recipe,
        __doc__=f"A recipe of the {task.name} task (family {family}).",
        family=(Literal[family], field(description="The model family.")),
        task=(Literal[task.name], field(description="The task.")),
        model=(model_section(family, set_fields),
               field(description="A preset of the family and overrides of its config.")),
        data=(task.Data, field(description="The data set and the task's data keys.")),
        training=(task.Training, field(description="Batching, optimizer, schedule, precision.")),
        evaluation=(evaluation, Field(default_factory=evaluation,
                                      description="The test metric and its settings.")),
        **extra,
    )


# === Errors in the recipe's words ===


def _path(recipe, location):
    """The dotted key of an error's location in `recipe` (pydantic adds the
    union member's tag, which is not a key of the recipe)."""
    node, parts = recipe, []
    for i, element in enumerate(location):
        if isinstance(node, dict) and element in node:
            parts.append(str(element))
            node = node[element]
        elif isinstance(node, list) and isinstance(element, int) and element < len(node):
            parts[-1] += f"[{element}]"
            node = node[element]
        elif i == len(location) - 1:  # a key that is missing
            parts.append(str(element))
            node = None
    return ".".join(parts)


def join_keys(*keys):
    """Dotted keys joined, empty ones left out."""
    return ".".join(key for key in keys if key)


def _value_at(recipe, key):
    node = recipe
    for part in key.split(".") if key else ():
        name, _, index = part.partition("[")
        node = node.get(name) if isinstance(node, dict) else None
        if index:
            node = node[int(index.rstrip("]"))] if isinstance(node, list) else None
    return node


def _fields_at(model, recipe, key):
    """The key names the object at dotted `key` of `recipe` takes."""
    node = recipe
    for part in key.split(".") if key else ():
        node = node.get(part) if isinstance(node, dict) else None
        info = model.model_fields.get(part)
        model = object_model(info.annotation, node) if info is not None else None
        if model is None:
            return []
    return sorted(info.alias or name for name, info in model.model_fields.items())


def object_model(annotation, value):
    """The pydantic model `annotation` stands for, given the input `value`
    (for a union of models: the member whose `name` tag it carries)."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    for member in typing.get_args(annotation):
        if typing.get_origin(member) is Union or typing.get_args(member):
            found = object_model(member, value)
            if found is not None:
                return found
        if isinstance(member, type) and issubclass(member, pydantic.BaseModel):
            tag = member.model_fields.get("name")
            if tag is None or typing.get_origin(tag.annotation) is not Literal:
                return member
            if isinstance(value, dict) and value.get("name") in typing.get_args(tag.annotation):
                return member
    return None


def _sentence(message):
    return message[0].lower() + message[1:]


def _message(error, recipe, model):
    """One pydantic error as "Recipe key `a.b` ... Received: a.b=value"."""
    kind, context = error["type"], error.get("ctx", {})
    key = _path(recipe, error["loc"])
    if kind == "recipe_key":
        key = join_keys(key, context["key"])
        return key, (f"Recipe key `{key}` {context['expectation']}. "
                     f"Received: {key}={context['value']!r}")
    if kind in ("missing", "union_tag_not_found"):
        if kind == "union_tag_not_found":
            key = join_keys(key, context["discriminator"].strip("'"))
        parent = key.rpartition(".")[0]
        received = (f"{parent}={_value_at(recipe, parent)!r}" if parent
                    else f"keys {sorted(recipe)}")
        return key, f"Missing recipe key `{key}` (required). Received: {received}"
    if kind == "union_tag_invalid":
        key = join_keys(key, context["discriminator"].strip("'"))
        return key, (f"Recipe key `{key}` must be one of [{context['expected_tags']}]. "
                     f"Received: {key}={context['tag']!r}")
    if kind == "extra_forbidden":
        parent = key.rpartition(".")[0]
        where = f" in `{parent}`" if parent else ""
        return key, (f"Unknown recipe key `{key}`; valid keys{where} are "
                     f"{_fields_at(model, recipe, parent)}. Received: {key}={error['input']!r}")
    return key, (f"Recipe key `{key}`: {_sentence(error['msg'])}. "
                 f"Received: {key}={error['input']!r}")


def recipe_error(error, recipe, model):
    """A pydantic `ValidationError` of `recipe` (validated by `model`) as a
    `ValueError` with a line per wrong key."""
    lines = {}
    for item in error.errors():
        key, message = _message(item, recipe, model)
        lines.setdefault(key, message)  # a union reports a key once per member
    messages = list(lines.values())
    if len(messages) == 1:
        return RecipeError(messages[0])
    return RecipeError(f"{len(messages)} problems in the recipe:\n"
                      + "\n".join(f"- {message}" for message in messages))
