"""`process_environment`: the table of docs/distributed.md, variable by
variable (pure Python: no process is started, nothing connects)."""

import pytest

from keras_attn.training.cluster import ProcessEnvironment
from keras_attn.training.cluster import process_environment

pytestmark = pytest.mark.backend_independent

SLURM = {"SLURM_JOB_ID": "123457", "SLURM_NTASKS": "8", "SLURM_PROCID": "5",
         "SLURM_STEP_NODELIST": "node[003-006,9],gpu1", "SLURM_JOB_NODELIST": "other01"}
LAUNCHER = {"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
JOBSET = {"JOBSET_NAME": "train", "REPLICATED_JOB_NAME": "workers", "JOB_INDEX": "1",
          "JOB_GLOBAL_INDEX": "1", "GLOBAL_REPLICAS": "2", "REPLICATED_JOB_REPLICAS": "2",
          "JOB_COMPLETION_INDEX": "2", "KERAS_DISTRIBUTION_NUM_PROCESSES": "8"}


def test_nothing_set_is_one_process():
    assert process_environment({}) is None
    assert process_environment({"PATH": "/bin", "MASTER_ADDR": "10.0.0.1"}) is None


def test_keras_variables():
    found = process_environment({"KERAS_DISTRIBUTION_JOB_ADDRESSES": "10.0.0.1:1234,10.0.0.2:1234",
                                 "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
                                 "KERAS_DISTRIBUTION_PROCESS_ID": "1"})
    assert found == ProcessEnvironment("10.0.0.1:1234,10.0.0.2:1234", 2, 1, "KERAS_DISTRIBUTION_*")


def test_slurm():
    # The first host of the step's node list; JAX's own port rule:
    # 61440 + 123457 % 4096.
    assert process_environment(SLURM) == ProcessEnvironment("node003:62017", 8, 5, "SLURM")
    job_nodes = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_NODELIST"}
    assert process_environment(job_nodes).coordinator == "other01:62017"
    for nodelist, host in (("gpu7", "gpu7"), ("a[10-12]", "a10"), ("b1,b2", "b1"),
                           ("c[5,7-9],d1", "c5")):
        environ = dict(SLURM, SLURM_STEP_NODELIST=nodelist)
        assert process_environment(environ).coordinator == f"{host}:62017"


def test_launcher_and_torchrun():
    assert process_environment(LAUNCHER) == ProcessEnvironment(
        "10.0.0.1:29500", 4, 3, "launcher (RANK, WORLD_SIZE)")
    # torchrun's agent serves its own store on MASTER_PORT: the next port.
    found = process_environment(dict(LAUNCHER, TORCHELASTIC_RUN_ID="none"))
    assert found.coordinator == "10.0.0.1:29501"


def test_jobset():
    # Job 1 of 2, pod 2 of that Job's 4 pods: process 1 x 4 + 2.
    found = process_environment(JOBSET)
    assert found == ProcessEnvironment(
        "train-workers-0-0.train:8476", 8, 6,
        "Kubernetes JobSet and KERAS_DISTRIBUTION_NUM_PROCESSES")
    one_job = {k: v for k, v in JOBSET.items()
               if k not in ("JOB_INDEX", "JOB_GLOBAL_INDEX", "GLOBAL_REPLICAS",
                            "REPLICATED_JOB_REPLICAS")}
    assert process_environment(dict(one_job, KERAS_DISTRIBUTION_NUM_PROCESSES="4")).process_id == 2


def test_keras_variables_win_value_by_value():
    found = process_environment(dict(SLURM, KERAS_DISTRIBUTION_JOB_ADDRESSES="head:1234"))
    assert (found.coordinator, found.num_processes, found.process_id) == ("head:1234", 8, 5)
    assert found.source == "SLURM and KERAS_DISTRIBUTION_JOB_ADDRESSES"
    found = process_environment(dict(LAUNCHER, KERAS_DISTRIBUTION_PROCESS_ID="0"))
    assert found.process_id == 0 and found.coordinator == "10.0.0.1:29500"


def test_a_scheduler_job_of_one_task_is_one_process():
    assert process_environment(dict(SLURM, SLURM_NTASKS="1", SLURM_PROCID="0")) is None
    assert process_environment(dict(LAUNCHER, WORLD_SIZE="1", RANK="0")) is None


@pytest.mark.parametrize("environ, message", [
    (dict(SLURM, SLURM_PROCID="8"),
     "below the number of processes .8: ids 0 to 7.. Received: SLURM_PROCID=8, SLURM_NTASKS=8"),
    (dict(LAUNCHER, RANK="4"), "Received: RANK=4, WORLD_SIZE=4"),
    (dict(LAUNCHER, KERAS_DISTRIBUTION_PROCESS_ID="9"),
     "Received: KERAS_DISTRIBUTION_PROCESS_ID=9, WORLD_SIZE=4"),
    (dict(JOBSET, JOB_GLOBAL_INDEX="2"),
     "Received: JOB_GLOBAL_INDEX x 4 \\+ JOB_COMPLETION_INDEX=10, "
     "KERAS_DISTRIBUTION_NUM_PROCESSES=8"),
    (dict(JOBSET, JOB_COMPLETION_INDEX="4"),
     "below the 4 pods of each Job .8 processes in 2 Jobs.. Received: JOB_COMPLETION_INDEX=4"),
    (dict(LAUNCHER, WORLD_SIZE="two"), "`WORLD_SIZE`: it must be a positive integer. "
     "Received: WORLD_SIZE='two'"),
    (dict(LAUNCHER, WORLD_SIZE="0"), "Received: WORLD_SIZE='0'"),
    (dict(LAUNCHER, RANK="-1"), "non-negative integer. Received: RANK='-1'"),
    ({k: v for k, v in LAUNCHER.items() if k != "MASTER_ADDR"},
     "No coordinator address .* set KERAS_DISTRIBUTION_JOB_ADDRESSES .or MASTER_ADDR and "
     "MASTER_PORT.. Received: KERAS_DISTRIBUTION_JOB_ADDRESSES unset"),
    ({k: v for k, v in SLURM.items() if "NODELIST" not in k}, "or SLURM_STEP_NODELIST"),
    ({"KERAS_DISTRIBUTION_NUM_PROCESSES": "2", "KERAS_DISTRIBUTION_PROCESS_ID": "0"},
     "No coordinator address"),
    ({k: v for k, v in JOBSET.items() if k != "KERAS_DISTRIBUTION_NUM_PROCESSES"},
     "number of processes is not set: Kubernetes JobSet does not give it; set "
     "KERAS_DISTRIBUTION_NUM_PROCESSES"),
    (dict(JOBSET, KERAS_DISTRIBUTION_NUM_PROCESSES="7"),
     "2 Jobs cannot hold 7 processes.*Received: GLOBAL_REPLICAS=2"),
    ({"KERAS_DISTRIBUTION_JOB_ADDRESSES": "head", "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
      "KERAS_DISTRIBUTION_PROCESS_ID": "0"},
     "must be host:port .* Received: KERAS_DISTRIBUTION_JOB_ADDRESSES='head'"),
    ({"KERAS_DISTRIBUTION_JOB_ADDRESSES": "h:1"}, "number of processes is not set"),
])
def test_inconsistent_values_are_refused_by_name(environ, message):
    with pytest.raises(ValueError, match=message):
        process_environment(environ)


@pytest.mark.parametrize("environ, message", [
    # A port is 16 bits: 70000 would be refused only when something connects.
    (dict(LAUNCHER, MASTER_PORT="70000"), "port .* 1 to 65535. Received: MASTER_PORT=70000"),
    (dict(LAUNCHER, MASTER_PORT="65535", TORCHELASTIC_RUN_ID="none"),
     "Received: MASTER_PORT=65535 \\(\\+ 1 under torchrun: 65536\\)"),
    ({"KERAS_DISTRIBUTION_JOB_ADDRESSES": "head:99999", "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
      "KERAS_DISTRIBUTION_PROCESS_ID": "0"},
     "port .* Received: KERAS_DISTRIBUTION_JOB_ADDRESSES='head:99999'"),
    # A list of addresses names every process's: 2 cannot serve 3 processes.
    ({"KERAS_DISTRIBUTION_JOB_ADDRESSES": "a:1,b:1", "KERAS_DISTRIBUTION_NUM_PROCESSES": "3",
      "KERAS_DISTRIBUTION_PROCESS_ID": "0"},
     "one address per process .3.* Received: KERAS_DISTRIBUTION_JOB_ADDRESSES='a:1,b:1' "
     "\\(2 addresses\\), KERAS_DISTRIBUTION_NUM_PROCESSES=3"),
    # A process id past a job of one task is not process 0 of one process.
    (dict(LAUNCHER, RANK="3", WORLD_SIZE="1"), "Received: RANK=3, WORLD_SIZE=1"),
    (dict(SLURM, SLURM_PROCID="1", SLURM_NTASKS="1"), "Received: SLURM_PROCID=1, SLURM_NTASKS=1"),
    # A launcher sets both: one of them alone is a broken launch, not one process.
    ({"RANK": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
     "RANK is set without WORLD_SIZE.* Received: RANK='2', WORLD_SIZE unset"),
    ({"WORLD_SIZE": "4"}, "WORLD_SIZE is set without RANK.* Received: WORLD_SIZE='4', RANK unset"),
    ({"SLURM_PROCID": "3"},
     "SLURM_PROCID is set without SLURM_NTASKS.* Received: SLURM_PROCID='3', SLURM_NTASKS unset"),
])
def test_impossible_jobs_are_refused_not_run_as_one_process(environ, message):
    with pytest.raises(ValueError, match=message):
        process_environment(environ)


def test_one_task_alone_is_still_one_process():
    # sbatch sets SLURM_PROCID=0 without SLURM_NTASKS (no -n): one process.
    assert process_environment({"SLURM_PROCID": "0"}) is None
    assert process_environment({"WORLD_SIZE": "1"}) is None
    assert process_environment(dict(LAUNCHER, MASTER_PORT="65535")).coordinator == "10.0.0.1:65535"
