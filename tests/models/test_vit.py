import dataclasses

import keras
import numpy as np
import pytest

from keras_attn.models.vit import VIT_PRESETS
from keras_attn.models.vit import ViT
from keras_attn.models.vit import ViTConfig
from keras_attn.models.vit import build_vit
from keras_attn.models.vit import get_vit_config
from keras_attn.models.vit import interpolate_position_embeddings
from keras_attn.models.vit import resize_vit
from _families import FAMILIES
from test_case import run_model_test
from test_case import to_numpy

TINY = dict(
    image_size=32, patch_size=8, hidden_dim=16, num_layers=2, num_heads=2,
    intermediate_dim=32,
)


def tiny(**overrides):
    return build_vit(ViTConfig(**{**TINY, **overrides}))


def images(batch=2, size=32, channels=3, dtype="uint8", seed=0, width=None):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (batch, size, width or size, channels)).astype(dtype)


def test_the_tiny_classifier_passes_the_model_harness(tmp_path):
    family = FAMILIES["vit"]
    overrides = dict(pooling="gap", layer_norm_epsilon=1e-5, num_channels=2)
    x, y = family.batch(size=3, **overrides)
    bad_labels = [(np.where(np.arange(3) == 0, -1, y), r"`labels` must lie in \[0, 3\).*-1"),
                  (np.where(np.arange(3) == 1, 3, y), r"`labels` must lie in \[0, 3\).*3")]
    run_model_test(lambda: family.build(**overrides), x, y, crop=family.crop,
                   tmp_path=tmp_path, bad_labels=bad_labels,
                   expected_config=dataclasses.asdict(family.config(**overrides)))


@pytest.mark.presets
@pytest.mark.parametrize("name", sorted(VIT_PRESETS))
def test_every_preset_shrunk_builds_and_runs(name):
    preset = VIT_PRESETS[name]
    # Keep the preset's patch size, heads and MLP ratio; shrink the rest.
    model = build_vit(
        name,
        num_classes=3,
        hidden_dim=4 * preset.num_heads,
        intermediate_dim=16 * preset.num_heads,
        num_layers=2,
        image_size=2 * preset.patch_size,
    )
    logits = to_numpy(model(images(size=2 * preset.patch_size)))
    assert logits.shape == (2, 3)
    assert np.all(np.isfinite(logits))
    # 2 x 2 patches + [CLS].
    assert model.get_layer("position_embedding").max_sequence_length == 5


def test_preset_fields():
    base = VIT_PRESETS["vit_base_16"]
    assert (base.hidden_dim, base.num_layers, base.num_heads, base.intermediate_dim) == (
        768, 12, 12, 3072,
    )
    assert VIT_PRESETS["vit_huge_14"].patch_size == 14
    assert all(config.image_size == 224 for name, config in VIT_PRESETS.items()
               if name.startswith("vit_"))
    dino = VIT_PRESETS["dinov2_registers_small_14"]
    assert (dino.image_size, dino.patch_size, dino.hidden_dim, dino.num_layers, dino.num_heads,
            dino.intermediate_dim, dino.num_register_tokens) == (518, 14, 384, 12, 6, 1536, 4)


@pytest.mark.large
@pytest.mark.backend_independent  # a count, the same on every backend
def test_dinov2_registers_small_parameter_count():
    # transformers' Dinov2WithRegistersModel of facebook/dinov2-with-registers-small's
    # config has 22,058,112, of which 384 are the `mask_token` of masked pretraining.
    model = build_vit("dinov2_registers_small_14")
    assert model.count_params() == 22_058_112 - 384
    assert model.output_shape == (None, 768)  # [CLS] and the mean patch token


@pytest.mark.large
@pytest.mark.backend_independent  # a count, the same on every backend
def test_vit_base_16_parameter_counts():
    assert build_vit("vit_base_16", num_classes=1000).count_params() == 86_567_656
    assert build_vit("vit_base_16").count_params() == 85_798_656


def test_output_shapes_and_layer_names():
    model = tiny(num_classes=7)
    assert model.output_shape == (None, 7)
    for name in ("rescaling", "patch_embedding", "class_token", "position_embedding",
                 "transformer_block_0", "transformer_block_1", "final_layer_norm",
                 "classifier"):
        model.get_layer(name)
    conv = model.get_layer("patch_embedding")
    assert conv.kernel_size == (8, 8) and conv.strides == (8, 8)
    block = model.get_layer("transformer_block_1")
    assert block.norm_position == "pre" and block.activation.__name__ == "gelu"
    backbone = tiny()
    assert backbone.output_shape == (None, 16)
    assert model.name == "vit"  # not Keras's "vi_t" from the class name
    assert ViT(**dataclasses.asdict(ViTConfig(**TINY)), name="digits").name == "digits"


def test_uint8_and_float_pixels_agree():
    model = tiny(num_classes=3)
    pixels = images()
    np.testing.assert_allclose(
        to_numpy(model(pixels)), to_numpy(model(pixels.astype("float32"))), atol=1e-6
    )


def test_rescaling_maps_pixels_to_minus_one_one():
    out = to_numpy(tiny().get_layer("rescaling")(np.array([0.0, 127.5, 255.0])))
    np.testing.assert_allclose(out, [-1.0, 0.0, 1.0], atol=1e-6)


@pytest.mark.parametrize("channels", [1, 2, 4])
def test_any_channel_count(channels):
    model = tiny(num_channels=channels, num_classes=2)
    assert model(images(channels=channels)).shape == (2, 2)


def test_gap_pooling_has_no_class_token():
    model = tiny(pooling="gap", num_classes=3)
    assert "class_token" not in [layer.name for layer in model.layers]
    assert model.get_layer("position_embedding").max_sequence_length == 16
    assert model(images()).shape == (2, 3)


def test_cls_pooling_reads_the_first_token():
    model = tiny()
    features = keras.Model(model.input, model.get_layer("final_layer_norm").output)
    np.testing.assert_allclose(
        to_numpy(model(images())), to_numpy(features(images()))[:, 0], atol=1e-6
    )


def test_config_dict_and_overrides():
    model = build_vit({**TINY, "num_classes": 5}, num_channels=1)
    assert model.vit_config.num_channels == 1
    assert model.output_shape == (None, 5)
    assert build_vit(model.vit_config, num_classes=2).output_shape == (None, 2)


# === Errors ===


def test_unknown_preset():
    with pytest.raises(ValueError, match=r"'vit_mega_16'.*vit_base_16.*Received: config='vit_mega_16'"):
        build_vit("vit_mega_16")


def test_unknown_override_key():
    with pytest.raises(ValueError, match=r"'hidden_size'.*Received: hidden_size=8"):
        build_vit("vit_tiny_16", hidden_size=8)


def test_bad_config_type():
    with pytest.raises(ValueError, match=r"Received: config=3"):
        get_vit_config(3)


def test_patch_size_must_divide_image_size():
    with pytest.raises(ValueError, match=r"Received: image_size=30, patch_size=8"):
        tiny(image_size=30)


def test_num_heads_must_divide_hidden_dim():
    with pytest.raises(ValueError, match=r"Received: hidden_dim=16, num_heads=3"):
        tiny(num_heads=3)


def test_bad_pooling():
    with pytest.raises(ValueError, match=r"Received: pooling='max'"):
        tiny(pooling="max")


def test_bad_num_classes():
    with pytest.raises(ValueError, match=r"Received: num_classes=0"):
        tiny(num_classes=0)


def test_wrong_image_shape_is_rejected():
    with pytest.raises(ValueError):
        tiny()(images(size=40))


# === Resolution change ===


def numpy_bilinear(grid, new_size):
    """Half-pixel-centre bilinear resize of a (g, g, D) grid, one axis at a time."""

    def along(x, axis):
        old = x.shape[axis]
        coords = np.clip((np.arange(new_size) + 0.5) * old / new_size - 0.5, 0, old - 1)
        low = np.floor(coords).astype(int)
        high = np.minimum(low + 1, old - 1)
        frac = (coords - low).reshape([-1 if a == axis else 1 for a in range(x.ndim)])
        return np.take(x, low, axis) * (1 - frac) + np.take(x, high, axis) * frac

    return along(along(grid, 0), 1)


@pytest.mark.parametrize("new_grid", [5, 3])
def test_interpolation_matches_numpy(new_grid):
    rng = np.random.default_rng(0)
    table = rng.normal(size=(1 + 4 * 4, 3)).astype("float32")
    out = to_numpy(interpolate_position_embeddings(table, 4, new_grid))
    assert out.shape == (1 + new_grid**2, 3)
    np.testing.assert_array_equal(out[0], table[0])
    expected = numpy_bilinear(table[1:].reshape(4, 4, 3), new_grid)
    np.testing.assert_allclose(out[1:].reshape(new_grid, new_grid, 3), expected, atol=1e-5)


def test_interpolation_without_prefix_and_bicubic():
    table = np.random.default_rng(1).normal(size=(9, 2)).astype("float32")
    out = to_numpy(
        interpolate_position_embeddings(table, 3, 6, num_prefix_tokens=0, interpolation="bicubic")
    )
    assert out.shape == (36, 2) and np.all(np.isfinite(out))
    # A constant grid stays constant whatever the kernel.
    flat = np.ones((9, 2), "float32")
    np.testing.assert_allclose(
        to_numpy(interpolate_position_embeddings(flat, 3, 5, 0, "bicubic")), 1.0, atol=1e-5
    )


def test_interpolation_rejects_a_table_of_the_wrong_size():
    with pytest.raises(ValueError, match=r"Received: table.shape=\(10, 2\)"):
        interpolate_position_embeddings(np.zeros((10, 2)), 4, 2)


def test_resize_to_the_same_size_is_an_identity():
    model = tiny(num_classes=3)
    same = resize_vit(model, 32)
    np.testing.assert_allclose(to_numpy(model(images())), to_numpy(same(images())), atol=1e-6)


@pytest.mark.parametrize("pooling", ["cls", "gap"])
def test_resize_to_a_new_size(pooling):
    model = tiny(num_classes=3, pooling=pooling)
    bigger = resize_vit(model, 48)
    assert bigger.vit_config.image_size == 48
    assert to_numpy(bigger(images(size=48))).shape == (2, 3)
    assert np.all(np.isfinite(to_numpy(bigger(images(size=48)))))
    old = to_numpy(model.get_layer("position_embedding").position_embeddings)
    new = to_numpy(bigger.get_layer("position_embedding").position_embeddings)
    prefix = 1 if pooling == "cls" else 0
    assert new.shape == (prefix + 36, 16)
    np.testing.assert_array_equal(new[:prefix], old[:prefix])  # the [CLS] row
    np.testing.assert_array_equal(
        to_numpy(bigger.get_layer("classifier").kernel),
        to_numpy(model.get_layer("classifier").kernel),
    )


def test_resize_rejects_bad_sizes_and_models():
    model = tiny()
    with pytest.raises(ValueError, match=r"Received: image_size=36, patch_size=8"):
        resize_vit(model, 36)
    with pytest.raises(ValueError, match=r"Received: model=Sequential"):
        resize_vit(keras.Sequential([keras.layers.Dense(2)]), 32)
    with pytest.raises(ValueError, match=r"Received: interpolation='nearest'"):
        resize_vit(model, 48, interpolation="nearest")


# === DINOv2's options: registers, LayerScale, SwiGLU, ImageNet pixels ===

DINO = dict(num_register_tokens=3, layer_scale_init=0.5, feed_forward="swiglu",
            pixel_normalization="imagenet", pooling="cls_gap")


def test_dinov2_options_pass_the_model_harness(tmp_path):
    # At any input size, as transformers' DINOv2 (the harness runs it at its
    # native size: config, .keras file, batching, mixed precision, a fit step).
    options = {**DINO, "position_interpolation": "bicubic_antialias"}
    family = FAMILIES["vit"]
    x, y = family.batch(size=3, **options)
    run_model_test(lambda: family.build(**options), x, y, crop=family.crop,
                   tmp_path=tmp_path, expected_config=dataclasses.asdict(family.config(**options)))


def test_registers_follow_the_class_token_without_positions():
    model = tiny(**DINO)
    block = model.get_layer("transformer_block_0")
    assert block.gated and block.activation.__name__ == "silu"
    assert block.layer_scale_init == 0.5
    assert model.get_layer("position_embedding").max_sequence_length == 1 + 16
    registers = np.arange(3 * 16, dtype="float32").reshape(3, 16)
    model.get_layer("register_tokens").tokens.assign(registers)
    embedded = keras.Model(model.input, model.get_layer("register_tokens").output)
    before = keras.Model(model.input, model.get_layer("add_position_embedding").output)
    got, want = to_numpy(embedded(images())), to_numpy(before(images()))
    assert got.shape == (2, 1 + 3 + 16, 16)
    np.testing.assert_array_equal(got[:, 0], want[:, 0])
    np.testing.assert_array_equal(got[:, 1:4], np.broadcast_to(registers, (2, 3, 16)))
    np.testing.assert_array_equal(got[:, 4:], want[:, 1:])
    # The head reads [CLS] and the mean of the patch tokens, not the registers.
    features = to_numpy(keras.Model(model.input, model.get_layer("final_layer_norm").output)(
        images()))
    pooled = np.concatenate([features[:, 0], features[:, 4:].mean(axis=1)], axis=-1)
    np.testing.assert_allclose(to_numpy(model(images())), pooled, atol=1e-6)


def test_imagenet_pixel_normalization():
    out = to_numpy(tiny(**DINO).get_layer("rescaling")(np.array([[0.0, 127.5, 255.0]] * 2)))
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    np.testing.assert_allclose(out, (np.array([[0.0, 0.5, 1.0]] * 2) - mean) / std, atol=1e-5)


def test_custom_pixel_normalization_survives_a_saved_config():
    """(x - pixel_mean) / pixel_std per channel, in the input's units; a
    saved config's lists come back as the same tuples."""
    model = tiny(pixel_normalization="custom", pixel_mean=[100, 120.0, 140.0],
                 pixel_std=(60.0, 50.0, 70.0))
    out = to_numpy(model.get_layer("rescaling")(np.array([[0.0, 127.5, 255.0]])))
    np.testing.assert_allclose(out, [[-100 / 60, 7.5 / 50, 115 / 70]], atol=1e-6)
    again = type(model).from_config(model.get_config())
    assert again.vit_config == model.vit_config
    assert again.vit_config.pixel_mean == (100.0, 120.0, 140.0)


@pytest.mark.parametrize("overrides, match", [
    ({"num_register_tokens": -1}, r"Received: num_register_tokens=-1"),
    ({"num_register_tokens": 2, "pooling": "gap"}, r"pooling='gap', num_register_tokens=2"),
    ({"pixel_normalization": "imagenet", "num_channels": 1}, r"Received: num_channels=1"),
    ({"pixel_normalization": "clip"}, r"Received: pixel_normalization='clip'"),
    ({"feed_forward": "geglu"}, r"Received: feed_forward='geglu'"),
    ({"layer_scale_init": 0.0}, r"Received: layer_scale_init=0.0"),
    ({"pixel_normalization": "custom"}, r"Received: pixel_mean=None"),
    ({"pixel_normalization": "custom", "pixel_mean": (1.0, 2.0), "pixel_std": (1.0, 1.0)},
     r"num_channels=3\)\. Received: pixel_mean=\(1.0, 2.0\)"),
    ({"pixel_normalization": "custom", "pixel_mean": (0.0,) * 3, "pixel_std": (1.0, 0.0, 1.0)},
     r"Received: pixel_std=\(1.0, 0.0, 1.0\)"),
    ({"pixel_std": (1.0, 1.0, 1.0)}, r"pixel_normalization='half', pixel_std="),
    ({"pixel_normalization": "custom", "pixel_mean": "0", "pixel_std": (1.0,) * 3},
     r"Received: pixel_mean='0'"),
])
def test_bad_dinov2_options(overrides, match):
    with pytest.raises(ValueError, match=match):
        ViTConfig(**{**TINY, **overrides})


def test_antialiased_bicubic_interpolation_keeps_constants_and_the_same_size():
    table = np.concatenate([np.full((1, 4), 7.0), np.full((16, 4), 2.0)]).astype("float32")
    for new in (2, 4, 6, 9):
        got = to_numpy(interpolate_position_embeddings(table, 4, new,
                                                       interpolation="bicubic_antialias"))
        assert got.shape == (1 + new * new, 4)
        np.testing.assert_allclose(got[0], 7.0)
        np.testing.assert_allclose(got[1:], 2.0, atol=1e-6)


# === Any input size: the position grid resampled to each input's, as transformers ===


def torch_resized(grid, height, width, interpolation):
    """transformers' resampling of a `(g, g, D)` position grid: torch's
    bicubic (ViT) or antialiased bicubic (DINOv2) on `(1, D, g, g)`."""
    import torch
    out = torch.nn.functional.interpolate(
        torch.from_numpy(grid).permute(2, 0, 1)[None], size=(height, width), mode="bicubic",
        align_corners=False, antialias=interpolation == "bicubic_antialias")
    return out[0].permute(1, 2, 0).numpy()


@pytest.mark.parametrize("interpolation", ["bicubic", "bicubic_antialias"])
def test_position_grid_resampling_equals_torchs(interpolation):
    from keras_attn.models.vit.vit_positions import resample_grid
    grid = np.random.default_rng(2).normal(size=(4, 4, 3)).astype("float32")
    for height, width in ((6, 8), (3, 2), (9, 4), (4, 4)):  # larger, smaller, both, same
        np.testing.assert_allclose(to_numpy(resample_grid(grid, height, width, interpolation)),
                                   torch_resized(grid, height, width, interpolation), atol=1e-5)
    # resize_vit's square resampling is the same (keras.ops.image.resize's
    # bicubic is another kernel on TensorFlow and JAX).
    table = np.concatenate([np.ones((1, 3), "float32"), grid.reshape(16, 3)])
    got = to_numpy(interpolate_position_embeddings(table, 4, 6, interpolation=interpolation))
    np.testing.assert_allclose(got[1:].reshape(6, 6, 3),
                               torch_resized(grid, 6, 6, interpolation), atol=1e-5)


@pytest.mark.parametrize("pooling, interpolation",
                         [("cls", "bicubic"), ("gap", "bicubic_antialias")])
def test_an_any_size_vit_is_the_fixed_one_at_its_size_and_resamples_at_others(
        pooling, interpolation):
    fixed = tiny(num_classes=3, pooling=pooling)
    model = tiny(num_classes=3, pooling=pooling, position_interpolation=interpolation)
    assert model.input_shape == (None, None, None, 3)
    assert model.count_params() == fixed.count_params()
    assert [(w.path, w.shape) for w in model.weights] == [
        (w.path, w.shape) for w in fixed.weights]
    model.set_weights(fixed.get_weights())
    np.testing.assert_array_equal(to_numpy(model(images())), to_numpy(fixed(images())))
    # 24 x 40 pixels: a 3 x 5 grid of 8 x 8 patches from the 4 x 4 table.
    wide = images(size=24, width=40, seed=3)
    assert to_numpy(model(wide)).shape == (2, 3)
    table = to_numpy(model.get_layer("position_embedding").position_embeddings)
    prefix = 1 if pooling == "cls" else 0
    positions = keras.Model(model.input, model.get_layer("position_embedding").output)
    got = to_numpy(positions(wide))
    assert got.shape == (2, prefix + 15, 16)
    np.testing.assert_array_equal(got[:, :prefix], np.broadcast_to(table[:prefix], (2, prefix, 16)))
    want = torch_resized(table[prefix:].reshape(4, 4, 16), 3, 5, interpolation)
    np.testing.assert_allclose(got[0, prefix:].reshape(3, 5, 16), want, atol=1e-5)


def test_an_any_size_vit_round_trips_through_a_keras_file(tmp_path):
    model = tiny(num_classes=3, **DINO, position_interpolation="bicubic_antialias")
    model.get_layer("position_embedding").position_embeddings.assign(
        np.random.default_rng(4).normal(size=(17, 16)).astype("float32"))
    path = str(tmp_path / "vit.keras")
    model.save(path)
    again = keras.saving.load_model(path)
    assert again.vit_config.position_interpolation == "bicubic_antialias"
    wide = images(size=40, width=16, seed=5)
    np.testing.assert_allclose(to_numpy(again(wide)), to_numpy(model(wide)), atol=1e-6)


def test_sizes_an_any_size_vit_refuses():
    model = tiny(position_interpolation="bicubic")
    with pytest.raises(ValueError, match=r"patch size 8 must divide the height and width"
                                         r".*Received: images.shape=\(2, 36, 32, 3\)"):
        model(images(size=36, width=32))
    # Without the option a model takes its own size only, as before.
    with pytest.raises(ValueError, match=r"expected shape=\(None, 32, 32, 3\), "
                                         r"found shape=\(2, 24, 40, 3\)"):
        tiny()(images(size=24, width=40))
    with pytest.raises(ValueError, match=r"Received: position_interpolation='bilinear'"):
        ViTConfig(**TINY, position_interpolation="bilinear")


@pytest.mark.tf_only
def test_an_unknown_size_in_a_tensorflow_graph_that_the_patch_does_not_divide_gives_nan():
    import tensorflow as tf
    model = tiny(num_classes=3, position_interpolation="bicubic")
    serve = tf.function(model, input_signature=[tf.TensorSpec((None, None, None, 3))])
    for size, width in ((24, 40), (32, 32)):
        x = images(size=size, width=width, dtype="float32")
        np.testing.assert_allclose(serve(x).numpy(), to_numpy(model(x)), atol=1e-6)
    assert np.isnan(serve(images(size=36, width=32, dtype="float32")).numpy()).all()
