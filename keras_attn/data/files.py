"""Your own files as training data, for the five tasks of the package.

```
path (a file, or a folder with train / validation / test)
 -> read and checked here (columns, fields, labels, images, audio)
 -> the task's tf.data pipeline (keras_attn.data.text, .images, .speech,
    .translation)
 -> FilesData(train, validation, test, class_names, vocabulary, tokenizer)
```

Tables are CSV (a header row naming the columns) or JSON Lines (one object
per line); images are a folder with one sub-folder per class (Keras's
`image_dataset_from_directory` layout); audio is WAV, listed in a table with
its transcript. Splits: a single file (or class folder) is the training set;
a folder holding `train.csv` / `train.jsonl` (or a `train/` class folder)
and optionally `validation.*` and `test.*` gives the three; with
`validation_fraction`, a seeded share of the training examples is held out
for validation when there is no validation file.

Reading and checking need no TensorFlow (the recipe check uses them before
anything loads); the pipelines import it when they are built, and images are
decoded with it once when the data loads.

No silent wrong answer: what a file holds is used as it is or refused with a
`keras_attn.errors.DataFileError` (a `ValueError`) that names the file, the
line (or row), the field and the value. A table is UTF-8; a CSV row has one
value per column; a JSON value is of its field's kind (a text is a string:
null, a number or NaN is not one); integer labels are class ids 0, 1, ...
and a validation or test label the training set lacks is refused (a model
cannot learn a class it never sees); every class folder holds an image and
every image decodes; a WAV file is mono, whole and not empty.
"""

import csv
import dataclasses
import json
import math
import os
import re
from typing import Optional

import numpy as np
from keras_attn._base.errors import DataFileError
# The one WAV reader (below data and export: SpeechRecognizerArtifact reads
# WAV files too); its names stay importable from here.
from keras_attn._wav import SAMPLE_RATES  # noqa: F401
from keras_attn._wav import read_wav
from keras_attn._wav import resample  # noqa: F401
from keras_attn._wav import wav_samples  # noqa: F401

SPLITS = ("train", "validation", "test")
TABLE_SUFFIXES = (".csv", ".jsonl")
# What keras.utils.image_dataset_from_directory reads.
IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png")
# The kinds of value of a table's field (as a JSON value; a CSV value is a
# string, which each kind takes): a text is a string; a label is a class id
# (an integer) or a class name (a string); words are a list of strings or
# one string split at white space; tags a list of labels or such a string.
TEXT, LABEL, WORDS, TAGS = "text", "label", "words", "tags"


def _error(problem, argument, value):
    return DataFileError(f"{problem}. Received: {argument}={value!r}")


@dataclasses.dataclass
class FilesData:
    """What the `load_*_files` functions return.

    Attributes:
        train: the training batches (shuffled at every pass).
        validation: batches, or None when there is no validation set.
        test: batches, or None when there is no test file.
        class_names: the label (or tag) of each class id, for the
            classification tasks; None otherwise.
        vocabulary: the tokenizer's vocabulary (text, translation), or the
            characters of the transcripts, ids 1..V (speech).
        tokenizer: the keras-hub tokenizer (text, translation), or None.
        examples: `{split: number of examples}`.
    """

    train: object
    validation: Optional[object]
    test: Optional[object]
    class_names: Optional[list] = None
    vocabulary: Optional[list] = None
    tokenizer: Optional[object] = None
    examples: dict = dataclasses.field(default_factory=dict)


# === Tables: CSV and JSON Lines ===


def table_splits(path, argument="path"):
    """`{"train": file, "validation": file or None, "test": file or None}`
    for `path`: a CSV / JSONL file (the training set alone), or a folder
    with `train.csv` or `train.jsonl` and optionally `validation.*` and
    `test.*`. A `ValueError` naming `argument` otherwise."""
    if os.path.isfile(path):
        if not path.endswith(TABLE_SUFFIXES):
            raise _error(f"A data file must be CSV or JSON Lines ({', '.join(TABLE_SUFFIXES)})",
                         argument, path)
        return {"train": path, "validation": None, "test": None}
    if not os.path.isdir(path):
        raise _error("No file or folder at this path", argument, path)
    splits = {}
    for split in SPLITS:
        found = [os.path.join(path, split + suffix) for suffix in TABLE_SUFFIXES
                 if os.path.isfile(os.path.join(path, split + suffix))]
        if len(found) > 1:
            raise _error(f"The folder holds both {' and '.join(found)}: keep one", argument, path)
        splits[split] = found[0] if found else None
    if splits["train"] is None:
        raise _error("A data folder needs train.csv or train.jsonl (and may hold "
                     f"validation.* and test.*); it holds {sorted(os.listdir(path))[:10]}",
                     argument, path)
    return splits


class Row(dict):
    """A table row, `{field: value}`, that knows where it was read: `place`
    ("reviews/test.csv, line 7"), for the errors that name it."""

    place = None


def _kinds(fields):
    """`{field: kind}`: `fields` is such a dict, or names (each a TEXT)."""
    return dict(fields) if isinstance(fields, dict) else {name: TEXT for name in fields}


def _problem(value, kind):
    """What makes `value` (a JSON value) no value of `kind`; None if none."""
    if value is None:
        return "is null"
    if isinstance(value, float) and math.isnan(value):
        return "is NaN"
    if isinstance(value, float) and math.isinf(value):
        return "is infinite"
    if isinstance(value, str):
        return None
    if kind == LABEL:
        if isinstance(value, bool):
            return (f"is {json.dumps(value)}, a boolean; a label is a class id (an integer) "
                    "or a class name (a string)")
        if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
            return None
        return f"is {value!r}; a label is a class id (a whole number) or a class name (a string)"
    if kind in (WORDS, TAGS) and isinstance(value, list):
        return None
    return {TEXT: "must be a string (a text)", WORDS: "must be a list of words or a string",
            TAGS: "must be a list of tags or a string"}[kind] + f"; it is {value!r}"


def _row(values, kinds, place):
    """`values` as a `Row` read at `place`, each of its field's kind (a
    `DataFileError` naming the place, the field and the value otherwise);
    a whole float label (3.0) becomes the int it is."""
    row = Row()
    row.place = place
    for name, kind in kinds.items():
        value = values[name]
        problem = _problem(value, kind)
        if problem is None and isinstance(value, list):  # words or tags: each a text or a label
            item_kind = TEXT if kind == WORDS else LABEL
            for i, item in enumerate(value):
                problem = _problem(item, item_kind)
                if problem is not None:
                    problem = f"item {i} {problem}"
                    break
            value = [int(v) if isinstance(v, float) else v for v in value]
        if problem is not None:
            raise _error(f"{place}: field `{name}` {problem}", name, value)
        row[name] = int(value) if isinstance(value, float) else value
    return row


def _not_utf8(path, argument):
    """The `DataFileError` of a table that is not UTF-8, naming the line of
    its first such byte."""
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        data.decode("utf-8")
        start = len(data)
    except UnicodeDecodeError as error:
        start = error.start
    line = data.count(b"\n", 0, start) + 1
    return _error(f"{path}, line {line}: the byte {data[start:start + 1]!r} is not UTF-8; a "
                  "data file must be UTF-8 text (re-save it as UTF-8, e.g. `iconv -f latin1 "
                  "-t utf-8`, if it is Latin-1)", argument, path)


def _csv_rows(path, fields, argument):
    kinds = _kinds(fields)
    # utf-8-sig: UTF-8, a byte-order mark first skipped (Excel's "CSV UTF-8").
    with open(path, newline="", encoding="utf-8-sig") as handle:
        try:
            reader = csv.reader(handle)
            columns = next(reader, [])
            missing = [name for name in kinds if name not in columns]
            if missing:
                raise _error(f"{path} has no column {missing} (its header row: {columns})",
                             argument, path)
            for values in reader:
                if not values:  # a blank line
                    continue
                place = f"{path}, line {reader.line_num}"
                if len(values) != len(columns):
                    # csv.DictReader would put extra values under None and
                    # fill missing ones with None: a comma inside a text that
                    # is not quoted moves the label.
                    raise _error(f"{place}: {len(values)} values; the header has "
                                 f"{len(columns)} columns {columns} (a value holding a comma "
                                 "must be in double quotes)", "values", values)
                yield _row(dict(zip(columns, values)), kinds, place)
        except UnicodeDecodeError:
            raise _not_utf8(path, argument) from None


def _jsonl_rows(path, fields, argument):
    kinds = _kinds(fields)
    with open(path, encoding="utf-8-sig") as handle:
        try:
            for line, text in enumerate(handle, start=1):
                if not text.strip():
                    continue
                try:
                    row = json.loads(text)
                except json.JSONDecodeError as error:
                    raise _error(f"{path}, line {line}: not JSON ({error.msg})",
                                 argument, path) from None
                if not isinstance(row, dict):
                    raise _error(f"{path}, line {line}: not a JSON object", argument, path)
                missing = [name for name in kinds if name not in row]
                if missing:
                    raise _error(f"{path}, line {line} has no field {missing} (its fields: "
                                 f"{sorted(row)})", argument, path)
                yield _row(row, kinds, f"{path}, line {line}")
        except UnicodeDecodeError:
            raise _not_utf8(path, argument) from None


def read_table(path, fields, argument="path", limit=None):
    """The rows of a CSV or JSONL file as `Row`s of `fields` (each
    required), at most `limit`. `fields` is `{name: kind}` (`TEXT`,
    `LABEL`, `WORDS`, `TAGS`), or names, each a `TEXT`. A
    `DataFileError` naming `argument` for a missing column or field, a
    file that is not UTF-8, a CSV row with more or fewer values than the
    header, a line that is not JSON, a value not of its field's kind (named
    with its line), or a file without rows."""
    reader = _csv_rows if path.endswith(".csv") else _jsonl_rows
    rows = []
    for row in reader(path, fields, argument):
        rows.append(row)
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise _error(f"{path} holds no examples", argument, path)
    return rows


def _require(splits, require, path, argument):
    missing = [split for split in require if splits[split] is None]
    if missing:
        raise _error(f"The data needs a {' and a '.join(missing)} set: a folder with "
                     f"{' and '.join(missing)} files (or folders) beside train", argument, path)


def check_table_files(path, fields, argument="path", require=("train",)):
    """Checks, reading only the first row of each file, that `path` gives
    tables with `fields` and the splits in `require`; returns
    `table_splits(path)`."""
    splits = table_splits(path, argument)
    for file in splits.values():
        if file is not None:
            read_table(file, fields, argument, limit=1)
    _require(splits, require, path, argument)
    return splits


def hold_out(count, fraction, seed):
    """`(kept, held_out)` index arrays: a seeded `fraction` of `count`
    examples (at least one when `fraction` > 0, never all)."""
    order = np.random.default_rng(seed).permutation(count)
    held = min(count - 1, max(1, round(fraction * count))) if fraction else 0
    return np.sort(order[held:]), np.sort(order[:held])


def table_rows(path, fields, validation_fraction=0.0, seed=0, argument="path"):
    """`{split: rows or None}` of `path` (see `table_splits`), the
    validation rows held out from train when there is no validation file."""
    if not 0.0 <= validation_fraction < 1.0:
        raise _error("`validation_fraction` must be in [0, 1)", "validation_fraction",
                     validation_fraction)
    files = table_splits(path, argument)
    rows = {split: read_table(file, fields, argument) if file else None
            for split, file in files.items()}
    if rows["validation"] is None and validation_fraction:
        kept, held = hold_out(len(rows["train"]), validation_fraction, seed)
        train = rows["train"]
        rows["train"], rows["validation"] = [train[i] for i in kept], [train[i] for i in held]
        for i, row in enumerate(rows["validation"]):
            rows["validation"][i] = Row(row)
            rows["validation"][i].place = f"{row.place}, held out by `validation_fraction`"
    return rows


def _integer(value):
    """`value` as an int when it is one (an int, or a string of ASCII digits
    with an optional sign), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]+\s*", value):
        return int(value)
    return None


def label_ids(values_by_split, path, argument="path", places=None, field="label",
              class_names=None):
    """Class ids and names for labels given as integers (ids as they are) or
    as names (sorted names of the training set: ids 0, 1, ...).

    A negative integer is refused (ids are 0, 1, ...), and so is a label of
    another split that the training set lacks (a class the model never
    learns, or a head wider than the classes it is taught).

    Args:
        values_by_split: `{split: list of labels or None}`.
        path, argument: named by the errors about the whole set.
        places: `{split: where each label was read}` (e.g. "test.csv, line
            3"), named by the errors; None: "test example 3".
        field: the labels' column or field, named by the errors.
        class_names: the classes in the model's order (as Keras's
            `image_dataset_from_directory(class_names=...)`): a name label
            gets its index there, an integer label must be below its
            length; a label it lacks is refused. None: the sorted names of
            the training set.

    Returns:
        `({split: int32 ids or None}, class_names)`.
    """
    def place(split, i):
        where = (places or {}).get(split)
        return where[i] if where and where[i] else f"{split} example {i + 1}"

    integers = {split: None if values is None else [_integer(v) for v in values]
                for split, values in values_by_split.items()}
    if class_names is not None:
        return _ids_in_order(values_by_split, integers, _checked_names(class_names), place,
                             field)
    if all(i is not None for values in integers.values() for i in values or []):
        for split, values in integers.items():
            negative = [i for i, value in enumerate(values or []) if value < 0]
            if negative:
                value = values[negative[0]]
                raise _error(f"{place(split, negative[0])}: the {field} {value} is negative; "
                             "integer labels are class ids 0, 1, ... (renumber them from 0, or "
                             "name the classes)", field, value)
        keys, names = integers, None
    else:
        keys = {split: None if values is None else [str(v) for v in values]
                for split, values in values_by_split.items()}
        names = sorted(set(keys["train"]))
    known = set(keys["train"])
    for split, values in keys.items():
        unknown = sorted(set(values or []) - known)
        if unknown:
            first = next(i for i, value in enumerate(values) if value not in known)
            raise _error(f"The {split} set has labels the training set does not have: "
                         f"{unknown[:10]} (first: {place(split, first)}); a model cannot learn "
                         "a class it is never shown", argument, path)
    if names is None:  # integer ids: as they are
        return ({split: None if values is None else np.array(values, "int32")
                 for split, values in keys.items()},
                [str(i) for i in range(max(known) + 1)])
    index = {name: i for i, name in enumerate(names)}
    return ({split: None if values is None else np.array([index[v] for v in values], "int32")
             for split, values in keys.items()}, names)


def _checked_names(class_names):
    names = list(class_names) if isinstance(class_names, (list, tuple)) else None
    if (not names or not all(isinstance(n, str) and n for n in names)
            or len(set(names)) != len(names)):
        raise ValueError("Invalid value for argument `class_names`: a non-empty list of "
                         f"distinct, non-empty strings. Received: class_names={class_names!r}")
    return names


def _ids_in_order(values_by_split, integers, names, place, field):
    """`label_ids` with the classes given: each label's index in `names`
    (an integer label is an index already)."""
    index = {name: i for i, name in enumerate(names)}
    ids = {}
    for split, values in values_by_split.items():
        if values is None:
            ids[split] = None
            continue
        row = []
        for i, (value, integer) in enumerate(zip(values, integers[split])):
            if str(value) in index:
                row.append(index[str(value)])
            elif integer is not None and 0 <= integer < len(names):
                row.append(integer)
            else:
                raise _error(f"{place(split, i)}: the {field} {value!r} is not one of "
                             f"class_names={names} (nor an index into it)", field, value)
        ids[split] = np.array(row, "int32")
    return ids, names


def row_labels(rows, field, path, argument="path", class_names=None):
    """`label_ids` of the `field` of each row of `{split: rows or None}`
    (`table_rows`), its errors naming each row's file and line."""
    return label_ids({split: None if r is None else [row[field] for row in r]
                      for split, r in rows.items()}, path, argument,
                     places={split: None if r is None else [getattr(row, "place", None)
                                                             for row in r]
                             for split, r in rows.items()}, field=field,
                     class_names=class_names)


def _words(value):
    """A list of words: a JSON list, or a string split at white space."""
    return value.split() if isinstance(value, str) else [str(word) for word in value]


def _wordpiece(tokenizer, vocabulary_size, texts, train_vocabulary, make_tokenizer):
    """The given tokenizer, or one over a vocabulary learned from `texts`."""
    if tokenizer is not None:
        return tokenizer, list(tokenizer.get_vocabulary())
    vocabulary = train_vocabulary(texts, vocabulary_size)
    return make_tokenizer(vocabulary), list(vocabulary)


# === Text classification ===


def load_text_classification_files(path, tokenizer=None, vocabulary_size=1000,
                                   sequence_length=128, batch_size=32, validation_fraction=0.0,
                                   seed=0, text_field="text", label_field="label",
                                   second_text_field=None, model=None, class_names=None):
    """Text classification from your CSV / JSONL files.

    Each row has a text and a label (an integer class id, or a class name);
    with `second_text_field`, a second text (a pair task: `[CLS] a [SEP] b
    [SEP]`, RoBERTa's `<s> a </s></s> b </s>`). The batches are
    `keras_attn.data.text.classification_dataset`'s: the tokenizer's own
    special tokens and padding id, cut as transformers' `truncation=True,
    max_length=sequence_length`, and the inputs `model` reads. Tokenized
    once: the packed examples are cached in memory (`sequence_length`
    int32 per input and example), so an epoch after the first costs what
    the model costs; the training set is shuffled again at every pass.

    Args:
        path: a CSV / JSONL file, or a folder with `train.csv|jsonl` and
            optionally `validation.*` and `test.*`.
        tokenizer: the checkpoint's tokenizer (`keras_attn.convert.
            load_hf_tokenizer(dir)`: WordPiece, byte-level BPE,
            SentencePiece; or any keras-hub tokenizer with
            `start_token_id` / `end_token_id` / `pad_token_id`, or BERT's or
            RoBERTa's special tokens in its vocabulary); None learns a
            WordPiece vocabulary of `vocabulary_size` from the training
            texts.
        vocabulary_size: the size of the learned vocabulary.
        sequence_length: the packed length.
        batch_size: examples per batch.
        validation_fraction: held out from the training rows when there is
            no validation file.
        seed: the hold-out's and the shuffle's seed.
        text_field, label_field, second_text_field: the column (CSV) or
            field (JSONL) names.
        model: the model the batches are for: `x` holds its inputs
            (`token_ids`, `padding_mask`, and `segment_ids` where it takes
            them: not ModernBERT); None gives all three (BERT's).
        class_names: the classes in the model's order (`model.class_names`
            of `keras_attn.convert.load_hf(dir, class_names=...)`): label
            `class_names[i]` is class `i`; a label not among them is
            refused. None: the sorted labels of the training set.

    Returns:
        A `FilesData`; `class_names[i]` is the label of class `i`.
    """
    from keras_attn.data import text

    names = text.input_names(model)
    fields = [text_field, label_field] + ([second_text_field] if second_text_field else [])
    rows = table_rows(path, {name: LABEL if name == label_field else TEXT for name in fields},
                      validation_fraction, seed)
    labels, class_names = row_labels(rows, label_field, path, class_names=class_names)
    train_texts = [str(row[f]) for row in rows["train"] for f in fields if f != label_field]
    tokenizer, vocabulary = _wordpiece(tokenizer, vocabulary_size, train_texts,
                                       text.train_wordpiece_vocabulary, text.make_tokenizer)

    def batches(split):
        if rows[split] is None:
            return None
        return text.classification_dataset(
            [str(row[text_field]) for row in rows[split]], labels[split], tokenizer,
            sequence_length=sequence_length, batch_size=batch_size, shuffle=split == "train",
            seed=seed, second_texts=[str(row[second_text_field]) for row in rows[split]]
            if second_text_field else None, inputs=names)

    return FilesData(*(batches(split) for split in SPLITS), class_names=class_names,
                     vocabulary=vocabulary, tokenizer=tokenizer,
                     examples={s: len(r) for s, r in rows.items() if r is not None})


# === Token classification ===


def tagged_rows(path, validation_fraction=0.0, seed=0, tokens_field="tokens",
                tags_field="tags", argument="path"):
    """`(words, tag_ids, class_names)` of tagging tables (see
    `load_token_classification_files`): `{split: [words of each example]
    or None}`, `{split: [int32 tag ids of each example] or None}` and the
    tag of each id; a `ValueError` for an example whose tags are not one
    per word."""
    rows = table_rows(path, {tokens_field: WORDS, tags_field: TAGS}, validation_fraction, seed,
                      argument)
    words = {split: None if r is None else [_words(row[tokens_field]) for row in r]
             for split, r in rows.items()}
    tags = {split: None if r is None else [_words(row[tags_field]) for row in r]
            for split, r in rows.items()}
    for split, examples in words.items():
        for row, example_words, example_tags in zip(rows[split] or [], examples or [],
                                                    tags[split] or []):
            if len(example_words) != len(example_tags):
                raise _error(f"{row.place}: {len(example_words)} words and "
                             f"{len(example_tags)} tags (one tag per word)", argument, path)
    flat, class_names = label_ids(
        {split: None if t is None else [v for row in t for v in row] for split, t in tags.items()},
        path, argument, field=tags_field,
        places={split: None if t is None else [row.place for row, row_tags in zip(rows[split], t)
                                               for _ in row_tags]
                for split, t in tags.items()})
    tag_ids = {split: None for split in tags}
    for split, t in tags.items():
        if t is not None:
            ends = np.cumsum([len(row) for row in t])
            tag_ids[split] = np.split(flat[split], ends[:-1])
    return words, tag_ids, class_names


def load_token_classification_files(path, tokenizer=None, vocabulary_size=1000,
                                    sequence_length=128, batch_size=32,
                                    validation_fraction=0.0, seed=0, tokens_field="tokens",
                                    tags_field="tags", model=None):
    """Token classification (tagging) from your CSV / JSONL files.

    Each row has words and one tag per word: JSON lists in JSONL
    (`{"tokens": ["John", "lives", "in", "Paris"], "tags": ["B-PER", "O",
    "O", "B-LOC"]}`), white-space separated strings in CSV. Tags are
    integer ids or names (sorted names of the training set: ids 0, 1, ...).
    Words are split into WordPieces; a word's tag is on its first piece and
    the other pieces have weight 0 (`keras_attn.data.text.
    token_classification_dataset`), as Hugging Face's token classification
    recipe labels them.

    Args:
        path: a CSV / JSONL file, or a folder with `train.csv|jsonl` and
            optionally `validation.*` and `test.*`.
        tokenizer: as `load_text_classification_files` (a byte-level BPE
            one reads each word after a space, as transformers'
            `add_prefix_space=True`); None learns a WordPiece vocabulary of
            `vocabulary_size` from the training words.
        vocabulary_size: as `load_text_classification_files`.
        sequence_length: the packed length.
        batch_size: examples per batch.
        validation_fraction: as `load_text_classification_files`.
        seed: as `load_text_classification_files`.
        tokens_field, tags_field: the column or field names.
        model: as `load_text_classification_files`.

    Returns:
        A `FilesData` of `(x, tags, sample_weight)` batches for
        `BertTokenClassifier`; `class_names[i]` is the tag of id `i`.
    """
    from keras_attn.data import text

    names = text.input_names(model)
    words, tag_ids, class_names = tagged_rows(path, validation_fraction, seed, tokens_field,
                                              tags_field)
    tokenizer, vocabulary = _wordpiece(
        tokenizer, vocabulary_size, [" ".join(w) for w in words["train"]],
        text.train_wordpiece_vocabulary, text.make_tokenizer)

    def batches(split):
        if words[split] is None:
            return None
        return text.token_classification_dataset(
            words[split], tag_ids[split], tokenizer, sequence_length=sequence_length,
            batch_size=batch_size, shuffle=split == "train", seed=seed, inputs=names)

    return FilesData(*(batches(split) for split in SPLITS), class_names=class_names,
                     vocabulary=vocabulary, tokenizer=tokenizer,
                     examples={s: len(w) for s, w in words.items() if w is not None})


# === Images ===


def _class_folders(folder):
    return sorted(name for name in os.listdir(folder)
                  if os.path.isdir(os.path.join(folder, name)))


def image_folder_splits(path, argument="path"):
    """`{split: folder or None}`: a folder of class sub-folders is the
    training set; a folder whose sub-folders are `train` and optionally
    `validation` and `test` (each of class sub-folders) gives the three."""
    if not os.path.isdir(path):
        raise _error("Images are read from a folder with one sub-folder per class; there is "
                     "no folder at this path", argument, path)
    folders = _class_folders(path)
    if "train" in folders and set(folders) <= set(SPLITS):
        return {split: os.path.join(path, split) if split in folders else None
                for split in SPLITS}
    return {"train": path, "validation": None, "test": None}


def _is_image(name):
    # `._x.png` is the AppleDouble file macOS writes beside `x.png` on a disk
    # that is not a Mac's (its metadata, not an image): skipped, as macOS
    # itself hides it.
    return name.lower().endswith(IMAGE_SUFFIXES) and not name.startswith("._")


def list_images(folder, class_names=None, argument="path"):
    """`(paths, labels, class_names)` of a folder with one sub-folder per
    class (sorted names: ids 0, 1, ...). With `class_names` (the training
    set's), the folder's classes must be among them. Files named `._*`
    (macOS's AppleDouble metadata) are skipped; a class folder without an
    image is refused by name."""
    classes = _class_folders(folder)
    if not classes:
        raise _error(f"{folder} has no class sub-folder (one sub-folder of images per class)",
                     argument, folder)
    if class_names is None:
        class_names = classes
    unknown = sorted(set(classes) - set(class_names))
    if unknown:
        raise _error(f"{folder} has classes the training set does not have: {unknown}",
                     argument, folder)
    paths, labels, empty = [], [], []
    for name in classes:
        count = len(paths)
        for root, _, names in sorted(os.walk(os.path.join(folder, name))):
            for file in sorted(names):
                if _is_image(file):
                    paths.append(os.path.join(root, file))
                    labels.append(class_names.index(name))
        if len(paths) == count:
            empty.append(os.path.join(folder, name))
    if not paths:
        raise _error(f"{folder}'s class folders hold no image ({', '.join(IMAGE_SUFFIXES)})",
                     argument, folder)
    if empty:
        raise _error(f"{', '.join(empty)} {'holds' if len(empty) == 1 else 'hold'} no image "
                     f"({', '.join(IMAGE_SUFFIXES)}): a class without examples is a class the "
                     "model is never shown (remove the folder, or fill it)", argument, folder)
    return paths, np.array(labels, "int32"), list(class_names)


def check_image_folder(path, argument="path", require=("train",)):
    """Checks that `path` is an image folder (`image_folder_splits`) with the
    splits in `require`, each holding images of the training classes."""
    folders = image_folder_splits(path, argument)
    class_names = list_images(folders["train"], argument=argument)[2]
    _require(folders, require, path, argument)
    for split in ("validation", "test"):
        if folders[split] is not None:
            list_images(folders[split], class_names, argument)
    return folders


def image_files(path, validation_fraction=0.0, seed=0, argument="path", num_channels=None):
    """`({split: (paths, labels) or None}, class_names)` of an image folder
    (`image_folder_splits`), validation held out from train when there is
    no validation folder. With `num_channels`, every image is decoded once
    as the pipeline will decode it (`keras_attn.data.images.
    check_image_files`), so that a file that does not decode is refused
    by name now, not deep inside `fit`."""
    folders = image_folder_splits(path, argument)
    paths, labels, class_names = list_images(folders["train"], argument=argument)
    splits = {"train": (paths, labels), "validation": None, "test": None}
    for split in ("validation", "test"):
        if folders[split] is not None:
            splits[split] = list_images(folders[split], class_names, argument)[:2]
    if num_channels is not None:
        from keras_attn.data import images

        images.check_image_files([p for split in splits.values() if split for p in split[0]],
                                 num_channels, argument)
    if splits["validation"] is None and validation_fraction:
        kept, held = hold_out(len(paths), validation_fraction, seed)
        splits["train"] = ([paths[i] for i in kept], labels[kept])
        splits["validation"] = ([paths[i] for i in held], labels[held])
    return splits, class_names


def load_image_files(path, image_size, num_channels=3, batch_size=32, validation_fraction=0.0,
                     seed=0, augmentation=None):
    """Image classification from your folder of images.

    `path` holds one sub-folder per class (`cats/`, `dogs/`: sorted names
    are the class ids), or `train/` and optionally `validation/` and
    `test/`, each of class sub-folders. Images (PNG, JPEG, GIF, BMP) are
    decoded with TensorFlow, resized to `image_size` and given
    `num_channels`, batch by batch as training reads them
    (`keras_attn.data.images.image_files_pipeline`); each is decoded once
    here first, so that a damaged file is refused by name. `._*` files
    (macOS's AppleDouble metadata) are skipped; an empty class folder is
    refused.

    Args:
        path: the folder.
        image_size: the side the images are resized to (the ViT's).
        num_channels: 1 (grey) or 3 (RGB).
        batch_size: images per batch.
        validation_fraction: held out from the training images when there
            is no validation folder.
        seed: the hold-out's and the shuffle's seed.
        augmentation: a layer applied to training batches (e.g.
            `keras_attn.data.images.image_augmentation(...)`), or None.

    Returns:
        A `FilesData` of `(pixels, label)` batches, pixels in [0, 255].
    """
    from keras_attn.data import images

    splits, class_names = image_files(path, validation_fraction, seed, num_channels=num_channels)

    def batches(split):
        if splits[split] is None:
            return None
        return images.image_files_pipeline(
            *splits[split], image_size=image_size, num_channels=num_channels,
            batch_size=batch_size, training=split == "train",
            augmentation=augmentation if split == "train" else None, seed=seed)

    return FilesData(*(batches(split) for split in SPLITS), class_names=class_names,
                     examples={s: len(v[0]) for s, v in splits.items() if v is not None})


# === Speech ===


def ctc_frames(samples, frame_step):
    """The frames a Conformer's CTC head emits for `samples` samples: the
    log-mel front end's `1 + samples // frame_step` feature frames after the
    4x subsampling (`keras_attn.layers.conv_subsampling.subsampled_length`,
    written again here so that reading files imports no Keras).

    >>> [ctc_frames(n, 160) for n in (0, 959, 960, 1599, 1600, 16000)]
    [0, 0, 1, 1, 2, 24]
    """
    frames = 1 + samples // frame_step
    for _ in range(2):  # kernel 3, stride 2, no padding
        frames = max((frames - 3) // 2 + 1, 0)
    return frames


def ctc_frames_needed_by(text):
    """The frames CTC needs to emit the characters of `text`: one per
    character, plus a blank between two equal characters in a row
    (`keras_attn.models.conformer.ctc_frames_needed` of its ids).

    >>> ctc_frames_needed_by("hello"), ctc_frames_needed_by("")
    (6, 0)
    """
    return len(text) + sum(a == b for a, b in zip(text, text[1:]))


def _model_frames(model_config, frame_step):
    """`(samples -> CTC frames, what they are in words)`: of `model_config`
    (a `ConformerConfig`: its front end and subsampling, the FastConformer's
    8x included; imports the model code, so Keras) or, without one, of the
    Conformer's log-mel front end at `frame_step` and its 4x subsampling."""
    if model_config is None:
        if isinstance(frame_step, bool) or not isinstance(frame_step, int) or frame_step < 1:
            raise ValueError("Invalid value for argument `frame_step`: it must be a positive "
                             f"integer (samples between log-mel frames). Received: "
                             f"frame_step={frame_step!r}")
        return (lambda samples: ctc_frames(samples, frame_step),
                f"log-mel frames every {frame_step} samples, then the Conformer's 4x "
                "subsampling")
    from keras_attn.models.conformer.conformer_config import ConformerConfig
    from keras_attn.models.conformer.conformer_config import feature_frames
    from keras_attn.models.conformer.conformer_config import encoder_length

    if not isinstance(model_config, ConformerConfig):
        raise ValueError("Invalid value for argument `model_config`: a ConformerConfig (a "
                         "model's `conformer_config`). Received: "
                         f"model_config={type(model_config).__name__}")
    factor = 8 if model_config.subsampling == "fast" else 4
    return (lambda samples: int(encoder_length(model_config, feature_frames(model_config,
                                                                            samples))),
            f"the model's {model_config.front_end} frames every {model_config.frame_step} "
            f"samples, then its {factor}x subsampling")


def speech_files(path, validation_fraction=0.0, seed=0, audio_field="audio",
                 text_field="text", sampling_rate=16000, argument="path", frame_step=160,
                 model_config=None, head="ctc"):
    """`{split: (waveforms, transcripts) or None}` of speech tables: each row
    an audio file (a WAV path, relative to the table's folder or absolute)
    and its transcript. A clip too short for its transcript (fewer CTC
    frames, `ctc_frames(len(clip), frame_step)` or those of `model_config`,
    than `ctc_frames_needed_by(transcript)`) is refused naming the file:
    the model could not emit it (its loss is NaN, and training would stop
    there naming no file); that holds in every split. With
    `head="transducer"` a clip needs one frame whatever its transcript (a
    transducer emits any number of labels at a frame)."""
    if head not in ("ctc", "transducer"):
        raise ValueError("Invalid value for argument `head`: 'ctc' or 'transducer'. "
                         f"Received: head={head!r}")
    frames_of, frames_are = _model_frames(model_config, frame_step)
    rows = table_rows(path, [audio_field, text_field], validation_fraction, seed, argument)
    files = table_splits(path, argument)
    splits = {}
    for split, split_rows in rows.items():
        if split_rows is None:
            splits[split] = None
            continue
        folder = os.path.dirname(files[split] or files["train"])
        waveforms = []
        for row in split_rows:
            audio = os.path.join(folder, row[audio_field])
            if not os.path.isfile(audio):
                raise _error(f"{row.place}: no audio file {audio}", argument, path)
            try:
                waveforms.append(read_wav(audio, sampling_rate, argument))
            except DataFileError as error:
                raise DataFileError(f"{row.place}: {error}") from None
            text = str(row[text_field])
            emitted = frames_of(len(waveforms[-1]))
            if head == "transducer" and emitted < 1:
                raise DataFileError(
                    f"{row.place}: {audio} is too short for the model: its "
                    f"{len(waveforms[-1])} samples at {sampling_rate} Hz give no frame "
                    f"({frames_are}), and a transducer needs one. Received: "
                    f"{argument}={os.fspath(path)!r} with {row[audio_field]!r} of "
                    f"{len(waveforms[-1])} samples")
            if head == "ctc" and emitted < ctc_frames_needed_by(text):
                raise DataFileError(
                    f"{row.place}: {audio} is too short for its transcript: its "
                    f"{len(waveforms[-1])} samples at {sampling_rate} Hz give "
                    f"{emitted} CTC frame(s) ({frames_are}), and CTC needs "
                    f"{ctc_frames_needed_by(text)} to emit {text!r} (one per character, "
                    "plus one between two equal characters): a model could not learn it "
                    f"(fix the row, or drop it). Received: {argument}={os.fspath(path)!r} "
                    f"with {row[audio_field]!r} of {len(waveforms[-1])} samples")
        splits[split] = (waveforms, [str(row[text_field]) for row in split_rows])
    return splits


def load_speech_files(path, batch_size=16, vocabulary=None, validation_fraction=0.0, seed=0,
                      audio_field="audio", text_field="text", sampling_rate=16000,
                      frame_step=160, model_config=None):
    """Speech recognition (CTC) from your WAV files and transcripts.

    A CSV / JSONL table (or a folder of `train.*`, `validation.*`,
    `test.*` tables) whose rows name an audio file (`audio_field`: a mono
    PCM WAV path relative to the table's folder, or absolute; see
    `wav_samples` for what is refused) and its transcript (`text_field`).
    The audio is read into memory at `sampling_rate` (the Conformer's
    log-mel front end expects 16 kHz) and batched by duration
    (`keras_attn.data.speech.speech_dataset`).

    Args:
        path: the table or the folder.
        batch_size: utterances per batch.
        vocabulary: the characters, ids 1..V (0 is the CTC blank); None:
            every character of the transcripts, sorted.
        validation_fraction, seed: as `load_text_classification_files`.
        audio_field, text_field: the column or field names.
        sampling_rate: the rate the audio is resampled to.
        frame_step: the model's `frame_step` (samples between log-mel
            frames: 160, 10 ms at 16 kHz, the Conformer's default). A clip
            too short for its transcript at that step (after the 4x
            subsampling, fewer frames than CTC needs to emit it) is refused
            naming the file, in every split.
        model_config: the model's `ConformerConfig` (`model.conformer_config`),
            whose front end and subsampling count the frames instead (a
            FastConformer's 8x, the Parakeet front end's): give it for any
            model but the default Conformer; `frame_step` is then its own.

    Returns:
        A `FilesData` of `({"waveform", "waveform_length"}, labels)`
        batches; `vocabulary` is the characters (build the Conformer with
        `vocabulary_size=len(vocabulary)`: the labels 1..V; its CTC head
        adds the blank, index 0).
    """
    from keras_attn.data import speech

    splits = speech_files(path, validation_fraction, seed, audio_field, text_field,
                          sampling_rate, frame_step=frame_step, model_config=model_config)
    if vocabulary is None:
        vocabulary = tuple(sorted({c for split in splits.values() if split
                                   for text in split[1] for c in text}))

    def batches(split):
        if splits[split] is None:
            return None
        return speech.speech_dataset(*splits[split], batch_size=batch_size,
                                     vocabulary=vocabulary, shuffle=split == "train", seed=seed)

    return FilesData(*(batches(split) for split in SPLITS), vocabulary=list(vocabulary),
                     examples={s: len(v[0]) for s, v in splits.items() if v is not None})


# === Translation ===


def load_translation_files(path, tokenizer=None, vocabulary_size=1000, batch_size=64,
                           validation_fraction=0.0, seed=0, source_field="source",
                           target_field="target", bucket_boundaries=None):
    """Translation from your CSV / JSONL files of sentence pairs.

    Each row has a source and a target sentence. One WordPiece vocabulary is
    shared by both sides (`[PAD]`, `[START]`, `[END]`, `[UNK]` first), as
    the Transformer's tied embeddings expect; batches are bucketed by length
    (`keras_attn.data.translation.make_translation_dataset`).

    Args:
        path: a CSV / JSONL file, or a folder with `train.csv|jsonl` and
            optionally `validation.*` and `test.*`.
        tokenizer: from `keras_attn.data.translation.make_tokenizer`; None
            learns a vocabulary of `vocabulary_size` from the training pairs.
        batch_size: sentence pairs per batch.
        validation_fraction, seed: as `load_text_classification_files`.
        source_field, target_field: the column or field names (e.g. "en",
            "fr").
        bucket_boundaries: as `make_translation_dataset`.

    Returns:
        A `FilesData` of `((source_ids, target_in_ids), target_out_ids)`
        batches.
    """
    from keras_attn.data import translation

    rows = table_rows(path, [source_field, target_field], validation_fraction, seed)
    pairs = {split: None if r is None else ([str(row[source_field]) for row in r],
                                            [str(row[target_field]) for row in r])
             for split, r in rows.items()}
    tokenizer, vocabulary = _wordpiece(tokenizer, vocabulary_size,
                                       pairs["train"][0] + pairs["train"][1],
                                       translation.train_vocabulary, translation.make_tokenizer)

    def batches(split):
        if pairs[split] is None:
            return None
        return translation.make_translation_dataset(
            *pairs[split], tokenizer, batch_size, shuffle=split == "train", seed=seed,
            bucket_boundaries=bucket_boundaries)

    return FilesData(*(batches(split) for split in SPLITS), vocabulary=vocabulary,
                     tokenizer=tokenizer,
                     examples={s: len(p[0]) for s, p in pairs.items() if p is not None})
