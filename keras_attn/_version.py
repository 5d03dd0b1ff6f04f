"""The package's version, stated once, in a module that imports nothing.

setup.cfg reads it here (`version = attr: keras_attn._version.__version__`,
which setuptools evaluates from this file alone: a build environment has no
Keras), `keras_attn/__init__.py` re-exports it, and the package's own modules
import it from here rather than from `keras_attn`, whose `__init__` imports
them.
"""

__version__ = "0.1.0"
