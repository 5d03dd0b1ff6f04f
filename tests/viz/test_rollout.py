import numpy as np
import pytest

from keras_attn import viz
from keras_attn.models.vit import ViTConfig
from keras_attn.models.vit import build_vit
from test_case import to_numpy


@pytest.mark.backend_independent
def test_rollout_of_known_maps():
    # Two blocks, one head, 2 tokens. With w = 0 the rollout is A2 @ A1.
    a1 = np.array([[[[1.0, 0.0], [0.5, 0.5]]]])
    a2 = np.array([[[[0.2, 0.8], [0.0, 1.0]]]])
    np.testing.assert_allclose(viz.attention_rollout([a1, a2], residual_weight=0.0)[0], a2[0, 0] @ a1[0, 0])
    # With w = 0.5: each map is (I + A) / 2 (rows already sum to 1).
    mixed = lambda a: 0.5 * np.eye(2) + 0.5 * a[0, 0]  # noqa: E731
    np.testing.assert_allclose(viz.attention_rollout([a1, a2])[0], mixed(a2) @ mixed(a1))


@pytest.mark.backend_independent
def test_rollout_averages_heads():
    heads = np.array([[[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]]])  # (1, 2, 2, 2)
    np.testing.assert_allclose(viz.attention_rollout([heads], residual_weight=0.0)[0], np.full((2, 2), 0.5))


def test_vit_rollout_maps_and_plot(tmp_path):
    model = build_vit(ViTConfig(image_size=16, patch_size=4, num_channels=1, hidden_dim=16,
                                num_layers=2, num_heads=2, intermediate_dim=32, num_classes=3))
    images = np.random.default_rng(0).integers(0, 256, (3, 16, 16, 1)).astype("uint8")
    maps = viz.vit_attention_rollout(model, images)
    assert maps.shape == (3, 4, 4)
    np.testing.assert_allclose(maps.sum(axis=(1, 2)), 1.0, atol=1e-6)
    # The probe feeds each block what the model feeds it: block 0's output
    # is block 1's input.
    probe, blocks = viz.rollout._block_inputs_model(model, "transformer_block_")
    first_in, second_in = probe(images)
    np.testing.assert_allclose(to_numpy(blocks[0](first_in)), to_numpy(second_in), atol=1e-5)
    path = tmp_path / "rollout.png"
    viz.plot_attention_rollout(images, maps, path=path, titles=["a", "b", "c"])
    with open(path, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.backend_independent
def test_rollout_rejects_cross_attention_shapes():
    with pytest.raises(ValueError, match=r"Received: shape=\(1, 2, 3, 4\)"):
        viz.attention_rollout([np.ones((1, 2, 3, 4))])


@pytest.mark.backend_independent
def test_rollout_plot_rejects_mismatched_batches():
    with pytest.raises(ValueError, match=r"Received: images.shape=\(2, 8, 8, 1\), maps.shape=\(3, 2, 2\)"):
        viz.plot_attention_rollout(np.zeros((2, 8, 8, 1)), np.ones((3, 2, 2)))
