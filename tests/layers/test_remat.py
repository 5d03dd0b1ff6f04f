"""Blocks made inside `keras.RematScope(mode="list_of_layers")` that lists
them are rematerialised in training and give the outputs, gradients and
state updates (dropout seeds, BatchNorm statistics) of the plain blocks.

Dropout is on in every case: a recomputation that drew new masks would give
the gradient of another forward pass. The compiled step is the one `fit`
runs (`tf.function` / `jax.jit`), where plain `keras.remat` of a block fails.
"""

import contextlib

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.layers import ConformerBlock
from keras_attn.layers import TransformerBlock
from keras_attn.layers import TransformerDecoderBlock
from test_case import assert_all_close
from test_case import checkpoint_count
from test_case import training_step_results

NAMES = ["block_0", "block_1"]
RNG = np.random.default_rng(4)
TOKENS = np.array([[3, 5, 7, 2, 0, 0], [4, 4, 9, 1, 6, 8]], "int32")  # 0 = padding
SOURCE = RNG.standard_normal((2, 4, 8)).astype("float32")
SOURCE_MASK = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)


def encoder(name):
    return TransformerBlock(num_heads=2, intermediate_dim=16, dropout=0.2,
                            attention_dropout=0.1, name=name)


def decoder(name):
    return TransformerDecoderBlock(num_heads=2, intermediate_dim=16, dropout=0.2,
                                   norm_position="pre", name=name)


def conformer(name):
    return ConformerBlock(num_heads=2, kernel_size=3, dropout=0.2, name=name)


def two_blocks(make, remat):
    """Token ids -> Embedding(mask_zero=True) -> two blocks; the implicit
    mask reaches the encoder blocks, the others get explicit masks. The same
    seed gives the same weights and dropout seeds with and without remat."""
    keras.utils.set_random_seed(7)
    if remat:
        scope = keras.RematScope(mode="list_of_layers", layer_names=NAMES)
    else:
        scope = contextlib.nullcontext()
    with scope:
        blocks = [make(name) for name in NAMES]
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    source = keras.Input((None, 8), name="source")
    source_mask = keras.Input((None,), dtype="bool", name="source_mask")
    x = keras.layers.Embedding(10, 8, mask_zero=True, name="embedding")(tokens)
    for block in blocks:
        if make is decoder:
            x = block(x, source, encoder_padding_mask=source_mask)
        elif make is conformer:
            x = block(x, padding_mask=ops.not_equal(tokens, 0))
        else:
            x = block(x)  # the implicit mask
    return keras.Model([tokens, source, source_mask], x)


def mean_square(outputs):
    return ops.mean(ops.square(outputs))


@pytest.mark.slow
@pytest.mark.parametrize("make", [encoder, decoder, conformer], ids=lambda f: f.__name__)
def test_remat_gives_the_plain_outputs_gradients_and_state(make):
    plain, remat = two_blocks(make, remat=False), two_blocks(make, remat=True)
    remat.set_weights(plain.get_weights())
    inputs = [TOKENS, SOURCE, SOURCE_MASK]
    outputs, grads, state = training_step_results(plain, inputs, mean_square)
    remat_outputs, remat_grads, remat_state = training_step_results(remat, inputs, mean_square)
    assert len(state) >= 4  # the dropout seeds at least
    assert_all_close(outputs, remat_outputs, 1e-5, "output")
    assert_all_close(grads, remat_grads, 1e-5, "gradient")
    assert_all_close(state, remat_state, 1e-5, "state")
    assert max(np.abs(g).max() for g in grads) > 0


def test_a_scope_without_the_name_changes_nothing():
    with keras.RematScope(mode="list_of_layers", layer_names=["another_layer"]):
        block = encoder("block_0")
    x = RNG.standard_normal((2, 5, 8)).astype("float32")
    call = block.rematerialized_call(block.call, x, training=True)
    assert call == block.call


@pytest.mark.jax_only  # a fact about JAX programs
def test_jax_program_checkpoints_each_listed_block_in_training_only():
    import jax

    inputs = [TOKENS, SOURCE, SOURCE_MASK]

    def checkpoints(model, training, grad=False):
        trainable = [v.value for v in model.trainable_variables]
        state = [v.value for v in model.non_trainable_variables]

        def loss(values):
            outputs, _ = model.stateless_call(values, state, inputs, training=training)
            return mean_square(outputs)

        return checkpoint_count(jax.make_jaxpr(jax.grad(loss) if grad else loss)(trainable).jaxpr)

    remat = two_blocks(encoder, remat=True)
    assert checkpoints(remat, training=True) == len(NAMES)  # not the sublayers
    assert checkpoints(remat, training=True, grad=True) > 0
    assert checkpoints(remat, training=False, grad=True) == 0
    assert checkpoints(two_blocks(encoder, remat=False), training=True, grad=True) == 0
