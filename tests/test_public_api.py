"""The README's "Public API" block is the list of stable names: each imports
from where it says, and every name a public module exports is in it."""

import importlib
import os
import re

import keras_attn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _listed():
    """{module: [names]} of the README's Public API block."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
        text = handle.read()
    section = text.split("## Public API", 1)[1].split("\n## ", 1)[0]
    block = section.split("```python", 1)[1].split("```", 1)[0]
    listed = {}
    for line in block.strip().splitlines():
        match = re.fullmatch(r"from (\S+) import (.+)", line.strip())
        assert match, f"not an import line: {line!r}"
        listed.setdefault(match[1], []).extend(n.strip() for n in match[2].split(","))
    return listed


def test_every_listed_name_imports_from_where_the_readme_says():
    missing = []
    for module, names in _listed().items():
        imported = importlib.import_module(module)
        missing += [f"{module}.{name}" for name in names if not hasattr(imported, name)]
    assert not missing


def test_every_exported_name_is_listed():
    listed = _listed()
    unlisted = []
    for package in ("models", "layers", "training", "convert", "export", "viz", "zoo", "data"):
        module = f"keras_attn.{package}"
        exported = importlib.import_module(module).__all__
        # The family subpackages are modules, not names to import.
        names = [n for n in exported if not (package == "models" and n in (
            "bert", "vit", "transformer", "conformer", "modernbert"))]
        unlisted += [f"{module}.{n}" for n in names if n not in listed.get(module, [])]
    assert not unlisted


def test_the_package_names_its_subpackages_and_imports_the_optional_ones_lazily():
    import sys

    for name in keras_attn.__all__:
        assert getattr(keras_attn, name) is not None
    assert keras_attn.viz is sys.modules["keras_attn.viz"]
    try:
        keras_attn.nope
    except AttributeError as error:
        assert "nope" in str(error)
    else:
        raise AssertionError("an unknown attribute must raise AttributeError")


def test_models_exports_the_same_objects_as_the_family_subpackages():
    from keras_attn import models

    for family in ("bert", "vit", "transformer", "conformer", "modernbert"):
        subpackage = getattr(models, family)
        for name in subpackage.__all__:
            if name in models.__all__:
                assert getattr(models, name) is getattr(subpackage, name), name
