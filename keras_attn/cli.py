"""The `keras-attn` command line: train, evaluate, export and list the zoo's
recipes (`models/<family>/<name>.json`).

```
keras-attn train RECIPE [--set key=value ...] [--output DIR] [--distribute [MODE]] [--data DIR]
keras-attn prepare RECIPE [--set key=value ...] [--out DIR]
keras-attn evaluate RUN_DIR [--json] [--exported DIR]
keras-attn export RUN_DIR [--output PATH] [--format saved_model|onnx|litert|hf] [--precision P]
                  [--streaming]
keras-attn transcribe RUN_DIR AUDIO.wav [--streaming [--chunk-ms N]]
keras-attn list [--family F]
```

It only parses arguments (declared in `keras_attn._base.command_line`) and
prints: each command is a call of
`keras_attn.zoo` (`train`, `prepare`, `evaluate`, `export`, `list_recipes`),
whose docstrings say what it does (resuming a killed run, refusing a
directory of another recipe or in use, exporting on TensorFlow from JAX).
RECIPE is a recipe file or the name of one in the zoo. The library knows
nothing of this module: its errors name Python arguments (`output`), which
`in_flags` names as given here (`--output`). An error prints its message
and exits with status 2 (KERAS_ATTN_TRACEBACK=1 shows the traceback).

`--help`, `list` and argument errors need no Keras: this module imports
`keras_attn._base` (the library's Keras-free part) at once (the package's
`__init__` loads no Keras either) and the rest of `keras_attn` only in the
commands that need it. The library never imports this module
(`tests/test_imports.py`); it was the top-level `keras_attn_cli` while
`import keras_attn` imported Keras.
"""

import json
import os
import re
import sys

from keras_attn._base import command_line
from keras_attn._base.quiet_tensorflow import import_tensorflow_quietly
from keras_attn._base.recipe_check import check_recipe_early
from keras_attn._base.zoo_files import CURVES
from keras_attn._base.zoo_files import MODEL
from keras_attn._base.zoo_files import RESULTS
from keras_attn._base.zoo_files import SAVED_MODEL
from keras_attn._base.zoo_files import list_recipes
from keras_attn._base.zoo_files import models_directory


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
    check_recipe_early(args.recipe, args.set or ())  # before Keras: seconds sooner
    results = _runs().train(args.recipe, args.set or (), output=args.output,
                            distribute=args.distribute, export=not args.no_export,
                            verbose=args.verbose, data=args.data)
    if "message" not in results:  # a process other than 0 of a job printed its line
        _report(results["output"], results)
    return 0


def prepare(args):
    check_recipe_early(args.recipe, args.set or ())
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
    path, source = _runs().export(args.run_dir, args.output, args.format, args.precision,
                                  streaming=args.streaming)
    kind = {"hf": "Hugging Face directory", "saved_model": "SavedModel", "onnx": "ONNX model",
            "litert": "LiteRT model"}[args.format] + (" of the streaming step" if args.streaming
                                                     else "")
    print(f"{kind} of {source}: {os.path.abspath(path)}")
    return 0


def transcribe(args):
    _runs()  # TensorFlow, quietly
    from keras_attn.zoo.transcribe import Transcriber
    from keras_attn.zoo.transcribe import transcribe as transcribe_file

    if not args.stream:
        text = transcribe_file(args.run_dir, args.audio, chunk_ms=args.chunk_ms)
        print(text)
        _say_if_empty(text, args)
        return 0
    # A line per piece that changes the text, or on a terminal one line
    # rewritten in place; the final text alone on the last line either way.
    terminal, shown = sys.stdout.isatty(), ""
    for partial in Transcriber(args.run_dir).stream(args.audio, args.chunk_ms):
        if partial.final:
            print(("\r\033[K" if terminal else "") + partial.text)
            _say_if_empty(partial.text, args)
        elif partial.text != shown:
            line = f"[{partial.seconds:6.2f} s] {partial.text}"
            print("\r\033[K" + line if terminal else line, end="" if terminal else "\n",
                  flush=True)
            shown = partial.text
    return 0


def _say_if_empty(text, args):
    """An empty transcript is an empty last line on stdout (what a script
    reads), and named on stderr, where a person sees it: the file read, and
    nothing recognised in it."""
    if not text:
        print(f"keras-attn transcribe: the transcript of {args.audio} is empty (the model "
              f"of {args.run_dir} recognised nothing in it)", file=sys.stderr, flush=True)


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


def build_parser():
    """The parser of every subcommand (declared in keras_attn._base.command_line)."""
    return command_line.build_parser({"train": train, "prepare": prepare, "evaluate": evaluate,
                                      "export": export, "transcribe": transcribe,
                                      "list": list_command})


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
