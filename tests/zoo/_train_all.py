"""`python _train_all.py OUT_DIR NAME [NAME ...]`: trains the tiny version of
each small recipe with `keras_attn.zoo.train` on this process's backend,
one after the other in this one process, into `OUT_DIR/<name>` (no
SavedModel). One process per backend keeps the cross-backend test short: the
imports and the backend start-up are paid once, not once per recipe."""

import os
import sys

from _tiny import recipe_path
from _tiny import tiny_overrides

from keras_attn import zoo


def main(out, *names):
    import keras

    for name in names:
        overrides = tiny_overrides(name)
        if keras.backend.backend() == "jax":
            # JAX runs eagerly op by op without XLA: compiling is quicker even for
            # 3 steps (the conformer's epoch: 96 s eager, 28 s compiled).
            overrides = [o for o in overrides if not o.startswith("training.jit_compile=")]
            overrides.append("training.jit_compile=true")
        results = zoo.train(recipe_path(name), overrides,
                            output=os.path.join(out, name), export=False, verbose=0)
        print(f"{name}: {results['metric']} = {results['value']:.4f} on {results['backend']}",
              flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
