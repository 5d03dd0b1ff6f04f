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
below the number of processes, one of a job of one task included, a number
that is not a positive integer, a process id without the number of processes
or the reverse (`RANK` without `WORLD_SIZE`), a port outside 1 to 65535, a
list of addresses that is not one per process, no coordinator) are refused
by name before anything connects.
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


# A TCP port is 16 bits; 0 is no port.
MAX_PORT = 65535


def env_integer(environ, name, minimum):
    """`environ[name]` as an int >= minimum; a ValueError naming it."""
    text = environ[name]
    if not re.fullmatch(r"\s*[0-9]+\s*", text) or int(text) < minimum:
        kind = "a positive integer" if minimum else "a non-negative integer"
        raise ValueError(f"Invalid value for the environment variable `{name}`: it must be "
                         f"{kind}. Received: {name}={text!r}")
    return int(text)


def _check_port(port, name, received):
    """A ValueError naming `name` (`received` its text) when `port` is not a
    TCP port: one above 65535 would fail only when something connects."""
    if not 1 <= port <= MAX_PORT:
        raise ValueError(f"Invalid value for the environment variable `{name}`: a "
                         f"coordinator port must be 1 to {MAX_PORT}. Received: {received}")


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
        _check_port(port, "MASTER_PORT", f"MASTER_PORT={port}")
        # torchrun's agent serves its store on MASTER_PORT itself.
        if "TORCHELASTIC_RUN_ID" in environ:
            port += 1
            _check_port(port, "MASTER_PORT",
                        f"MASTER_PORT={port - 1} (+ 1 under torchrun: {port})")
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


# (process id, number of processes) of a scheduler: the one without the
# other is a broken launch, not a job of one process, except SLURM_PROCID=0
# alone (an `sbatch` script without `-n`) and a count of 1 alone.
PAIRS = (("SLURM_PROCID", "SLURM_NTASKS"), ("RANK", "WORLD_SIZE"))


def _check_pairs(environ):
    for id_name, count_name in PAIRS:
        if id_name in environ and count_name not in environ:
            if id_name == "SLURM_PROCID" and env_integer(environ, id_name, 0) == 0:
                continue
            raise ValueError(
                f"{id_name} is set without {count_name}: a process id needs the number "
                f"of processes (set {count_name} or {KERAS_PROCESSES}). Received: "
                f"{id_name}={environ[id_name]!r}, {count_name} unset")
        if count_name in environ and id_name not in environ and id_name != "SLURM_PROCID":
            if env_integer(environ, count_name, 1) > 1:
                raise ValueError(
                    f"{count_name} is set without {id_name}: a job of several processes "
                    f"needs each one's id (set {id_name} or {KERAS_PROCESS_ID}). Received: "
                    f"{count_name}={environ[count_name]!r}, {id_name} unset")


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
    keras_set = [name for name in (KERAS_ADDRESSES, KERAS_PROCESSES, KERAS_PROCESS_ID)
                 if name in environ]
    if KERAS_PROCESSES not in environ or KERAS_PROCESS_ID not in environ:
        _check_pairs(environ)
    source, found = "KERAS_DISTRIBUTION_*", {}
    for name, present, reader in SCHEDULERS:
        if all(variable in environ for variable in present):
            source, found = name, reader(environ)
            break
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
            # A scheduler's job of one task, whose process id must then be 0.
            id_name = found.get("process_id", (None,))[0]
            if id_name in environ and env_integer(environ, id_name, 0) != 0:
                raise ValueError(
                    "The process id must be below the number of processes (1: id 0). "
                    f"Received: {id_name}={env_integer(environ, id_name, 0)}, "
                    f"{processes_name}=1")
            return None
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
    name = KERAS_ADDRESSES if KERAS_ADDRESSES in environ else "coordinator"
    addresses = coordinator.split(",")
    for entry in addresses:
        _check_port(int(entry.rsplit(":", 1)[1]), name, f"{name}={coordinator!r}")
    if len(addresses) not in (1, processes):
        raise ValueError(
            f"Invalid value for the environment variable `{name}`: process 0's host:port, "
            f"or one address per process ({processes}), process 0's first. Received: "
            f"{name}={coordinator!r} ({len(addresses)} addresses), "
            f"{processes_name}={processes}")
    return ProcessEnvironment(coordinator, processes, process_id, source)
