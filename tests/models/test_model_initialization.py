"""Every randomly initialised weight of a freshly built model of each family is
its own draw: no two projections, blocks or embeddings start equal (before
the fix every attention layer started with W_Q == W_K == W_V)."""

import pytest

from _families import FAMILIES
from _families import NAMES
from keras_attn.models import build_bert
from test_case import assert_distinct_draws


@pytest.mark.parametrize("family", NAMES)
def test_family_weights_are_distinct_draws(family):
    assert_distinct_draws(FAMILIES[family].build().weights)


def test_bert_tiny_preset_weights_are_distinct_draws():
    # The reproducer at the preset's own size (W_Q == W_K in every layer).
    assert_distinct_draws(build_bert("bert_tiny", vocabulary_size=64).weights)


def test_transformer_with_separate_embeddings_distinct():
    model = FAMILIES["transformer"].build(target_vocabulary_size=24)
    assert_distinct_draws(model.weights)
