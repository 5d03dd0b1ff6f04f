"""The `keras-attn` command line's arguments, declared without Keras.

`build_parser(handlers)` returns the argparse parser of every subcommand;
`handlers` maps each subcommand's name to the function the launcher
(`keras_attn.cli`) runs for it. Declared here, apart from the launcher's
parsing-and-printing code, so that the launcher stays short as commands are
added, and so that `--help` and argument errors answer with the standard
library only. Each subcommand's parser records `flags` (argument name ->
flag or metavar), which the launcher uses to name a library error's Python
arguments by their flags.
"""

import argparse
import re

from keras_attn._base.zoo_files import recipe_families


# One flag for the streaming mode of every command (`export`, `transcribe`);
# --stream, which `transcribe` once took, is its alias.
STREAMING = ("--streaming", "--stream")


def distribute_mode(value):
    # parse_distribute's forms, checked before Keras is imported.
    if value == "data_parallel" or re.fullmatch(r"model_parallel:[1-9][0-9]*x[1-9][0-9]*", value):
        return value
    raise argparse.ArgumentTypeError(
        f"expected data_parallel or model_parallel:MxN (e.g. model_parallel:2x4), got {value!r}")


def build_parser(handlers):
    parser = argparse.ArgumentParser(prog="keras-attn", description="Train, evaluate, "
                                     "export and list keras_attn model-zoo recipes.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, help, description, *arguments):
        """A subcommand of (flags, keywords) `arguments`; `flags`: dest -> flag."""
        func = handlers[name]
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
    add("train", "train a recipe (resumes an interrupted run)",
        "Validate a recipe, train it (resuming an interrupted run in the same output directory), "
        "evaluate it on the test set, and write model.keras, a SavedModel, learning curves and "
        "results.json.", recipe,
        (("--set",), {"action": "append", "metavar": "KEY=VALUE",
                      "help": "override a dotted recipe key, e.g. --set training.epochs=3 (the "
                              "value is JSON, else a string); repeatable"}),
        (("--output",), {"metavar": "DIR", "help": "run directory (default: runs/<recipe name>)"}),
        (("--distribute",), {
            "nargs": "?", "const": "data_parallel", "default": None, "type": distribute_mode,
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
    add("prepare", "write a recipe's batches to files, for `train --data`",
        "Make a recipe's batches (every training epoch, validation, test) with its tf.data "
        "pipelines and write them to a directory, checksummed, so that `keras-attn train RECIPE "
        "--data DIR` trains from them where TensorFlow is not installed. Needs TensorFlow. Give "
        "`train` the same --set overrides.", recipe,
        (("--set",), {"action": "append", "metavar": "KEY=VALUE",
                      "help": "override a dotted recipe key (as for train); repeatable"}),
        (("--out",), {"dest": "output", "metavar": "DIR",
                      "help": "the directory (default: prepared/<recipe name>)"}))
    add("evaluate", "evaluate a run on its test set",
        "Evaluate a run directory's model.keras (or, for a run that has not finished, its newest "
        "checkpoint) on the recipe's test set, or (--exported) what `keras-attn export` wrote "
        "from it, in its own runtime.",
        run_dir, (("--json",), {"action": "store_true", "help": "print one JSON object"}),
        (("--exported",), {"metavar": "DIR", "help": "an exported directory of this run "
                           "(SavedModel, ONNX or LiteRT): its metrics in onnxruntime / LiteRT / "
                           "TensorFlow (image classification, speech and translation runs)"}))
    add("export", "write a run's serving SavedModel (or a Hugging Face directory)",
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
                                    "(onnx, litert) or int8 (onnx, litert; dynamic range; ONNX: "
                                    "the text and image classifiers)"}),
        (STREAMING, {"action": "store_true", "dest": "streaming",
                     "help": "onnx, litert (a streaming Conformer run): the streaming "
                             "step, one audio chunk and the state tensors in, tokens and "
                             "the next state out (default output RUN_DIR/<format>_"
                             "streaming; docs/streaming.md, 'On device')"}))
    add("transcribe", "print the transcript of a WAV file (speech runs)",
        "Transcribe a mono PCM WAV file (16-, 24- or 32-bit; resampled to the model's rate) with "
        "a speech run's model, greedy CTC, whole or (--streaming) fed chunk by chunk with "
        "partial results as the text grows (a line each when piped, one line rewritten on a "
        "terminal); the last line is the transcript (an empty one is also named on stderr).",
        run_dir, (("audio",), {"metavar": "AUDIO", "help": "a WAV file"}),
        # dest `stream`: the library's argument (`transcribe(..., stream=True)`).
        (STREAMING, {"action": "store_true", "dest": "stream",
                     "help": "stream the file chunk by chunk (a run trained for streaming: a "
                             "recipe with chunk_size)"}),
        (("--chunk-ms",), {"type": int, "metavar": "N", "help": "with --streaming: milliseconds "
                           "of audio per step, a multiple of the model's 40 ms step (default: "
                           "its attention chunk, 320 ms for conformer_tiny_digits_streaming)"}))
    add("list", "list the zoo's recipes",
        "List the zoo's recipes: family, preset, dataset (embedded: trains offline; tfds:...: "
        "downloaded), parameters (models/parameters.json or the recorded run in "
        "models/results/), expected result, and the recorded run's training time.", (("--family",), {"choices": recipe_families()}))
    return parser
