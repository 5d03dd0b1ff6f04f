"""The model zoo: training recipes (`models/<family>/<name>.json`), their
validation (`recipe`), the task adapters that train, evaluate and export
them (`tasks`), and a run's life from recipe to results (`runs`). The
`keras-attn` command line (`keras_attn.cli`) is a thin layer over these
functions; they know nothing of it:

    from keras_attn import zoo
    results = zoo.train("vit_tiny_digits", output="runs/vit")

    zoo.prepare("vit_tiny_digits", output="prepared/vit")        # with TensorFlow
    zoo.train("vit_tiny_digits", data="prepared/vit")             # without it

`keras_attn.zoo.transcribe` reads a WAV file through a speech run's model
(`keras-attn transcribe RUN_DIR AUDIO [--streaming]`).
"""

from keras_attn.zoo.runs import evaluate
from keras_attn.zoo.runs import export
from keras_attn.zoo.prepared import prepare
from keras_attn.zoo.runs import load_run
from keras_attn.zoo.runs import train
from keras_attn._base.zoo_files import list_recipes  # JSON only, no Keras

__all__ = ["evaluate", "export", "list_recipes", "load_run", "prepare", "train"]
