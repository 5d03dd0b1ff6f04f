"""Model-parallel layouts (`keras_attn.models.layout_map`): what is sharded,
how much memory a device keeps, the same training steps as one device, and
the errors for sizes that do not divide."""

import functools
import json
import os
import re
import subprocess
import sys

import keras
import pytest

from _families import NAMES
from keras_attn.models import get_bert_config
from keras_attn.models import get_conformer_config
from keras_attn.models import get_transformer_config
from keras_attn.models import get_vit_config
from keras_attn.models import layout_map
from keras_attn.training.distribute import model_parallel
from keras_attn.training.distribute import parse_distribute
from test_case import jax_cpu_devices_flags

HERE = os.path.dirname(os.path.abspath(__file__))
# The table's (tests/_families.py), run by _parallel_worker.py; ModernBERT has
# no layout map yet (keras_attn.models.parallel covers the four families).
FAMILIES = [name for name in NAMES if name != "modernbert"]
MODEL_SHARDS = 4

# What the issue asks for, stated here independently of the module's table:
# (path pattern, expected PartitionSpec) for every sharded variable; every
# other variable is replicated.
EXPECTED = (
    (r".*/(query|key|value|position)/kernel", [None, "model", None]),
    (r".*/(query|key|value)/bias", ["model", None]),
    (r".*/(content_bias|position_bias)", ["model", None]),
    (r".*/attention_output/kernel", ["model", None, None]),
    (r".*/intermediate_dense/kernel", [None, "model"]),
    (r".*/intermediate_dense/bias", ["model"]),
    (r".*feed_forward(_[12])?/output_dense/kernel", ["model", None]),
    (r"token_embedding/embeddings", ["model", None]),  # vocabulary 64 over 4
)


def _mesh(shape=(2, 4), names=("batch", "model")):
    count = shape[0] * shape[1]
    return keras.distribution.DeviceMesh(shape, names, [f"cpu:{i}" for i in range(count)])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    env = dict(os.environ, KERAS_BACKEND="jax", XLA_FLAGS=jax_cpu_devices_flags(8))
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    result = subprocess.run(
        [sys.executable, os.path.join(HERE, "_parallel_worker.py")],
        capture_output=True, text=True, env=env, timeout=1800,
        cwd=tmp_path_factory.mktemp("parallel"),
    )
    assert result.returncode == 0, result.stderr[-6000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _expected_spec(path, rank):
    for pattern, spec in EXPECTED:
        if re.fullmatch(pattern, path):
            return spec
    return [None] * rank


@pytest.mark.slow  # the report: an 8-device JAX subprocess trains every family
@pytest.mark.backend_independent
@pytest.mark.xdist_group("distribute")  # one worker, after the other multi-device runs
@pytest.mark.parametrize("family", FAMILIES)
def test_every_large_variable_is_sharded_as_intended(report, family):
    variables = report[family]["variables"]
    wrong = {
        path: (found["spec"], _expected_spec(path, len(found["shape"])))
        for path, found in variables.items()
        if (found["spec"] or [None] * len(found["shape"]))
        != _expected_spec(path, len(found["shape"]))
    }
    assert not wrong, wrong
    # Every block's attention and feed-forward are among them.
    sharded = [p for p, found in variables.items() if "model" in (found["spec"] or [])]
    assert any(p.endswith("query/kernel") for p in sharded)
    assert any(p.endswith("intermediate_dense/kernel") for p in sharded)
    # The optimizer's slot of a sharded kernel is sharded the same way.
    assert report[family]["query_momentum"] == [[None, "model", None]]


@pytest.mark.slow  # the report: an 8-device JAX subprocess trains every family
@pytest.mark.backend_independent
@pytest.mark.xdist_group("distribute")  # one worker, after the other multi-device runs
@pytest.mark.parametrize("family", FAMILIES)
def test_a_device_holds_a_model_shard_of_the_sharded_weights(report, family):
    variables = report[family]["variables"].values()
    sharded = [v for v in variables if "model" in (v["spec"] or [])]
    replicated = [v for v in variables if "model" not in (v["spec"] or [])]
    for v in sharded:
        assert v["first_device_bytes"] * MODEL_SHARDS == v["bytes"]
    for v in replicated:
        assert v["first_device_bytes"] == v["bytes"]
    total = sum(v["bytes"] for v in variables)
    on_device = sum(v["first_device_bytes"] for v in variables)
    sharded_bytes = sum(v["bytes"] for v in sharded)
    # In these small models the blocks hold most of the weights: a device
    # keeps well under half of them (a quarter of the blocks, all the rest).
    assert sharded_bytes > 0.6 * total
    assert on_device == total - sharded_bytes + sharded_bytes // MODEL_SHARDS
    assert on_device < 0.55 * total


@pytest.mark.slow  # the report: an 8-device JAX subprocess trains every family
@pytest.mark.backend_independent
@pytest.mark.xdist_group("distribute")  # one worker, after the other multi-device runs
@pytest.mark.parametrize("family", FAMILIES)
def test_model_parallel_steps_give_the_one_device_losses(report, family):
    single, parallel = report[family]["single_losses"], report[family]["losses"]
    assert single[1] != single[0]  # the first step changed the weights
    for a, b in zip(single, parallel):
        assert abs(a - b) <= 1e-5 * abs(a), (single, parallel)


@pytest.mark.parametrize(
    "config, message",
    [
        (get_bert_config("bert_tiny", num_heads=2, hidden_dim=128),
         "num_heads=2 does not divide over the 4 devices"),
        (get_vit_config("vit_tiny_16", num_heads=4, intermediate_dim=770),
         "intermediate_dim=770 (the feed-forward's inner width) does not divide over the 4 devices"),
        (get_conformer_config("conformer_tiny", vocabulary_size=10, num_heads=6, hidden_dim=144),
         "num_heads=6 does not divide over the 4 devices"),
        (get_transformer_config("transformer_base", intermediate_dim=1026),
         "intermediate_dim=1026"),
    ],
)
def test_sizes_that_do_not_divide_are_refused_naming_both_numbers(config, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        layout_map(config, _mesh())


def test_a_model_is_checked_variable_by_variable():
    from keras_attn.models import build_vit

    model = build_vit("vit_tiny_16", image_size=16, patch_size=4, num_layers=1,
                      hidden_dim=16, num_heads=2, intermediate_dim=32, num_classes=3)
    with pytest.raises(ValueError, match=r"num_heads=2 \(variable 'transformer_block_0/"
                                         r"self_attention/query/kernel'.*over the 4 devices"):
        layout_map(model, _mesh())
    layouts = layout_map(model, _mesh((4, 2)))
    assert layouts["transformer_block_0/self_attention/query/kernel"].axes == (None, "model", None)
    assert layouts["transformer_block_0/self_attention_layer_norm/gamma"] is None


def test_a_vocabulary_that_does_not_divide_shards_the_table_over_its_width():
    # BERT's 30,522 word pieces over 4 devices: the table is split by columns.
    layouts = layout_map(get_bert_config("bert_base"), _mesh())
    assert layouts["token_embedding/embeddings"].axes == (None, "model")
    layouts = layout_map(get_bert_config("bert_base", vocabulary_size=30524), _mesh())
    assert layouts["token_embedding/embeddings"].axes == ("model", None)
    # An untied Transformer: both tables and the output projection.
    config = get_transformer_config("transformer_base", vocabulary_size=800,
                                    target_vocabulary_size=1200)
    layouts = layout_map(config, _mesh())
    assert layouts["source_token_embedding/embeddings"].axes == ("model", None)
    assert layouts["output_projection/kernel"].axes == (None, "model")
    assert layouts["output_projection/bias"].axes == ("model",)
    assert layouts["decoder_block_0/cross_attention/attention_output/kernel"].axes == (
        "model", None, None)
    assert layouts["decoder_block_0/cross_attention/attention_output/bias"] is None


def test_bad_meshes_and_arguments_are_refused():
    with pytest.raises(ValueError, match=r"no axis named 'model'.*Received: axis_names=\['batch', 'shard'\]"):
        layout_map(get_bert_config("bert_tiny"), _mesh(names=("batch", "shard")))
    with pytest.raises(ValueError, match="`device_mesh` must be a `keras.distribution.DeviceMesh`"):
        layout_map(get_bert_config("bert_tiny"), (2, 4))
    with pytest.raises(ValueError, match="`model_or_config` must be"):
        layout_map({"num_heads": 4}, _mesh())


@pytest.mark.parametrize(
    "value, parsed",
    [(None, None), (False, None), (True, "data_parallel"), ("data_parallel", "data_parallel"),
     ("model_parallel:2x4", (2, 4)), ("model_parallel:1x8", (1, 8))],
)
def test_distribute_values(value, parsed):
    assert parse_distribute(value) == parsed


@pytest.mark.parametrize("value", ["model_parallel", "model_parallel:0x4", "model_parallel:2*4",
                                   "pipeline", 2])
def test_bad_distribute_values_are_refused(value):
    with pytest.raises(ValueError, match=re.escape(f"Received: distribute={value!r}")):
        parse_distribute(value)


def test_model_parallel_needs_jax_or_the_right_device_count():
    config = get_vit_config("vit_tiny_16", num_heads=4)
    if keras.backend.backend() != "jax":
        with pytest.raises(ValueError, match="runs on the jax backend"):
            with model_parallel((1, 2), functools.partial(layout_map, config)):
                pass
    else:
        devices = len(keras.distribution.list_devices())
        with pytest.raises(ValueError, match=f"needs {devices + 1} devices and there are {devices}"):
            with model_parallel((1, devices + 1), functools.partial(layout_map, config)):
                pass
    assert keras.distribution.distribution() is None
