"""One initializer, regularizer or constraint object per sublayer.

A Keras 3 initializer made without a seed draws its seed once, when it is
made: the same instance handed to the query, key and value projections gives
them the same weights (W_Q == W_K == W_V). Keras's own `MultiHeadAttention`
clones its initializer for every sublayer, and keras-hub calls
`clone_initializer`; every layer and builder of keras_attn that hands one of
these objects to a sublayer or to `add_weight` goes through `for_sublayer`.

A seeded initializer stays reproducible: its clone's seed is derived from the
seed and the sublayer's name, so the same seed gives the same weights and two
sublayers still differ. An initializer seeded with a `keras.random.SeedGenerator`
is shared as it is: each call advances the generator, so draws differ already.
"""

import zlib

import keras


def _derived_seed(seed, name):
    # crc32 is stable across processes (Python's hash of a str is not).
    return zlib.crc32(f"{seed}/{name}".encode()) & 0x7FFFFFFF


def for_sublayer(obj, name):
    """A fresh copy of `obj` (an initializer, regularizer or constraint) for
    the sublayer or weight called `name`; None and plain callables as they
    are."""
    if obj is None or not hasattr(obj, "get_config"):
        return obj
    config = obj.get_config()
    if isinstance(obj, keras.initializers.Initializer) and "seed" in config:
        seed = config["seed"]
        if isinstance(seed, bool) or not (seed is None or isinstance(seed, int)):
            return obj  # a SeedGenerator: shared on purpose (see above)
        if seed is not None:
            config["seed"] = _derived_seed(seed, name)
    return obj.__class__.from_config(config)

# The packages that register classes, once this module is whole.
from keras_attn._registration import register_all as _register_all  # noqa: E402

_register_all(__name__)
