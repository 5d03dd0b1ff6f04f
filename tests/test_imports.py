"""The package's import rules, read from its source (no import needed):

- Keras internals (`keras.src`) are reached through `keras_attn/_keras_compat.py`
  only, so a Keras upgrade that moves one breaks one file;
- no module imports another package's underscore module (package-level
  private modules `keras_attn._x` are shared by all);
- layers and model builders import no TensorFlow, JAX or PyTorch.
"""

import ast
import os

import pytest

pytestmark = pytest.mark.backend_independent

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "keras_attn")


def _modules():
    for directory, _, files in os.walk(PACKAGE):
        for file in sorted(files):
            if file.endswith(".py"):
                path = os.path.join(directory, file)
                relative = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                yield relative.removesuffix(".__init__"), path


def _imports(path):
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


MODULES = dict(_modules())


def test_the_rules_see_the_whole_package():
    assert "keras_attn._keras_compat" in MODULES and len(MODULES) > 60


def test_keras_internals_only_through_the_compatibility_module():
    found = [f"{name}:{line} {target}" for name, path in MODULES.items()
             if name != "keras_attn._keras_compat"
             for line, target in _imports(path)
             if target == "keras.src" or target.startswith("keras.src.")]
    assert not found


def _package(name, path):
    return name if path.endswith("__init__.py") else name.rpartition(".")[0]


def test_no_module_imports_another_packages_private_module():
    found = []
    for name, path in MODULES.items():
        here = _package(name, path)
        for line, target in _imports(path):
            parts = target.split(".")
            if parts[0] != "keras_attn":
                continue
            for i, part in enumerate(parts[1:], start=1):
                if part.startswith("_") and not part.startswith("__"):
                    owner = ".".join(parts[:i])
                    if not (here == owner or here.startswith(owner + ".")):
                        found.append(f"{name}:{line} {target}")
                    break
    assert not found


@pytest.mark.parametrize("package", ["keras_attn.layers", "keras_attn.models"])
def test_layers_and_models_import_no_backend_framework(package):
    found = [f"{name}:{line} {target}" for name, path in MODULES.items()
             if name == package or name.startswith(package + ".")
             for line, target in _imports(path)
             if target.split(".")[0] in ("tensorflow", "jax", "torch")]
    assert not found
