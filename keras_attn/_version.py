"""The package's version, in a module that imports nothing: modules inside
the package read it here (a checkpoint records it) rather than from
`keras_attn`, whose `__init__` imports them.

`keras_attn/__init__.py` states it again as a literal because setup.cfg's
`version = attr: keras_attn.__version__` reads that line without running
the package (a build environment has no Keras); tests/test_imports.py checks
that the two agree.
"""

__version__ = "0.1.0"
