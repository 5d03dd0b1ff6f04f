"""Prepared data read by rows (issue 45, item 4): process k of N of a
data-parallel job reads and checks only its rows of every training and
validation batch, the rows one process would feed as that process's share,
so the global batch and the examples of each step stay those of one
process."""

import json
import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest

from _tiny import tiny_overrides
from keras_attn.zoo import prepared as prepared_module
from keras_attn.zoo import runs
from keras_attn.zoo.recipe import load_recipe
from keras_attn.zoo.tasks import make_task

# Two epochs of 4 steps; conformer's `y` varies in width from batch to batch.
SETTINGS = {
    "vit_tiny_digits": tiny_overrides("vit_tiny_digits", run=False)
    + ["training.epochs=2", "training.steps_per_epoch=4", "training.batch_size=16"],
    "conformer_tiny_digits": tiny_overrides("conformer_tiny_digits", run=False)
    + ["training.epochs=2", "training.steps_per_epoch=4"],
}


def _recipe(name, extra=()):
    return load_recipe(runs.locate_recipe(name), SETTINGS[name] + list(extra))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The recipes' prepared directories, by name (made on demand), in
    blocks of 256 bytes: vit_tiny_digits's rows (35 bytes) in blocks of 8,
    2 to each batch of 16."""
    made = {}

    def get(name):
        if name not in made:
            made[name] = str(tmp_path_factory.mktemp("prepared") / name)
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(prepared_module, "BLOCK_BYTES", 256)
                prepared_module.prepare(name, SETTINGS[name], output=made[name], verbose=False)
        return made[name]

    return get


def _prepared_task(name, data):
    """The task of `name` as a run from the prepared `data` has it."""
    task = make_task(_recipe(name))
    task.use_prepared(data.state)
    return task


def _flat(batch):
    return [np.asarray(leaf) for leaf in keras.tree.flatten(batch)]


def _passes(data):
    epochs = data.manifest["epochs"]
    return [("train", epoch) for epoch in range(epochs)] + [("validation", None)]


def _assert_shards_are_the_batch(one, shards, replicas, task=None):
    """Each batch of the one-process read, evened for `replicas` (as
    `task` finishes it, its fillers made weightless, when given), is the
    shards' batches end to end, bit for bit."""
    count = len(shards)
    finish, weightless = (task.finish_prepared, task.weightless_rows) if task else (None, None)
    for split, epoch in _passes(one):
        whole = one.batches(split, epoch, finish, replicas, weightless)
        parts = [shard.batches(split, epoch, finish, replicas, weightless) for shard in shards]
        assert all(len(part) == len(whole) for part in parts)
        for index in range(len(whole)):
            expected = _flat(whole[index])
            found = [_flat(part[index]) for part in parts]
            for leaf, want in enumerate(expected):
                assert len(want) % replicas == 0, (split, epoch, index)
                share = len(want) // count
                for k in range(count):
                    got = found[k][leaf]
                    assert got.dtype == want.dtype and got.shape[1:] == want.shape[1:]
                    np.testing.assert_array_equal(got, want[k * share:(k + 1) * share],
                                                  err_msg=f"{split} {epoch} batch {index}")


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_each_process_reads_exactly_its_rows_of_every_batch(prepared, name):
    """Process k of N gets rows k/N to (k+1)/N of each batch of the
    one-process read (a short batch first filled up to a multiple of the
    replicas, as from tf.data), and reads of the files' blocks only those
    that hold its rows (plus the batch sizes and block digests, read
    whole)."""
    directory, recipe = prepared(name), _recipe(name)
    one = prepared_module.PreparedData(directory, recipe)
    manifest = one.manifest
    for processes, replicas in ((2, 2), (2, 4), (4, 4)):
        shards = [prepared_module.PreparedData(directory, recipe, (k, processes))
                  for k in range(processes)]
        _assert_shards_are_the_batch(one, shards, replicas)
        for k, shard in enumerate(shards):
            # What it read: each block that holds a row it feeds, once.
            expected = total = 0
            for split, epoch in _passes(one):
                entry = manifest["files"][f"train-{epoch:04d}" if split == "train" else split]
                with np.load(os.path.join(directory, entry["file"])) as stored:
                    sizes, ends = stored["sizes"], stored["block_ends"]
                starts = prepared_module._block_starts(sizes, entry["block_rows"])
                rows = np.concatenate(prepared_module.batch_rows(sizes, replicas, k, processes))
                blocks = np.unique(np.searchsorted(starts, rows, side="right") - 1)
                expected += np.diff(ends, prepend=0)[blocks].sum()
                total += ends[-1]
            assert shard.bytes_read == expected, (processes, replicas, k)
            if name == "vit_tiny_digits":  # 16 rows a batch: 2 blocks of 8
                assert expected < total  # its blocks, not every block
        # So are the batches as a run reads them: finished, fillers weightless.
        _assert_shards_are_the_batch(one, shards, replicas, _prepared_task(name, one))


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_the_filler_rows_of_prepared_batches_weigh_nothing(prepared, name):
    """A batch the replicas do not divide is filled up with its own first
    rows, which the task makes weightless (`Task.weightless_rows`), on
    every process that feeds one: a weight of 0 exactly where
    `batch_kept` says filler, 1 elsewhere."""
    directory, recipe = prepared(name), _recipe(name)
    task = _prepared_task(name, prepared_module.PreparedData(directory, recipe))
    fillers = 0
    for processes, replicas in ((1, 3), (2, 6)):
        for k in range(processes):
            shard = prepared_module.PreparedData(directory, recipe, (k, processes))
            for split, epoch in _passes(shard):
                batches = shard.batches(split, epoch, task.finish_prepared, replicas,
                                        task.weightless_rows)
                sizes = shard._arrays(f"train-{epoch:04d}" if split == "train" else split,
                                      replicas)[0]
                kept = prepared_module.batch_kept(sizes, replicas, k, processes)
                for index in range(len(batches)):
                    weights = batches[index][2]
                    np.testing.assert_array_equal(weights, kept[index].astype("float32"))
                    fillers += int(np.sum(~kept[index]))
    assert fillers  # some batches were filled up


def _flip(file, key, byte):
    """Flips a bit of byte `byte` of member `key` of an uncompressed .npz."""
    with open(file, "r+b") as stream:
        stream.seek(prepared_module._stored_members(file)[key][0] + byte)
        value = stream.read(1)
        stream.seek(-1, os.SEEK_CUR)
        stream.write(bytes([value[0] ^ 1]))


def test_a_process_checks_its_own_rows_and_no_others(prepared, tmp_path):
    """A damaged block refuses the process that reads it, naming the file
    and the rows, before anything is trained; the other process, which does
    not read it, reads its rows as they were written; one process, which
    reads everything, refuses the file by its SHA-256."""
    name, recipe = "vit_tiny_digits", _recipe("vit_tiny_digits")
    directory = str(tmp_path / "copy")
    shutil.copytree(prepared(name), directory)
    assert prepared_module.PreparedData(directory, recipe).files["train-0001"]["block_rows"] == 8
    untouched = prepared_module.PreparedData(prepared(name), recipe, (1, 2))
    # The first block (rows 0 to 7) of batch 0 (16 rows, 2 replicas):
    # process 0's.
    _flip(os.path.join(directory, "train-0001.npz"), prepared_module.BLOCKS, 5)
    other = prepared_module.PreparedData(directory, recipe, (1, 2))
    for epoch in (0, 1):
        for got, want in zip(other.batches("train", epoch, replicas=2),
                             untouched.batches("train", epoch, replicas=2)):
            for a, b in zip(_flat(got), _flat(want)):
                np.testing.assert_array_equal(a, b)
    owner = prepared_module.PreparedData(directory, recipe, (0, 2))
    with pytest.raises(ValueError, match=r"train-0001.npz is not the file `prepare` wrote: "
                                         r"rows 0 to 7 \(a block that this process reads\) "
                                         r"are not the rows written"):
        owner.batches("train", 1, replicas=2)
    task = make_task(recipe)
    task.use_prepared(owner.state)
    with pytest.raises(ValueError, match=r"train-0001.npz is not the file `prepare` wrote: "
                                         r"rows 0 to 7"):
        owner.check(task.build_model(), task, replicas=2)
    with pytest.raises(ValueError, match=r"train-0001.npz is not the file `prepare` wrote "
                                         r"\(size"):
        prepared_module.PreparedData(directory, recipe)

    # What every process reads whole is checked whole against the
    # manifest: the batch sizes, each block's end and SHA-256, edited and
    # saved again (a damaged byte is refused by the zip's own CRC-32 first).
    for index, key in enumerate(["sizes", prepared_module.BLOCK_ENDS,
                                 prepared_module.BLOCK_DIGESTS]):
        damaged = str(tmp_path / f"meta{index}")
        shutil.copytree(prepared(name), damaged)
        file = os.path.join(damaged, "train-0000.npz")
        with np.load(file) as stored:
            members = {member: stored[member] for member in stored.files}
        members[key].reshape(-1)[0] ^= 1
        np.savez(file, **members)
        with pytest.raises(ValueError, match=r"train-0000.npz is not the file `prepare` "
                                             r"wrote: its batch sizes, shapes or block digests"):
            prepared_module.PreparedData(damaged, recipe, (1, 2))
        _flip(file, key, 0)
        with pytest.raises(ValueError, match=r"train-0000.npz is not the file `prepare` "
                                             r"wrote \(Bad CRC-32"):
            prepared_module.PreparedData(damaged, recipe, (1, 2))
    truncated = str(tmp_path / "truncated")
    shutil.copytree(prepared(name), truncated)
    file = os.path.join(truncated, "validation.npz")
    with open(file, "r+b") as stream:
        stream.truncate(os.path.getsize(file) // 2)
    with pytest.raises(ValueError, match=r"validation.npz is not the file `prepare` wrote "
                                         r"\(.*\): truncated"):
        prepared_module.PreparedData(truncated, recipe, (1, 2))


def _as_format_2(directory):
    """`directory` rewritten as `prepare` wrote it before format 3: every
    file's arrays compressed whole, no blocks."""
    path = os.path.join(directory, "prepared.json")
    with open(path) as handle:
        manifest = json.load(handle)
    for entry in manifest["files"].values():
        file = os.path.join(directory, entry["file"])
        arrays, extra = prepared_module._read_file(file, entry)
        np.savez_compressed(file, **extra, **arrays)
        for key in ("stored", "block_rows", "meta_sha256"):
            entry.pop(key, None)
        entry.update(bytes=os.path.getsize(file), sha256=prepared_module._sha256(file))
    manifest["format"] = 2
    with open(path, "w") as handle:
        json.dump(prepared_module._seal(manifest), handle)


def test_an_earlier_format_is_read_whole_by_every_process(prepared, tmp_path):
    """A directory of format 2 (compressed, checked file by file) still
    trains across processes: each reads and checks every file whole and
    keeps its rows, the same rows as from format 3."""
    name, recipe = "conformer_tiny_digits", _recipe("conformer_tiny_digits")
    directory = str(tmp_path / "format2")
    shutil.copytree(prepared(name), directory)
    _as_format_2(directory)
    one = prepared_module.PreparedData(directory, recipe)
    assert one.manifest["format"] == 2
    shards = [prepared_module.PreparedData(directory, recipe, (k, 2)) for k in range(2)]
    _assert_shards_are_the_batch(one, shards, 2)
    assert [shard.bytes_read for shard in shards] == [0, 0]  # nothing read by rows
    newer = prepared_module.PreparedData(prepared(name), recipe, (1, 2))
    for split, epoch in _passes(one):
        for got, want in zip(shards[1].batches(split, epoch, replicas=2),
                             newer.batches(split, epoch, replicas=2)):
            for a, b in zip(_flat(got), _flat(want)):
                np.testing.assert_array_equal(a, b)


def test_what_cannot_be_shared_out_is_refused_by_name(prepared, tmp_path):
    name = "vit_tiny_digits"
    with pytest.raises(ValueError, match=r"global batch of 16 rows cannot be shared out evenly "
                                         r"over 3 processes.*Received: training.batch_size=16 "
                                         r"with 3 processes"):
        prepared_module.PreparedData(prepared(name), _recipe(name), (0, 3))
    with pytest.raises(ValueError, match=r"Invalid value for argument `process`.*"
                                         r"Received: process=\(2, 2\)"):
        prepared_module.PreparedData(prepared(name), _recipe(name), (2, 2))
    with pytest.raises(ValueError, match=r"Invalid value for argument `replicas`.*over its 2 "
                                         r"processes. Received: replicas=3"):
        prepared_module.batch_rows([4, 3], replicas=3, process=0, processes=2)
    with pytest.raises(ValueError, match=r"Model parallel does not take prepared `data` yet.*"
                                         r"Received: distribute='model_parallel:1x2'"):
        runs.train(name, SETTINGS[name], output=str(tmp_path / "run"),
                   distribute="model_parallel:1x2", data=prepared(name))
    assert not os.path.exists(tmp_path / "run")


def _run_jobs(tmp_path, jobs):
    """Starts `keras-attn train --data ... --distribute` for each `(output,
    data, log name, process id or None[, environment])` of `jobs` (the ids:
    one job of 2 processes on a free port; None: a process alone), waits
    for all, ends every one either way; returns `[(returncode, output)]`."""
    from test_multiprocess import RECIPE
    from test_multiprocess import SETS
    from test_multiprocess import _env
    from test_multiprocess import _finish
    from test_multiprocess import _free_port

    port = _free_port()
    sets = [item for value in SETS for item in ("--set", value)]
    started = []
    try:
        for output, data, name, rank, *environment in jobs:
            extra = dict(*environment) if rank is None else {
                "KERAS_DISTRIBUTION_JOB_ADDRESSES": f"localhost:{port}",
                "KERAS_DISTRIBUTION_NUM_PROCESSES": "2", "KERAS_DISTRIBUTION_PROCESS_ID": str(rank)}
            log = open(tmp_path / name, "w+")
            started.append(subprocess.Popen(
                [sys.executable, "-m", "keras_attn.cli", "train", RECIPE, "--output", str(output),
                 "--data", data, "--verbose", "0", "--distribute", "--no-export", *sets],
                cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env=_env(**extra)))
            started[-1].log = log
    finally:
        results = _finish(started)  # every process ended, whatever happened
    return results


@pytest.mark.slow
@pytest.mark.backend_independent
@pytest.mark.xdist_group("distribute")
@pytest.mark.exclusive
def test_two_processes_from_prepared_files_train_as_one(tmp_path):
    """`keras-attn train --data DIR --distribute` as two JAX processes, each
    reading its rows, and as one process of two devices (the prepared
    batches split over its replicas): the final weights of one device
    trained from the same files with the same global batch."""
    from test_case import jax_cpu_devices_flags
    from test_multiprocess import RECIPE
    from test_multiprocess import SETS
    from test_multiprocess import _weights

    directory = str(tmp_path / "prepared")
    prepared_module.prepare(RECIPE, SETS, output=directory, verbose=False)
    # The job's two processes, one process of two devices, and one process
    # of one device alone (the reference).
    results = _run_jobs(tmp_path, [
        (tmp_path / "run", directory, "log0.txt", 0),
        (tmp_path / "run", directory, "log1.txt", 1),
        (tmp_path / "devices", directory, "devices.txt", None,
         {"XLA_FLAGS": jax_cpu_devices_flags(2)}),
        (tmp_path / "single", directory, "single.txt", None)])
    for code, log in results:
        assert code == 0, log[-3000:]
    assert "process 1 of 2: trained vit_tiny_digits" in results[1][1]
    assert "2 replicas: global batch 32 = 16 examples per replica" in results[2][1]
    expected = _weights(tmp_path / "single" / "model.keras")
    for run in ("run", "devices"):
        found = _weights(tmp_path / run / "model.keras")
        assert sorted(found) == sorted(expected)
        for key in expected:
            np.testing.assert_allclose(found[key], expected[key], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{run}: {key}")


@pytest.mark.slow
@pytest.mark.backend_independent
@pytest.mark.xdist_group("distribute")
@pytest.mark.exclusive
def test_a_process_that_refuses_its_rows_stops_the_job(tmp_path):
    """Each host with its own copy of the prepared files, process 1's
    damaged: process 1 refuses it, naming the file and the rows, and
    process 0, whose copy is sound, stops too, naming process 1, before
    the first step (neither waits for the other)."""
    from test_multiprocess import RECIPE
    from test_multiprocess import SETS

    sound = str(tmp_path / "host0")
    prepared_module.prepare(RECIPE, SETS, output=sound, verbose=False)
    damaged = str(tmp_path / "host1")
    shutil.copytree(sound, damaged)
    _flip(os.path.join(damaged, "train-0000.npz"), prepared_module.BLOCKS, 5)
    results = _run_jobs(tmp_path, [(tmp_path / "run", sound, "log0.txt", 0),
                                   (tmp_path / "run", damaged, "log1.txt", 1)])
    (code0, log0), (code1, log1) = results
    assert code1 != 0 and code0 != 0, (log0[-3000:], log1[-3000:])
    assert "host1/train-0000.npz is not the file `prepare` wrote: rows 0 to " in log1, \
        log1[-3000:]
    assert ("The prepared data of process 1 of 2 was refused there (its output names the file "
            "and what is wrong): every process of the job stops before the first step") in log0, \
        log0[-3000:]
    assert not os.path.exists(tmp_path / "run" / "checkpoints") or not os.listdir(
        tmp_path / "run" / "checkpoints")


@pytest.mark.slow
@pytest.mark.backend_independent
@pytest.mark.xdist_group("distribute")
@pytest.mark.exclusive
def test_hosts_with_different_prepared_copies_are_refused_by_name(tmp_path):
    """Each host with its own copy, both sound and both for this recipe, but
    not the same files (process 1's an earlier format of the same batches,
    as a host never updated would hold): every process stops before the
    first step, naming the prepared data, rather than train on what only
    each host's own checks vouch for."""
    from test_multiprocess import RECIPE
    from test_multiprocess import SETS

    newer = str(tmp_path / "host0")
    prepared_module.prepare(RECIPE, SETS, output=newer, verbose=False)
    older = str(tmp_path / "host1")
    shutil.copytree(newer, older)
    _as_format_2(older)
    results = _run_jobs(tmp_path, [(tmp_path / "run", newer, "log0.txt", 0),
                                   (tmp_path / "run", older, "log1.txt", 1)])
    for code, log in results:
        assert code != 0, log[-3000:]
        assert ("The processes of this job were started with another prepared data: "
                "process 1 differs from process 0") in log, log[-3000:]
    assert not os.path.exists(tmp_path / "run" / "checkpoints") or not os.listdir(
        tmp_path / "run" / "checkpoints")


@pytest.mark.tf_only
def test_prepared_data_across_tensorflow_workers_is_refused_by_name(prepared, tmp_path,
                                                                      monkeypatch):
    """How TensorFlow's multi-worker strategy would share out prepared
    batches is untested: refused by name, nothing written (TensorFlow users
    train from the recipe's own pipeline)."""
    from keras_attn.training import distribute

    name = "vit_tiny_digits"
    monkeypatch.setattr(distribute, "initialize_processes", lambda: (0, 2))
    with pytest.raises(ValueError, match=r"Prepared `data` trains across processes on JAX "
                                         r"only.*with 2 tensorflow processes"):
        runs.train(name, SETTINGS[name], output=str(tmp_path / "run"), distribute=True,
                   data=prepared(name))
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.slow
@pytest.mark.tf_only
@pytest.mark.xdist_group("distribute")
def test_prepared_data_on_two_tensorflow_devices_trains_as_one(tmp_path):
    """One TensorFlow process of two devices (MirroredStrategy; the CPU split
    in a subprocess before TensorFlow starts) from prepared files: Keras
    hands each replica its half of every prepared batch, and the weights
    are those of one device."""
    from test_multiprocess import RECIPE
    from test_multiprocess import SETS
    from test_multiprocess import _weights

    # No dropout (each replica draws its own masks on TensorFlow); Adam with
    # epsilon 1 (TensorFlow sums the replicas' gradients in another order:
    # with a small epsilon a near-zero gradient's rounding becomes a full
    # step; measured 0.014 apart from tf.data as from prepared files). SETS'
    # jit_compile=true is not used under the strategy (a warning says so).
    sets = SETS + ["model.overrides.dropout=0", "training.optimizer.epsilon=1",
                   "training.optimizer.learning_rate=0.05"]
    directory = str(tmp_path / "prepared")
    prepared_module.prepare(RECIPE, sets, output=directory, verbose=False)
    script = "\n".join([
        "import json, sys",
        "import tensorflow as tf",
        "cpu = tf.config.list_physical_devices('CPU')[0]",
        "tf.config.set_logical_device_configuration(",
        "    cpu, [tf.config.LogicalDeviceConfiguration()] * 2)",
        "from keras_attn.zoo import runs",
        "data, output, sets = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])",
        "for name, distribute in (('one', False), ('two', True)):",
        "    runs.train(sys.argv[4], sets, output=f'{output}/{name}', data=data,",
        "               distribute=distribute, export=False, verbose=0)",
    ])
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-c", script, directory, str(tmp_path),
         json.dumps(sets), RECIPE],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 replicas: global batch 32 = 16 examples per replica" in done.stdout, \
        done.stdout[-3000:]
    assert "training.jit_compile=true is not used under TensorFlow's distribution " \
        "strategy (2 replicas)" in done.stderr, done.stderr[-3000:]
    expected = _weights(tmp_path / "one" / "model.keras")
    found = _weights(tmp_path / "two" / "model.keras")
    assert sorted(found) == sorted(expected)
    for key in expected:
        np.testing.assert_allclose(found[key], expected[key], rtol=1e-5, atol=1e-6, err_msg=key)
