"""The part of keras_attn that imports no Keras: the zoo's files and
TensorFlow's quiet import, shared by the library (`keras_attn`), the
command line (`keras_attn_cli`) and the examples.

Why a package of its own, beside `keras_attn`: Python runs a package's
`__init__` before any module inside it, and `import keras_attn` imports
Keras on purpose (it registers every saved class, so that
`keras.saving.load_model` needs no other import). What must answer without
Keras (`keras-attn --help` and `list`), or run before Keras is imported
(holding back TensorFlow's start-up notices), lives here, and imports the
standard library only, but for `jsonschema` in the early recipe check
(`tests/test_imports.py` checks it).

- `keras_attn_base.zoo_files`: the recipes shipped with the package, and the
  names of a run directory's files.
- `keras_attn_base.quiet_tensorflow`: `import_tensorflow_quietly`,
  `tensorflow_installed`.
- `keras_attn_base.errors`: the exception classes (`keras_attn.errors`).
- `keras_attn_base.recipe_files`, `keras_attn_base.recipe_check`: reading a
  recipe and its `--set` overrides, and the command line's early check of
  it against the published JSON Schema (with `jsonschema`, the one import
  here outside the standard library, loaded by `train` and `prepare` only).
- `keras_attn_base.command_line`: the `keras-attn` subcommands' arguments
  (`build_parser`), which the launcher (`keras_attn_cli`) parses with.
"""
