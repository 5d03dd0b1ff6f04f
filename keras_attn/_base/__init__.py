"""The part of keras_attn that imports no Keras: the zoo's files and
TensorFlow's quiet import, shared by the library (`keras_attn`), the
command line (`keras_attn.cli`) and the examples.

What must answer without Keras (`keras-attn --help` and `list`), or run
before Keras is imported (holding back TensorFlow's start-up notices),
lives here, and imports the standard library only, but for `jsonschema` in
the early recipe check (`tests/test_imports.py` checks it). It was a
top-level package (`keras_attn_base`) while `import keras_attn` imported
Keras; the package's `__init__` now loads no Keras (it registers the saved
classes when Keras itself is loaded: `keras_attn._registration`), so it
lives inside the package (issue 69).

- `keras_attn._base.zoo_files`: the recipes shipped with the package, and the
  names of a run directory's files.
- `keras_attn._base.quiet_tensorflow`: `import_tensorflow_quietly`,
  `tensorflow_installed`.
- `keras_attn._base.errors`: the exception classes (`keras_attn.errors`).
- `keras_attn._base.recipe_files`, `keras_attn._base.recipe_check`: reading a
  recipe and its `--set` overrides, and the command line's early check of
  it against the published JSON Schema (with `jsonschema`, the one import
  here outside the standard library, loaded by `train` and `prepare` only).
- `keras_attn._base.command_line`: the `keras-attn` subcommands' arguments
  (`build_parser`), which the launcher (`keras_attn.cli`) parses with.
"""
