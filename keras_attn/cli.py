"""The `keras-attn` command line: train, evaluate, export and list the zoo's
recipes (`models/<family>/<name>.json`).

```
keras-attn train RECIPE [--set key=value ...] [--output DIR] [--distribute]
keras-attn evaluate RUN_DIR [--json]
keras-attn export RUN_DIR [--output PATH]
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
"""

import argparse
import json
import os
import sys

from keras_attn.zoo import runs
from keras_attn.zoo.runs import CURVES
from keras_attn.zoo.runs import MODEL
from keras_attn.zoo.runs import RESULTS
from keras_attn.zoo.runs import SAVED_MODEL


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
    print(f"TensorBoard:     tensorboard --logdir {os.path.join(output, 'tensorboard')}")



def train(args):
    results = runs.train(args.recipe, args.set or (), output=args.output,
                         distribute=args.distribute, export=not args.no_export,
                         verbose=args.verbose)
    _report(results["output"], results)
    return 0


def evaluate(args):
    recipe, metrics, source = runs.evaluate(args.run_dir)
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
    path, source = runs.export(args.run_dir, args.output)
    print(f"SavedModel of {source}: {os.path.abspath(path)}")
    return 0


def list_recipes(args):
    rows = [
        (row["name"], row["family"], row["preset"], row["dataset"],
         "-" if row["parameters"] is None else f"{row['parameters']:,}",
         "-" if row["expected"] is None
         else f"{row['expected']['metric']} {row['expected']['value']:.4g}")
        for row in runs.list_recipes(args.family)
    ]
    header = ("recipe", "family", "preset", "dataset", "parameters", "expected")
    widths = [max(len(str(row[i])) for row in rows + [header]) for i in range(len(header))]
    for row in [header] + rows:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
    if not rows:
        print(f"(no recipe{' of family ' + args.family if args.family else ''} in "
              f"{runs.models_directory()})")
    return 0


# === Parser ===


def build_parser():
    from keras_attn.zoo.tasks import families

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
        (("--distribute",), {"action": "store_true",
                             "help": "data-parallel over every local accelerator (or the "
                                     "workers of TF_CONFIG / the JAX multi-process "
                                     "environment)"}),
        (("--no-export",), {"action": "store_true",
                            "help": "do not write the SavedModel (`keras-attn export RUN_DIR` "
                                    "writes it later; on JAX and PyTorch export runs in a "
                                    "TensorFlow subprocess)"}),
        (("--verbose",), {"type": int, "choices": (0, 1, 2), "default": 1,
                          "help": "a line per epoch in every case; 1 (default) adds a "
                                  "progress line while an epoch runs, on a terminal"}))
    add("evaluate", evaluate, "evaluate a run on its test set",
        "Evaluate a run directory's model.keras (or, for a run that has not finished, its "
        "newest checkpoint) on the recipe's test set.",
        run_dir, (("--json",), {"action": "store_true", "help": "print one JSON object"}))
    add("export", export, "write a run's serving SavedModel",
        "Export a run's model.keras (or newest checkpoint) as the task's serving SavedModel.",
        run_dir, (("--output",), {"metavar": "PATH",
                                  "help": "SavedModel directory (default: RUN_DIR/saved_model)"}))
    add("list", list_recipes, "list the zoo's recipes",
        "List every recipe in the zoo's models/ directory with its family, preset, dataset, "
        "parameter count (models/parameters.json, or the recorded run in "
        "models/results/) and expected result.",
        (("--family",), {"choices": sorted(families())}))
    return parser


def main(argv=None):
    """The `keras-attn` entry point; returns the exit status."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, OSError) as error:
        # OSError: a full disk, a read-only or vanished directory. Atomic
        # writes leave no half-written file; the message says what failed.
        if os.environ.get("KERAS_ATTN_TRACEBACK"):
            raise
        print(f"keras-attn {args.command}: error: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        # A batch refused by the pipeline's data check (keras_attn.data.checks)
        # arrives as TensorFlow's InvalidArgumentError.
        if os.environ.get("KERAS_ATTN_TRACEBACK") or "keras_attn data check:" not in str(error):
            raise
        from keras_attn.data.checks import data_check_message

        print(f"keras-attn {args.command}: error: {data_check_message(error)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
