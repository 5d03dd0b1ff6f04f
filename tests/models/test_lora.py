"""LoRA on every family and variant (ModernBERT, DINOv2: tests/_families.py's
VARIANTS): the chosen projections get adapters, only they (and a head when
asked) train, merging gives a plain model with the same outputs, and an
adapter file loads onto its own base model only."""

import os
import re

import keras
import numpy as np
import pytest

from keras_attn import _keras_compat
from keras_attn.models import enable_lora
from keras_attn.models import load_lora_weights
from keras_attn.models import lora_layers
from keras_attn.models import merge_lora
from keras_attn.models import save_lora_weights
from _families import FAMILIES
from _families import NAMES
from _families import TABLE
from _families import VARIANT_NAMES
from _families import outputs as _outputs
from test_case import to_numpy

_bert = FAMILIES["bert"].build
BERT_INPUTS = FAMILIES["bert"].inputs()
RNG = np.random.default_rng(5)


def _close(a, b, atol):
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, atol=atol, rtol=0)


def _perturb_adapters(model, seed=0):
    rng = np.random.default_rng(seed)
    for layer in lora_layers(model):
        layer.lora_kernel_b.assign(rng.normal(0, 0.5, layer.lora_kernel_b.shape).astype("float32"))


@pytest.mark.parametrize("family", NAMES + VARIANT_NAMES)
def test_adapters_train_alone_and_merge_into_a_plain_model(family, tmp_path):
    inputs, heads = TABLE[family].inputs(), TABLE[family].heads
    model = TABLE[family].build()
    base = _outputs(model, inputs)
    base_count = len(model.weights)
    chosen = enable_lora(model, rank=2, train_also=heads)

    # The query and value projections of every attention layer, nothing else.
    every = _keras_compat.sublayers(model)
    attention_layers = [layer for layer in every if layer.name == "query"]
    assert attention_layers and {layer.name for layer in chosen} == {"query", "value"}
    assert len(chosen) == 2 * len(attention_layers)
    adapters = [v for layer in chosen for v in (layer.lora_kernel_a, layer.lora_kernel_b)]
    head_weights = [v for layer in every if any(layer.name == h for h in heads) for v in layer.weights]
    assert {id(v) for v in model.trainable_weights} == {id(v) for v in adapters + head_weights}
    assert all(v.dtype == "float32" for v in adapters)

    # B starts at zero: the adapted model starts equal to its base.
    _close(_outputs(model, inputs), base, atol=1e-6)
    # A trained-looking head (the ViT's starts at zero and would hide the rest).
    for layer in every:
        if layer.name in heads:
            layer.kernel.assign(RNG.normal(0, 0.5, layer.kernel.shape).astype("float32"))
    before = _outputs(model, inputs)
    _perturb_adapters(model)
    adapted = _outputs(model, inputs)
    # (at least 100 times the tolerance the merged model is held to)
    assert max(np.abs(a - b).max() for a, b in zip(adapted, before)) > 1e-3

    merged = merge_lora(model)
    assert not lora_layers(merged) and len(merged.weights) == base_count
    assert all(v.trainable for v in merged.trainable_weights) and merged.trainable_weights
    _close(_outputs(merged, inputs), adapted, atol=1e-5)
    # The merged model saves and loads like any other.
    merged.save(tmp_path / "merged.keras")
    _close(_outputs(keras.saving.load_model(tmp_path / "merged.keras"), inputs), adapted, atol=1e-5)
    assert lora_layers(model)  # merging leaves the adapted model as it was


def test_fit_changes_the_adapters_and_the_head_only():
    model = _bert()
    enable_lora(model, rank=2, alpha=4, targets=("query", "key", "value", "attention_output"),
                train_also=("classifier",))
    frozen = {v.path: to_numpy(v) for v in model.weights if not v.trainable}
    trainable = {v.path: to_numpy(v) for v in model.trainable_weights}
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    model.fit(BERT_INPUTS, np.array([0, 2]), epochs=2, verbose=0)
    for variable in model.weights:
        if variable.path in frozen:
            np.testing.assert_array_equal(to_numpy(variable), frozen[variable.path], err_msg=variable.path)
    changed = [p for p, value in trainable.items()
               if not np.array_equal(to_numpy(_variable(model, p)), value)]
    assert any(p.endswith("lora_kernel_b") for p in changed)
    assert any(p.startswith("classifier/") for p in changed)
    assert {layer.lora_alpha for layer in lora_layers(model)} == {4}


def _variable(model, path):
    (found,) = [v for v in model.weights if v.path == path]
    return found


def test_adapters_stay_float32_under_mixed_precision():
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = _bert()
    chosen = enable_lora(model, rank=2)
    assert all(layer.lora_kernel_a.dtype == layer.lora_kernel_b.dtype == "float32" for layer in chosen)
    assert keras.backend.standardize_dtype(model(BERT_INPUTS).dtype) == "bfloat16"


def test_targets_select_by_name_or_path():
    model = _bert()
    chosen = enable_lora(model, rank=2, targets=("transformer_block_1/*",))
    assert chosen and all(layer.path.startswith("transformer_block_1/") for layer in chosen)
    # every projection of the block: four of attention, two of the feed-forward
    assert sorted(layer.name for layer in chosen) == sorted(
        ["query", "key", "value", "attention_output", "intermediate_dense", "output_dense"])


def test_adapter_file_loads_onto_its_base_model_only(tmp_path):
    keras.utils.set_random_seed(1)
    model = _bert()
    model.save_weights(tmp_path / "base.weights.h5")
    enable_lora(model, rank=2, train_also=("classifier",))
    _perturb_adapters(model)
    model.get_layer("classifier").kernel.assign(RNG.normal(size=(16, 3)).astype("float32"))
    adapted = _outputs(model, BERT_INPUTS)
    path = save_lora_weights(model, tmp_path / "adapters.npz")
    assert os.path.getsize(path) < os.path.getsize(tmp_path / "base.weights.h5") / 2

    keras.utils.set_random_seed(2)  # other initial weights, then the base checkpoint
    again = _bert()
    again.load_weights(tmp_path / "base.weights.h5")
    layers = load_lora_weights(again, path)
    assert sorted(layer.path for layer in layers) == sorted(layer.path for layer in lora_layers(model))
    assert sorted(v.path for v in again.trainable_weights) == sorted(v.path for v in model.trainable_weights)
    _close(_outputs(again, BERT_INPUTS), adapted, atol=1e-6)
    # Onto a model adapted the same way: loads too.
    load_lora_weights(again, path)
    _close(_outputs(again, BERT_INPUTS), adapted, atol=1e-6)


def test_bad_adapter_files_and_models_are_refused_before_any_change(tmp_path):
    keras.utils.set_random_seed(1)
    model = _bert()
    model.save_weights(tmp_path / "base.weights.h5")
    enable_lora(model, rank=2)
    _perturb_adapters(model)
    path = save_lora_weights(model, tmp_path / "adapters.npz")

    other_base = _bert()  # its own random weights
    before = [to_numpy(v) for v in other_base.weights]
    with pytest.raises(ValueError, match="trained on another base model"):
        load_lora_weights(other_base, path)
    assert not lora_layers(other_base)
    assert all(np.array_equal(a, to_numpy(v)) for a, v in zip(before, other_base.weights))

    base = _bert()
    base.load_weights(tmp_path / "base.weights.h5")
    data = open(path, "rb").read()
    (tmp_path / "truncated.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        load_lora_weights(base, tmp_path / "truncated.npz")
    with np.load(path) as arrays:
        kept = {k: arrays[k] for k in arrays.files if not k.endswith("lora_kernel_b")}
    np.savez(tmp_path / "edited.npz", **kept)
    with pytest.raises(ValueError, match="truncated or edited"):
        load_lora_weights(base, tmp_path / "edited.npz")
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with pytest.raises(ValueError, match="not a LoRA adapter file"):
        load_lora_weights(base, tmp_path / "other.npz")
    with pytest.raises(ValueError, match="No LoRA adapter file"):
        load_lora_weights(base, tmp_path / "missing.npz")
    assert not lora_layers(base)

    enable_lora(base, rank=4)
    with pytest.raises(ValueError, match="other LoRA adapters"):
        load_lora_weights(base, path)
    with pytest.raises(ValueError, match="no LoRA adapters"):
        save_lora_weights(_bert(), tmp_path / "none.npz")
    with pytest.raises(ValueError, match="no LoRA adapters"):
        merge_lora(_bert())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"rank": 0}, "Received: rank=0"),
        ({"rank": 2.0}, "Received: rank=2.0"),
        ({"rank": 2, "alpha": -1}, "Received: alpha=-1"),
        ({"rank": 2, "targets": ("nope",)}, "`targets` pattern 'nope' matches no"),
        ({"rank": 2, "targets": ()}, "Received: targets=()"),
        ({"rank": 2, "train_also": ("head",)}, "`train_also` pattern 'head' matches no"),
    ],
)
def test_bad_arguments(kwargs, message):
    model = _bert()
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        enable_lora(model, **kwargs)
    assert not lora_layers(model)


@pytest.mark.slow
def test_enabling_twice_or_after_training_started_is_refused():
    model = _bert()
    enable_lora(model, rank=2)
    with pytest.raises(ValueError, match="already has LoRA adapters"):
        enable_lora(model, rank=2)
    trained = _bert()
    trained.compile(optimizer="adam")
    trained.fit(BERT_INPUTS, np.array([0, 1]), verbose=0)
    with pytest.raises(ValueError, match="before the optimizer has taken a step"):
        enable_lora(trained, rank=2)


def _saved_adapters(tmp_path):
    """(path of the base weights, path of an adapter file on that base, the
    adapted model's outputs)."""
    keras.utils.set_random_seed(1)
    model = _bert()
    model.save_weights(tmp_path / "base.weights.h5")
    enable_lora(model, rank=2, train_also=("classifier",))
    _perturb_adapters(model)
    path = save_lora_weights(model, tmp_path / "adapters.npz")
    return tmp_path / "base.weights.h5", path, _outputs(model, BERT_INPUTS)


def _rewrite(source, target, edit_arrays=None, edit_header=None):
    """A copy of the adapter file `source` at `target`, its arrays and its
    header changed by the two functions (`edit_header(header, arrays)`, after
    the arrays are edited), nothing else."""
    import json

    with np.load(source) as data:
        arrays = {k: data[k].copy() for k in data.files}
    header = json.loads(arrays.pop("__lora_metadata__").tobytes().decode())
    if edit_arrays:
        edit_arrays(arrays)
    if edit_header:
        edit_header(header, arrays)
    arrays["__lora_metadata__"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    np.savez(target, **arrays)
    return str(target)


def test_an_edited_value_nan_or_alpha_is_refused_naming_the_file_and_weight(tmp_path):
    import re

    from keras_attn.models import lora

    base_weights, path, adapted = _saved_adapters(tmp_path)
    base = _bert()
    base.load_weights(base_weights)
    before = [to_numpy(v) for v in base.weights]
    with np.load(path) as data:
        name = sorted(k for k in data.files if k.endswith("lora_kernel_b"))[0]

    def bump(arrays):
        arrays[name][0, 0] += 1e-3

    def nan(arrays):
        arrays[name][0, 0] = np.nan

    def alpha(header, arrays):
        header["alpha"] = header["alpha"] * 2

    def re_sign(header, arrays):  # what a careful editor would do: recompute the digests
        header["tensor_sha256"] = {k: lora._tensor_digest(k, arrays[k]) for k in arrays}
        header["sha256"] = lora._header_digest(header)

    cases = [
        (_rewrite(path, tmp_path / "value.npz", bump),
         f"weight {name!r} does not match its digest"),
        (_rewrite(path, tmp_path / "nan.npz", nan),
         f"non-finite values (NaN or infinite) in weight {name!r}"),
        (_rewrite(path, tmp_path / "alpha.npz", edit_header=alpha),
         "its header (layers, rank, alpha, the weights' digests) does not match"),
    ]
    # A NaN, or a nonsensical alpha, with digests made to match: still refused.
    cases.append((_rewrite(path, tmp_path / "nan_signed.npz", nan, re_sign),
                  f"non-finite values (NaN or infinite) in weight {name!r}"))

    def negative_alpha(header, arrays):
        header["alpha"] = -1.0
        re_sign(header, arrays)

    cases.append((_rewrite(path, tmp_path / "alpha_signed.npz", edit_header=negative_alpha),
                  "invalid header: `alpha` must be a positive number"))
    # The re-signed file without a change loads: the digests are what is checked.
    assert lora._read(_rewrite(path, tmp_path / "signed.npz", edit_header=re_sign))[0]["alpha"] > 0

    def version_1(header, arrays):
        header["version"] = 1
        del header["sha256"], header["tensor_sha256"]

    cases.append((_rewrite(path, tmp_path / "v1.npz", edit_header=version_1),
                  "written without digests, so it cannot be checked"))
    for edited, message in cases:
        with pytest.raises(ValueError, match=re.escape(message) + ".*" + re.escape(
                f"Received: path={edited!r}")):
            load_lora_weights(base, edited)
    assert not lora_layers(base)
    assert all(np.array_equal(a, to_numpy(v)) for a, v in zip(before, base.weights))

    # The file itself, and a byte-for-byte rewrite of it, load with the outputs saved.
    _close(_outputs(_loaded(base_weights, path), BERT_INPUTS), adapted, atol=1e-6)
    same = _rewrite(path, tmp_path / "same.npz")
    _close(_outputs(_loaded(base_weights, same), BERT_INPUTS), adapted, atol=1e-6)


def _loaded(base_weights, path):
    model = _bert()
    model.load_weights(base_weights)
    load_lora_weights(model, path)
    return model


def test_weights_that_are_not_finite_are_not_saved(tmp_path):
    model = _bert()
    chosen = enable_lora(model, rank=2)
    chosen[0].lora_kernel_a.assign(np.full(chosen[0].lora_kernel_a.shape, np.inf, "float32"))
    with pytest.raises(ValueError, match=r"not finite \(NaN or infinite\), so the adapters are "
                                         rf"not saved: \['{chosen[0].path}/lora_kernel_a'\]"):
        save_lora_weights(model, tmp_path / "adapters.npz")
    assert not (tmp_path / "adapters.npz").exists()


def test_loading_onto_a_model_whose_optimizer_took_a_step_is_refused(tmp_path):
    base_weights, path, adapted = _saved_adapters(tmp_path)
    stepped = _bert()
    stepped.load_weights(base_weights)
    stepped.compile(optimizer="adam")
    stepped.optimizer.build(stepped.trainable_variables)  # as after a first step
    with pytest.raises(ValueError, match=re.escape(
            "call load_lora_weights, then compile. Received: model=") + ".*with a built optimizer"):
        load_lora_weights(stepped, path)
    assert not lora_layers(stepped) and all(v.trainable for v in stepped.weights
                                            if v.path.endswith("kernel"))

    # The order that works: load, compile, fit. The adapters and the head
    # train; the base does not.
    model = _loaded(base_weights, path)
    frozen = {v.path: to_numpy(v) for v in model.weights if not v.trainable}
    trained = {v.path: to_numpy(v) for v in model.trainable_weights}
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    model.fit(BERT_INPUTS, np.array([0, 2]), epochs=2, verbose=0)
    for variable in model.weights:
        if variable.path in frozen:
            np.testing.assert_array_equal(to_numpy(variable), frozen[variable.path],
                                          err_msg=variable.path)
    changed = {p for p, value in trained.items()
               if not np.array_equal(to_numpy(_variable(model, p)), value)}
    assert any(p.endswith("lora_kernel_b") for p in changed)
    assert any(p.endswith("lora_kernel_a") for p in changed)
    # Onto a model already adapted the same way the optimizer's state fits:
    # the file loads, and training goes on moving the adapters.
    load_lora_weights(model, path)
    _close(_outputs(model, BERT_INPUTS), adapted, atol=1e-6)
    reloaded = {p: to_numpy(_variable(model, p)) for p in trained}
    model.fit(BERT_INPUTS, np.array([0, 2]), epochs=1, verbose=0)
    assert any(not np.array_equal(to_numpy(_variable(model, p)), reloaded[p])
               for p in reloaded if p.endswith("lora_kernel_b"))
