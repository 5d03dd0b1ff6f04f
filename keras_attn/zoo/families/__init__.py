"""The text encoder families of the zoo's text tasks (text_classification,
token_classification, masked_lm): one `TextFamily` object per family owns
what differs between families, and the tasks ask it (they hold no family
conditionals).

A family is a `TextFamily` subclass in a module of this package, found,
not written, as the tasks are (`FAMILIES`): adding a text family is adding
its module (and its model in `keras_attn.models`, and its recipes). Its
`name` is a key here; `recipe_family` the recipe `family` whose recipes it
builds (RoBERTa and XLM-R recipes are the bert family's: a `BertConfig`
with RoBERTa's positions, so the resolved recipes keep `"family": "bert"`);
`model_type` the `config.json` model type of its Hugging Face directories
(`by_model_type`, for a pretrained source of that family).

Every family learns the zoo's WordPiece vocabulary from the training
texts (`keras_attn.data.text`); `tokenizer_kind`, `special_tokens` and
`pad_id` describe the family's own vocabulary, the one a Hugging Face
directory of it brings. A Hugging Face directory is read by the family its
`config.json`'s `model_type` names (`hf_family`), with that family's own
config, weights and tokenizer readers (`keras_attn.convert`).

Importing this package imports neither TensorFlow nor Keras: a run from
prepared files trains without TensorFlow (`keras_attn.zoo.prepared`).
"""

import importlib
import json
import os
import pkgutil
from typing import Any
from typing import NamedTuple

PRETRAINED = "training.pretrained"


class Pretrained(NamedTuple):
    """What a pretrained source gives a fine-tuning: its tokenizer, its
    vocabulary (a list of tokens) and its backbone's config."""

    tokenizer: Any
    vocabulary: list
    config: Any


def vocabulary_pad_id(vocabulary):
    """The `[PAD]` id of a learned vocabulary (its special tokens' order
    when the sizes are assumed before the vocabulary is learned)."""
    if vocabulary[0] is None:  # assume_data_sizes: the learned order
        # Imported here: keras_attn.data.text imports TensorFlow, which a
        # run from prepared files does without.
        from keras_attn.data.text import SPECIAL_TOKENS

        return SPECIAL_TOKENS.index("[PAD]")
    return vocabulary.index("[PAD]")


# BERT's special tokens (ModernBERT's are the same).
BERT_SPECIAL_TOKENS = {"cls": "[CLS]", "sep": "[SEP]", "pad": "[PAD]", "mask": "[MASK]",
                       "unk": "[UNK]"}
_TOKENIZER_WORDS = {"wordpiece": "WordPiece", "byte_level_bpe": "BPE",
                    "sentencepiece": "SentencePiece"}


def _lines(path):
    with open(path, encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle if line.rstrip("\n")]


class TextFamily:
    """A text encoder family: what the zoo's text tasks take from it.

    Class attributes:
        name: the key in `FAMILIES`; `title` its name in words.
        recipe_family: the recipe `family` it builds (RoBERTa's and
            XLM-R's: "bert"); the family named so is the one its recipes
            get (`text_family`).
        model_type: `config.json`'s `model_type` of its Hugging Face
            directories.
        tokenizer_kind: its own tokenizer, `"wordpiece"`,
            `"byte_level_bpe"` or `"sentencepiece"`.
        special_tokens: `{"cls", "sep", "pad", "mask", "unk"}` tokens of its
            own vocabulary; `pad_id` that vocabulary's padding id.
        pooling: how a sequence classifier pools (`"pooler"`: BERT's tanh
            dense on `[CLS]`; `"cls"`: the `[CLS]` vector).
        inputs: the model's inputs (and the prepared rows' keys).
        tasks: the zoo tasks it builds.
        set_fields: the config fields the tasks set from their data (the
            recipe's `model.overrides` may not set them).
        next_sentence_prediction: its masked LM also predicts the next
            sentence (masked_lm's `nsp_accuracy`).
        hf_tokenizer_files: the files of its Hugging Face directories'
            tokenizer, as alternatives (tuples of files; any one whole
            tuple will do), the readable one first.
        hf_tasks: the zoo tasks that fine-tune its Hugging Face
            directories (their pipelines take its tokenizer).
    """

    name = None
    title = None
    recipe_family = None
    model_type = None
    tokenizer_kind = None
    special_tokens = {}
    pad_id = None
    pooling = None
    inputs = ("token_ids", "padding_mask")
    tasks = ()
    set_fields = ("vocabulary_size",)
    next_sentence_prediction = False
    hf_tokenizer_files = (("tokenizer.json",), ("vocab.json", "merges.txt"))
    hf_tasks = ("text_classification",)

    # === The config and the models ===

    def model_config(self, preset, overrides, vocabulary):
        """The config of `preset` with `overrides` for the learned
        `vocabulary` (its size, and what else the family takes from it)."""
        raise NotImplementedError

    def config_from_dict(self, fields):
        """The config of a prepared directory's state (its fields)."""
        raise NotImplementedError

    def backbone(self, preset, overrides, vocabulary):
        """A new backbone of `preset` with `overrides` for `vocabulary`."""
        raise NotImplementedError

    def sequence_classifier(self, backbone, num_classes):
        raise NotImplementedError

    def token_classifier(self, backbone, num_classes):
        raise NotImplementedError

    def masked_lm(self, backbone, max_segments, next_sentence):
        """The masked LM of `backbone` (`max_segments` next-sentence slots
        per packed row; `next_sentence`: the data has sentence pairs)."""
        raise NotImplementedError

    # === masked_lm: BERT's pretraining batches as the model takes them ===

    def masked_lm_inputs(self):
        """The masked LM's serving inputs."""
        return self.inputs

    def masked_lm_batches(self, dataset):
        """A `tf.data` dataset of BERT pretraining batches (`(x, {"mlm",
        "nsp"}, weights)`, `mask_positions` in `x`) as the masked LM takes
        them."""
        return dataset

    def masked_lm_outputs(self, outputs):
        """The masked LM's outputs as a dict (`{"mlm": ...[, "nsp": ...]}`)."""
        return outputs

    def masked_lm_compile_arguments(self):
        """The masked LM's loss and metrics for `compile` (`{}`: its own)."""
        return {}

    # === Pretrained sources (training.pretrained) ===

    def read_pretrained(self, path, kind):
        """The tokenizer, vocabulary and config of `path`, a pretrained
        source of `kind` (`"run"`: a finished masked_lm run of this
        family's recipes; `"hf"`: a Hugging Face directory): `Pretrained`;
        a `ValueError` naming `training.pretrained` for one it does not
        read."""
        if kind == "run":
            return self._read_run(path)
        return self.read_hf(path)

    def _read_run(self, path):
        from keras_attn.data import text

        with open(os.path.join(path, "recipe.json"), encoding="utf-8") as handle:
            theirs = json.load(handle)
        family = theirs.get("family", "bert")
        if family != self.recipe_family:
            raise ValueError(
                f"Recipe key `{PRETRAINED}` names a run of the {family!r} family; this "
                f"recipe's family is {self.recipe_family!r}. Received: "
                f"{PRETRAINED}={path!r}")
        vocabulary = _lines(os.path.join(path, "vocab.txt"))
        return Pretrained(text.make_tokenizer(vocabulary), vocabulary, self.model_config(
            theirs["model"]["preset"], theirs["model"].get("overrides", {}), vocabulary))

    def read_hf(self, path):
        """`Pretrained` of a Hugging Face directory of this family: its
        own tokenizer (`hf_tokenizer`), the tokens by id, its config
        (`hf_config`); a `ValueError` naming the file when the tokenizer
        lacks a special token the packing uses, holds ids past the model's
        vocabulary, or pads with another id than the model's."""
        tokenizer, config = self.hf_tokenizer(path), self.hf_config(path)
        file = os.path.join(path, "+".join(self.present_tokenizer_files(path)))
        size = int(tokenizer.vocabulary_size())
        if size > config.vocabulary_size:
            raise ValueError(
                f"{file}: the tokenizer's {size} ids do not fit the model's vocabulary "
                f"(config.json vocab_size={config.vocabulary_size}). Received: "
                f"{PRETRAINED}={path!r}")
        vocabulary = self.hf_vocabulary(tokenizer)
        for role in ("cls", "sep", "pad"):
            if self.special_tokens[role] not in vocabulary:
                raise ValueError(
                    f"{file}: the {self.title} tokenizer must hold {self.special_tokens[role]!r} "
                    f"(the {role} token a text is packed with). Received: "
                    f"{PRETRAINED}={path!r}")
        pad_id, model_pad = vocabulary.index(self.special_tokens["pad"]), self.config_pad_id(config)
        if model_pad is not None and pad_id != model_pad:
            raise ValueError(
                f"{file}: the tokenizer's {self.special_tokens['pad']} is id {pad_id}, config.json's "
                f"pad_token_id {model_pad}; the model must pad with the tokenizer's id. "
                f"Received: {PRETRAINED}={path!r}")
        return Pretrained(tokenizer, vocabulary, config)

    def hf_vocabulary(self, tokenizer):
        """The tokenizer's tokens, by id."""
        return [tokenizer.id_to_token(i) for i in range(int(tokenizer.vocabulary_size()))]

    def config_pad_id(self, config):
        """The padding id the model's config holds (None: none it uses)."""
        return None

    def present_tokenizer_files(self, path):
        """The first of `hf_tokenizer_files` that `path` holds whole, or ()."""
        return next((files for files in self.hf_tokenizer_files
                     if all(os.path.isfile(os.path.join(path, name)) for name in files)), ())

    def hf_tokenizer_assets(self, path):
        """`{file name: text}` of the tokenizer files of the Hugging Face
        directory `path` (the text ones), for a run directory."""
        assets = {}
        for name in self.present_tokenizer_files(path):
            if name.endswith((".json", ".txt")):
                with open(os.path.join(path, name), encoding="utf-8") as handle:
                    assets[name] = handle.read()
        return assets

    def hf_config(self, path):
        """The config of a Hugging Face directory of this family."""
        raise NotImplementedError

    def hf_tokenizer(self, path):
        """The tokenizer of a Hugging Face directory of this family."""
        raise NotImplementedError

    def hf_backbone(self, path):
        """The backbone of a Hugging Face directory of this family."""
        raise NotImplementedError

    def pretrained_backbone(self, path, kind):
        """The backbone of a pretrained source (`read_pretrained`'s)."""
        if kind == "hf":
            return self.hf_backbone(path)
        import keras

        return keras.saving.load_model(os.path.join(path, "model.keras"),
                                       compile=False).backbone


def find_families():
    """{name: a `TextFamily` instance} of every module in this package,
    each recipe family's own (its `name` is the recipe family) first."""
    found = {}
    for module_info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, TextFamily)
                    and value.__module__ == module.__name__):
                if value.name in found:
                    raise ImportError(f"Two text families are named {value.name!r}: "
                                      f"{found[value.name]} and {value()}")
                found[value.name] = value()
    return found


FAMILIES = find_families()


def recipe_families():
    """{recipe family: the family that builds its recipes}."""
    return {family.recipe_family: family for family in FAMILIES.values()
            if family.name == family.recipe_family}


def text_family(recipe_family):
    """The family that builds the recipes of `recipe_family` (a recipe's
    `family`: "bert", "modernbert")."""
    return recipe_families()[recipe_family]


def task_families(task_name):
    """{recipe family: the config fields set from the data} of the families
    that build `task_name`."""
    return {name: tuple(family.set_fields) for name, family in recipe_families().items()
            if task_name in family.tasks}


def by_model_type(model_type):
    """The family of a Hugging Face `config.json`'s `model_type`, or None."""
    return next((family for family in FAMILIES.values() if family.model_type == model_type),
                None)


def hf_family(path, recipe_family, task):
    """The family of the Hugging Face directory `path` (its `config.json`'s
    `model_type`), given as `training.pretrained` to a `task` recipe of
    `recipe_family`; a `ValueError` naming the key when no family reads
    it, its recipes are of another family, `task` does not take its
    tokenizer, or its tokenizer files are missing."""
    from keras_attn._base.zoo_files import read_json

    config = read_json(os.path.join(path, "config.json"))  # pretrained_source checked it is there
    model_type = config.get("model_type", "bert") if isinstance(config, dict) else None
    family = by_model_type(model_type)
    received = f"Received: {PRETRAINED}={path!r}"
    if family is None:
        types = sorted(f.model_type for f in FAMILIES.values())
        raise ValueError(
            f"Recipe key `{PRETRAINED}` must be a Hugging Face directory of a text family the "
            f"zoo fine-tunes (config.json model_type one of {types}); "
            f"{os.path.join(path, 'config.json')} has model_type={model_type!r}. {received}")
    if family.recipe_family != recipe_family:
        raise ValueError(
            f"Recipe key `family` must be {family.recipe_family!r} to fine-tune {path}, a Hugging "
            f"Face {family.title} directory (config.json model_type={model_type!r}; its recipes "
            f"are the {family.recipe_family} family's). Received: family={recipe_family!r}")
    if task not in family.hf_tasks:
        raise ValueError(
            f"Recipe key `{PRETRAINED}` of a {task} recipe must be a masked_lm run or a Hugging "
            f"Face BERT directory: {path} is a {family.title} directory, whose "
            f"{_TOKENIZER_WORDS[family.tokenizer_kind]} tokenizer the {task} task does not read "
            f"({', '.join(family.hf_tasks)} does). {received}")
    if not family.present_tokenizer_files(path):
        files = " or ".join(" and ".join(names) for names in family.hf_tokenizer_files)
        raise ValueError(
            f"Recipe key `{PRETRAINED}` must hold its tokenizer: {path} is a Hugging Face "
            f"{family.title} directory without {files}. {received}")
    return family
