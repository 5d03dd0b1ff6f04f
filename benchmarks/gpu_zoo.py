"""The zoo's small recipes trained on the GPU machine from prepared data
(issue 43, "the zoo trained on the GPU"): that machine has JAX and no
TensorFlow, so the recipes' tf.data pipelines cannot run there; `keras-attn
prepare` makes their batches here, and `keras-attn train --data` reads them
there.

Here (TensorFlow installed), once, into a git-ignored folder that a device
call carries (the four small recipes: about 8.5 MiB, 3 minutes on 2 cores):

    for r in vit_tiny_digits bert_tiny_pydoc transformer_numbers conformer_tiny_digits; do
        python -m keras_attn.cli prepare $r --out .prep/$r; done

On the GPU machine (the prefix of ../shared/gpu/README.md first), carrying
`.whl` and `.prep`:

    python3 benchmarks/gpu_zoo.py --prepared .prep --out $OUT --timeout 150

Each recipe trains in a fresh process (its own peak memory), as published
and with `model.overrides.remat=true` (`--no-remat` skips that run), in
`--precision` (mixed_bfloat16 by default), through `keras_attn.zoo.runs.train`
as `keras-attn train NAME --data DIR` does. What each run reports: the test
metric beside the recipe's CPU result in models/results/NAME.json, the
training seconds (compiles included) and steps, the device's peak memory.
The table goes to `$OUT/gpu_zoo.md`, every run to `$OUT/gpu_zoo.json` as it
finishes. The conformer's prepared data holds no waveforms: they are made
again there with eSpeak NG and SciPy (carry `espeakng-loader` as a wheel;
another SciPy version makes other waveforms, and `train` refuses them by
name, which the table then shows).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RECIPES = ("vit_tiny_digits", "bert_tiny_pydoc", "transformer_numbers", "conformer_tiny_digits")


def run_one(name, data, precision, remat, extra):
    """Trains `name` from `data` in this process; returns its record."""
    sys.path.insert(0, ROOT)
    import jax

    from keras_attn.zoo import runs

    sets = [f"training.precision={precision}"] + (["model.overrides.remat=true"] if remat
                                                   else []) + list(extra)
    with tempfile.TemporaryDirectory() as output:
        results = runs.train(name, sets, output=os.path.join(output, "run"), export=False,
                             verbose=2, data=data)
    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    return {"recipe": name, "remat": remat, "precision": precision, "sets": sets,
            "metric": results["metric"], "value": results["value"],
            "train_seconds": results["train_seconds"], "steps": results["steps"],
            "device": device.device_kind, "peak_bytes": stats.get("peak_bytes_in_use"),
            "software": f"jax {jax.__version__}"}


def _cpu_result(name):
    path = os.path.join(ROOT, "models", "results", f"{name}.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        found = json.load(handle)
    return {"value": found["value"], "hardware": found.get("hardware"),
            "backend": found.get("backend"), "date": found.get("date")}


def _text(stream):
    if stream is None:
        return ""
    return stream.decode("utf-8", "replace") if isinstance(stream, bytes) else stream


def _last_progress(text):
    """The run's last epoch line (Keras's verbose=2 progress), or ''."""
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines()
             if line.strip().startswith("epoch ")]
    return lines[-1] if lines else ""


def launch(name, data, precision, remat, extra, timeout, log_path=None):
    """One run in a fresh Python; its record, or its error. The run's whole
    output goes to `log_path`, so a run cut off by `timeout` still shows how
    far it got (its last epoch line is in the error)."""
    command = [sys.executable, os.path.abspath(__file__), "--run", name, "--data", data,
               "--precision", precision] + (["--remat"] if remat else [])
    for item in extra:
        command += ["--set", item]
    env = dict(os.environ, KERAS_BACKEND=os.environ.get("KERAS_BACKEND", "jax"),
               PYTHONUNBUFFERED="1", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    start = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        output = _text(expired.stdout) + _text(expired.stderr)
        if log_path:
            with open(log_path, "w", encoding="utf-8") as handle:
                handle.write(output)
        reached = _last_progress(output)
        return {"recipe": name, "remat": remat, "error": f"timed out after {timeout} s"
                + (f" (last: {reached})" if reached else " (before its first epoch ended)")}
    if log_path:
        with open(log_path, "w", encoding="utf-8") as handle:
            handle.write(done.stdout + done.stderr)
    marker = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not marker:
        lines = (done.stderr or done.stdout).strip().splitlines()
        errors = [line for line in lines if "Error" in line.split(":")[0]]
        return {"recipe": name, "remat": remat,
                "error": (errors[-1] if errors else lines[-1] if lines else
                          f"exit {done.returncode}")[:300]}
    record = json.loads(marker[-1][len("RESULT "):])
    record["wall_seconds"] = time.perf_counter() - start
    return record


def table(records):
    lines = ["| recipe | remat | metric (GPU) | CPU result | steps | train s (compiles "
             "included) | peak GiB | device |", "|---|---|---|---|---|---|---|---|"]
    for r in records:
        cpu = _cpu_result(r["recipe"])
        cpu_text = f"{cpu['value']:.4f} ({cpu['backend']}, {cpu['date']})" if cpu else "n/a"
        if "error" in r:
            lines.append(f"| {r['recipe']} | {r['remat']} | not measured: "
                         f"{r['error'].replace('|', '/')} | {cpu_text} | | | | |")
            continue
        peak = f"{r['peak_bytes'] / 2**30:.2f}" if r.get("peak_bytes") else "n/a"
        lines.append(f"| {r['recipe']} | {r['remat']} | {r['metric']} {r['value']:.4f} | "
                     f"{cpu_text} | {r['steps']} | {r['train_seconds']:.1f} | {peak} | "
                     f"{r['device']} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepared", default=".prep",
                        help="folder holding one prepared directory per recipe")
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--precision", default="mixed_bfloat16")
    parser.add_argument("--no-remat", action="store_true")
    parser.add_argument("--set", action="append", default=[],
                        help="an extra recipe override for every run (e.g. training.epochs=1)")
    parser.add_argument("--timeout", type=int, default=150, help="seconds per run")
    parser.add_argument("--out", default=None, help="folder for gpu_zoo.json and gpu_zoo.md")
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--remat", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        print("RESULT " + json.dumps(run_one(args.run, args.data, args.precision, args.remat,
                                             args.set)), flush=True)
        return None
    records = []
    out = args.out or os.path.join(HERE, "results")
    os.makedirs(out, exist_ok=True)
    for name in args.recipes.split(","):
        data = os.path.join(args.prepared, name)
        for remat in (False,) if args.no_remat else (False, True):
            if not os.path.isdir(data):
                record = {"recipe": name, "remat": remat,
                          "error": f"no prepared directory {data}"}
            else:
                record = launch(name, data, args.precision, remat, args.set, args.timeout,
                                log_path=os.path.join(out, f"{name}{'_remat' if remat else ''}.log"))
            records.append(record)
            print(f"  {name} remat={remat}: "
                  f"{record.get('value', record.get('error'))}", flush=True)
            with open(os.path.join(out, "gpu_zoo.json"), "w", encoding="utf-8") as handle:
                json.dump(records, handle, indent=1)
    text = table(records)
    with open(os.path.join(out, "gpu_zoo.md"), "w", encoding="utf-8") as handle:
        handle.write(text + "\n")
    print(text)
    return records


if __name__ == "__main__":
    main()
