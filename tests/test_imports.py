"""The package's import rules, read from its source (no import needed):

- Keras internals (`keras.src`) are reached through `keras_attn/_keras_compat.py`
  only, so a Keras upgrade that moves one breaks one file;
- no module imports another package's underscore module (package-level
  private modules `keras_attn._x` are shared by all);
- the attention ops, layers and model builders import no TensorFlow, JAX or
  PyTorch, but for the kernel module (`keras_attn/ops/kernels.py`), which
  imports JAX inside the functions that run on JAX only;
- dependencies run one way: the command line (`keras_attn.cli`) calls the
  library, which never imports it; `keras_attn._base` (what needs no Keras)
  imports the standard library only; the package-level private helpers
  (`keras_attn/_*.py`) sit below the subpackages and import none of them;
  no module imports the package's own `__init__`;
- the subpackages stand on floors (`FLOORS`): a package imports only
  packages on lower floors, so no two packages import each other.

One test imports: the modules `keras-attn --help` and `list` need import no
Keras.
"""

import ast
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.backend_independent

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "keras_attn")


def _modules(package=PACKAGE):
    for directory, _, files in os.walk(package):
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


# The one exception (issue 61): the kernel module calls a backend's own fast
# attention, importing that backend inside the function that runs only on it.
KERNEL_MODULE = "keras_attn.ops.kernels"
KERNEL_BACKENDS = {"jax"}


@pytest.mark.parametrize("package", ["keras_attn.ops", "keras_attn.layers", "keras_attn.models"])
def test_layers_and_models_import_no_backend_framework(package):
    found = [f"{name}:{line} {target}" for name, path in MODULES.items()
             if (name == package or name.startswith(package + ".")) and name != KERNEL_MODULE
             for line, target in _imports(path)
             if target.split(".")[0] in ("tensorflow", "jax", "torch")]
    assert not found


def test_the_kernel_module_imports_its_backend_inside_functions_only():
    path = MODULES[KERNEL_MODULE]
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    at_top = [f"{node.lineno} {alias.name}" for node in top for alias in node.names
              if (getattr(node, "module", None) or alias.name).split(".")[0]
              in ("tensorflow", "jax", "torch")]
    backends = {target.split(".")[0] for _, target in _imports(path)} & {
        "tensorflow", "jax", "torch"}
    assert not at_top and backends == KERNEL_BACKENDS


# === Dependencies run one way ===


def test_the_library_never_imports_its_command_line():
    found = [f"{name}:{line} {target}" for name, path in MODULES.items()
             for line, target in _imports(path)
             if name != "keras_attn.cli"
             and (target == "keras_attn.cli" or target.startswith("keras_attn.cli."))]
    assert not found


def test_the_keras_free_part_imports_the_standard_library_only():
    # And jsonschema, in the early recipe check only (inside its function:
    # `train` and `prepare` load it, `--help` and `list` do not).
    base = dict(_modules(os.path.join(PACKAGE, "_base")))
    assert "keras_attn._base.zoo_files" in base
    allowed = {"keras_attn._base.recipe_check": {"jsonschema"}}
    found = [f"{name}:{line} {target}" for name, path in base.items()
             for line, target in _imports(path)
             if target.split(".")[0] not in sys.stdlib_module_names
             and not target.startswith("keras_attn._base")
             and target.split(".")[0] not in allowed.get(name, ())]
    assert not found


def test_private_helpers_sit_below_the_subpackages():
    # keras_attn/_x.py may import other _x modules and the exception classes,
    # never a subpackage (layers, models, ...) that is built on them.
    found = [f"{name}:{line} {target}" for name, path in MODULES.items()
             if name.count(".") == 1 and name.split(".")[1].startswith("_")
             for line, target in _imports(path)
             if target.startswith("keras_attn.")
             and not target.split(".")[1].startswith("_")
             and target.split(".")[1] != "errors"]
    assert not found


def _explicit_edges(path, modules):
    """The modules in `modules` that `path` names in an import, anywhere in
    it (inside functions too): `from a.b import c` names `a.b.c` when that is
    a module, else `a.b`. (Python also runs each parent package's __init__;
    those edges are left out: a package's __init__ imports its own modules.)"""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in modules:
                    yield full
                elif node.module in modules:
                    yield node.module


def test_no_import_circles():
    # Before issue 40: keras_attn -> training -> checkpoints -> keras_attn (for
    # __version__), and keras_attn.cli -> zoo.prepared -> zoo.runs -> keras_attn.cli.
    modules = MODULES
    graph = {name: set(_explicit_edges(path, modules)) - {name}
             for name, path in modules.items()}
    assert not _circles(graph)


def _circles(graph):
    """Each path from a node of `graph` ({node: set of nodes}) through its
    edges back to itself."""
    circles = []
    for start in graph:
        seen, stack = set(), [(start, (start,))]
        while stack:
            name, path = stack.pop()
            for target in graph.get(name, ()):
                if target == start:
                    circles.append(" -> ".join(path + (start,)))
                elif target not in seen:
                    seen.add(target)
                    stack.append((target, path + (target,)))
    return circles


# The floors of the package, lowest first: a module imports only modules of
# its own package or of a package on a lower floor (anywhere in the file,
# inside functions too). "_private" is keras_attn/_*.py and errors.py;
# "keras_attn" is the package's own __init__, its face (it loads the
# others by name, on first use). training holds losses, metrics, schedules
# and the trainer, which the models' task heads use and which know no model:
# a caller hands it what depends on one (model_parallel's layout map).
FLOORS = (
    ("_private",),
    ("ops",),  # masks, scaled dot-product, rotary, kernels
    ("layers", "training"),
    ("models",),
    ("convert", "data", "export", "viz"),
    ("zoo",),
    ("cli", "keras_attn"),  # the command line calls the library; nothing imports it
)
# Upward imports allowed on purpose, "importer -> imported" (modules): none.
UPWARD_EXCEPTIONS = {}


def _floor_package(name):
    parts = name.split(".")
    if len(parts) == 1:
        return "keras_attn"
    return "_private" if parts[1].startswith("_") or parts[1] == "errors" else parts[1]


def _package_imports():
    """`{(importer package, imported package): ["module -> module", ...]}`
    between different packages of keras_attn."""
    found = {}
    for name, path in MODULES.items():
        for target in sorted(set(_explicit_edges(path, MODULES))):
            pair = (_floor_package(name), _floor_package(target))
            if pair[0] != pair[1] and f"{name} -> {target}" not in UPWARD_EXCEPTIONS:
                found.setdefault(pair, []).append(f"{name} -> {target}")
    return found


def test_every_package_stands_on_one_floor():
    packages = {_floor_package(name) for name in MODULES}
    floors = [package for floor in FLOORS for package in floor]
    assert sorted(floors) == sorted(set(floors)) == sorted(packages)


def test_packages_import_only_lower_floors():
    # Before issue 69: layers.multi_head_attention -> kernels (kernels imported
    # layers.masking: a circle, dodged by a lazy import) and
    # training.distribute -> models.parallel.
    level = {package: i for i, floor in enumerate(FLOORS) for package in floor}
    found = [f"{level[a]}:{a} -> {level[b]}:{b}: {edges[0]}"
             for (a, b), edges in _package_imports().items() if level[a] <= level[b]]
    assert not found


def test_no_circles_between_packages():
    graph = {}
    for a, b in _package_imports():
        graph.setdefault(a, set()).add(b)
    assert not _circles(graph)


def _version_literals(path):
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    return [node.value.value for node in tree.body if isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == ["__version__"]]


def test_the_version_is_stated_once():
    # _version.py holds the only literal; __init__ imports it, and setup.cfg's
    # `attr:` reads it as a build does (setuptools evaluates that file alone,
    # without Keras). The wheel's name carries it (tests/zoo/test_wheel.py).
    from setuptools.config.setupcfg import read_configuration

    (version,) = _version_literals(os.path.join(PACKAGE, "_version.py"))
    assert _version_literals(os.path.join(PACKAGE, "__init__.py")) == []
    assert read_configuration(os.path.join(ROOT, "setup.cfg"))["metadata"]["version"] == version
    import keras_attn

    assert keras_attn.__version__ == version


def test_help_and_list_modules_import_no_keras():
    code = ("import sys, keras_attn.cli, keras_attn._base.zoo_files, "
            "keras_attn._base.quiet_tensorflow\n"
            "heavy = ('keras', 'tensorflow', 'jax', 'torch', 'pydantic', 'numpy', 'jsonschema',\n"
            "         'keras_attn.layers', 'keras_attn.models', 'keras_attn.zoo')\n"
            "print(sorted(name for name in heavy if name in sys.modules))")
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, env=environment, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


def _assert_imported_quietly(backend, code):
    """Runs `code` in a fresh process on `backend` with no logging variable
    set: it exits 0, stderr has none of TensorFlow's C++ start-up notices,
    and what `code` writes to stderr after its imports still shows."""
    environment = dict(os.environ, KERAS_BACKEND=backend,
                       PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    environment.pop("TF_CPP_MIN_LOG_LEVEL", None)
    code += "; print('after the import', file=sys.stderr)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=environment, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    for notice in ("absl::InitializeLog", "oneDNN custom operations",
                   "Could not find cuda drivers", "rebuild TensorFlow"):
        assert notice not in result.stderr, result.stderr
    assert "after the import" in result.stderr


def test_importing_the_package_shows_no_tensorflow_start_up_notices():
    """`import keras_attn` first (TensorFlow backend) loads Keras and
    TensorFlow without their C++ start-up notices and INFO lines."""
    _assert_imported_quietly("tensorflow", "import sys, keras_attn; import keras_attn.data.text")


def test_tensorflow_loads_quietly_through_the_data_modules_on_jax():
    """On JAX (Keras imports no TensorFlow), the first keras_attn module that
    needs TensorFlow (keras_attn.data.text here) imports it quietly."""
    _assert_imported_quietly(
        "jax", "import sys, keras_attn; assert 'tensorflow' not in sys.modules; "
               "import keras_attn.data.text, keras_attn.export.text_classifier; "
               "assert 'tensorflow' in sys.modules")


def test_the_data_and_export_modules_import_tensorflow_quietly():
    """keras_attn.data and keras_attn.export take TensorFlow from
    keras_attn._base.quiet_tensorflow.tensorflow_module() (quiet on every
    backend), except portable.py, which runtime-only machines load by path
    without the package (its TensorFlow import runs only in an export)."""
    offenders = []
    modules = [path for package in ("data", "export")
               for _, path in _modules(os.path.join(PACKAGE, package))]
    for path in modules:
        if os.path.basename(path) in ("portable.py", "_wordpiece_graph.py"):
            continue
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(
                    alias.name == "tensorflow" for alias in node.names):
                offenders.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
    assert not offenders


def test_keras_internals_are_used_in_keras_compat_only():
    """`_keras_compat.py` holds every use of Keras's private walks and
    values: no other module calls `_flatten_layers` or reads `._value`."""
    private = {"_flatten_layers", "_value"}
    found = []
    for _, path in _modules():
        if os.path.basename(path) == "_keras_compat.py":
            continue
        with open(path) as file:
            tree = ast.parse(file.read())
        found += [f"{os.path.relpath(path, ROOT)}:{node.lineno} .{node.attr}"
                  for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and node.attr in private]
    assert not found, found


# A deployment machine: NumPy and a runtime, no Keras nor any backend.
DEPLOYMENT = """
import importlib.abc, importlib.util, sys
ABSENT = {"keras", "tensorflow", "jax", "jaxlib", "torch", "keras_hub", "tensorflow_text"}

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NotInstalled())
_find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, package=None: (
    None if name.split(".")[0] in ABSENT else _find_spec(name, package))

import numpy as np
from keras_attn.export import Artifact
from keras_attn.export.portable import Artifact as Same
from keras_attn.export.streaming_runtime import StreamingRecognizer
from keras_attn.data import pack_sequences
import keras_attn

assert Artifact is Same
packed = pack_sequences([np.arange(1, 4), np.arange(1, 3)], row_length=8)
assert packed["segment_ids"].tolist() == [[1, 1, 1, 2, 2, 0, 0, 0]], packed["segment_ids"]
try:
    keras_attn.layers
except ModuleNotFoundError as error:
    assert error.name == "keras", error
else:
    raise AssertionError("keras_attn.layers loaded without Keras")
print(sorted(m for m in sys.modules if m.split(".")[0] in ABSENT))
"""


def test_the_runtime_modules_import_where_keras_is_not_installed():
    # Artifact (ONNX/LiteRT), the streaming runtime and the packing helpers
    # promise NumPy and a runtime only (docs/export.md, docs/packing.md).
    result = subprocess.run([sys.executable, "-c", DEPLOYMENT], capture_output=True, text=True,
                            timeout=600, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout


# A deployment machine where Keras is installed all the same (a training
# machine, or a runtime image built from the same requirements).
KERAS_INSTALLED = """
import sys
HEAVY = ("keras", "tensorflow", "jax", "torch", "keras_hub")
from keras_attn.export.portable import Artifact
from keras_attn.export.streaming_runtime import StreamingRecognizer
from keras_attn.data.packing import pack_sequences
import keras_attn
print(sorted(m for m in sys.modules if m.split(".")[0] in HEAVY))
import keras  # whoever imports Keras, every class is registered then
print(all(keras.saving.get_registered_object("keras_attn>" + name) is not None for name in (
    "MultiHeadAttention", "BertBackbone", "ModernBertBackbone", "ConformerCTC",
    "TransformerSchedule", "SkipNonFiniteSteps")))
"""


def test_the_runtime_modules_load_no_keras_where_keras_is_installed():
    # `import keras_attn` registered its classes by importing Keras (and
    # TensorFlow) itself: Artifact cost a deployment machine 3.7 s and both.
    result = subprocess.run([sys.executable, "-c", KERAS_INSTALLED], capture_output=True,
                            text=True, timeout=600, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[:2] == ["[]", "True"], result.stdout

