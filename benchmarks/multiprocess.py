"""One JAX process against two on this machine: the training step time of
the vit_tiny_digits model at the same global batch, and the share of the
two-process step that the gradient all-reduce takes. Writes
`results/multiprocess.json` and prints a table (never run as a test).

Run:  KERAS_BACKEND=jax python benchmarks/multiprocess.py [--rounds 15] [--steps 20]
      python benchmarks/multiprocess.py --smoke      (tiny model: checks the script)

On a 2-core machine two processes share the two cores that one process had
to itself, so "2 processes" here measures the overhead of splitting a step
across processes (the collectives over gloo, two programs contending for
the cores), not a speed-up: that needs a core, host or accelerator per
process. The script says so in its output.

Setup: three worker processes of this script are started at once and kept
alive: one alone, and two joined as one JAX job by `KERAS_DISTRIBUTION_*`
(`keras_attn.training.distribute.initialize_processes`, which calls
`keras.distribution.initialize`) on a free port, as `keras-attn train
--distribute` joins them. Each compiles, then waits for the parent's "round"
lines on its stdin (a waiting process takes no CPU). The step is the
recipe's ViT (4 blocks, width 64, 16 x 16 images, 10 classes; dropout 0)
as a `jax.shard_map` over a one-axis mesh of the job's devices: the
gradient of the mean cross-entropy on the process's rows of the global
batch (half each with two processes), `lax.pmean` over the mesh (the
all-reduce of a gradient-sized pytree), then an SGD update. The
two-process job also times the same step without the `pmean` (each process
updates with its own half's gradient), and the `pmean` alone of a
gradient-sized pytree (one array per weight, as in the step) and of the
same values as one buffer.

Rounds: the parent alternates which job goes first (the one-process job
first in even rounds); within a round each job runs every function
`--steps` times (its order rotated by round) and reports seconds per step
(process 0's clock; the collectives keep the processes in step). A ratio is
the median of the rounds' ratios with its 95% interval (`_stats.py`). Every
worker is ended in a `finally`; a worker that does not answer within
`--timeout` seconds fails the run.
"""

import argparse
import datetime
import json
import os
import platform
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _stats import median_interval  # noqa: E402
from _stats import paired_ratio  # noqa: E402

# vit_tiny_digits's model (models/vit/vit_tiny_digits.json) and batch.
RECIPE = dict(image_size=16, patch_size=4, num_channels=1, hidden_dim=64,
              num_layers=4, num_heads=4, intermediate_dim=128)
SMOKE = dict(image_size=8, patch_size=4, num_channels=1, hidden_dim=16,
             num_layers=1, num_heads=2, intermediate_dim=32)
NUM_CLASSES = 10
NOTE = ("Two processes on a 2-core machine share the cores one process had to itself: "
        "this measures the cost of splitting a step across processes (gloo collectives, "
        "contention), not a speed-up; it is not a speed claim.")


# --- worker -------------------------------------------------------------------


def worker(args):
    import jax
    import keras
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from keras_attn.models.vit import build_vit
    from keras_attn.training.distribute import initialize_processes

    process, processes = initialize_processes()
    sizes = SMOKE if args.smoke else RECIPE
    keras.utils.set_random_seed(0)
    model = build_vit("vit_tiny_16", num_classes=NUM_CLASSES, dropout=0.0, **sizes)
    trainable = [v.value for v in model.trainable_variables]
    frozen = [v.value for v in model.non_trainable_variables]
    mesh = jax.make_mesh((jax.device_count(),), ("batch",))

    def global_array(local, spec):
        return jax.make_array_from_process_local_data(NamedSharding(mesh, spec), local)

    rng = np.random.default_rng(process)
    rows = args.batch // processes
    side = sizes["image_size"]
    images = global_array(rng.uniform(0, 1, (rows, side, side, 1)).astype("float32"),
                          P("batch"))
    labels = global_array(rng.integers(0, NUM_CLASSES, rows).astype("int32"), P("batch"))
    params = [global_array(np.asarray(p), P()) for p in trainable]

    def loss_fn(params, x, y):
        logits, _ = model.stateless_call(params, frozen, x, training=False)
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(
            y, logits, from_logits=True))

    def step_fn(allreduce):
        def step(params, x, y):
            grads = jax.grad(loss_fn)(params, x, y)
            if allreduce:
                grads = jax.lax.pmean(grads, "batch")
            return [p - 0.01 * g for p, g in zip(params, grads)]

        # check_vma off: without the pmean each process's "replicated"
        # result is its own (only timed, never read).
        return jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P("batch"), P("batch")),
                                     out_specs=P(), check_vma=False))

    allreduce_alone = jax.jit(jax.shard_map(
        lambda tree: jax.lax.pmean(tree, "batch"), mesh=mesh, in_specs=P(), out_specs=P(),
        check_vma=False))
    flat = global_array(np.concatenate([np.ravel(p) for p in trainable]), P())
    steps = {"step": step_fn(True), "step_no_allreduce": step_fn(False)}
    calls = {"step": lambda: steps["step"](params, images, labels),
             "step_no_allreduce": lambda: steps["step_no_allreduce"](params, images, labels),
             "allreduce_alone": lambda: allreduce_alone(params),
             "allreduce_one_buffer": lambda: allreduce_alone(flat)}
    names = list(calls) if processes > 1 else ["step"]
    for name in names:  # compile and warm up
        for _ in range(2):
            jax.block_until_ready(calls[name]())
    parameters = sum(int(np.prod(p.shape)) for p in trainable)
    print(json.dumps({"ready": True, "process": process, "processes": processes,
                      "leaves": len(trainable),
                      "devices": jax.device_count(), "parameters": parameters,
                      "versions": {"jax": jax.__version__, "keras": keras.__version__}}),
          flush=True)
    for line in sys.stdin:
        command = line.split()
        if not command or command[0] != "round":
            break
        r, count = int(command[1]), int(command[2])
        shift = r % len(names)
        seconds = {}
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            for _ in range(count):
                jax.block_until_ready(calls[name]())
            seconds[name] = (time.perf_counter() - start) / count
        print(json.dumps({"round": r, "process": process, "seconds": seconds}), flush=True)


# --- parent -------------------------------------------------------------------


def _free_port():
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


# What would make a worker join another job (keras_attn.training.cluster).
SCHEDULER_VARIABLES = ("TF_CONFIG", "SLURM_PROCID", "RANK", "JOBSET_NAME")


def _worker_env(**extra):
    """This environment without any job description, on JAX, plus `extra`;
    its XLA flags kept, except a host device count (each process is one
    device)."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("KERAS_DISTRIBUTION_") and name not in SCHEDULER_VARIABLES}
    path = os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])
    flags = " ".join(flag for flag in os.environ.get("XLA_FLAGS", "").split()
                     if not flag.startswith("--xla_force_host_platform_device_count"))
    return dict(env, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3", XLA_FLAGS=flags,
                PYTHONPATH=path, **extra)


class Worker:
    """A worker process; its stdout's JSON lines read by a thread into a queue."""

    def __init__(self, argv, env, log_path):
        self.log = open(log_path, "w+")
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.log, env=env, text=True, cwd=ROOT)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def send(self, text):
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()

    def answer(self, timeout):
        try:
            message = self.lines.get(timeout=timeout)
        except queue.Empty:
            message = None
        if message is None:
            self.log.seek(0)
            raise RuntimeError(f"worker {self.process.args[-1]} gave no answer in {timeout} s "
                               f"(exit code {self.process.poll()}):\n{self.log.read()[-3000:]}")
        return message

    def end(self):
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def _interval(values):
    median, low, high = median_interval(values)
    return {"median": median, "low": low, "high": high}


def _ratio(ours, peer):
    median, low, high, verdict = paired_ratio(ours, peer)
    return {"median": median, "low": low, "high": high, "verdict": verdict}


def measure(args, tmp):
    base = [sys.executable, os.path.abspath(__file__), "--worker", "--batch", str(args.batch)]
    base += ["--smoke"] if args.smoke else []
    port = _free_port()
    workers = []
    try:
        workers.append(Worker(base + ["single"], _worker_env(), os.path.join(tmp, "one.log")))
        for rank in range(2):
            workers.append(Worker(base + [f"rank{rank}"], _worker_env(
                KERAS_DISTRIBUTION_JOB_ADDRESSES=f"localhost:{port}",
                KERAS_DISTRIBUTION_NUM_PROCESSES="2",
                KERAS_DISTRIBUTION_PROCESS_ID=str(rank)), os.path.join(tmp, f"two{rank}.log")))
        ready = [w.answer(args.timeout) for w in workers]
        if [r["processes"] for r in ready] != [1, 2, 2]:
            raise RuntimeError(f"the workers did not join as 1 + 2 processes: {ready}")
        one, two = [workers[0]], workers[1:]
        times = {"one_process": [], "step": [], "step_no_allreduce": [], "allreduce_alone": [],
                 "allreduce_one_buffer": []}
        for r in range(args.rounds):
            for job in (one, two) if r % 2 == 0 else (two, one):
                for w in job:
                    w.send(f"round {r} {args.steps}")
                answers = [w.answer(args.timeout) for w in job]
                seconds = answers[0]["seconds"]  # process 0's clock
                if job is one:
                    times["one_process"].append(seconds["step"])
                else:
                    for name, value in seconds.items():
                        times[name].append(value)
        return ready[1], times
    finally:
        for w in workers:
            w.end()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="tiny ViT, batch 8, 1 round of 2 steps (checks the script)")
    parser.add_argument("--batch", type=int, default=64, help="global batch (the recipe's)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=20, help="steps per job per round")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds a worker may take to answer (compile included)")
    parser.add_argument("--output", default=os.path.join(HERE, "results", "multiprocess.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("name", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke and not args.worker:
        args.batch, args.rounds, args.steps = 8, 1, 2
    if args.worker:
        return worker(args)
    if args.batch % 2:
        raise ValueError(f"Invalid value for argument `--batch`: it must split into two "
                         f"processes' halves. Received: --batch={args.batch}")
    print(NOTE, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        ready, times = measure(args, tmp)
    steps = times["step"]
    results = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()} CPU cores",
        "note": NOTE,
        "versions": dict(ready["versions"], python=platform.python_version()),
        "model": {"recipe": "vit_tiny_digits", "smoke": args.smoke,
                  "sizes": SMOKE if args.smoke else RECIPE, "num_classes": NUM_CLASSES,
                  "parameters": ready["parameters"], "gradient_leaves": ready["leaves"]},
        "gradient_bytes": 4 * ready["parameters"],
        "global_batch": args.batch, "rounds": args.rounds, "steps_per_round": args.steps,
        "median_step_seconds": {name: _interval(values)["median"]
                                for name, values in times.items()},
        "ratios": {
            "two_vs_one_process": _ratio(steps, times["one_process"]),
            "with_vs_without_allreduce": _ratio(steps, times["step_no_allreduce"]),
        },
        "allreduce_share": {
            "allreduce_alone_over_step": _interval(
                [a / s for a, s in zip(times["allreduce_alone"], steps)]),
            "allreduce_one_buffer_over_step": _interval(
                [a / s for a, s in zip(times["allreduce_one_buffer"], steps)]),
            "step_minus_no_allreduce_over_step": _interval(
                [(s - n) / s for s, n in zip(steps, times["step_no_allreduce"])]),
        },
        "seconds": times,
        "load_average": list(os.getloadavg()),
        "command": " ".join(["python"] + sys.argv),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(results, f, indent=1)
    print(table(results))


def table(results):
    """The markdown table of a results dict."""
    ms = {name: 1e3 * s for name, s in results["median_step_seconds"].items()}
    lines = [f"ViT ({results['model']['parameters']:,} parameters), global batch "
             f"{results['global_batch']}, {results['rounds']} rounds x "
             f"{results['steps_per_round']} steps, {results['machine']}", "",
             "| measured | median | 95% interval |", "|---|---|---|",
             f"| step, 1 process (ms) | {ms['one_process']:.2f} | |",
             f"| step, 2 processes (ms) | {ms['step']:.2f} | |",
             f"| step, 2 processes, no all-reduce (ms) | {ms['step_no_allreduce']:.2f} | |",
             f"| all-reduce alone, {results['model']['gradient_leaves']} arrays (ms) | "
             f"{ms['allreduce_alone']:.2f} | |",
             f"| all-reduce alone, one buffer (ms) | {ms['allreduce_one_buffer']:.2f} | |"]
    for name, r in results["ratios"].items():
        lines.append(f"| {name} | {r['median']:.2f} | {r['low']:.2f}-{r['high']:.2f} "
                     f"({r['verdict']}) |")
    for name, r in results["allreduce_share"].items():
        lines.append(f"| {name} | {r['median']:.2f} | {r['low']:.2f}-{r['high']:.2f} |")
    return "\n".join(lines + ["", results["note"]])


if __name__ == "__main__":
    main()
