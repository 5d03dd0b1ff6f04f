"""The `keras-attn` command line: train, evaluate, export and list the zoo's
recipes (`models/<family>/<name>.json`).

```
keras-attn train RECIPE [--set key=value ...] [--output DIR] [--distribute [MODE]] [--data DIR]
keras-attn prepare RECIPE [--set key=value ...] [--out DIR]
keras-attn evaluate RUN_DIR [--json] [--exported DIR]
keras-attn export RUN_DIR [--output PATH] [--format saved_model|onnx|litert|hf] [--precision P]
keras-attn list [--family F]
```

RECIPE is a path to a recipe file or the name of one in the zoo (shipped with
the package as `keras_attn/zoo/recipes`; in a source checkout, the
repository's `models/`). `train` validates the recipe (with the `--set` overrides) before
anything else, then writes the run directory `--output` (default
`runs/<name>`; its files are listed in `keras_attn.zoo.runs`).

This module only parses arguments and prints: each command is a call of
`keras_attn.zoo` (`train`, `evaluate`, `export`, `list_recipes`), which Python
users can make themselves.

Running the same `train` command again after a kill resumes the run from
its newest checkpoint (the trainer restores the weights, optimizer, seeds and
the position in the epoch). Running it after the run finished (results.json
exists) trains nothing and only reports the results: use `keras-attn
evaluate` / `keras-attn export` to evaluate or export again, another
`--output` to train again. A directory that holds a run of a different
recipe is refused.

`prepare` writes a recipe's batches (every epoch, validation, test) to files
where TensorFlow is installed; `train --data DIR` trains from them where it
is not (`keras_attn.zoo.prepared`: every task; speech from the embedded
digits only).

The SavedModel exporters trace TensorFlow graphs: on the JAX or torch
backend, `train` and `export` write it in a subprocess on the TensorFlow
backend, from model.keras (train on JAX on a GPU, export on TensorFlow).

One `train` at a time per output directory: a second one is refused at once
with the first one's process id (a lock released when that process ends,
however it ends). Leftovers of a process killed while writing (`.export-*`,
`.partial-*`, `*.tmp`) are removed when the run starts again.

Errors (a bad recipe, a missing run, an `--output` that is a file or cannot
be written, a full disk) print the message and exit with status 2; set
KERAS_ATTN_TRACEBACK=1 to see the traceback instead.

Why a module of its own, outside the `keras_attn` package: `import
keras_attn` registers every saved class with Keras (so that
`keras.saving.load_model` finds them), which imports Keras and TensorFlow, a
few seconds. `--help`, `list` and argument errors need none of it, so this
module imports the package only in the commands that train, evaluate or
export, and reads the recipes' JSON itself for `list`.
"""

import argparse
import glob
import importlib
import importlib.util
import json
import os
import re
import sys
import tempfile

MODEL = "model.keras"
RESULTS = "results.json"
SAVED_MODEL = "saved_model"
CURVES = "learning_curves.png"
PARAMETERS = "parameters.json"


# === The zoo's recipes, read without importing keras_attn ===


def models_directory():
    """The zoo's recipes: package data, `keras_attn/zoo/recipes` (in a source
    checkout a link to the repository's `models/`, their home), so that an
    installed wheel has them too. Found without running the package's
    `__init__` (which imports Keras)."""
    spec = importlib.util.find_spec("keras_attn")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("The keras_attn package is not installed: no zoo recipes to read.")
    package = list(spec.submodule_search_locations)[0]
    return os.path.realpath(os.path.join(package, "zoo", "recipes"))


def recipe_paths(directory=None):
    """`{name: path}` of every recipe under `models/` (results and the
    parameter table left out)."""
    directory = directory or models_directory()
    paths = {}
    for path in sorted(glob.glob(os.path.join(directory, "*", "*.json"))):
        if os.path.basename(os.path.dirname(path)) == "results":
            continue
        paths.setdefault(os.path.splitext(os.path.basename(path))[0], path)
    return paths


def _read_json(path):
    with open(path, encoding="utf-8") as stream:
        return json.load(stream)


def list_recipes(family=None, directory=None):
    """One dict per zoo recipe (of `family`, if given): `name`, `family`,
    `preset`, `dataset`, `parameters` (from models/parameters.json or the
    recorded run; None if neither has it), `expected` (or None)."""
    directory = directory or models_directory()
    counts_path = os.path.join(directory, PARAMETERS)
    counts = _read_json(counts_path) if os.path.exists(counts_path) else {}
    rows = []
    for name, path in recipe_paths(directory).items():
        recipe = _read_json(path)
        if family and recipe.get("family") != family:
            continue
        count = counts.get(name)
        result_path = os.path.join(directory, "results", name + ".json")
        if count is None and os.path.exists(result_path):
            # Recipes on embedded data learn their vocabulary: counted by their run.
            count = _read_json(result_path).get("parameters")
        rows.append({
            "name": name, "family": recipe.get("family", "?"),
            "preset": recipe.get("model", {}).get("preset", "?"),
            "dataset": recipe.get("data", {}).get("dataset", "?"),
            "parameters": count if isinstance(count, int) else None,
            "expected": recipe.get("expected") or None,
        })
    return rows


def recipe_families(directory=None):
    """The families that have recipes (their directories under `models/`)."""
    return sorted({os.path.basename(os.path.dirname(path))
                   for path in recipe_paths(directory).values()})


# === Importing TensorFlow quietly ===

# TensorFlow's C++ libraries (2.21) write these notices to the process's
# stderr while they load, before TF_CPP_MIN_LOG_LEVEL applies: absl's note
# that logging is not initialised, oneDNN's round-off notice, and "Could not
# find cuda drivers" on a CPU machine. They come from below us and no setting
# turns them off, so they alone are held back while TensorFlow is imported;
# every other line it writes is passed on.
_STARTUP_NOTICES = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called"
    r"|\] oneDNN custom operations are on"
    r"|\] Could not find cuda drivers on your machine"
)


def import_tensorflow_quietly():
    """Imports TensorFlow (when installed and not imported yet) with its
    start-up notices held back. The zoo's data pipelines use TensorFlow on
    every backend."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if "tensorflow" not in sys.modules and tensorflow_installed():
        import_holding_back_notices("tensorflow")


def tensorflow_installed():
    """Whether TensorFlow can be imported here, without importing it."""
    try:
        return importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):
        return False


def import_holding_back_notices(module):
    """Imports `module` with the process's stderr file descriptor sent to a
    temporary file, then writes back every line of it except the start-up
    notices. Only fd 2 is redirected, and only during the import."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            importlib.import_module(module)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode("utf-8", "replace").splitlines(keepends=True):
                if not _STARTUP_NOTICES.search(line):
                    sys.stderr.write(line)
            sys.stderr.flush()


def _runs():
    """`keras_attn.zoo.runs`, imported (with Keras and TensorFlow) when a
    command needs it."""
    import_tensorflow_quietly()
    from keras_attn.zoo import runs

    return runs


def _report(output, results):
    value = results["value"]
    print(f"\n{results['name']}: {results['metric']} = {value:.4f} "
          f"(trained {results['train_seconds']:.0f} s on {results['hardware']})")
    print(f"model:           {os.path.join(output, MODEL)}")
    saved_model = os.path.join(output, SAVED_MODEL)
    if os.path.exists(saved_model):
        print(f"SavedModel:      {saved_model}")
    else:
        print(f"SavedModel:      not written; `keras-attn export {output}` writes it")
    print(f"learning curves: {os.path.join(output, CURVES)}")
    print(f"results:         {os.path.join(output, RESULTS)}")
    if os.path.isdir(os.path.join(output, "tensorboard")):
        print(f"TensorBoard:     tensorboard --logdir {os.path.join(output, 'tensorboard')}")



def train(args):
    results = _runs().train(args.recipe, args.set or (), output=args.output,
                            distribute=args.distribute, export=not args.no_export,
                            verbose=args.verbose, data=args.data)
    _report(results["output"], results)
    return 0


def prepare(args):
    _runs()  # TensorFlow, quietly
    from keras_attn.zoo.prepared import prepare as prepare_data

    manifest = prepare_data(args.recipe, args.set or (), output=args.out)
    print(f"train from it with: keras-attn train {args.recipe} --data {manifest['output']}"
          + "".join(f" --set {value}" for value in args.set or ()))
    return 0


def evaluate(args):
    recipe, metrics, source = _runs().evaluate(args.run_dir, args.exported)
    metric = recipe["evaluation"]["metric"]
    if args.json:
        print(json.dumps({"name": recipe["name"], "metric": metric, "value": metrics[metric],
                          "metrics": metrics, "source": source}))
        return 0
    print(f"{recipe['name']} from {source}")
    for name, value in metrics.items():
        print(f"  {name}: {value:.6g}")
    print(f"{metric} = {metrics[metric]:.6f}")
    return 0


def export(args):
    path, source = _runs().export(args.run_dir, args.output, args.format, args.precision)
    kind = {"hf": "Hugging Face directory", "saved_model": "SavedModel", "onnx": "ONNX model",
            "litert": "LiteRT model"}[args.format]
    print(f"{kind} of {source}: {os.path.abspath(path)}")
    return 0


def list_command(args):
    rows = [
        (row["name"], row["family"], row["preset"], row["dataset"],
         "-" if row["parameters"] is None else f"{row['parameters']:,}",
         "-" if row["expected"] is None
         else f"{row['expected']['metric']} {row['expected']['value']:.4g}")
        for row in list_recipes(args.family)
    ]
    header = ("recipe", "family", "preset", "dataset", "parameters", "expected")
    widths = [max(len(str(row[i])) for row in rows + [header]) for i in range(len(header))]
    for row in [header] + rows:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
    if not rows:
        print(f"(no recipe{' of family ' + args.family if args.family else ''} in "
              f"{models_directory()})")
    return 0


# === Parser ===


def _distribute_mode(value):
    # The same forms as keras_attn.training.distribute.parse_distribute, checked
    # here so that a typo is an argument error before Keras is imported.
    if value == "data_parallel" or re.fullmatch(r"model_parallel:[1-9][0-9]*x[1-9][0-9]*", value):
        return value
    raise argparse.ArgumentTypeError(
        f"expected data_parallel or model_parallel:MxN (e.g. model_parallel:2x4), got {value!r}"
    )


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-attn",
        description="Train, evaluate, export and list keras_attn model-zoo recipes.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, func, help, description, *arguments):
        """A subcommand with `arguments`: (flags, add_argument keywords) pairs."""
        command = commands.add_parser(name, help=help, description=description)
        for flags, options in arguments:
            command.add_argument(*flags, **options)
        command.set_defaults(func=func)

    run_dir = (("run_dir",), {"metavar": "RUN_DIR"})
    add("train", train, "train a recipe (resumes an interrupted run)",
        "Validate a recipe, train it (resuming an interrupted run in the same output "
        "directory), evaluate it on the test set, and write model.keras, a SavedModel, "
        "learning curves and results.json.",
        (("recipe",), {"metavar": "RECIPE",
                       "help": "a recipe file, or a recipe name from `keras-attn list`"}),
        (("--set",), {"action": "append", "metavar": "KEY=VALUE",
                      "help": "override a dotted recipe key, e.g. --set training.epochs=3 "
                              "(the value is JSON, else a string); repeatable"}),
        (("--output",), {"metavar": "DIR", "help": "run directory (default: runs/<recipe name>)"}),
        (("--distribute",), {"nargs": "?", "const": "data_parallel", "default": None,
                             "type": _distribute_mode, "metavar": "MODE",
                             "help": "alone (or `data_parallel`): data parallel over every "
                                     "local accelerator (or the workers of TF_CONFIG / the "
                                     "JAX multi-process environment); `model_parallel:MxN` "
                                     "(JAX): M data replicas x N model shards, each "
                                     "attention layer split over its heads and each "
                                     "feed-forward over its inner width"}),
        (("--data",), {"metavar": "DIR",
                       "help": "train from a directory written by `keras-attn prepare` for "
                               "this recipe and overrides (no TensorFlow needed)"}),
        (("--no-export",), {"action": "store_true",
                            "help": "do not write the SavedModel (`keras-attn export RUN_DIR` "
                                    "writes it later; on JAX and PyTorch export runs in a "
                                    "TensorFlow subprocess)"}),
        (("--verbose",), {"type": int, "choices": (0, 1, 2), "default": 1,
                          "help": "a line per epoch in every case; 1 (default) adds a "
                                  "progress line while an epoch runs, on a terminal"}))
    add("prepare", prepare, "write a recipe's batches to files, for `train --data`",
        "Make a recipe's batches (every training epoch, validation, test) with its tf.data "
        "pipelines and write them to a directory, checksummed, so that `keras-attn train "
        "RECIPE --data DIR` trains from them where TensorFlow is not installed. Needs "
        "TensorFlow. Give `train` the same --set overrides.",
        (("recipe",), {"metavar": "RECIPE",
                       "help": "a recipe file, or a recipe name from `keras-attn list`"}),
        (("--set",), {"action": "append", "metavar": "KEY=VALUE",
                      "help": "override a dotted recipe key (as for train); repeatable"}),
        (("--out",), {"metavar": "DIR",
                      "help": "the directory (default: prepared/<recipe name>)"}))
    add("evaluate", evaluate, "evaluate a run on its test set",
        "Evaluate a run directory's model.keras (or, for a run that has not finished, its "
        "newest checkpoint) on the recipe's test set, or (--exported) what `keras-attn export` "
        "wrote from it, in its own runtime.",
        run_dir, (("--json",), {"action": "store_true", "help": "print one JSON object"}),
        (("--exported",), {"metavar": "DIR",
                           "help": "an exported directory of this run (SavedModel, ONNX or "
                                   "LiteRT): its metrics in onnxruntime / LiteRT / TensorFlow "
                                   "(image classification, speech and translation runs)"}))
    add("export", export, "write a run's serving SavedModel (or a Hugging Face directory)",
        "Export a run's model.keras (or newest checkpoint) as the task's serving SavedModel, "
        "or, for BERT and ViT runs, as a Hugging Face directory (config.json, "
        "model.safetensors, the tokenizer's vocab.txt) that transformers loads.",
        run_dir, (("--output",), {"metavar": "PATH",
                                  "help": "output directory (default: RUN_DIR/saved_model, "
                                          "or RUN_DIR/<format>: onnx, litert, hf)"}),
        (("--format",), {"choices": ("saved_model", "onnx", "litert", "hf"),
                         "default": "saved_model",
                         "help": "saved_model (default): the serving SavedModel; onnx, litert: "
                                 "the same model as model.onnx / model.tflite with serving.json "
                                 "(pip install keras-attn[onnx,litert]); hf: a Hugging Face "
                                 "directory (BERT and ViT runs)"}),
        (("--precision",), {"choices": ("float32", "float16", "int8"), "default": "float32",
                            "help": "LiteRT weights: float32 (default), float16 or dynamic-range "
                                    "int8"}))
    add("list", list_command, "list the zoo's recipes",
        "List every recipe in the zoo's models/ directory with its family, preset, dataset, "
        "parameter count (models/parameters.json, or the recorded run in "
        "models/results/) and expected result.",
        (("--family",), {"choices": recipe_families()}))
    return parser


def main(argv=None):
    """The `keras-attn` entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        # The reader went away (`keras-attn list | head`): stop quietly, as
        # Unix tools do; stdout goes to /dev/null so that the interpreter's
        # final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ValueError, OSError) as error:
        # ValueError: bad input of every kind, keras_attn.errors' classes
        # included (a recipe, a refused batch, a run directory in use);
        # OSError: a full disk, a read-only or vanished directory. Atomic
        # writes leave no half-written file; the message says what failed.
        if os.environ.get("KERAS_ATTN_TRACEBACK"):
            raise
        print(f"keras-attn {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
