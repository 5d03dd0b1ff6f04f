import itertools
import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from keras_attn.models.transformer import TransformerConfig
from keras_attn.models.transformer import build_transformer
from keras_attn.models.transformer.decoding import TransformerTranslator
from keras_attn.models.transformer.decoding import beam_search
from keras_attn.models.transformer.decoding import expand_to_beams
from keras_attn.models.transformer.decoding import greedy_search
from keras_attn.models.transformer.decoding import transformer_beam_search
from keras_attn.models.transformer.decoding import transformer_greedy_search
from test_case import to_numpy

PAD, EOS, START = 0, 1, 2
TINY = TransformerConfig(
    vocabulary_size=13, hidden_dim=8, intermediate_dim=16, num_heads=2,
    num_encoder_layers=1, num_decoder_layers=2, dropout=0.0, max_sequence_length=24,
)


# === Generic searches over fixed next-token tables ===


def table_step_fn(tables):
    """Next-token log-probabilities from `tables[parity][last token]`, where
    parity counts the 3s fed so far (mod 2): the state must follow each
    hypothesis, so a wrong reordering changes the results."""
    tables = ops.convert_to_tensor(np.log(np.asarray(tables, "float64")).astype("float32"))

    def step_fn(token_ids, index, count):
        count = count + ops.cast(ops.equal(token_ids, 3), "int32")
        rows = ops.take(tables, count % 2, axis=0)  # (N, V, V)
        logits = ops.take_along_axis(rows, token_ids[:, None, None], axis=1)[:, 0]
        return logits, count

    return step_fn


def random_tables(seed, vocab=4):
    rng = np.random.default_rng(seed)
    tables = rng.dirichlet(np.ones(vocab), size=(2, vocab))
    tables[..., PAD] = 1e-13  # padding is never a real next token
    return tables / tables.sum(-1, keepdims=True)


def brute_force(tables, max_length, alpha):
    """Best GNMT-scored sequence over every sequence of real tokens."""
    vocab = tables.shape[-1]
    best = (-math.inf, None)
    for length in range(1, max_length + 1):
        for seq in itertools.product(range(1, vocab), repeat=length):
            if EOS in seq[:-1] or (length < max_length and seq[-1] != EOS):
                continue
            log_prob, last, count = 0.0, START, 0
            for token in seq:
                count += last == 3
                log_prob += math.log(tables[count % 2, last, token])
                last = token
            score = log_prob / ((5 + length) / 6) ** alpha
            best = max(best, (score, seq))
    return best


def run_beam(tables, batch=1, **kwargs):
    k = kwargs.get("beam_width", 4)
    start = np.full((batch,), START, "int32")
    state = expand_to_beams(ops.zeros((batch,), "int32"), k)
    return beam_search(table_step_fn(tables), state, start, end_id=EOS, pad_id=PAD, **kwargs)


def as_sequence(row):
    row = list(np.asarray(row))
    return tuple(row[: row.index(EOS) + 1] if EOS in row else row)


def test_beam_search_finds_the_known_best_sequence():
    # Tokens 3 = "a", 4 = "b". After the start: a 0.6, b 0.4. After a:
    # EOS 0.3, a 0.35, b 0.35. After b: EOS 0.9, a 0.05, b 0.05.
    # Greedy: a a a (no EOS within 3 tokens), log(0.6 * 0.35 * 0.35) = -2.54.
    # Best: b EOS, log(0.4 * 0.9) = -1.02, which a beam of 2 keeps.
    tiny = 1e-13
    table = np.full((5, 5), tiny)
    table[START] = [tiny, tiny, tiny, 0.6, 0.4]
    table[3] = [tiny, 0.3, tiny, 0.35, 0.35]
    table[4] = [tiny, 0.9, tiny, 0.05, 0.05]
    tables = np.stack([table, table])
    greedy = greedy_search(
        table_step_fn(tables), ops.zeros((1,), "int32"), np.array([START], "int32"),
        max_length=3, end_id=EOS,
    )
    assert to_numpy(greedy).tolist() == [[3, 3, 3]]
    tokens, scores = run_beam(tables, beam_width=2, alpha=0.0, max_length=3)
    assert to_numpy(tokens).tolist() == [[4, EOS, PAD]]
    np.testing.assert_allclose(float(to_numpy(scores)[0]), math.log(0.4 * 0.9), rtol=1e-5)
    assert brute_force(tables, 3, 0.0)[1] == (4, EOS)
    # The GNMT score with alpha 3: b EOS -1.02 / (7/6)^3 = -0.64 still beats
    # a b EOS at log(0.6 * 0.35 * 0.9) / (8/6)^3 = -0.70.
    tokens, scores = run_beam(tables, beam_width=2, alpha=3.0, max_length=3)
    assert to_numpy(tokens).tolist() == [[4, EOS, PAD]]
    expected_score = math.log(0.4 * 0.9) / (7 / 6) ** 3
    np.testing.assert_allclose(float(to_numpy(scores)[0]), expected_score, rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_wide_beam_equals_exhaustive_search(seed, alpha):
    # 3 real tokens, length <= 4: a beam of 32 never drops a hypothesis.
    tables = random_tables(seed)
    tokens, scores = run_beam(tables, beam_width=32, alpha=alpha, max_length=4)
    expected_score, expected = brute_force(tables, 4, alpha)
    assert as_sequence(to_numpy(tokens)[0]) == expected
    np.testing.assert_allclose(float(to_numpy(scores)[0]), expected_score, rtol=1e-5)


@pytest.mark.parametrize("seed", [3, 4, 5, 6])
def test_beam_width_one_is_greedy(seed):
    tables = random_tables(seed, vocab=5)
    greedy = greedy_search(
        table_step_fn(tables), ops.zeros((3,), "int32"), np.full((3,), START, "int32"),
        max_length=6, end_id=EOS,
    )
    tokens, _ = run_beam(tables, batch=3, beam_width=1, alpha=0.0, max_length=6)
    np.testing.assert_array_equal(to_numpy(tokens), to_numpy(greedy))


def test_search_stops_when_every_sentence_has_ended():
    tables = np.full((2, 4, 4), 1e-6)
    tables[..., EOS] = 1.0  # EOS is certain from the first step
    calls = []
    inner = table_step_fn(tables)

    def counting_step_fn(*args):
        if keras.backend.backend() == "jax":
            import jax

            # The loop body is traced once: count its executions instead.
            jax.debug.callback(lambda: calls.append(1))
        else:
            calls.append(1)  # eager TensorFlow and PyTorch: one call per step
        return inner(*args)

    start = np.full((2,), START, "int32")
    tokens = greedy_search(counting_step_fn, ops.zeros((2,), "int32"), start, 10, EOS)
    assert len(calls) == 1 and to_numpy(tokens).tolist() == [[EOS] + [PAD] * 9] * 2
    calls.clear()
    state = expand_to_beams(ops.zeros((2,), "int32"), 3)
    tokens, _ = beam_search(counting_step_fn, state, start, 10, EOS, beam_width=3)
    # Step 1 ends the best beam; the 2 other live beams ("x") end at step 2
    # ("x EOS"), after which nothing live can beat the 3 finished ones.
    assert len(calls) == 2 and to_numpy(tokens).tolist() == [[EOS] + [PAD] * 9] * 2


def test_return_all_beams_sorted_and_errors():
    tokens, scores = run_beam(random_tables(7), beam_width=3, alpha=0.6, max_length=4, return_all_beams=True)
    assert tuple(tokens.shape) == (1, 3, 4) and tuple(scores.shape) == (1, 3)
    scores = to_numpy(scores)[0]
    assert np.all(np.diff(scores) <= 0)
    with pytest.raises(ValueError, match="Received: max_length=0"):
        run_beam(random_tables(7), max_length=0)
    with pytest.raises(ValueError, match="Received: beam_width=0"):
        run_beam(random_tables(7), beam_width=0, max_length=3)


# === With a Transformer ===


@pytest.fixture(scope="module")
def built():
    """`built(kind)`: each model made once a module, so that `model` and
    `default_model` give one object (what a backend compiled for it serves
    both)."""
    models = {}

    def get(kind):
        if kind not in models:
            keras.utils.set_random_seed(7)
            if kind == "small_keys":  # d_k != d_v, as in Table 3 row (B)
                models[kind] = build_transformer(TINY, key_dim=2, value_dim=6)
            else:
                models[kind] = build_transformer(TINY)
        return models[kind]

    return get


@pytest.fixture(scope="module", params=["default", "small_keys"])
def model(request, built):
    """Both models: for the tests of the decoding cache, whose key and value
    entries d_k and d_v shape (step by step, in the searches, in a compiled
    loop)."""
    return built(request.param)


@pytest.fixture(scope="module")
def default_model(built):
    """The default model alone: for the searches' other contracts (batch
    mates, beam width 1, length limits, `predict`), which d_k and d_v do not
    touch; `model`'s tests above check the cache of d_k != d_v."""
    return built("default")


def sources():
    rng = np.random.default_rng(0)
    x = rng.integers(3, 13, (3, 6)).astype("int32")
    x[1, 4:] = PAD
    x[2, 2:] = PAD
    return x


def test_cached_decode_step_equals_full_decoder(model):
    source = sources()
    target = np.random.default_rng(1).integers(3, 13, (3, 5)).astype("int32")
    encoder_output, mask = model.encode(source)
    full = to_numpy(model.decode(target, encoder_output, mask))
    np.testing.assert_allclose(full, to_numpy(model([source, target])), atol=1e-5)
    state = model.init_decoding_state(encoder_output, mask, 5)
    steps = []
    for i in range(5):
        logits, state = model.decode_step(target[:, i], i, state)
        steps.append(to_numpy(logits))
    np.testing.assert_allclose(np.stack(steps, 1), full, atol=1e-5)


def test_cached_search_equals_recomputing_the_prefix(model):
    source = sources()
    kwargs = dict(start_id=START, end_id=EOS, max_length=7)
    np.testing.assert_array_equal(
        to_numpy(transformer_greedy_search(model, source, **kwargs)),
        to_numpy(transformer_greedy_search(model, source, use_cache=False, **kwargs)),
    )
    cached = transformer_beam_search(model, source, beam_width=3, **kwargs)
    recomputed = transformer_beam_search(model, source, beam_width=3, use_cache=False, **kwargs)
    np.testing.assert_array_equal(to_numpy(cached[0]), to_numpy(recomputed[0]))
    np.testing.assert_allclose(to_numpy(cached[1]), to_numpy(recomputed[1]), atol=1e-4)


def test_a_batch_equals_single_sentences(default_model):
    model = default_model
    source = sources()
    kwargs = dict(start_id=START, end_id=EOS, max_length=6)
    greedy = to_numpy(transformer_greedy_search(model, source, **kwargs))
    tokens, scores = transformer_beam_search(model, source, **kwargs)
    for row in range(3):
        single = source[row : row + 1, : int((source[row] != PAD).sum())]  # unpadded
        np.testing.assert_array_equal(
            to_numpy(transformer_greedy_search(model, single, **kwargs))[0], greedy[row]
        )
        one_tokens, one_scores = transformer_beam_search(model, single, **kwargs)
        np.testing.assert_array_equal(to_numpy(one_tokens)[0], to_numpy(tokens)[row])
        np.testing.assert_allclose(to_numpy(one_scores)[0], to_numpy(scores)[row], atol=1e-5)


def test_transformer_beam_width_one_is_greedy(default_model):
    model = default_model
    source = sources()
    kwargs = dict(start_id=START, end_id=EOS, max_length=8)
    tokens, _ = transformer_beam_search(model, source, beam_width=1, alpha=0.0, **kwargs)
    np.testing.assert_array_equal(
        to_numpy(tokens), to_numpy(transformer_greedy_search(model, source, **kwargs))
    )


def test_max_length_one_and_length_limits(default_model):
    model = default_model
    source = sources()
    greedy = to_numpy(transformer_greedy_search(model, source, START, EOS, max_length=1))
    tokens, scores = transformer_beam_search(model, source, START, EOS, max_length=1)
    assert greedy.shape == (3, 1) and tuple(tokens.shape) == (3, 1)
    # One step: both take the most likely first token.
    np.testing.assert_array_equal(to_numpy(tokens), greedy)
    assert np.all(np.isfinite(to_numpy(scores)))
    # Default: source width + 50, capped by max_sequence_length (24 here).
    assert tuple(transformer_greedy_search(model, source, START, EOS).shape) == (3, 24)
    with pytest.raises(ValueError, match="Received: max_length=25"):
        transformer_greedy_search(model, source, START, EOS, max_length=25)
    # The start token may be the pad id (Marian's convention): the first
    # decoder position is never masked as padding, so the cached steps and the
    # full decoder pass on the prefix agree.
    cached = to_numpy(transformer_greedy_search(model, source, PAD, EOS, max_length=5))
    recomputed = transformer_greedy_search(model, source, PAD, EOS, max_length=5,
                                           use_cache=False)
    np.testing.assert_array_equal(cached, to_numpy(recomputed))


@pytest.mark.tf_only
def test_search_compiles_to_one_graph_loop(model):
    source = sources()
    expected = to_numpy(transformer_beam_search(model, source, START, EOS, max_length=6)[0])
    compiled = tf.function(
        lambda s: transformer_beam_search(model, s, START, EOS, max_length=6)[0],
        input_signature=[tf.TensorSpec((None, None), tf.int32)],
    )
    graph = compiled.get_concrete_function().graph
    assert any(op.type in ("While", "StatelessWhile") for op in graph.get_operations())
    np.testing.assert_array_equal(compiled(source).numpy(), expected)


def test_translator_predict_equals_the_searches(default_model):
    model = default_model
    """`predict` compiles the search on TensorFlow and JAX (one XLA / graph
    loop) and runs it step by step on PyTorch: the same tokens everywhere."""
    source = sources()
    expected = to_numpy(transformer_beam_search(model, source, START, EOS, max_length=6)[0])
    translator = TransformerTranslator(model, START, EOS, beam_width=4, max_length=6)
    tokens, scores = translator.predict(source, verbose=0)
    np.testing.assert_array_equal(tokens, expected)
    greedy = TransformerTranslator(model, START, EOS, beam_width=None, max_length=6)
    np.testing.assert_array_equal(
        greedy.predict(source, verbose=0)[0],
        to_numpy(transformer_greedy_search(model, source, START, EOS, max_length=6)),
    )
    config = translator.get_config()
    assert TransformerTranslator.from_config(config).get_config() == config


def test_cached_decoding_with_learned_positions_pre_norm_and_separate_vocabularies():
    import dataclasses

    keras.utils.set_random_seed(3)
    variant = build_transformer(
        dataclasses.replace(
            TINY, norm_position="pre", position_embedding="learned", target_vocabulary_size=11
        )
    )
    source = sources()
    target = np.random.default_rng(2).integers(3, 11, (3, 6)).astype("int32")
    encoder_output, mask = variant.encode(source)
    full = to_numpy(variant.decode(target, encoder_output, mask))
    np.testing.assert_allclose(full, to_numpy(variant([source, target])), atol=1e-5)
    state = variant.init_decoding_state(encoder_output, mask, 6)
    steps = []
    for i in range(6):
        logits, state = variant.decode_step(target[:, i], ops.convert_to_tensor(i), state)
        steps.append(to_numpy(logits))
    np.testing.assert_allclose(np.stack(steps, 1), full, atol=1e-5)
    # Make padding the most likely output: it must still never be generated.
    bias = variant.get_layer("output_projection").bias
    bias.assign(np.where(np.arange(11) == PAD, 50.0, to_numpy(bias)).astype("float32"))
    kwargs = dict(start_id=START, end_id=EOS, max_length=5)
    tokens = to_numpy(transformer_beam_search(variant, source, **kwargs)[0])
    assert all(PAD not in as_sequence(row) for row in tokens)  # filler only after EOS
    np.testing.assert_array_equal(
        tokens, to_numpy(transformer_beam_search(variant, source, use_cache=False, **kwargs)[0])
    )
    greedy = to_numpy(transformer_greedy_search(variant, source, **kwargs))
    assert all(PAD not in as_sequence(row) for row in greedy)
    np.testing.assert_array_equal(
        greedy, to_numpy(transformer_greedy_search(variant, source, use_cache=False, **kwargs))
    )


def test_a_source_the_model_cannot_read_gets_minus_two_and_nan_alone():
    """Where Python runs, an id outside the vocabulary is a ValueError naming
    `source_ids` (docs/bad_input.md). Inside a compiled search nothing can
    raise: the model makes such a row's encoder output NaN (as it does past a
    learned position table in a graph of free length), and the search gives
    that sentence tokens of -2 and a NaN score (never a plausible
    translation), its batch mates what they get alone: held here with a
    NaN in the embedding row of one id (the exports' graphs:
    tests/export/test_portable.py)."""
    import dataclasses

    keras.utils.set_random_seed(5)
    # Source and target vocabularies apart: a NaN source embedding row below
    # touches the encoder alone.
    learned = build_transformer(dataclasses.replace(
        TINY, position_embedding="learned", max_sequence_length=8, target_vocabulary_size=13))
    kwargs = dict(start_id=START, end_id=EOS, max_length=5)
    good = sources()[:1]
    for bad, value in ((np.array([[5, 13, 3, 4, 5, 6]], "int32"), 13),
                       (np.array([[-1, 3, 0, 0, 0, 0]], "int32"), -1),
                       (np.array([[5, 2**32 + 3, 3, 0, 0, 0]], "int64"), 2**32 + 3)):
        batch = np.concatenate([good.astype(bad.dtype), bad])
        for search in (transformer_beam_search, transformer_greedy_search):
            with pytest.raises(ValueError, match=rf"`source_ids` must lie in \[0, 13\) "
                                                 rf"\(the source vocabulary\).*{value}"):
                search(learned, batch, **kwargs)
    alone = [to_numpy(x) for x in transformer_beam_search(learned, good, **kwargs)]
    alone_greedy = to_numpy(transformer_greedy_search(learned, good, **kwargs))
    too_long = np.full((2, 9), 5, "int32")
    too_long[0, 6:] = PAD  # the padded width is past the table: both rows
    broken = 12
    assert broken not in good
    table = to_numpy(learned.get_layer("source_token_embedding").embeddings).copy()
    table[broken] = float("nan")
    learned.get_layer("source_token_embedding").embeddings.assign(table)
    batch = np.concatenate([good, np.array([[5, broken, 3, 4, 5, 6]], "int32")])
    tokens, scores = (to_numpy(x) for x in transformer_beam_search(learned, batch, **kwargs))
    greedy = to_numpy(transformer_greedy_search(learned, batch, **kwargs))
    assert (tokens[1] == -2).all() and np.isnan(scores[1]) and (greedy[1] == -2).all()
    np.testing.assert_array_equal(tokens[:1], alone[0])
    np.testing.assert_allclose(scores[:1], alone[1], atol=1e-5)
    np.testing.assert_array_equal(greedy[:1], alone_greedy)
    # A static width past the table is refused here; a graph with a free
    # length (an export) gets -2 rows (tests/export/test_portable.py).
    with pytest.raises(ValueError, match="Received: sequence length=9"):
        transformer_beam_search(learned, too_long, **kwargs)


def test_unknown_length_penalty_is_refused(default_model):
    model = default_model
    with pytest.raises(ValueError, match="Received: length_penalty='google'"):
        transformer_beam_search(model, sources(), START, EOS, max_length=2, length_penalty="google")
