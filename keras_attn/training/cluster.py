"""Who this process is in a multi-process job: from `KERAS_DISTRIBUTION_*`,
or from what a scheduler or launcher sets (SLURM, a `torchrun`-style
launcher, a Kubernetes JobSet).

```python
from keras_attn.training.cluster import process_environment
found = process_environment()      # None: one process, nothing to join
found.coordinator, found.num_processes, found.process_id, found.source
```

Each of the three values `keras.distribution.initialize` takes is read from
its `KERAS_DISTRIBUTION_*` variable when that is set, else from the
scheduler's (the first of the table whose variables are present):

| value | KERAS_DISTRIBUTION_* | SLURM (`srun`) | launcher (`torchrun`, ...) | Kubernetes JobSet |
|---|---|---|---|---|
| process id | `_PROCESS_ID` | `SLURM_PROCID` | `RANK` | `JOB_GLOBAL_INDEX` x pods per Job + `JOB_COMPLETION_INDEX` (`JOB_INDEX` without `JOB_GLOBAL_INDEX`) |
| processes | `_NUM_PROCESSES` | `SLURM_NTASKS` | `WORLD_SIZE` | `KERAS_DISTRIBUTION_NUM_PROCESSES` (JobSet does not set it) |
| coordinator | `_JOB_ADDRESSES` | first host of `SLURM_STEP_NODELIST` (else `SLURM_JOB_NODELIST`, `SLURM_NODELIST`), port `61440 + SLURM_JOB_ID % 4096` (JAX's own choice) | `MASTER_ADDR`:`MASTER_PORT` (`MASTER_PORT + 1` under `torchrun`, whose agent holds `MASTER_PORT`: `TORCHELASTIC_RUN_ID` set) | `<JOBSET_NAME>-<REPLICATED_JOB_NAME>-0-0.<JOBSET_NAME>:8476` (pod 0 of Job 0 on the JobSet's headless service) |

A scheduler's job of one process (`SLURM_NTASKS=1`, `WORLD_SIZE=1`) is not a
multi-process job: None. Values that cannot be one job (a process id not
below the number of processes, a number that is not a positive integer, no
coordinator) are refused by name before anything connects.
"""

import collections
import os
import re

KERAS_ADDRESSES = "KERAS_DISTRIBUTION_JOB_ADDRESSES"
KERAS_PROCESSES = "KERAS_DISTRIBUTION_NUM_PROCESSES"
KERAS_PROCESS_ID = "KERAS_DISTRIBUTION_PROCESS_ID"
# The coordinator's port where the scheduler names no port (a JobSet): the
# one JAX's Cloud TPU detection uses.
DEFAULT_PORT = 8476

ProcessEnvironment = collections.namedtuple(
    "ProcessEnvironment", ["coordinator", "num_processes", "process_id", "source"]
)
ProcessEnvironment.__doc__ = """`coordinator`: what `keras.distribution.initialize`
takes as `job_addresses` (`host:port`, or a comma-separated list of every
process's address); `num_processes`, `process_id`: ints; `source`: where the
values came from, e.g. `"SLURM"`, `"KERAS_DISTRIBUTION_*"`."""


def env_integer(environ, name, minimum):
    """`environ[name]` as an int >= minimum; a ValueError naming it."""
    text = environ[name]
    if not re.fullmatch(r"\s*[0-9]+\s*", text) or int(text) < minimum:
        kind = "a positive integer" if minimum else "a non-negative integer"
        raise ValueError(f"Invalid value for the environment variable `{name}`: it must be "
                         f"{kind}. Received: {name}={text!r}")
    return int(text)


def _first_host(nodelist):
    """The first host of a SLURM host list: `node[001-004,9],gpu7` -> `node001`."""
    match = re.match(r"([^,\[]*)(?:\[([^\],-]*))?", nodelist.strip())
    return match.group(1) + (match.group(2) or "")


def _slurm(environ):
    found = {"processes": ("SLURM_NTASKS", None), "process_id": ("SLURM_PROCID", None)}
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if environ.get(name, "").strip():
            host = _first_host(environ[name])
            if "SLURM_JOB_ID" in environ and host:
                port = 61440 + env_integer(environ, "SLURM_JOB_ID", 0) % 4096
                found["coordinator"] = (name, f"{host}:{port}")
            break
    return found


def _launcher(environ):
    found = {"processes": ("WORLD_SIZE", None), "process_id": ("RANK", None)}
    if environ.get("MASTER_ADDR", "").strip() and "MASTER_PORT" in environ:
        port = env_integer(environ, "MASTER_PORT", 1)
        # torchrun's agent serves its store on MASTER_PORT itself.
        port += 1 if "TORCHELASTIC_RUN_ID" in environ else 0
        found["coordinator"] = ("MASTER_ADDR", f"{environ['MASTER_ADDR'].strip()}:{port}")
    return found


def _jobset(environ):
    found = {"process_id": ("JOB_COMPLETION_INDEX", None)}
    name, job = environ.get("JOBSET_NAME", ""), environ.get("REPLICATED_JOB_NAME", "")
    if name and job:
        found["coordinator"] = ("JOBSET_NAME", f"{name}-{job}-0-0.{name}:{DEFAULT_PORT}")
    return found


# (source, the variables whose presence selects it, their reader)
SCHEDULERS = (
    ("SLURM", ("SLURM_PROCID", "SLURM_NTASKS"), _slurm),
    ("launcher (RANK, WORLD_SIZE)", ("RANK", "WORLD_SIZE"), _launcher),
    ("Kubernetes JobSet", ("JOBSET_NAME", "JOB_COMPLETION_INDEX"), _jobset),
)


def _jobset_process_id(environ, processes):
    """JOB_GLOBAL_INDEX (or JOB_INDEX) x pods per Job + JOB_COMPLETION_INDEX."""
    pod = env_integer(environ, "JOB_COMPLETION_INDEX", 0)
    index_name = "JOB_GLOBAL_INDEX" if "JOB_GLOBAL_INDEX" in environ else "JOB_INDEX"
    if index_name not in environ:
        return pod, "JOB_COMPLETION_INDEX"
    jobs_name = "GLOBAL_REPLICAS" if index_name == "JOB_GLOBAL_INDEX" else "REPLICATED_JOB_REPLICAS"
    jobs = env_integer(environ, jobs_name, 1) if jobs_name in environ else 1
    if processes % jobs:
        raise ValueError(
            f"A JobSet of {jobs} Jobs cannot hold {processes} processes in equal Jobs. "
            f"Received: {jobs_name}={jobs}, {KERAS_PROCESSES}={processes}")
    pods = processes // jobs
    if pod >= pods:
        raise ValueError(
            f"The pod index must be below the {pods} pods of each Job ({processes} processes "
            f"in {jobs} Jobs). Received: JOB_COMPLETION_INDEX={pod}, {jobs_name}={jobs}, "
            f"{KERAS_PROCESSES}={processes}")
    return env_integer(environ, index_name, 0) * pods + pod, (
        f"{index_name} x {pods} + JOB_COMPLETION_INDEX")


def process_environment(environ=None):
    """This process's place in a multi-process job, or None for one process.

    Args:
        environ: the environment to read (default `os.environ`).

    Returns:
        A `ProcessEnvironment(coordinator, num_processes, process_id,
        source)`, or None when neither `KERAS_DISTRIBUTION_*` nor a
        scheduler's variables are set, or a scheduler's job has one process.

    Raises:
        ValueError: naming the variables, when a number is not an integer
            (or not positive), the process id is not below the number of
            processes, or no coordinator address can be found.

    Example:

    >>> process_environment({"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "4",
    ...                      "SLURM_PROCID": "1", "SLURM_STEP_NODELIST": "gpu[07-10]"})
    ProcessEnvironment(coordinator='gpu07:61586', num_processes=4, process_id=1, source='SLURM')
    """
    environ = os.environ if environ is None else environ
    source, found = "KERAS_DISTRIBUTION_*", {}
    for name, present, reader in SCHEDULERS:
        if all(variable in environ for variable in present):
            source, found = name, reader(environ)
            break
    keras_set = [name for name in (KERAS_ADDRESSES, KERAS_PROCESSES, KERAS_PROCESS_ID)
                 if name in environ]
    if not found and not keras_set:
        return None
    if keras_set and found:
        source = f"{source} and {', '.join(keras_set)}"

    if KERAS_PROCESSES in environ:
        processes_name, processes = KERAS_PROCESSES, env_integer(environ, KERAS_PROCESSES, 1)
    elif "processes" in found:
        processes_name = found["processes"][0]
        processes = env_integer(environ, processes_name, 1)
        if processes == 1 and not keras_set:
            return None  # a scheduler's job of one task
    else:
        raise ValueError(
            f"The number of processes is not set: {source} does not give it; set "
            f"{KERAS_PROCESSES} to the job's total. Received: {KERAS_PROCESSES} unset")

    if KERAS_PROCESS_ID in environ:
        id_names, process_id = KERAS_PROCESS_ID, env_integer(environ, KERAS_PROCESS_ID, 0)
    elif source.startswith("Kubernetes JobSet"):
        process_id, id_names = _jobset_process_id(environ, processes)
    elif "process_id" in found:
        id_names = found["process_id"][0]
        process_id = env_integer(environ, id_names, 0)
    else:
        raise ValueError(
            f"This process's id is not set: {source} does not give it; set "
            f"{KERAS_PROCESS_ID}. Received: {KERAS_PROCESS_ID} unset")
    if process_id >= processes:
        raise ValueError(
            f"The process id must be below the number of processes ({processes}: "
            f"ids 0 to {processes - 1}). Received: {id_names}={process_id}, "
            f"{processes_name}={processes}")

    if KERAS_ADDRESSES in environ and environ[KERAS_ADDRESSES].strip():
        coordinator = environ[KERAS_ADDRESSES].strip()
    elif "coordinator" in found:
        coordinator = found["coordinator"][1]
    else:
        wanted = {"SLURM": "SLURM_STEP_NODELIST and SLURM_JOB_ID",
                  "launcher (RANK, WORLD_SIZE)": "MASTER_ADDR and MASTER_PORT",
                  "Kubernetes JobSet": "JOBSET_NAME and REPLICATED_JOB_NAME"}
        needed = next((v for k, v in wanted.items() if source.startswith(k)), None)
        raise ValueError(
            "No coordinator address (process 0's host:port) for a job of "
            f"{processes} processes: set {KERAS_ADDRESSES}"
            + (f" (or {needed})" if needed else "")
            + f". Received: {KERAS_ADDRESSES} unset, source {source}")
    address = r"(?:\[[0-9a-fA-F:.]+\]|[^\s,:\[\]]+):[0-9]+"
    if not re.fullmatch(f"{address}(?:,{address})*", coordinator):
        raise ValueError(
            "The coordinator address must be host:port (or a comma-separated list of "
            f"every process's host:port, process 0's first). Received: "
            f"{KERAS_ADDRESSES if KERAS_ADDRESSES in environ else 'coordinator'}="
            f"{coordinator!r}")
    return ProcessEnvironment(coordinator, processes, process_id, source)
