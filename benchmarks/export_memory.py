"""Peak memory of exporting a BERT text classifier to each format of
`keras_attn.export` (SavedModel, ONNX, LiteRT), each export in a fresh
process. Prints a table and writes `results/export_memory.json` (never run
as a test).

Run:  python benchmarks/export_memory.py [--presets bert_base,bert_large]
          [--formats saved_model,onnx,litert] [--keras-onnx] [--limit-gb 11]
      python benchmarks/export_memory.py --smoke     (tiny BERT: checks the script)
      (TensorFlow backend: every export needs it)

Each export runs in its own process (`--worker`): it builds the classifier
(`BertSequenceClassifier(build_bert(preset), num_classes=2)`, random
weights) and a WordPiece tokenizer of the preset's vocabulary size, records
its resident memory, and calls `export_text_classifier(..., format=...)`.
This process polls the resident memory of the worker and of every process
it starts, summed, every 20 ms, and reads the worker's own high-water mark
from the kernel (`ru_maxrss` of `wait4`) when it ends: the table's "peak" is
the larger of the two. "built" is the memory of the process before the
export (the libraries and the model's weights), so "peak - built" is what
the export itself costs. A worker that passes `--limit-gb` is killed (its
row says so) so that the machine does not run out of memory.

`--keras-onnx` adds a row converted as Keras's `model.export(format="onnx")`
does (the weights frozen into the graph that tf2onnx rewrites), the path
`keras_attn.export` took before it converted the weights as inputs.
"""

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FORMATS = ("saved_model", "onnx", "litert")
GB = 2 ** 30


def build(preset, smoke):
    import keras
    import keras_hub

    from keras_attn.models.bert import BertSequenceClassifier
    from keras_attn.models.bert import build_bert

    sizes = dict(num_layers=2, hidden_dim=32, num_heads=2, intermediate_dim=64,
                 vocabulary_size=100) if smoke else {}
    keras.utils.set_random_seed(0)
    model = BertSequenceClassifier(build_bert(preset, **sizes), num_classes=2)
    size = model.backbone.bert_config.vocabulary_size
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(size - 5)]
    return model, keras_hub.tokenizers.WordPieceTokenizer(vocabulary=vocabulary)


def keras_onnx(model, path):
    """The classifier's serving model (as `export_text_classifier` builds
    it) converted by Keras's own `model.export(format="onnx")`."""
    import keras

    from keras_attn.export.portable import _input_signature

    names = ("token_ids", "segment_ids", "padding_mask")
    inputs = {name: keras.Input((None,), dtype="int32", name=name) for name in names}
    probabilities = keras.ops.softmax(model(inputs, training=False), axis=-1)
    serving = keras.Model([inputs[name] for name in names], {"probabilities": probabilities})
    os.makedirs(path)
    serving.export(os.path.join(path, "model.onnx"), format="onnx",
                   input_signature=_input_signature(serving), verbose=False)


def worker(preset, format, smoke):
    """One export in this process; prints a JSON line of what it measured."""
    import psutil

    from keras_attn.export import export_text_classifier

    model, tokenizer = build(preset, smoke)
    built = psutil.Process().memory_info().rss
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "export")
        start = time.perf_counter()
        if format == "keras_onnx":
            keras_onnx(model, path)
        else:
            export_text_classifier(model, tokenizer, path, format=format)
        seconds = time.perf_counter() - start
        size = sum(os.path.getsize(os.path.join(folder, name))
                   for folder, _, names in os.walk(path) for name in names)
    print("RESULT" + json.dumps({"parameters": int(model.count_params()), "built": built,
                                 "seconds": seconds, "bytes": size}), flush=True)


def tree_rss(process):
    import psutil

    total = 0
    for each in [process] + process.children(recursive=True):
        try:
            total += each.memory_info().rss
        except psutil.Error:
            pass
    return total


def measure(preset, format, smoke, limit):
    """Runs one worker; `{peak, polled_peak, maxrss, built, ...}` in bytes."""
    import psutil

    command = [sys.executable, os.path.abspath(__file__), "--worker", preset, format]
    if smoke:
        command.append("--smoke")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                             text=True)
    process = psutil.Process(child.pid)
    polled, killed = 0, False
    while child.poll() is None:
        try:
            polled = max(polled, tree_rss(process))
        except psutil.Error:
            pass
        if polled > limit and not killed:
            killed = True
            for each in process.children(recursive=True) + [process]:
                try:
                    each.kill()
                except psutil.Error:
                    pass
        time.sleep(0.02)
    stdout, stderr = child.communicate()
    # The largest resident set of any process this one has waited for (the
    # worker; it reaps its own children): the kernel's count, no sampling.
    maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    row = {"preset": preset + (" (smoke sizes)" if smoke else ""), "format": format,
           "polled_peak": polled, "maxrss": maxrss, "killed_above": limit if killed else None}
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT")]
    if lines:
        row.update(json.loads(lines[-1][len("RESULT"):]))
        row["peak"] = max(polled, maxrss)
    elif not killed:
        raise RuntimeError(f"{preset} {format} failed:\n{stderr[-3000:]}")
    return row


def versions():
    import importlib.metadata

    names = ("keras", "tensorflow", "tf2onnx", "onnx", "protobuf", "ai-edge-litert")
    found = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    found["python"] = platform.python_version()
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="bert_base")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--keras-onnx", action="store_true",
                        help="also Keras's own ONNX conversion (the path before)")
    parser.add_argument("--limit-gb", type=float, default=11.0)
    parser.add_argument("--smoke", action="store_true", help="a tiny BERT")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "export_memory.json"))
    parser.add_argument("--worker", nargs=2, metavar=("PRESET", "FORMAT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if os.environ.setdefault("KERAS_BACKEND", "tensorflow") != "tensorflow":
        raise SystemExit("The exports need the TensorFlow backend (KERAS_BACKEND=tensorflow).")
    if args.worker:
        return worker(*args.worker, args.smoke)
    formats = args.formats.split(",") + (["keras_onnx"] if args.keras_onnx else [])
    rows = []
    # A fresh parent's RUSAGE_CHILDREN would carry the earlier workers' high
    # water mark: each worker is measured from a parent of its own.
    for preset in args.presets.split(","):
        for format in formats:
            row = json.loads(subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--measure-one", preset, format,
                 str(args.limit_gb * GB), "1" if args.smoke else "0"],
                check=True, capture_output=True, text=True).stdout.splitlines()[-1])
            rows.append(row)
            print(f"  {preset} {format}: " + (
                f"peak {row['peak'] / GB:.2f} GB" if "peak" in row else
                f"killed above {row['killed_above'] / GB:.1f} GB"), flush=True)
    print()
    print("| model | format | parameters | built GB | peak GB | peak - built GB | export s "
          "| artifact MB |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        if "peak" not in row:
            print(f"| {row['preset']} | {row['format']} | | | > {row['killed_above'] / GB:.1f} "
                  f"(killed) | | | |")
            continue
        print(f"| {row['preset']} | {row['format']} | {row['parameters']:,} | "
              f"{row['built'] / GB:.2f} | {row['peak'] / GB:.2f} | "
              f"{(row['peak'] - row['built']) / GB:.2f} | {row['seconds']:.0f} | "
              f"{row['bytes'] / 2 ** 20:.0f} |")
    result = {
        "what": "peak resident memory of export_text_classifier per format, one process each",
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
                   f"{_total_memory() / GB:.0f} GB",
        "versions": versions(),
        "command": "python benchmarks/export_memory.py " + " ".join(argv or sys.argv[1:]),
        "smoke": args.smoke,
        "rows": rows,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as stream:
        json.dump(result, stream, indent=2)
        stream.write("\n")
    print(f"\nwritten {args.out}")


def _total_memory():
    import psutil

    return psutil.virtual_memory().total


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--measure-one":
        _, _, preset, format, limit, smoke = sys.argv
        print(json.dumps(measure(preset, format, smoke == "1", float(limit))))
    else:
        main()
