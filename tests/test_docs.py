"""The documentation site (mkdocs.yml, docs/) builds in strict mode, so a
broken link or cross-reference fails; its API reference covers every stable
name; and every Python block of its pages runs as written, checked as the
README's are (tests/test_readme.py)."""

import glob
import html
import os
import re
import subprocess
import sys

import pytest
import yaml

from test_public_api import _listed
from test_readme import check_block_ran
from test_readme import python_blocks
from test_readme import ran_blocks  # noqa: F401  (a fixture)

pytestmark = pytest.mark.backend_independent

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")


def _pages():
    return sorted(glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True))


def _blocks():
    """(page, index) of every Python block, each in its page's xdist group:
    a page's blocks run in one process (test_readme.ran_blocks)."""
    return [pytest.param(os.path.relpath(page, ROOT), index,
                         marks=pytest.mark.xdist_group(os.path.relpath(page, ROOT)))
            for page in _pages() for index in range(len(python_blocks(page)))]


def _build(config, site):
    """`mkdocs build --strict` of `config` into `site`, in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", config,
         "--site-dir", site],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = str(tmp_path_factory.mktemp("site"))
    result = _build(os.path.join(ROOT, "mkdocs.yml"), site)
    assert result.returncode == 0, result.stderr[-5000:]
    return site


def test_the_site_builds_in_strict_mode(site):
    for page in ("index.html", "quickstart/index.html", "api/layers/index.html"):
        assert os.path.exists(os.path.join(site, page)), page


def test_the_reference_documents_every_stable_name(site):
    html = ""
    for page in glob.glob(os.path.join(site, "api", "*", "index.html")):
        with open(page, encoding="utf-8") as handle:
            html += handle.read()
    # A function that shares its module's name (scaled_dot_product_attention,
    # sinusoidal_positional_encoding)
    # is documented at its full path: the short one names the module.
    missing = [f"{module}.{name}" for module, names in _listed().items() for name in names
               if f'id="{module}.{name}"' not in html
               and f'id="{module}.{name}.{name}"' not in html]
    assert not missing


def _reference_text(site, module, name):
    """The text (tags dropped) of `name`'s entry in the API reference page of
    `module`, up to the next entry."""
    with open(os.path.join(site, "api", module, "index.html"), encoding="utf-8") as handle:
        page = handle.read()
    start = page.index(f'<h2 id="keras_attn.{module}.{name}"')
    end = page.find("<h2 id=", start + 1)
    return html.unescape(re.sub(r"<[^>]+>", "", page[start:end if end > 0 else None]))


def test_the_reference_shows_defaults_as_values(site):
    # A config field declared `field(30522, positive_int)` shows its default,
    # and a builder's `config=DEFAULT_PRESET` the preset's name
    # (docs/_ext/doctest_blocks.py); every builder documents its parameters.
    config = _reference_text(site, "models", "BertConfig")
    # The quotes around a string default are the renderer's (griffe 1.x
    # writes "gelu", later releases 'gelu'): either shows the value.
    assert "vocabulary_size=30522" in config
    assert 'activation="gelu"' in config or "activation='gelu'" in config
    assert "field(" not in _reference_text(site, "models", "ConformerConfig")
    for builder, preset in (("build_bert", "bert_base"), ("build_vit", "vit_base_16"),
                            ("build_transformer", "transformer_base"),
                            ("build_conformer", "conformer_small")):
        text = _reference_text(site, "models", builder)
        assert f'config="{preset}"' in text or f"config='{preset}'" in text, text[:300]
        assert "Parameters:" in text and "**overrides" in text, builder


def test_a_broken_reference_fails_the_strict_build(tmp_path):
    # The same site, copied, with one reference to a name that does not exist.
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    docs = tmp_path / "docs"
    subprocess.run(["cp", "-r", DOCS, str(docs)], check=True)
    with open(docs / "layers.md", "a", encoding="utf-8") as handle:
        handle.write("\nSee [`NoSuchLayer`][keras_attn.layers.NoSuchLayer].\n")
    config["docs_dir"] = str(docs)
    python = config["plugins"][2]["mkdocstrings"]["handlers"]["python"]
    python["paths"] = [ROOT]
    python["options"]["extensions"] = [
        os.path.join(ROOT, e) for e in python["options"]["extensions"]]
    with open(tmp_path / "mkdocs.yml", "w", encoding="utf-8") as handle:
        yaml.safe_dump(config, handle)
    result = _build(str(tmp_path / "mkdocs.yml"), str(tmp_path / "site"))
    assert result.returncode != 0
    assert "keras_attn.layers.NoSuchLayer" in result.stderr, result.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("page, index", _blocks())
def test_every_python_block_of_the_docs_runs_as_written(page, index, ran_blocks):
    path = os.path.join(ROOT, page)
    check_block_ran(ran_blocks(path)[index], python_blocks(path)[index], f"{page} block {index}")
