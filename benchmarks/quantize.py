"""int8 against float32 on the zoo's small recipes: the test metric before and
after `model.quantize("int8")`, the `.keras` file size, and the CPU inference
latency ratio int8 / float32. Not a test.

Needs the runs of the recipes (`keras-attn train vit_tiny_digits`, ... write
`runs/<name>`). For each, the trained `model.keras` is loaded twice, one copy
quantized; both are evaluated on the recipe's test set by the recipe's own
evaluation (`keras-attn evaluate`), saved to measure their files, and timed
on the inference a deployment runs (`Task.reference_outputs` on 8 test
examples: class probabilities, CTC decoding, beam-search translation, masked
token logits) in paired, order-alternating rounds (`_stats.py`).

Run:
    python benchmarks/quantize.py                     # every small recipe with a run
    python benchmarks/quantize.py --runs runs --repeats 15 vit_tiny_digits
"""

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _stats import median_interval  # noqa: E402
from _stats import time_pair  # noqa: E402

SMALL = ("vit_tiny_digits", "conformer_tiny_digits", "transformer_numbers", "bert_tiny_pydoc")


def _saved_bytes(model, directory, name):
    path = os.path.join(directory, name)
    model.save(path)
    return os.path.getsize(path)


def measure(run_dir, repeats):
    import warnings

    import keras

    from keras_attn.zoo.runs import load_run

    recipe, task, model, _ = load_run(run_dir)
    _, _, quantized, _ = load_run(run_dir)
    with warnings.catch_warnings():  # "Layer X does not have a `quantize` method"
        warnings.simplefilter("ignore")
        quantized.quantize("int8")
    metric = recipe["evaluation"]["metric"]
    before = task.evaluate(model)[metric]
    after = task.evaluate(quantized)[metric]
    with tempfile.TemporaryDirectory() as directory:
        float_bytes = _saved_bytes(model, directory, "float.keras")
        int8_bytes = _saved_bytes(quantized, directory, "int8.keras")
    inputs = task.example_inputs()
    times_int8, times_float = time_pair(
        lambda: task.reference_outputs(quantized, inputs),
        lambda: task.reference_outputs(model, inputs),
        rounds=repeats,
    )
    ratio, low, high = median_interval([a / b for a, b in zip(times_int8, times_float)])
    return {
        "recipe": recipe["name"], "metric": metric, "float32": before, "int8": after,
        "float32_mib": float_bytes / 2**20, "int8_mib": int8_bytes / 2**20,
        "latency_ratio": ratio, "interval": [low, high],
        "float32_ms": 1000 * sorted(times_float)[len(times_float) // 2],
        "backend": keras.backend.backend(),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipes", nargs="*", default=list(SMALL))
    parser.add_argument("--runs", default="runs", help="the directory of the run directories")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    rows = []
    for name in args.recipes:
        run_dir = os.path.join(args.runs, name)
        if not os.path.exists(os.path.join(run_dir, "model.keras")):
            print(f"{name}: no {run_dir}/model.keras (train it with `keras-attn train {name}`)")
            continue
        row = measure(run_dir, args.repeats)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print()
    print("| recipe | metric | float32 | int8 | .keras float32 / int8 (MiB) | latency int8 / float32 (95% interval) | float32 latency, 8 examples |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['recipe']} | {r['metric']} | {r['float32']:.4g} | {r['int8']:.4g} | "
              f"{r['float32_mib']:.2f} / {r['int8_mib']:.2f} | {r['latency_ratio']:.2f} "
              f"({r['interval'][0]:.2f}-{r['interval'][1]:.2f}) | {r['float32_ms']:.0f} ms |")


if __name__ == "__main__":
    main()
