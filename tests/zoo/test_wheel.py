"""The zoo ships in the wheel: built from a copy of the sources, installed
into a directory of its own, and used from a directory without the
checkout, `keras-attn list` shows the recipes and `keras-attn train` runs
one of them."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from _tiny import ROOT
from _tiny import tiny_overrides
from keras_attn._version import __version__

# One worker builds the wheel once for both tests (module fixture).
pytestmark = [pytest.mark.backend_independent, pytest.mark.xdist_group("wheel")]

# Generous limits: a loaded 2-core machine, and a build that fetches
# setuptools for its isolated environment.
TIMEOUT = 1200


def _run(command, cwd, env=None):
    result = subprocess.run([str(part) for part in command], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, f"{command}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The site directory the wheel was installed into."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"  # a copy: building writes build/ and egg-info
    source.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), source)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "runs", "results.json")
    shutil.copytree(os.path.join(ROOT, "keras_attn"), source / "keras_attn", symlinks=True,
                    ignore=ignore)
    shutil.copytree(os.path.join(ROOT, "models"), source / "models", ignore=ignore)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", base / "dist",
          source], cwd=base)
    # Named with the package's version (setup.cfg reads keras_attn/_version.py).
    (wheel,) = (base / "dist").glob(f"keras_attn-{__version__}-py3-none-any.whl")
    site = base / "site"
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", site,
          wheel], cwd=base)
    return site


def _cli(site, cwd, *args):
    # The wheel's package first on the path, the environment's dependencies
    # after it; the checkout is nowhere on the path and not the directory.
    env = dict(os.environ, PYTHONPATH=str(site))
    code = ("import importlib.util, sys, keras_attn.cli; status = keras_attn.cli.main(sys.argv[1:]); "
            "print('package:', importlib.util.find_spec('keras_attn').origin); "
            "print('launcher:', keras_attn.cli.__file__); "
            "print('base:', importlib.util.find_spec('keras_attn._base').origin); "
            "print('keras imported:', 'keras' in sys.modules); sys.exit(status)")
    return _run([sys.executable, "-c", code, *args], cwd=cwd, env=env)


def test_the_console_script_runs_from_the_wheel(installed, tmp_path):
    script = installed / "bin" / "keras-attn"
    env = dict(os.environ, PYTHONPATH=str(installed))
    shown = _run([script, "--help"], cwd=tmp_path, env=env).stdout
    assert "usage: keras-attn" in shown and "train" in shown


def test_the_wheel_carries_the_zoo(installed, tmp_path):
    recipes = installed / "keras_attn" / "zoo" / "recipes"
    assert not recipes.is_symlink() and (recipes / "vit" / "vit_tiny_digits.json").is_file()
    assert (recipes / "recipe.schema.json").is_file() and (recipes / "RECIPES.md").is_file()
    shipped = sorted(path.stem for path in recipes.glob("*/*.json")
                     if path.parent.name != "results")
    in_checkout = sorted(name[:-5] for family in os.listdir(os.path.join(ROOT, "models"))
                         if os.path.isdir(os.path.join(ROOT, "models", family))
                         and family != "results"
                         for name in os.listdir(os.path.join(ROOT, "models", family))
                         if name.endswith(".json"))
    assert shipped == in_checkout

    listed = _cli(installed, tmp_path, "list").stdout
    assert f"package: {installed}" in listed and f"launcher: {installed}" in listed
    assert f"base: {installed}" in listed  # the Keras-free part of the library, shipped too
    assert "keras imported: False" in listed  # `list` reads the JSON only
    for name in in_checkout:
        assert name in listed

    run = tmp_path / "run"
    sets = [item for value in tiny_overrides("vit_tiny_digits") for item in ("--set", value)]
    trained = _cli(installed, tmp_path, "train", "vit_tiny_digits", "--output", run,
                   "--no-export", "--verbose", "0", *sets)
    assert f"package: {installed}" in trained.stdout
    assert "keras imported: True" in trained.stdout
    results = json.loads((run / "results.json").read_text())
    assert results["steps"] == 3 and 0.0 <= results["value"] <= 1.0
