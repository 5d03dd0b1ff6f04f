"""Writes models/README.md, the zoo's table, from the recipes and the results files.

    python models/make_table.py                 # rewrite models/README.md
    python models/make_table.py --check         # exit 1 when models/README.md is stale
    python models/make_table.py --count [NAME ...]
                                                # build each model, record its parameter
                                                # count in models/parameters.json
    python models/make_table.py --record RUN_DIR
                                                # copy a finished run's results.json to
                                                # models/results/<name>.json
    python models/make_table.py --record-served RUN_DIR
                                                # export a finished run to every format
                                                # and precision, score each in its own
                                                # runtime: models/results/<name>.served.json
    python models/make_table.py --record-served out/bert_finetune/served.json
                                                # the fine-tuning example's own scores

Every number in the table comes from a file: parameter counts from
`parameters.json` (measured by building the model here), results from
`results/<name>.json` (written by `keras-attn train`), the paper's figures from
the recipe's `paper` entry. Nothing is typed into the table by hand, so it cannot
drift from the recipes (tests/zoo/test_table.py checks it is up to date).
"""

import argparse
import glob
import json
import os
import re
import shutil
import sys
import tempfile

from keras_attn._base.zoo_files import recipe_paths
from keras_attn.zoo.runs import write_json
from keras_attn.zoo.runs import write_text
from keras_attn.zoo.tasks import TASKS

HERE = os.path.dirname(os.path.abspath(__file__))
FAMILIES = ("vit", "bert", "modernbert", "transformer", "conformer")
TITLES = {
    "vit": "Vision Transformer",
    "bert": "BERT",
    "modernbert": "ModernBERT",
    "transformer": "Transformer (Attention Is All You Need)",
    "conformer": "Conformer",
}
def load_recipes(root=HERE):
    return [_load_json(path, None) for path in recipe_paths(root).values()]


def _load_json(path, default):
    if not os.path.exists(path):
        return default
    with open(path) as handle:
        return json.load(handle)


def _dataset(recipe):
    name = recipe["data"]["dataset"]
    if name == "embedded":
        return f"embedded: {TASKS[recipe['task']].embedded_data}"
    return name.replace("tfds:", "tfds ")


def _count(value):
    return f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value:,}"


def _metric(result, task):
    if not result:
        return "not run here"
    name = TASKS[task].metric_names.get(result["metric"], result["metric"])
    value = result["value"]
    text = f"{value:.4f}" if isinstance(value, float) and value < 1.5 else f"{value:.2f}"
    return f"{name} {text}"


def _time(result):
    if not result:
        return "-"
    seconds = result.get("train_seconds")
    if seconds is None:
        return "-"
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


# The exports `--record-served` scores, in the table's column order.
SERVED = (("saved_model", "float32", "SavedModel"), ("onnx", "float32", "ONNX"),
          ("onnx", "float16", "ONNX float16"), ("litert", "float32", "LiteRT"),
          ("litert", "float16", "LiteRT float16"), ("litert", "int8", "LiteRT int8"))


def _served_rows(recipes, root):
    rows = []
    # The recipes' runs, then the examples' (examples/bert_finetune.py's
    # classifier: a served.json of no recipe).
    named = {recipe["name"]: recipe for recipe in recipes}
    files = sorted(glob.glob(os.path.join(root, "results", "*.served.json")))
    extra = [os.path.basename(f).removesuffix(".served.json") for f in files]
    for name in [r["name"] for r in recipes] + [n for n in extra if n not in named]:
        served = _load_json(os.path.join(root, "results", name + ".served.json"), None)
        if not served:
            continue
        if name in named:
            names = TASKS[named[name]["task"]].metric_names
            variant = name
        else:
            names, variant = {}, f"{name} ({served['source'].split(' ')[0]})"
        cells = [variant, names.get(served["metric"], served["metric"]), _value(served["keras"])]
        for format, precision, _ in SERVED:
            entry = served["exports"].get(f"{format}_{precision}")
            cells.append("-" if entry is None else
                         f"{_value(entry['value'])} ({entry['megabytes']:.2f} MB)")
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    if not rows:
        return []
    return [
        "",
        "## Exported",
        "",
        "A run of each small recipe (trained again for this table: its model.keras is the "
        "Keras column) exported to every format and precision "
        "(`keras-attn export RUN_DIR --format F --precision P`) and scored on its test set in "
        "the format's own runtime (`keras-attn evaluate RUN_DIR --exported DIR`: onnxruntime, "
        "LiteRT, TensorFlow for the SavedModel), beside model.keras on Keras; the size is the "
        "exported directory's. Recorded with `python models/make_table.py --record-served "
        "runs/<name>`. The BERT classifier of `examples/bert_finetune.py` is scored by the "
        "example itself (token ids into ONNX and LiteRT, raw strings into the SavedModel) "
        "and recorded with `--record-served out/bert_finetune/served.json`. float16: the "
        "weights stored in float16, the arithmetic in float32; int8: dynamic-range int8 "
        "weights.",
        "",
        "| variant | metric | Keras | " + " | ".join(title for _, _, title in SERVED) + " |",
        "|---|---|---|" + "---|" * len(SERVED),
    ] + rows


def _value(value):
    return f"{value:.4f}" if isinstance(value, float) and value < 1.5 else f"{value:.2f}"


def _paper_count(value):
    return f"{value / 1e6:g}M" if value else "-"


def _order(recipe, parameters):
    """Embedded (measured) recipes first; then the Transformer's base and big
    models and Table 3's rows in the paper's order, other families by size."""
    name = recipe["name"]
    if recipe["family"] == "transformer":
        rank = ("transformer_base", "transformer_big")
        natural = [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
        size = (rank.index(name) if name in rank else len(rank), natural)
    else:
        size = (parameters.get(name, 0), name)
    return (recipe["data"]["dataset"] != "embedded", size)


def _cell(text):
    return str(text).replace("|", "/")


def render(root=HERE):
    recipes = load_recipes(root)
    parameters = _load_json(os.path.join(root, "parameters.json"), {})
    lines = [
        "# The model zoo",
        "",
        "One recipe per variant: `models/<family>/<name>.json` holds the architecture "
        "(a preset plus overrides), the dataset, batching, optimizer, schedule, "
        "precision and the result it is expected to reach. Train one with "
        "`keras-attn train <name>`; `keras-attn list` prints the same variants. "
        "Every key a recipe takes, with its type, default and meaning, is in "
        "[RECIPES.md](RECIPES.md); editors check recipes against "
        "[recipe.schema.json](recipe.schema.json), which each recipe names in `\"$schema\"`.",
        "",
        "This file is generated by `python models/make_table.py` from the recipes, "
        "`models/parameters.json` (counted by building each model here: "
        "`python models/make_table.py --count`) and `models/results/*.json` (a "
        "finished run's `results.json`, recorded with "
        "`python models/make_table.py --record runs/<name>`). Do not edit it by hand.",
        "",
        "\"not run here\": the recipe is written for the paper's dataset and hardware and "
        "has not been trained on this project's machines (2 CPU cores, no accelerator "
        "so far); its paper columns say what to expect.",
    ]
    for family in FAMILIES:
        rows = sorted(
            (r for r in recipes if r["family"] == family),
            key=lambda r: _order(r, parameters),
        )
        if not rows:
            continue
        lines += [
            "",
            f"## {TITLES[family]}",
            "",
            "| variant | parameters (here) | parameters (paper) | dataset | reached here "
            "| train time | hardware | paper result | command |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for recipe in rows:
            name = recipe["name"]
            result = _load_json(os.path.join(root, "results", name + ".json"), None)
            count = parameters.get(name)
            if count is None and result and result.get("parameters"):
                count = result["parameters"]
            paper = recipe.get("paper") or {}
            cells = [
                f"[{name}]({family}/{name}.json)",
                _count(count) if count else "-",
                _paper_count(paper.get("parameters")),
                _dataset(recipe),
                _metric(result, recipe["task"]),
                _time(result),
                (result or {}).get("hardware", "-"),
                (f"{paper['result']} ({paper['source']})" if paper.get("result") else "-"),
                f"`keras-attn train {name}`",
            ]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines += _streaming_rows(recipes, root)
    lines += _served_rows(recipes, root)
    return "\n".join(lines) + "\n"


def _streaming_rows(recipes, root):
    """Streaming recipes (a model with `chunk_size`): the metric of
    decoding streamed chunk by chunk at each evaluated chunk size
    (`<metric>_chunk_<C>` in results.json) beside the offline call with the
    configured chunk mask and the recipe's offline counterpart (the recipe
    named without `_streaming`), with the algorithmic latency."""
    rows = []
    for recipe in recipes:
        overrides = (recipe.get("model") or {}).get("overrides") or {}
        if overrides.get("chunk_size") is None:
            continue
        name, metric = recipe["name"], recipe.get("evaluation", {}).get("metric", "wer")
        result = _load_json(os.path.join(root, "results", name + ".json"), None)
        offline_name = name.replace("_streaming", "")
        offline = _load_json(os.path.join(root, "results", offline_name + ".json"), None)
        label = TASKS[recipe["task"]].metric_names.get(metric, metric)
        metrics = (result or {}).get("metrics", {})
        sizes = recipe.get("evaluation", {}).get("streaming_chunk_sizes", [])
        reference = (f"{label} {_value(offline['metrics'][metric])} "
                     f"([{offline_name}]({recipe['family']}/{offline_name}.json))"
                     if offline else "-")
        cells = [(f"offline, chunk mask of {overrides['chunk_size']} frames",
                  metrics.get(metric))]
        cells += [(f"streamed, chunks of {size} frames", metrics.get(f"{metric}_chunk_{size}"),
                   metrics.get(f"latency_ms_chunk_{size}")) for size in sizes]
        for cell in cells:
            value = "not run here" if cell[1] is None else f"{label} {_value(cell[1])}"
            latency = f"{cell[2]:.0f} ms" if len(cell) > 2 and cell[2] is not None else "-"
            rows.append(f"| [{name}]({recipe['family']}/{name}.json) | {_cell(cell[0])} | "
                        f"{latency} | {value} | {_cell(reference)} |")
    if not rows:
        return []
    return [
        "",
        "## Streaming speech recognition",
        "",
        "Each streaming recipe's test metric decoded offline with its configured chunk mask "
        "and streamed chunk by chunk (`ConformerCTC.stream_step`, greedy) at other chunk "
        "sizes, beside its offline recipe. Algorithmic latency: the chunk (40 ms a frame; "
        "80 ms for the FastConformer's 8x subsampling) plus the front end's look-ahead "
        "(36 ms at 16 kHz; 6 ms for the FastConformer: docs/streaming.md).",
        "",
        "| variant | decoding | algorithmic latency | reached here | offline recipe |",
        "|---|---|---|---|---|",
    ] + rows


def _nominal_task(recipe):
    """The recipe's task with the sizes its model takes from the data set
    assumed from the recipe, so that nothing is downloaded."""
    from keras_attn.zoo.tasks import make_task

    task = make_task(recipe)
    task.assume_data_sizes()
    return task


def count_parameters(names, root=HERE):
    """Builds the model of each named recipe (all tfds recipes when `names`
    is empty) and records its parameter count in parameters.json. Recipes on
    the embedded data sets are counted by their runs (results.json), since
    their vocabulary is learned from the data."""
    import keras

    from keras_attn.zoo.recipe import load_recipe

    path = os.path.join(root, "parameters.json")
    counts = _load_json(path, {})
    for recipe in load_recipes(root):
        if names and recipe["name"] not in names:
            continue
        if recipe["data"]["dataset"] == "embedded":
            print(f"{recipe['name']}: counted by its run (embedded data)")
            continue
        resolved = load_recipe(os.path.join(root, recipe["family"], recipe["name"] + ".json"))
        model = _nominal_task(resolved).make_model(
            resolved["model"]["preset"], dict(resolved["model"]["overrides"])
        )
        counts[recipe["name"]] = int(model.count_params())
        print(f"{recipe['name']}: {counts[recipe['name']]:,}", flush=True)
        del model
        keras.backend.clear_session()
        write_json(path, dict(sorted(counts.items())))


def record(run_dir, root=HERE):
    results = _load_json(os.path.join(run_dir, "results.json"), None)
    if results is None:
        raise SystemExit(f"{run_dir} has no results.json: the run has not finished.")
    os.makedirs(os.path.join(root, "results"), exist_ok=True)
    target = os.path.join(root, "results", results["name"] + ".json")
    shutil.copyfile(os.path.join(run_dir, "results.json"), target)
    print(f"recorded {target}")


def _megabytes(path):
    return sum(os.path.getsize(os.path.join(folder, file))
               for folder, _, files in os.walk(path) for file in files) / 1e6


def record_served(run_dir, root=HERE):
    """Exports a finished run to each of SERVED and scores every export in
    its runtime; writes models/results/<name>.served.json. `run_dir` may
    also be a served.json an example wrote (examples/bert_finetune.py),
    copied as it is."""
    import datetime

    if os.path.isfile(run_dir):
        served = _load_json(run_dir, None)
        missing = [key for key in ("name", "metric", "keras", "exports", "source")
                   if key not in (served or {})]
        if missing:
            raise SystemExit(f"{run_dir} is not a served.json (it lacks {missing})")
        target = os.path.join(root, "results", served["name"] + ".served.json")
        write_json(target, served)  # atomically
        print(f"recorded {target}")
        return

    from keras_attn import __version__
    from keras_attn.zoo import runs

    recipe, metrics, source = runs.evaluate(run_dir)
    metric = recipe["evaluation"]["metric"]
    exports = {}
    with tempfile.TemporaryDirectory() as tmp:
        for format, precision, title in SERVED:
            path = os.path.join(tmp, f"{format}_{precision}")
            runs.export(run_dir, path, format, precision)
            _, served, _ = runs.evaluate(run_dir, exported=path)
            exports[f"{format}_{precision}"] = {"value": served[metric], "metrics": served,
                                                "megabytes": round(_megabytes(path), 3)}
            print(f"{title}: {metric} {served[metric]:.6g}", flush=True)
    target = os.path.join(root, "results", recipe["name"] + ".served.json")
    write_json(target, {
        "name": recipe["name"], "metric": metric, "keras": metrics[metric],
        "keras_metrics": metrics, "exports": exports, "source": os.path.basename(source),
        "date": datetime.date.today().isoformat(), "keras_attn_version": __version__})
    print(f"recorded {target}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if README.md is stale")
    parser.add_argument("--count", nargs="*", metavar="NAME", help="measure parameter counts")
    parser.add_argument("--record", metavar="RUN_DIR", help="copy a run's results.json")
    parser.add_argument("--record-served", metavar="RUN_DIR",
                        help="score a run's exports in their runtimes")
    args = parser.parse_args(argv)
    if args.count is not None:
        count_parameters(set(args.count))
    if args.record:
        record(args.record)
    if args.record_served:
        record_served(args.record_served)
    text = render()
    path = os.path.join(HERE, "README.md")
    if args.check:
        current = open(path).read() if os.path.exists(path) else ""
        if current != text:
            print("models/README.md is stale: run python models/make_table.py", file=sys.stderr)
            return 1
        return 0
    write_text(path, text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
