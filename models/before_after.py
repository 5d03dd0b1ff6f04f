"""Train recipes at two revisions of keras_attn and plot their learning curves.

When a change alters what training does (an initialisation, a default, a
loss), the zoo's recorded metrics move; this script shows how: each recipe
is trained from the same seed by the code of revision A and of revision B,
each in its own `git worktree` (so the working tree may change meanwhile),
and the per-epoch history of both runs lands in one JSON file and one
figure, a row per recipe (training loss; the validation metric where the
recipe logs one), A dashed and B solid.

    python models/before_after.py --before a62277c --after a00fe2e \
        --recipes vit_tiny_digits transformer_numbers \
        --json models/results/initialization_before_after.json \
        --figure docs/initialization_before_after.png

Each run is `python -m keras_attn.cli train RECIPE --no-export` inside its
worktree (that revision's recipe, that revision's code); a run already
finished in `--work` is read, not repeated, and an interrupted one resumes.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def worktree(revision, work):
    """A worktree of `revision` under `work` (made once)."""
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", revision],
                            check=True, capture_output=True, text=True).stdout.strip()
    path = os.path.join(work, f"tree-{commit}")
    if not os.path.isdir(path):
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", path, commit],
                       check=True)
    return commit, path


def train(tree, recipe, output):
    """Trains `recipe` with the code in `tree`; returns its results.json and
    per-epoch history."""
    results = os.path.join(output, "results.json")
    if not os.path.isfile(results):
        environment = dict(os.environ, PYTHONPATH=tree, KERAS_BACKEND="tensorflow")
        subprocess.run([sys.executable, "-m", "keras_attn.cli", "train", recipe,
                        "--output", output, "--no-export", "--verbose", "2"],
                       cwd=tree, env=environment, check=True)
    with open(results) as file:
        summary = json.load(file)
    with open(os.path.join(output, "checkpoints", "history.json")) as file:
        history = json.load(file)
    return summary, history


def plot(runs, path):
    """A row per recipe: the training loss and, where logged, the first
    validation metric that is not the loss; `before` dashed, `after` solid."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    recipes = list(runs)
    figure, axes = plt.subplots(len(recipes), 2, figsize=(10, 3.1 * len(recipes)),
                                squeeze=False)
    for row, recipe in zip(axes, recipes):
        sides = runs[recipe]
        history = sides["after"]["history"]
        others = [name for name in history if name.startswith("val_") and name != "val_loss"]
        panels = [("loss", "training loss")]
        panels.append((others[0], others[0].replace("val_", "validation "))
                      if others else ("val_loss", "validation loss"))
        for axis, (name, label) in zip(row, panels):
            for side, style in (("before", "--"), ("after", "-")):
                values = sides[side]["history"].get(name)
                if values:
                    axis.plot(range(1, len(values) + 1), values, style, linewidth=1.8,
                              label=f"{side} ({sides[side]['commit']})")
            axis.set_title(f"{recipe}: {label}", fontsize=11)
            axis.set_xlabel("epoch")
            axis.grid(alpha=0.3)
            axis.legend(fontsize=9)
    figure.tight_layout()
    temporary = path + ".tmp.png"
    figure.savefig(temporary, dpi=110)
    os.replace(temporary, path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision A")
    parser.add_argument("--after", required=True, help="git revision B")
    parser.add_argument("--recipes", nargs="+", required=True)
    parser.add_argument("--work", default="/tmp/keras_attn_before_after",
                        help="worktrees and run directories")
    parser.add_argument("--json", required=True, help="where the histories go")
    parser.add_argument("--figure", required=True, help="where the PNG goes")
    args = parser.parse_args(argv)

    os.makedirs(args.work, exist_ok=True)
    trees = {side: worktree(revision, args.work)
             for side, revision in (("before", args.before), ("after", args.after))}
    runs = {}
    for recipe in args.recipes:
        runs[recipe] = {}
        for side, (commit, tree) in trees.items():
            output = os.path.join(args.work, "runs", f"{recipe}-{commit}")
            summary, history = train(tree, recipe, output)
            runs[recipe][side] = {"commit": commit, "value": summary["value"],
                                  "metric": summary["metric"], "history": history,
                                  "train_seconds": summary.get("train_seconds")}
            print(f"{recipe} {side} ({commit}): {summary['metric']} {summary['value']:.4f}",
                  flush=True)
    record = {"date": datetime.date.today().isoformat(),
              "command": "python models/before_after.py " + " ".join(sys.argv[1:]),
              "runs": runs}
    temporary = args.json + ".tmp"
    with open(temporary, "w") as file:
        json.dump(record, file, indent=1)
    os.replace(temporary, args.json)
    plot(runs, args.figure)
    print(f"wrote {args.json} and {args.figure}")


if __name__ == "__main__":
    main()
