"""What every task adapter shares: the recipe's optimizer and schedule, the
steps, precision and seeds, and the interface the command line drives.

```
task = make_task(recipe)              # cheap: nothing loaded yet
task.prepare()                        # data: splits, vocabulary, tokenizer
model = task.build_model()            # preset + overrides, seeded, in the recipe's precision
task.compile(model)                   # loss, metrics, optimizer + schedule
trainer.fit(model, task.train_dataset_fn, epochs, task.steps_per_epoch,
            validation_data=task.validation_data())
task.evaluate(model)                  # {"accuracy": ...}: the recipe's metric and more
task.export(model, path)              # the serving SavedModel
```
"""

import math
import os
import warnings

import numpy as np

from keras_attn.zoo import schema
from keras_attn._base.quiet_tensorflow import traced_as_written

def warmup_steps(schedule, total_steps):
    """The schedule's warmup in steps (a value below 1 is a fraction of
    `total_steps`, rounded down as the examples do)."""
    warmup = schedule.get("warmup_steps", 0)
    return int(warmup * total_steps) if warmup < 1 else int(warmup)


def build_schedule(training, total_steps, hidden_dim):
    """The learning rate (a float or a `LearningRateSchedule`) of a resolved
    recipe's `training` section."""
    import keras

    from keras_attn.training.schedules import LinearWarmupDecay
    from keras_attn.training.schedules import TransformerSchedule

    schedule = training["schedule"]
    rate = training["optimizer"]["learning_rate"]
    warmup = warmup_steps(schedule, total_steps)
    name = schedule["name"]
    if name != "constant" and name != "transformer" and warmup >= total_steps:
        raise ValueError(
            "Recipe key `training.schedule.warmup_steps` must leave steps to decay: "
            f"fewer than the {total_steps} training steps. "
            f"Received: training.schedule.warmup_steps={schedule['warmup_steps']!r}"
        )
    if name == "constant":
        return rate
    if name == "cosine":
        return keras.optimizers.schedules.CosineDecay(
            0.0 if warmup else rate,
            decay_steps=total_steps - warmup,
            alpha=schedule["alpha"],
            warmup_target=rate if warmup else None,
            warmup_steps=warmup,
        )
    if name == "linear":
        return LinearWarmupDecay(rate, total_steps=total_steps, warmup_steps=warmup)
    return TransformerSchedule(hidden_dim, warmup_steps=max(1, warmup), scale=schedule["scale"])


def build_optimizer(training, total_steps, hidden_dim):
    """The recipe's optimizer (Adam or AdamW) driven by its schedule."""
    import keras

    options = dict(training["optimizer"])
    name = options.pop("name")
    options.pop("learning_rate")
    options = {key: value for key, value in options.items() if value is not None}
    optimizer_class = keras.optimizers.AdamW if name == "adamw" else keras.optimizers.Adam
    return optimizer_class(
        learning_rate=build_schedule(training, total_steps, hidden_dim), **options
    )


class Task:
    """The base of the task adapters; a subclass declares its recipe keys and
    fills in the data, the model and the evaluation of one task.

    A task is one module `keras_attn/zoo/tasks/<name>.py` defining one `Task`
    subclass (found by `keras_attn.zoo.tasks.TASKS`) with these class
    attributes, from which the recipe schema, its JSON Schema and the key
    reference are made (`keras_attn.zoo.schema`):

    - `name`: the recipe's `task`; `family`: its model family ("vit", ...);
    - `Data`, `Training`, `Evaluation`: subclasses of `schema.Data` (or
      `schema.TfdsSplits`), `schema.Training`, `schema.Evaluation` with the
      task's keys (types, defaults, limits, `only=` for one kind of dataset,
      and checks between keys as pydantic validators); `Evaluation.metric`
      is a `Literal` of the task's metrics, the first the default;
    - `set_fields`: the family config fields the task sets from its data
      (`model.overrides` may not set them);
    - `other_families`: `{family: its set_fields}` of the other model
      families the task builds (a recipe's `family` picks one: its
      `model.preset` and overrides are that family's; the instance's
      `model_family` is the recipe's), and `evaluation_class(family)` when
      a family has other metrics;
    - `embedded_data` and `metric_names`: the embedded data set and the
      metrics in a few words, for the zoo's table (models/make_table.py).

    Subclasses set `self.batches_per_epoch`, `self.model_config` (the
    family config the model is built from) in `load_data`, and implement
    `make_model`, `compile_arguments`, `train_dataset_fn`,
    `validation_data`, `evaluate`, `export`, and for the tests and the
    export check `example_inputs`, `reference_outputs` and `served_outputs`.

    Args:
        recipe: a resolved recipe (`keras_attn.zoo.recipe.load_recipe`).
    """

    name = None
    family = None
    Data = schema.Data
    Training = schema.Training
    Evaluation = schema.Evaluation
    set_fields = ()
    # A recipe section for the model's parts beside the family's config (a
    # `schema.Section`: the transducer's decoder), or None.
    Decoder = None
    other_families = {}
    embedded_data = None
    metric_names = {}

    @classmethod
    def family_fields(cls):
        """`{family: the config fields the task sets from its data}` of
        every family the task builds, its own `family` first."""
        return {cls.family: tuple(cls.set_fields),
                **{family: tuple(fields) for family, fields in cls.other_families.items()}}

    @classmethod
    def evaluation_class(cls, family):
        """The `Evaluation` of the task's recipes of `family` (by default
        the task's own)."""
        return cls.Evaluation

    def __init__(self, recipe):
        self.recipe = recipe
        self.model_family = recipe.get("family", self.family)
        self.data = recipe["data"]
        self.training = recipe["training"]
        self.evaluation = recipe["evaluation"]
        self.seed = self.training["seed"]
        self.batch_size = self.training["batch_size"]
        kind = schema.dataset_kind(self.data["dataset"])
        self.embedded = kind == schema.EMBEDDED
        # "files:<path>": the user's own files (keras_attn.data.files).
        self.files = schema.files_path(self.data["dataset"]) if kind == "files" else None
        self.tfds_name = self.data["dataset"][len("tfds:"):] if kind == "tfds" else None
        self.batches_per_epoch = None
        self.model_config = None
        self._prepared = False

    # === Data ===

    def prepare(self):
        """Loads the data once (splits, vocabulary). Returns `self`."""
        if not self._prepared:
            self.load_data()
            self._prepared = True
        return self

    def load_data(self):
        raise NotImplementedError

    def tfds_builder(self):
        """The recipe's tfds builder, downloaded and prepared first when
        `data.download` is true."""
        import tensorflow_datasets as tfds

        builder = tfds.builder(self.tfds_name, data_dir=self.data["data_dir"])
        if self.data["download"]:
            builder.download_and_prepare()
        return builder

    def tfds_examples(self, split):
        """The number of examples of a split (slices included), read without
        iterating; a `ValueError` when the data set is not prepared."""
        import tensorflow_datasets as tfds

        try:
            dataset = tfds.load(self.tfds_name, split=split, data_dir=self.data["data_dir"],
                                download=False)
        except AssertionError as error:  # tfds' "could not find data in ..."
            raise ValueError(
                f"Recipe key `data.dataset`: {error}. Prepare it in data.data_dir, or set "
                f"data.download=true. Received: data.dataset={self.data['dataset']!r}"
            ) from None
        return int(dataset.cardinality())

    @property
    def steps_per_epoch(self):
        """The recipe's `training.steps_per_epoch`, else one pass over the
        training data."""
        return self.training["steps_per_epoch"] or self.batches_per_epoch

    @property
    def total_steps(self):
        return self.training["epochs"] * self.steps_per_epoch

    def train_dataset_fn(self, epoch):
        """Epoch `epoch`'s training batches: a pure function of the recipe
        and `epoch` (the same batches at every call)."""
        raise NotImplementedError

    def validation_data(self):
        """Batches for `fit`'s validation (the same at every pass), or None."""
        raise NotImplementedError

    # What holds a validation set in a `files:` folder (the loaders' layout).
    validation_file = "validation.csv or validation.jsonl"

    def no_validation_note(self):
        """The line a run prints when it has no validation set (`fit`
        would otherwise run without one and say nothing): the epoch lines
        then show training metrics only, and the recipe keys (their values
        now) or, for files, the file that give one."""
        import json

        kind = schema.dataset_kind(self.data["dataset"])
        ways = [f"data.{name} (now {json.dumps(self.data.get(name))})"
                for name, info in self.Data.model_fields.items()
                if "validation" in name and schema.for_kind(info, kind)]
        ways = [f"set {' or '.join(ways)}"] if ways else []
        if kind == "files":
            ways.append(f"put {self.validation_file} beside the training data in {self.files}")
        return ("No validation set: the epoch lines show training metrics only"
                + (f" (for one, {', or '.join(ways)})." if ways else "."))

    def process_train_dataset_fn(self, replicas, process, processes):
        """For a task that can make a batch's rows one by one: `epoch ->`
        the rows of each training batch that process `process` of
        `processes` feeds, made without the others' (their images neither
        read nor augmented), equal to those rows of
        `process_rows(even_batches(train_dataset_fn(epoch), replicas, self),
        process, processes)`. None (the default): each process makes the
        whole batch and keeps its rows."""
        return None

    def weightless_rows(self, batch, keep):
        """A batch (of `train_dataset_fn`, `validation_data`, or a prepared
        one from `finish_prepared`) in which the rows where `keep` `(B,)` is
        False count for nothing in the loss, its gradient and the metrics:
        the filler rows that make a batch divide by the replicas
        (`even_batches`, `keras_attn.zoo.prepared.batch_rows`). TensorFlow
        tensors or NumPy arrays, as `keep` is; every batch of a pass gets
        the same structure. By default their `sample_weight` is 0
        (`weightless_rows`); a task whose loss weighs rows otherwise (by
        their tokens) overrides it."""
        return weightless_rows(batch, keep)

    # === Prepared data (keras_attn.zoo.prepared) ===

    def check_preparable(self):
        """Raises `ValueError` when this recipe's data cannot be prepared
        (the task can, this data set not yet)."""

    def test_data(self):
        """The test batches."""
        raise NotImplementedError

    def prepared_batches(self, split, epoch=None):
        """The batches `keras-attn prepare` stores for `split` ("train" with
        `epoch`, "validation", "test"; None when the recipe has none):
        `(x, y[, sample_weight])`, or a dict with those and what
        `finish_prepared` needs. By default the task's own pipelines."""
        if split == "train":
            return self.train_dataset_fn(epoch)
        return self.validation_data() if split == "validation" else self.test_data()

    def check_prepared(self, parts, model):
        """Raises `ValueError` for stored parts (a whole pass, NumPy) that
        the model's own checks do not see (e.g. lengths of examples stored
        once); called before the first step."""

    def prepared_tables(self):
        """Arrays `keras-attn prepare` stores once, for `finish_prepared`
        (e.g. examples the batches index): `{name: array}`."""
        return {}

    def finish_prepared(self, parts, tables):
        """A stored batch's parts (`{"x": ..., "y": ..., ...}`, NumPy) and
        the `prepared_tables` -> the model's `(x, y[, sample_weight])`,
        without TensorFlow."""
        return tuple(parts[key] for key in ("x", "y", "sample_weight") if key in parts)

    def prepared_state(self):
        """What `use_prepared` needs to build the model and its schedule
        without the data (JSON): the steps, and the sizes the data sets
        (and `index_rows`, the examples an `index` part may point at)."""
        return {"batches_per_epoch": self.batches_per_epoch}

    def use_prepared(self, state):
        """Takes the sizes from a prepared directory's `state` instead of
        loading the data (which needs TensorFlow)."""
        self.batches_per_epoch = state["batches_per_epoch"]
        self._prepared = True

    # === Model ===

    def build_model(self):
        """The recipe's model, uncompiled, with weights drawn from the
        recipe's seed in the recipe's precision (the global dtype policy is
        set to it)."""
        import keras

        self.prepare()
        keras.config.set_dtype_policy(self.training["precision"])
        keras.utils.set_random_seed(self.seed)
        model = self.make_model(self.recipe["model"]["preset"],
                                dict(self.recipe["model"]["overrides"]))
        lora = self.training.get("lora")
        if lora:
            self._load_base_weights(model, lora["base"])
            from keras_attn.models import enable_lora

            enable_lora(model, lora["rank"], targets=lora["targets"], alpha=lora["alpha"],
                        train_also=lora["train_also"])
        return model

    def model_note(self):
        """A line for the run's log on where the model's weights come from
        when they are not all drawn from the seed (a checkpoint under a new
        head), or None."""
        return None

    def served_model(self, model):
        """The model a run saves as model.keras, evaluates and exports, from
        the model that trained (`build_model`'s): the same model, except for
        a task that trains another form of it (packed speech trains a
        features-input twin; its waveform model has the same weights)."""
        return model

    def _load_base_weights(self, model, base):
        """The weights of `training.lora.base` (a run directory or a .keras
        file) into `model`, refusing a base of another model."""
        import json
        import os

        key = "`training.lora.base`"
        path = base
        if os.path.isdir(base):
            path = os.path.join(base, "model.keras")
            recipe_path = os.path.join(base, "recipe.json")
            if os.path.exists(recipe_path):
                with open(recipe_path, encoding="utf-8") as handle:
                    theirs = json.load(handle)
                ours = {"family": self.recipe["family"], **self.recipe["model"]}
                theirs = {"family": theirs.get("family"), **theirs.get("model", {})}
                if theirs != ours:
                    raise ValueError(
                        f"{key} was trained with another model: its recipe has "
                        f"{theirs}, this one {ours}. Received: training.lora.base={base!r}"
                    )
        if not (os.path.isfile(path) and path.endswith(".keras")):
            raise ValueError(
                f"{key} must be a run directory with a model.keras (a finished run) or a "
                f".keras file. Received: training.lora.base={base!r}"
            )
        try:
            model.load_weights(path)
        except (ValueError, KeyError, OSError) as error:
            raise ValueError(
                f"{key} does not hold this recipe's model ({error}). "
                f"Received: training.lora.base={base!r}"
            ) from None

    def make_model(self, preset, overrides):
        raise NotImplementedError

    def assume_data_sizes(self):
        """Sets what `make_model` takes from the data (the class count, the
        vocabulary) from the recipe and the data set's metadata alone,
        without loading or downloading the data: for counting a recipe's
        parameters (models/make_table.py --count)."""
        raise NotImplementedError

    def compile_arguments(self, model):
        """The loss and metrics given to `compile` (a dict)."""
        raise NotImplementedError

    def compile(self, model):
        """Compiles `model` with the task's loss and metrics and the recipe's
        optimizer, schedule and `jit_compile`. Returns `model`."""
        optimizer = build_optimizer(self.training, self.total_steps, self.hidden_dim(model))
        model.compile(optimizer=optimizer, jit_compile=_jit_compile(self.training["jit_compile"]),
                      **self.compile_arguments(model))
        return model

    def hidden_dim(self, model):
        return self.model_config.hidden_dim

    def load_model(self, path):
        """`model.keras` at `path`, compiled for evaluation."""
        import importlib

        import keras

        # The family's package (keras_attn.models.<family>) registers its classes.
        importlib.import_module(f"keras_attn.models.{self.recipe['family']}")
        self.prepare()
        keras.config.set_dtype_policy(self.training["precision"])
        return self.compile(keras.saving.load_model(path, compile=False))

    # === Results ===

    def evaluate(self, model):
        """The test metrics: a dict of floats including the recipe's metric."""
        raise NotImplementedError

    def evaluate_prepared(self, model, prepared):
        """The test metrics from prepared data (`keras_attn.zoo.prepared.
        PreparedData`), without TensorFlow: by default its test batches."""
        return self.evaluate_batches(model, prepared.batches("test", finish=self.finish_prepared))

    def evaluate_batches(self, model, batches):
        """`model.evaluate` of test batches (a dataset or prepared `Batches`)
        as a dict of floats: the whole evaluation of the tasks that can be
        prepared."""
        metrics = model.evaluate(batches, verbose=0, return_dict=True)
        return {name: float(value) for name, value in metrics.items()}

    def check_export_format(self, format, precision="float32"):
        """`ValueError` for a format or precision `export` does not write
        (named), before anything is loaded."""
        from keras_attn.export.portable import check_format

        check_format(format, precision)

    def export(self, model, path, format="saved_model", precision="float32"):
        """Writes the serving model to `path` (a directory, atomically) in
        `format` (`"saved_model"`, `"onnx"`, `"litert"`; ONNX and LiteRT also
        in `precision` `"float16"`, LiteRT in `"int8"`)."""
        raise NotImplementedError

    def evaluate_served(self, serve):
        """The test metrics of a served model: `serve(inputs) -> outputs`,
        dicts of NumPy arrays named as in the task's serving contract
        (`example_inputs` / `reference_outputs`): an exported directory in
        its runtime, or the Keras model through `reference_outputs`, scored
        on the same inputs the same way."""
        raise ValueError(
            f"Recipes of task {self.name!r} are not scored from an exported model yet (image "
            "classification, speech and translation are). Received: task="
            f"{self.name!r}")

    def assets(self):
        """Files the run directory should hold besides the model, as
        `{file name: text}` (a vocabulary)."""
        return {}

    def example_inputs(self):
        """A few test inputs in the form the SavedModel's `serve` takes."""
        raise NotImplementedError

    def reference_outputs(self, model, inputs):
        """What `serve` should return for `inputs`, computed with the Keras
        model: a dict of NumPy arrays."""
        raise NotImplementedError

    def served_outputs(self, loaded, inputs):
        """What the loaded SavedModel's `serve` returns: a dict of NumPy arrays."""
        raise NotImplementedError


def _jit_compile(value):
    """The recipe's `training.jit_compile`, except `true` under a TensorFlow
    distribution strategy of several replicas: XLA there cannot read a
    mirrored variable's copy on another device (`Trying to access resource
    .../replica_1/... located in device CPU:1 from device CPU:0`, seen with
    two devices), and Keras's own "auto" turns XLA off under tf.distribute
    for the same reason; so does this, with a warning."""
    import keras

    if value is not True or keras.backend.backend() != "tensorflow":
        return value
    import tensorflow as tf

    if not tf.distribute.has_strategy() or \
            tf.distribute.get_strategy().num_replicas_in_sync < 2:
        return value
    warnings.warn(
        "training.jit_compile=true is not used under TensorFlow's distribution strategy "
        f"({tf.distribute.get_strategy().num_replicas_in_sync} replicas): its XLA cannot "
        "read mirrored variables across devices (Keras's jit_compile='auto' turns XLA off "
        "there too); these steps run as TensorFlow graphs.", stacklevel=3)
    return False


def even_batches(dataset, replicas, task=None):
    """`dataset` with every batch's size made a multiple of `replicas` (JAX's
    data parallelism shards the batch axis evenly): a short batch (the last
    of an epoch or of a length bucket) is filled up with its own first
    examples again, and those filler rows are made to count for nothing
    (`task.weightless_rows`; with `task` None, `weightless_rows`, for
    `(x, y[, sample_weight])` batches), so that the step's loss and
    gradient are those of the real rows alone. A pure function of the
    batch, so the epoch stays a pure function of (recipe, epoch)."""
    import tensorflow as tf

    weightless = weightless_rows if task is None else task.weightless_rows

    def fill(*batch):
        structure = batch[0] if len(batch) == 1 else batch
        size = tf.shape(tf.nest.flatten(structure)[0])[0]
        positions = tf.range((size + replicas - 1) // replicas * replicas)
        index = positions % size
        filled = tf.nest.map_structure(lambda tensor: tf.gather(tensor, index), structure)
        return weightless(filled, positions < size)

    return dataset.map(traced_as_written(fill))


def process_positions(replicas, process, processes, arange=np.arange):
    """`size -> positions` of the rows that process `process` of `processes`
    feeds of a batch of `size` rows filled up to a multiple of `replicas` by
    `even_batches` (position p is row p % size; p >= size a filler): its
    slice of the filled batch, as `process_rows` cuts it. `arange`:
    `np.arange` for a NumPy size, `tf.range` for a size inside a `tf.data`
    map."""

    def positions(size):
        share = (size + replicas - 1) // replicas * replicas // processes
        return arange(process * share, (process + 1) * share)

    return positions


def in_memory_rows_fn(task, replicas, process, processes, rows_dataset):
    """`Task.process_train_dataset_fn` for a task whose training examples
    are in memory (embedded or the user's files) and bucketed by length:
    `epoch -> rows_dataset(positions, epoch)`, each process making only its
    rows (`process_positions`) of every batch. None for packed rows (made
    once, in memory: nothing per row to save) and tfds streams (lengths not
    known before they are read): there each process cuts the whole batch."""
    if task.data.get("packing") or task.tfds_name:
        return None
    task.prepare()
    positions = process_positions(replicas, process, processes)
    return lambda epoch: rows_dataset(positions, epoch)


def weightless_rows(batch, keep):
    """An `(x, y[, sample_weight])` batch with the rows where `keep` (a
    `(B,)` boolean vector) is False weighing nothing: `sample_weight`
    (each of its arrays, of any rank) zero on those rows, or, without one,
    a `(B,)` float32 weight of 1 and 0. TensorFlow tensors (in a `tf.data`
    map) or NumPy arrays (prepared batches), as `keep` is.

    The losses then must divide by the sum of the weights (Keras's
    `reduction="mean_with_sample_weight"`, as the task adapters compile
    theirs), and metrics read the weights as `weighted_metrics`."""
    if not isinstance(batch, (tuple, list)) or len(batch) not in (2, 3):
        raise ValueError("Filler rows can be made weightless only in batches of "
                         f"(x, y[, sample_weight]). Received: a batch of {type(batch).__name__}"
                         + (f" of {len(batch)} parts" if isinstance(batch, (tuple, list))
                            else ""))
    x, y = batch[0], batch[1]
    if len(batch) == 3 and batch[2] is not None:
        weights = _map_structure(lambda weight: rows_replaced(weight, keep, 0), batch[2])
    else:
        weights = _as_float32(keep)
    return x, y, weights


def rows_replaced(values, keep, fill):
    """`values` `(B, ...)` with every row where `keep` `(B,)` is False set
    to `fill`, in `values`' dtype; TensorFlow or NumPy, as `keep` is."""
    if isinstance(keep, np.ndarray):
        values = np.asarray(values)
        mask = keep.reshape((-1,) + (1,) * (values.ndim - 1))
        return np.where(mask, values, np.asarray(fill, values.dtype))
    import tensorflow as tf

    mask = tf.reshape(keep, [-1] + [1] * (values.shape.rank - 1))
    return tf.where(mask, values, tf.cast(fill, values.dtype))


def _as_float32(keep):
    if isinstance(keep, np.ndarray):
        return keep.astype("float32")
    import tensorflow as tf

    return tf.cast(keep, tf.float32)


def _map_structure(function, structure):
    """`keras.tree.map_structure` without importing Keras in a `tf.data`
    map: over dicts, tuples and lists."""
    if isinstance(structure, dict):
        return {key: _map_structure(function, value) for key, value in structure.items()}
    if isinstance(structure, (tuple, list)):
        return type(structure)(_map_structure(function, value) for value in structure)
    return function(structure)


def batch_count(examples, batch_size):
    """Batches in one pass when the last one may be partial."""
    return math.ceil(examples / batch_size)


def pretrained_source(path, key, run_task, run_files, hf_files, hf_what, noun):
    """"run" (a finished run of the `run_task` task: its directory holds
    `run_files`) or "hf" (a Hugging Face directory holding `hf_files`, the
    weights in `model.safetensors` or in shards with
    `model.safetensors.index.json`) for the recipe key `key` (a fine-tuning's
    `training.pretrained`); a `ValueError` naming the key otherwise: a run
    of another task (the `noun` it would bring comes from a `run_task` run),
    or a directory that is neither (`hf_what` names the Hugging Face kind)."""
    import json

    def has(files):
        return all(os.path.isfile(os.path.join(path, name)) for name in files)

    if os.path.isdir(path) and has(run_files):
        with open(os.path.join(path, "recipe.json"), encoding="utf-8") as handle:
            task = json.load(handle).get("task")
        if task != run_task:
            raise ValueError(
                f"Recipe key `{key}` names a run of the {task!r} task; {noun} comes from a "
                f"{run_task} run. Received: {key}={path!r}")
        return "run"
    sharded = ["model.safetensors.index.json" if name == "model.safetensors" else name
               for name in hf_files]
    if os.path.isdir(path) and (has(hf_files) or has(sharded)):
        return "hf"
    raise ValueError(
        f"Recipe key `{key}` must be a finished run directory of the {run_task} task "
        f"({', '.join(run_files)}) or a {hf_what} directory ({', '.join(hf_files)}; or the "
        f"weights' shards and model.safetensors.index.json). Received: {key}={path!r}")

