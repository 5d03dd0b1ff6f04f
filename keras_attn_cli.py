"""The `keras-attn` command line: train, evaluate, export and list the zoo's
recipes (`models/<family>/<name>.json`).

```
keras-attn train RECIPE [--set key=value ...] [--output DIR] [--distribute [MODE]] [--data DIR]
keras-attn prepare RECIPE [--set key=value ...] [--out DIR]
keras-attn evaluate RUN_DIR [--json] [--exported DIR]
keras-attn export RUN_DIR [--output PATH] [--format saved_model|onnx|litert|hf] [--precision P]
keras-attn list [--family F]
```

It only parses arguments and prints: each command is a call of
`keras_attn.zoo` (`train`, `prepare`, `evaluate`, `export`, `list_recipes`),
whose docstrings say what it does (resuming a killed run, refusing a
directory of another recipe or in use, exporting on TensorFlow from JAX).
RECIPE is a recipe file or the name of one in the zoo. The library knows
nothing of this module: its errors name Python arguments (`output`), which
`in_flags` names as given here (`--output`). An error prints its message
and exits with status 2 (KERAS_ATTN_TRACEBACK=1 shows the traceback).

Outside the `keras_attn` package because `import keras_attn` imports Keras
(it registers every saved class for `keras.saving.load_model`), a few
seconds, which `--help`, `list` and argument errors do not need: this module
imports `keras_attn_base` (the library's Keras-free part) at once and
`keras_attn` only in the commands that need it.
"""

import argparse
import json
import os
import re
import sys

from keras_attn_base.quiet_tensorflow import import_tensorflow_quietly
from keras_attn_base.zoo_files import CURVES
from keras_attn_base.zoo_files import MODEL
from keras_attn_base.zoo_files import RESULTS
from keras_attn_base.zoo_files import SAVED_MODEL
from keras_attn_base.zoo_files import list_recipes
from keras_attn_base.zoo_files import models_directory
from keras_attn_base.zoo_files import recipe_families


def in_flags(message, flags):
    """A library error in the command's words: each argument the message
    received (`Received: output=...`) named by its flag in `flags` ("`output`"
    -> "`output` (--output)"), a positional argument by its metavar ("RUN_DIR=")."""
    received = message.rpartition("Received:")[2]
    for argument, flag in flags.items():
        given = rf"(?<![\w.]){argument}="
        if not re.search(given, received):
            continue
        if flag.startswith("--"):
            message = re.sub(rf"`{argument}`(?! \()", f"`{argument}` ({flag})", message)
        else:
            message = re.sub(given, f"{flag}=", message)
    return message


def _runs():
    """`keras_attn.zoo.runs`, imported (with Keras and TensorFlow) when needed."""
    import_tensorflow_quietly()
    from keras_attn.zoo import runs

    return runs


def _report(output, results):
    print(f"\n{results['name']}: {results['metric']} = {results['value']:.4f} "
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

    manifest = prepare_data(args.recipe, args.set or (), output=args.output)
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
         else f"{row['expected']['metric']} {row['expected']['value']:.4g}",
         "-" if row["train_seconds"] is None else f"{row['train_seconds'] / 60:.0f} min")
        for row in list_recipes(args.family)
    ]
    header = ("recipe", "family", "preset", "dataset", "parameters", "expected", "trained in")
    widths = [max(len(str(row[i])) for row in rows + [header]) for i in range(len(header))]
    for row in [header] + rows:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
    if not rows:
        print(f"(no recipe{' of family ' + args.family if args.family else ''} in "
              f"{models_directory()})")
    return 0


def _distribute_mode(value):
    # parse_distribute's forms, checked before Keras is imported.
    if value == "data_parallel" or re.fullmatch(r"model_parallel:[1-9][0-9]*x[1-9][0-9]*", value):
        return value
    raise argparse.ArgumentTypeError(
        f"expected data_parallel or model_parallel:MxN (e.g. model_parallel:2x4), got {value!r}")


def build_parser():
    parser = argparse.ArgumentParser(prog="keras-attn", description="Train, evaluate, "
                                     "export and list keras_attn model-zoo recipes.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, func, help, description, *arguments):
        """A subcommand of (flags, keywords) `arguments`; `flags`: dest -> flag."""
        command = commands.add_parser(name, help=help, description=description)
        for flags, options in arguments:
            command.add_argument(*flags, **options)
        names = {options.get("dest", flags[0].lstrip("-").replace("-", "_")):
                 flags[0] if flags[0].startswith("-") else options["metavar"]
                 for flags, options in arguments}
        command.set_defaults(func=func, flags=names)

    run_dir = (("run_dir",), {"metavar": "RUN_DIR"})
    recipe = (("recipe",), {"metavar": "RECIPE",
                            "help": "a recipe file, or a recipe name from `keras-attn list`"})
    add("train", train, "train a recipe (resumes an interrupted run)",
        "Validate a recipe, train it (resuming an interrupted run in the same output directory), "
        "evaluate it on the test set, and write model.keras, a SavedModel, learning curves and "
        "results.json.", recipe,
        (("--set",), {"action": "append", "metavar": "KEY=VALUE",
                      "help": "override a dotted recipe key, e.g. --set training.epochs=3 (the "
                              "value is JSON, else a string); repeatable"}),
        (("--output",), {"metavar": "DIR", "help": "run directory (default: runs/<recipe name>)"}),
        (("--distribute",), {
            "nargs": "?", "const": "data_parallel", "default": None, "type": _distribute_mode,
            "metavar": "MODE", "help": "alone (or `data_parallel`): data parallel over every local "
            "accelerator (or the workers of TF_CONFIG / the JAX multi-process environment); "
            "`model_parallel:MxN` (JAX): M data replicas x N model shards, each attention layer "
            "split over its heads and each feed-forward over its inner width"}),
        (("--data",), {"metavar": "DIR", "help": "train from a directory written by `keras-attn "
                       "prepare` for this recipe and overrides (no TensorFlow needed)"}),
        (("--no-export",), {"action": "store_true", "help": "do not write the SavedModel "
                            "(`keras-attn export RUN_DIR` writes it later; on JAX and PyTorch "
                            "export runs in a TensorFlow subprocess)"}),
        (("--verbose",), {"type": int, "choices": (0, 1, 2), "default": 1,
                          "help": "a line per epoch in every case; 1 (default) adds a progress "
                                  "line while an epoch runs, on a terminal"}))
    add("prepare", prepare, "write a recipe's batches to files, for `train --data`",
        "Make a recipe's batches (every training epoch, validation, test) with its tf.data "
        "pipelines and write them to a directory, checksummed, so that `keras-attn train RECIPE "
        "--data DIR` trains from them where TensorFlow is not installed. Needs TensorFlow. Give "
        "`train` the same --set overrides.", recipe,
        (("--set",), {"action": "append", "metavar": "KEY=VALUE",
                      "help": "override a dotted recipe key (as for train); repeatable"}),
        (("--out",), {"dest": "output", "metavar": "DIR",
                      "help": "the directory (default: prepared/<recipe name>)"}))
    add("evaluate", evaluate, "evaluate a run on its test set",
        "Evaluate a run directory's model.keras (or, for a run that has not finished, its newest "
        "checkpoint) on the recipe's test set, or (--exported) what `keras-attn export` wrote "
        "from it, in its own runtime.",
        run_dir, (("--json",), {"action": "store_true", "help": "print one JSON object"}),
        (("--exported",), {"metavar": "DIR", "help": "an exported directory of this run "
                           "(SavedModel, ONNX or LiteRT): its metrics in onnxruntime / LiteRT / "
                           "TensorFlow (image classification, speech and translation runs)"}))
    add("export", export, "write a run's serving SavedModel (or a Hugging Face directory)",
        "Export a run's model.keras (or newest checkpoint) as the task's serving SavedModel, or, "
        "for BERT and ViT runs, as a Hugging Face directory (config.json, model.safetensors, the "
        "tokenizer's vocab.txt) that transformers loads.",
        run_dir, (("--output",), {"metavar": "PATH", "help": "output directory (default: "
                                  "RUN_DIR/saved_model, or RUN_DIR/<format>: onnx, litert, hf)"}),
        (("--format",), {"choices": ("saved_model", "onnx", "litert", "hf"),
                         "default": "saved_model",
                         "help": "saved_model (default): the serving SavedModel; onnx, litert: "
                                 "the same model as model.onnx / model.tflite with serving.json "
                                 "(pip install keras-attn[onnx,litert]); hf: a Hugging Face "
                                 "directory (BERT and ViT runs)"}),
        (("--precision",), {"choices": ("float32", "float16", "int8"), "default": "float32",
                            "help": "weights of the export: float32 (default), float16 "
                                    "(onnx, litert) or int8 (litert; dynamic range)"}))
    add("list", list_command, "list the zoo's recipes",
        "List the zoo's recipes: family, preset, dataset (embedded: trains offline; tfds:...: "
        "downloaded), parameters (models/parameters.json or the recorded run in "
        "models/results/), expected result, and the recorded run's training time.", (("--family",), {"choices": recipe_families()}))
    return parser


def main(argv=None):
    """The `keras-attn` entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        # The reader went away (`keras-attn list | head`): stop quietly, as Unix
        # tools do; stdout to /dev/null, so that the final flush does not fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ValueError, OSError) as error:
        # ValueError: bad input of every kind, keras_attn.errors' classes
        # included; OSError: a full disk, a read-only or vanished directory.
        if os.environ.get("KERAS_ATTN_TRACEBACK"):
            raise
        print(f"keras-attn {args.command}: error: {in_flags(str(error), args.flags)}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
