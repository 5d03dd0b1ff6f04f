"""Local attention's memory and time against length: the band route
(`keras_attn.ops.local_attention.banded_attention`, what a `window` layer
takes) against the `(T, S)`-masked route of the same layer (forced by a
pairwise all-True `attention_mask`), issue 72.

One ModernBERT-base local attention layer (768 wide, 12 heads of 64, window
128, rotary, no biases), batch 1, eager on the current backend. Each
(length, route) runs in a fresh process: the peak resident memory above the
built layer (`ru_maxrss`), one call's wall and CPU time and the cores it
kept busy. The two routes' outputs are checked equal (1e-4) at the first
length before anything is timed.

    python benchmarks/local_attention.py --lengths 2048,8192 \
        [--output results/local_attention.json]
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_CHILD = r"""
import json, resource, sys, time
import numpy as np, keras
from keras_attn.layers import MultiHeadAttention
length, route = int(sys.argv[1]), sys.argv[2]
layer = MultiHeadAttention(num_heads=12, key_dim=64, window=128, rotary_theta=10000.0,
                           use_bias=False)
x = np.random.default_rng(0).normal(size=(1, length, 768)).astype("float32")
layer(x[:, :256])  # built, weights drawn
kwargs = {} if route == "band" else {"attention_mask": np.ones((length, length), bool)}
if route == "check":
    band = keras.ops.convert_to_numpy(layer(x))
    full = keras.ops.convert_to_numpy(layer(x, attention_mask=np.ones((length, length), bool)))
    print(json.dumps({"max_difference": float(np.abs(band - full).max())}))
    sys.exit()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
wall, cpu = time.perf_counter(), time.process_time()
keras.ops.convert_to_numpy(layer(x, **kwargs))
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"length": length, "route": route, "memory_gb": (peak - base) / 1e6,
                  "seconds": wall, "cpu_seconds": cpu, "cores_used": cpu / wall}))
"""


def _child(*args):
    result = subprocess.run([sys.executable, "-c", _CHILD, *map(str, args)],
                            capture_output=True, text=True, timeout=3600)
    if result.returncode:
        raise SystemExit(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="2048,8192")
    parser.add_argument("--output", default=os.path.join(HERE, "results",
                                                         "local_attention.json"))
    args = parser.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]
    difference = _child(lengths[0], "check")["max_difference"]
    if difference > 1e-4:
        raise SystemExit(f"The two routes differ by {difference} at {lengths[0]} tokens")
    rows = [_child(length, route) for length in lengths for route in ("band", "full")]
    import keras

    results = {
        "what": __doc__.split("\n\n")[0], "date": datetime.date.today().isoformat(),
        "backend": keras.backend.backend(), "keras": keras.__version__,
        "machine": f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()})",
        "max_difference": difference, "rows": rows,
        "command": "python benchmarks/local_attention.py " + " ".join(argv or sys.argv[1:]),
    }
    print("| tokens | route | memory above the layer | one call | cores used |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['length']} | {row['route']} | +{row['memory_gb']:.2f} GB | "
              f"{row['seconds']:.2f} s | {row['cores_used']:.2f} |")
    with open(args.output + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)
    os.replace(args.output + ".tmp", args.output)


if __name__ == "__main__":
    main()
