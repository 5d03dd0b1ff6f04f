import copy
import glob
import json
import os

import textwrap

import pytest

from keras_attn.errors import RecipeError
from keras_attn.training.checkpoints import differences
from keras_attn.zoo import recipe as recipes
from keras_attn.zoo import reference
from keras_attn.zoo import schema
from keras_attn.zoo.tasks import TASKS

pytestmark = pytest.mark.backend_independent

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = sorted(
    path for path in glob.glob(os.path.join(ROOT, "models", "*", "*.json"))
    if os.path.basename(os.path.dirname(path)) != "results"
)


def _vit():
    return recipes.read_recipe_file(os.path.join(ROOT, "models/vit/vit_tiny_digits.json"))


def test_every_recipe_in_the_zoo_validates():
    # One test for the whole zoo (each test pays for the Keras session reset
    # of conftest.py); the failures are listed together.
    failures = {}
    for path in RECIPES:
        try:
            resolved = recipes.load_recipe(path)
        except ValueError as error:
            failures[path] = str(error)
            continue
        if os.path.basename(os.path.dirname(path)) != resolved["family"]:
            failures[path] = f"in the folder of another family than {resolved['family']}"
        # Resolved recipes are JSON, and resolving again changes nothing.
        elif recipes.validate_recipe(json.loads(json.dumps(resolved))) != resolved:
            failures[path] = "resolving the resolved recipe changes it"
    assert len(RECIPES) >= 4 and not failures, failures


def test_recipe_names_are_unique_and_the_small_ones_exist():
    names = [os.path.splitext(os.path.basename(p))[0] for p in RECIPES]
    assert len(names) == len(set(names))
    for name in ("vit_tiny_digits", "bert_tiny_pydoc", "transformer_numbers",
                 "conformer_tiny_digits"):
        assert name in names


def test_defaults_are_filled_in():
    minimal = {
        "name": "x", "family": "vit", "task": "image_classification",
        "model": {"preset": "vit_tiny_16"}, "data": {"dataset": "embedded"},
        "training": {"batch_size": 8, "epochs": 1, "optimizer": {"name": "adam"}},
    }
    resolved = recipes.validate_recipe(minimal)
    assert resolved["training"]["schedule"] == {"name": "constant"}
    assert resolved["training"]["optimizer"]["learning_rate"] == 0.001
    assert resolved["training"]["precision"] == "float32"
    assert resolved["evaluation"] == {"metric": "accuracy"}
    assert resolved["data"]["augmentation"] == {"zoom": 0.0, "translation": 0.0, "flip": False}
    assert "train_split" not in resolved["data"]  # a tfds-only key
    assert resolved["expected"] is None and resolved["model"]["overrides"] == {}


BAD = [
    # (overrides, dotted key in the message, received value in the message)
    ([("colour", "red")], "`colour`", "'red'"),
    ([("training.optimiser", {})], "`training.optimiser`", "{}"),
    ([("training.batch_size", "64")], "`training.batch_size`", "'64'"),
    ([("training.batch_size", True)], "`training.batch_size`", "True"),
    ([("training.epochs", 0)], "`training.epochs`", "0"),
    ([("training.optimizer.learning_rate", -1)], "`training.optimizer.learning_rate`", "-1"),
    ([("model.preset", "vit_gigantic_16")], "`model.preset`", "'vit_gigantic_16'"),
    ([("model.overrides.hiden_dim", 64)], "`model.overrides.hiden_dim`", "64"),
    ([("model.overrides.hidden_dim", "wide")], "`model.overrides.hidden_dim`", "'wide'"),
    ([("model.overrides.num_classes", 5)], "`model.overrides.num_classes`", "5"),
    ([("family", "gpt")], "`family`", "'gpt'"),
    ([("task", "masked_lm")], "`task`", "'masked_lm'"),
    ([("training.optimizer.name", "sgd")], "`training.optimizer.name`", "'sgd'"),
    ([("training.schedule", {"name": "step"})], "`training.schedule.name`", "'step'"),
    ([("training.schedule", {"name": "linear", "alpha": 0.1})],
     "`training.schedule.alpha`", "0.1"),
    ([("training.schedule.warmup_steps", 2.5)], "`training.schedule.warmup_steps`", "2.5"),
    ([("training.precision", "float16")], "`training.precision`", "'float16'"),
    ([("training.jit_compile", "yes")], "`training.jit_compile`", "'yes'"),
    ([("data.dataset", "imagenet")], "`data.dataset`", "'imagenet'"),
    ([("data.dataset", "tfds:no_such_dataset")], "`data.dataset`", "'tfds:no_such_dataset'"),
    ([("data.dataset", "tfds:wmt14_translate/xx-yy")], "`data.dataset`",
     "'tfds:wmt14_translate/xx-yy'"),
    ([("data.dataset", "tfds:cifar10")], "`data.test_fraction`", "0.2"),  # embedded only
    ([("data.train_split", "train")], "`data.train_split`", "'train'"),  # tfds only
    ([("data.augmentation.zoom", 1.5)], "`data.augmentation.zoom`", "1.5"),
    ([("evaluation.metric", "bleu")], "`evaluation.metric`", "'bleu'"),
    ([("evaluation.beam_width", 4)], "`evaluation.beam_width`", "4"),
    ([("expected", {"metric": "loss", "value": 0.9, "hardware": "cpu",
                    "train_seconds": 1, "date": "today"})], "`expected.metric`", "'loss'"),
    ([("name", "other_name")], "`name`", "'other_name'"),
    # Numbers of any magnitude: refused by name before anything is built.
    ([("training.batch_size", 10**20)], "`training.batch_size`", "100000000000000000000"),
    ([("training.epochs", 10**23)], "`training.epochs`", str(10**23)),
    ([("training.seed", -1)], "`training.seed`", "-1"),
    ([("training.seed", 2**70)], "`training.seed`", str(2**70)),
    ([("model.overrides.num_layers", 10**6)], "`model.overrides.num_layers`", "1000000"),
    ([("model.overrides.hidden_dim", 2**40)], "`model.overrides.hidden_dim`", str(2**40)),
    ([("training.optimizer.learning_rate", float("inf"))],
     "`training.optimizer.learning_rate`", "inf"),
    ([("model.overrides.layer_norm_epsilon", float("nan"))],
     "`model.overrides.layer_norm_epsilon`", "nan"),
]


def _sections(cls=schema.Section):
    for sub in cls.__subclasses__():
        yield sub
        yield from _sections(sub)


def test_every_integer_key_of_every_section_has_a_ceiling():
    """The class, not the cases: an integer key without an upper limit (a
    task's `data.utterances=1e9`) would build or synthesise for hours, or
    fail late with a raw error. Every section of every task, the model
    overrides included, bounds its integers (models/recipe.schema.json too)."""
    import typing

    import annotated_types

    for path in RECIPES:  # the overrides' sections are made per config
        recipes.validate_recipe(recipes.read_recipe_file(path))
    def bounded(metadata):
        return any(isinstance(m, (annotated_types.Le, annotated_types.Lt)) for m in metadata)

    def unbounded_ints(annotation, metadata):
        """True when `annotation` (Optional[int], list[int], Annotated[...])
        holds an int without an upper limit."""
        if annotation is int:
            return not bounded(metadata)
        if typing.get_origin(annotation) is typing.Annotated:
            inner, *extra = typing.get_args(annotation)
            limits = [m for e in extra for m in getattr(e, "metadata", [e])]
            return unbounded_ints(inner, list(metadata) + limits)
        return any(unbounded_ints(arg, metadata if arg is int else ())
                   for arg in typing.get_args(annotation))

    unbounded = [f"{section.__name__}.{name}" for section in set(_sections())
                 for name, info in section.model_fields.items()
                 if unbounded_ints(info.annotation, info.metadata)]
    assert not unbounded, unbounded
    recipe = recipes.apply_overrides(
        recipes.read_recipe_file(os.path.join(ROOT, "models/conformer/conformer_tiny_digits.json")),
        [("data.utterances", 10**9)])
    with pytest.raises(ValueError, match=r"`data\.utterances`.*1000000000"):
        recipes.validate_recipe(recipe)


@pytest.mark.parametrize("overrides, key, value", BAD, ids=[b[1] + b[2] for b in BAD])
def test_errors_name_the_dotted_key_and_the_value(overrides, key, value):
    recipe = recipes.apply_overrides(_vit(), overrides)
    with pytest.raises(ValueError) as error:
        recipes.validate_recipe(recipe, name="vit_tiny_digits")
    message = str(error.value)
    assert key in message and f"Received: {key.strip('`')}" in message, message
    assert value in message, message


def test_every_wrong_key_is_reported_at_once():
    recipe = recipes.apply_overrides(_vit(), [("training.batch_size", 0), ("data.colour", 1),
                                              ("training.schedule", {})])
    with pytest.raises(ValueError) as error:
        recipes.validate_recipe(recipe)
    message = str(error.value)
    assert message.startswith("3 problems in the recipe:\n"), message
    assert "Received: training.batch_size=0" in message
    assert "Unknown recipe key `data.colour`" in message
    assert "Missing recipe key `training.schedule.name` (required)" in message


def test_missing_keys_are_named():
    recipe = _vit()
    del recipe["training"]["batch_size"]
    with pytest.raises(ValueError, match=r"Missing recipe key `training.batch_size`"):
        recipes.validate_recipe(recipe)
    recipe = _vit()
    del recipe["model"]["preset"]
    with pytest.raises(ValueError, match=r"Missing recipe key `model.preset`"):
        recipes.validate_recipe(recipe)
    recipe = recipes.apply_overrides(_vit(), [("expected", {"metric": "accuracy", "value": 1})])
    with pytest.raises(ValueError, match=r"Missing recipe key `expected.hardware` .*"
                                         r"Received: expected=\{'metric': 'accuracy'"):
        recipes.validate_recipe(recipe)
    recipe = _vit()
    del recipe["family"]
    with pytest.raises(ValueError, match=r"Missing recipe key `family`"):
        recipes.validate_recipe(recipe)


@pytest.mark.parametrize(
    "path, overrides, key",
    [
        ("bert/bert_tiny_pydoc", [("data.validation_documents", 1)], "data.validation_documents"),
        ("bert/bert_tiny_pydoc", [("model.overrides.vocabulary_size", 10)],
         "model.overrides.vocabulary_size"),
        ("transformer/transformer_numbers", [("data.num_train", 99_990)], "data.num_train"),
        ("transformer/transformer_numbers", [("data.bucket_boundaries", [16, 8])],
         "data.bucket_boundaries"),
        ("transformer/transformer_numbers", [("model.overrides.pad_id", 5)],
         "model.overrides.pad_id"),
        ("conformer/conformer_tiny_digits", [("data.utterances", 300)], "data.utterances"),
        ("conformer/conformer_tiny_digits", [("evaluation.strategy", "sampling")],
         "evaluation.strategy"),
        ("conformer/conformer_tiny_digits", [("model.overrides.kernel_size", 3.5)],
         "model.overrides.kernel_size"),
        ("conformer/conformer_tiny_digits", [("model.overrides.vocabulary_size", 30)],
         "model.overrides.vocabulary_size"),
        ("transformer/transformer_numbers", [("training.label_smoothing", 1.0)],
         "training.label_smoothing"),
        ("conformer/conformer_tiny_digits_transducer", [("decoder.durations", [0])],
         "decoder.durations"),
        ("conformer/conformer_tiny_digits_transducer", [("decoder.predictor_dim", 0)],
         "decoder.predictor_dim"),
        ("conformer/conformer_tiny_digits_transducer", [("data.packing", True)],
         "data.packing"),
        # The decoder of a transducer recipe is not a key of a CTC one.
        ("conformer/conformer_tiny_digits", [("decoder.predictor_dim", 8)], "decoder"),
        # A training key of another task is unknown here.
        ("vit/vit_tiny_digits", [("training.label_smoothing", 0.1)], "training.label_smoothing"),
        # Moved out of the model config: the error says where it went.
        ("transformer/transformer_numbers", [("model.overrides.label_smoothing", 0.2)],
         "model.overrides.label_smoothing"),
    ],
)
def test_task_specific_errors(path, overrides, key):
    recipe = recipes.read_recipe_file(os.path.join(ROOT, "models", path + ".json"))
    with pytest.raises(ValueError, match=rf"`{key}`.*Received: {key}="):
        recipes.validate_recipe(recipes.apply_overrides(recipe, overrides))


def test_label_smoothing_is_a_translation_training_key():
    path = os.path.join(ROOT, "models/transformer/transformer_numbers.json")
    assert recipes.load_recipe(path)["training"]["label_smoothing"] == 0.1  # the paper's
    resolved = recipes.load_recipe(path, ["training.label_smoothing=0"])
    assert resolved["training"]["label_smoothing"] == 0.0
    with pytest.raises(ValueError, match=r"Transformer.compile.*training.label_smoothing"):
        recipes.load_recipe(path, ["model.overrides.label_smoothing=0.2"])


def test_tfds_datasets_validate_with_their_own_keys():
    recipe = _vit()
    del recipe["data"]["test_fraction"]
    recipe = recipes.apply_overrides(recipe, ["data.dataset=tfds:cifar10",
                                              "data.train_split=train[:50%]"])
    data = recipes.validate_recipe(recipe)["data"]
    assert data["dataset"] == "tfds:cifar10" and data["train_split"] == "train[:50%]"
    assert data["test_split"] == "test" and data["download"] is False
    assert schema.check_tfds_name("tfds:wmt14_translate/de-en") == "wmt14_translate/de-en"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("training.epochs=3", ("training.epochs", 3)),
        ("training.optimizer.learning_rate=1e-3", ("training.optimizer.learning_rate", 0.001)),
        ("training.optimizer.name=adamw", ("training.optimizer.name", "adamw")),
        ("data.dataset=tfds:cifar10", ("data.dataset", "tfds:cifar10")),
        ("training.jit_compile=false", ("training.jit_compile", False)),
        ("training.steps_per_epoch=null", ("training.steps_per_epoch", None)),
        ("data.bucket_boundaries=[8, 16]", ("data.bucket_boundaries", [8, 16])),
        ('training.schedule={"name": "linear"}', ("training.schedule", {"name": "linear"})),
        ('description="3"', ("description", "3")),  # a JSON string stays a string
        ("description=a=b", ("description", "a=b")),  # split at the first "="
        ("description=", ("description", "")),
    ],
)
def test_set_parsing(text, expected):
    assert recipes.parse_override(text) == expected


@pytest.mark.parametrize("text", ["1e309", "-1e309", "NaN", "Infinity", "[1, -Infinity]"])
def test_set_refuses_numbers_json_cannot_hold(text):
    with pytest.raises(RecipeError, match=r"`training\.optimizer\.learning_rate` must be a "
                                          r"finite number"):
        recipes.parse_override(f"training.optimizer.learning_rate={text}")


def test_a_recipe_file_with_a_number_json_cannot_hold_is_refused(tmp_path):
    path = tmp_path / "vit_tiny_digits.json"
    recipe = recipes.apply_overrides(_vit(), [("training.optimizer.learning_rate", 0.5)])
    path.write_text(json.dumps(recipe).replace("0.5", "1e999"))
    with pytest.raises(RecipeError, match=r"holds the number 1e999, which is not finite"):
        recipes.load_recipe(path)
    path.write_bytes(b"\xff\xfe{")
    with pytest.raises(RecipeError, match=r"is not valid JSON"):
        recipes.load_recipe(path)
    with pytest.raises(RecipeError, match=r"Recipe key `recipe` must be a JSON object"):
        recipes.apply_overrides([], ["training.epochs=1"])


@pytest.mark.parametrize("text", ["training.epochs", "=3", "training..epochs=3", ".a=1"])
def test_set_parsing_errors(text):
    with pytest.raises(ValueError, match=r"Received: --set"):
        recipes.parse_override(text)


def test_overrides_create_missing_objects_and_refuse_to_descend_into_values():
    recipe = recipes.apply_overrides({"a": 1}, ["b.c.d=2"])
    assert recipe == {"a": 1, "b": {"c": {"d": 2}}}
    with pytest.raises(ValueError, match=r"`a` is not an object.*Received: a=1"):
        recipes.apply_overrides({"a": 1}, ["a.b=2"])
    original = _vit()
    recipes.apply_overrides(original, ["training.epochs=1"])
    assert original == _vit()  # a copy is changed, not the argument


def test_load_recipe_applies_set_and_checks_the_file_name(tmp_path):
    resolved = recipes.load_recipe(os.path.join(ROOT, "models/vit/vit_tiny_digits.json"),
                                   ["training.epochs=2"])
    assert resolved["training"]["epochs"] == 2
    path = tmp_path / "renamed.json"
    path.write_text(json.dumps(_vit()))
    with pytest.raises(ValueError, match=r"`name` must equal .*'renamed'"):
        recipes.load_recipe(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"not valid JSON"):
        recipes.load_recipe(path)


def test_the_generated_schema_and_reference_are_current():
    # models/recipe.schema.json and models/RECIPES.md come from the pydantic
    # declaration; a change to a key must regenerate them.
    command = "python -m keras_attn.zoo.reference"
    with open(os.path.join(ROOT, "models", schema.SCHEMA_FILE), encoding="utf-8") as handle:
        assert handle.read() == reference.schema_text(), f"stale: run {command}"
    with open(os.path.join(ROOT, "models", reference.DOCS_FILE), encoding="utf-8") as handle:
        text = handle.read()
    assert text == reference.markdown(), f"stale: run {command}"
    for task in TASKS.values():
        assert f"\n## {task.name} (family `{task.family}`)" in text


def test_every_recipe_names_the_schema():
    for path in RECIPES:
        assert recipes.read_recipe_file(path).get("$schema") == schema.SCHEMA_REFERENCE, path


@pytest.fixture(scope="module")
def json_validator():
    import jsonschema

    with open(os.path.join(ROOT, "models", schema.SCHEMA_FILE), encoding="utf-8") as handle:
        published = json.load(handle)
    jsonschema.Draft202012Validator.check_schema(published)
    return jsonschema.Draft202012Validator(published)


def test_the_json_schema_accepts_every_recipe(json_validator):
    failures = {path: [error.message for error in
                       json_validator.iter_errors(recipes.read_recipe_file(path))]
                for path in RECIPES}
    assert not any(failures.values()), failures


# What an editor flags as it is typed: the published JSON Schema refuses
# what validate_recipe refuses (the checks that need Python, such as a tfds
# name or a field of the family config, are validate_recipe's alone).
EDITOR_CATCHES = [
    [("colour", "red")],
    [("training.batch_size", "64")],
    [("training.epochs", 0)],
    [("training.optimizer.name", "sgd")],
    [("training.schedule", {"name": "step"})],
    [("training.schedule", {"name": "linear", "alpha": 0.1})],
    [("training.precision", "float16")],
    [("training.jit_compile", "yes")],
    [("data.dataset", "imagenet")],
    [("data.train_split", "train")],  # tfds only
    [("data.dataset", "tfds:cifar10")],  # keeps the embedded-only test_fraction
    [("data.augmentation.zoom", 1.5)],
    [("evaluation.metric", "bleu")],
    [("model.overrides.hiden_dim", 64)],
    [("model.overrides.hidden_dim", "wide")],
    [("model.overrides.num_classes", 5)],
    [("model.preset", "vit_gigantic_16")],
    [("task", "masked_lm")],
    [("training.batch_size", 10**20)],
    [("training.seed", -1)],
    [("training.seed", 2**70)],
    [("model.overrides.num_layers", 10**6)],
    [("model.overrides.hidden_dim", 2**40)],
]


@pytest.mark.parametrize("overrides", EDITOR_CATCHES, ids=[str(o[0][0]) for o in EDITOR_CATCHES])
def test_the_json_schema_refuses_what_validation_refuses(json_validator, overrides):
    recipe = recipes.apply_overrides(_vit(), overrides)
    with pytest.raises(ValueError):
        recipes.validate_recipe(recipe)
    assert not json_validator.is_valid(recipe)


def test_a_new_task_is_one_module(tmp_path, monkeypatch):
    # A fifth task (BERT sequence classification) declared in one file of
    # its own: the recipe schema, its errors and the JSON Schema follow.
    (tmp_path / "sentence_labels.py").write_text(textwrap.dedent('''
        from typing import Literal

        from keras_attn.zoo import schema
        from keras_attn.zoo.tasks.base import Task


        class Data(schema.Data):
            """Sentences and their labels."""

            sequence_length: int = schema.field(128, ge=8, description="Tokens per sentence.")


        class Evaluation(schema.Evaluation):
            metric: Literal["accuracy", "f1"] = schema.field("accuracy", description="Test.")


        class SentenceLabels(Task):
            name = "sentence_labels"
            family = "bert"
            Data = Data
            Evaluation = Evaluation
            set_fields = ("vocabulary_size",)
    '''))
    from keras_attn.zoo import tasks

    monkeypatch.setattr(tasks, "__path__", [*tasks.__path__, str(tmp_path)])
    monkeypatch.setattr(tasks, "TASKS", tasks.find_tasks())
    bert_tasks = ["masked_lm", "sentence_labels", "text_classification", "token_classification"]
    assert tasks.families()["bert"] == bert_tasks
    recipe = {
        "name": "x", "family": "bert", "task": "sentence_labels",
        "model": {"preset": "bert_tiny"}, "data": {"dataset": "embedded"},
        "training": {"batch_size": 8, "epochs": 1, "optimizer": {"name": "adam"}},
    }
    resolved = recipes.validate_recipe(recipe)
    assert resolved["data"] == {"dataset": "embedded", "sequence_length": 128}
    assert resolved["evaluation"] == {"metric": "accuracy"}
    with pytest.raises(ValueError, match=r"`data.sequence_length`.*Received: "
                                         r"data.sequence_length=4"):
        recipes.validate_recipe(recipes.apply_overrides(recipe, ["data.sequence_length=4"]))
    with pytest.raises(ValueError,
                       match=r"`task` must be one of \['masked_lm', 'sentence_labels', "
                             r"'text_classification', 'token_classification'\]"):
        recipes.validate_recipe(recipes.apply_overrides(recipe, ["task=translation"]))
    tags = reference.json_schema()["discriminator"]["mapping"]
    assert "sentence_labels" in tags and "masked_lm" in tags
    assert "## sentence_labels (family `bert`)" in reference.markdown()


def test_a_task_module_must_define_its_task(tmp_path, monkeypatch):
    (tmp_path / "half_done.py").write_text("X = 1\n")
    from keras_attn.zoo import tasks

    monkeypatch.setattr(tasks, "__path__", [*tasks.__path__, str(tmp_path)])
    with pytest.raises(ImportError, match=r"half_done must define one Task subclass"):
        tasks.find_tasks()


def test_fingerprint_and_difference():
    resolved = recipes.load_recipe(os.path.join(ROOT, "models/vit/vit_tiny_digits.json"))
    documented = copy.deepcopy(resolved)
    documented["expected"] = {"metric": "accuracy", "value": 1}
    documented["description"] = "changed"
    assert recipes.fingerprint(documented) == recipes.fingerprint(resolved)
    changed = recipes.apply_overrides(resolved, ["training.optimizer.learning_rate=0.1"])
    assert differences(resolved, changed) == [("training.optimizer.learning_rate", 0.002, 0.1)]
    assert differences(resolved, copy.deepcopy(resolved)) == []
    # remat changes neither numbers nor variables: a run resumes with it
    # turned on (it is still validated as a config field).
    remat = recipes.validate_recipe(
        recipes.apply_overrides(resolved, ["model.overrides.remat=true"]), name="vit_tiny_digits")
    assert remat["model"]["overrides"]["remat"] is True
    before = copy.deepcopy(remat)
    assert recipes.fingerprint(remat) == recipes.fingerprint(resolved)
    assert remat == before  # the recipe itself keeps its remat
    other = recipes.apply_overrides(resolved, ["model.overrides.num_layers=1"])
    assert differences(recipes.fingerprint(resolved), recipes.fingerprint(other)) == [
        ("model.overrides.num_layers", 4, 1)]
