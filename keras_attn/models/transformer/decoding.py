"""Greedy and beam-search decoding as one `keras.ops.while_loop`.

The searches are generic: they drive a step function

    step_fn(token_ids, index, state) -> (logits, state)

that maps the last token of every hypothesis `(N,)` at position `index`
(a scalar tensor) to next-token logits `(N, V)`, carrying a `state` (any
nest of tensors with a leading `N` axis, e.g. key/value caches). Nothing
loops in Python per token: in a compiled function (`tf.function`,
`jax.jit`, `Model.predict`) the whole search is one graph loop, and it
stops as soon as every sentence is finished.

`transformer_greedy_search` / `transformer_beam_search` plug a `Transformer`
in: the encoder runs once, the cross-attention keys/values are projected
once, and each step runs the decoder on one token per hypothesis with the
self-attention cache. `TransformerTranslator` wraps them in a `keras.Model`
so that `predict` compiles the loop and SavedModel export serves it.

Outputs are `(B, max_length)` int32 token ids: the generated tokens, the
end token included, `pad_id` after it (no start token).
"""

import keras
import numpy as np
from keras import ops

from keras_attn._checks import check_positive_int
from keras_attn._guard import check_ids
from keras_attn._guard import concrete_value

NEG_INF = -1e9  # finite, so that `-inf - -inf` never makes a NaN


def _while(cond, body, loop_vars):
    """`ops.while_loop` over a nest of tensors (flattened for the backends)."""
    flat = keras.tree.flatten(loop_vars)

    def unflat(values):
        return keras.tree.pack_sequence_as(loop_vars, list(values))

    def flat_cond(*values):
        return cond(unflat(values))

    def flat_body(*values):
        return tuple(keras.tree.flatten(body(unflat(values))))

    return unflat(ops.while_loop(flat_cond, flat_body, tuple(flat)))


def _write_column(tokens, index, values):
    """`tokens[..., index] = values` with a traced index. (..., L), (...)"""
    length = ops.shape(tokens)[-1]
    at = ops.equal(ops.arange(length, dtype="int32"), index)  # (L,)
    return ops.where(at, ops.expand_dims(values, -1), tokens)


def _check_max_length(max_length):
    return check_positive_int("max_length", max_length)


_INT32_MAX = 2 ** 31 - 1


def _start_ids(start_ids):
    """`(start_ids as int32 (B,), broken)`: token ids are checked in their
    own dtype before the cast (an int64 2**32 + 3 would wrap to a valid 3).
    Where the values exist now an id outside [0, 2**31) is a `ValueError`
    naming it (`broken` is None); in a traced search `broken` `(B,)` marks
    those rows, whose tokens become -2 (and scores NaN), never another
    start's output."""
    values = concrete_value(start_ids)
    if values is not None:
        values = np.asarray(values)
        if values.dtype.kind in "iu" and values.size:
            outside = (values < 0) | (values > _INT32_MAX)
            if outside.any():
                row = int(np.flatnonzero(outside.ravel())[0])
                raise ValueError(
                    "Invalid value for argument `start_ids`: token ids must lie in "
                    f"[0, {_INT32_MAX}] (an id past int32 would wrap when cast). Received: "
                    f"start_ids[{row}]={int(values.ravel()[row])}")
        return ops.cast(ops.convert_to_tensor(values), "int32"), None
    start_ids = ops.convert_to_tensor(start_ids)
    if keras.backend.standardize_dtype(start_ids.dtype) not in ("int64", "uint32", "uint64"):
        return ops.cast(start_ids, "int32"), None
    # Ids that int32 may not hold: their range in their own dtype, before the cast.
    broken = ops.logical_or(start_ids < 0, start_ids > _INT32_MAX)  # (B,)
    return ops.cast(start_ids, "int32"), broken


def _mark_rows(broken, tokens, scores=None):
    """Tokens -2 (scores NaN) for the rows `broken` `(B,)` (None: none)."""
    if broken is None:
        return tokens if scores is None else (tokens, scores)
    rows = ops.reshape(broken, (-1,) + (1,) * (len(tokens.shape) - 1))
    tokens = ops.where(rows, INVALID_ID, tokens)
    if scores is None:
        return tokens
    rows = ops.reshape(broken, (-1,) + (1,) * (len(scores.shape) - 1))
    return tokens, ops.where(rows, float("nan"), scores)


def greedy_search(step_fn, state, start_ids, max_length, end_id, pad_id=0):
    """Arg-max decoding.

    Args:
        step_fn: `(token_ids (B,), index, state) -> (logits (B, V), state)`.
        state: the initial state (leaves with a leading B axis).
        start_ids: `(B,)` int32 first input tokens (the start token).
        max_length: number of tokens to generate at most (a Python int).
        end_id: the end token; a sentence that produced it is finished and
            gets `pad_id` afterwards.
        pad_id: filler after the end.

    Returns:
        `(B, max_length)` int32 tokens.
    """
    max_length = _check_max_length(max_length)
    start_ids, broken = _start_ids(start_ids)
    batch = ops.shape(start_ids)[0]
    tokens = ops.full((batch, max_length), pad_id, dtype="int32")
    finished = ops.zeros((batch,), dtype="bool")

    def cond(loop):
        index, _, _, finished, _ = loop
        return ops.logical_and(index < max_length, ops.logical_not(ops.all(finished)))

    def body(loop):
        index, last, tokens, finished, state = loop
        logits, state = step_fn(last, index, state)
        next_ids = ops.cast(ops.argmax(logits, axis=-1), "int32")  # (B,)
        next_ids = ops.where(finished, pad_id, next_ids)
        tokens = _write_column(tokens, index, next_ids)
        finished = ops.logical_or(finished, ops.equal(next_ids, end_id))
        return index + 1, next_ids, tokens, finished, state

    loop = (ops.convert_to_tensor(0, "int32"), start_ids, tokens, finished, state)
    return _mark_rows(broken, _while(cond, body, loop)[2])


LENGTH_PENALTIES = ("gnmt", "hf")


def length_penalty(length, alpha, convention="gnmt"):
    """GNMT's `((5 + length) / 6) ** alpha` (Wu et al., 2016, section 7), or
    with `convention="hf"` Hugging Face's `length ** alpha`."""
    length = ops.cast(length, "float32")
    if convention == "hf":
        return ops.power(length, alpha)
    return ops.power((5.0 + length) / 6.0, alpha)


_penalty = length_penalty  # for `beam_search`, whose argument takes the name


def expand_to_beams(x, beam_width):
    """Repeats each row `beam_width` times: `(B, ...) -> (B * K, ...)`, rows
    of one sentence next to each other (the layout `beam_search` uses)."""
    return ops.repeat(x, beam_width, axis=0)


def beam_search(
    step_fn,
    state,
    start_ids,
    max_length,
    end_id,
    beam_width=4,
    alpha=0.6,
    pad_id=0,
    return_all_beams=False,
    length_penalty="gnmt",
):
    """Beam search with the GNMT length penalty (or Hugging Face's).

    Keeps `beam_width` (K) live hypotheses per sentence. Each step scores the
    K x V extensions by total log-probability and takes the best 2K: a
    candidate ending with `end_id` among the top K enters the sentence's
    finished set with the score `log_prob / ((5 + length) / 6) ** alpha`
    (length counts the end token), the best K others stay alive. At
    `max_length` the top K candidates are finished as they are. A sentence is
    done when its K-th best finished score is at least what its best live
    hypothesis could still reach (`log_prob / penalty(max_length)`: log
    probabilities only fall); the loop stops when every sentence is done.
    With `beam_width=1` and `alpha=0` this is exactly greedy search.

    `length_penalty="hf"` follows Hugging Face's `generate` (`num_beams=K`,
    `length_penalty=alpha`, the default `early_stopping=False`): finished
    scores are `log_prob / length ** alpha`, and a sentence stops taking
    finished hypotheses once its best live one, scored at its current
    length, no longer beats its K-th finished one (a heuristic: with
    `alpha > 0` a longer hypothesis could still have won); the loop stops
    when no sentence can improve. The same model then gives Hugging Face's
    tokens and `sequences_scores` (tested against Marian models), with one
    difference: the pad id is removed from the softmax here, where
    `bad_words_ids` sets its log-probability to -inf after it, so scores
    agree when the model gives the pad id a negligible probability, as
    trained translation models do.

    Args:
        step_fn: `(token_ids (B*K,), index, state) -> (logits (B*K, V), state)`.
            Rows `b*K .. b*K + K - 1` are sentence b's hypotheses.
        state: the initial state with leaves of leading axis `B * K` (see
            `expand_to_beams`); reordered along that axis as hypotheses are
            selected. Closed-over tensors that do not depend on the
            hypothesis (an encoder output) need no reordering: keep them out
            of `state`.
        start_ids: `(B,)` int32 start tokens.
        max_length: tokens to generate at most (a Python int).
        end_id: the end token.
        beam_width: K.
        alpha: the length penalty exponent (0.6 in the Transformer paper; 0
            ranks by total log-probability).
        pad_id: filler after the end token.
        return_all_beams: return all K finished hypotheses per sentence.
        length_penalty: `"gnmt"` (the Transformer paper's) or `"hf"`.

    Returns:
        `(tokens (B, max_length), scores (B,))`, best first; with
        `return_all_beams`, `(B, K, max_length)` and `(B, K)` sorted by score.
    """
    max_length = _check_max_length(max_length)
    k = check_positive_int("beam_width", beam_width)
    alpha = float(alpha)
    convention = length_penalty
    if convention not in LENGTH_PENALTIES:
        raise ValueError(f"`length_penalty` must be one of {LENGTH_PENALTIES}. "
                         f"Received: length_penalty={convention!r}")
    penalty = _penalty
    start_ids, broken = _start_ids(start_ids)
    batch = ops.shape(start_ids)[0]
    penalty_at_max = penalty(max_length, alpha, convention)

    alive_tokens = ops.full((batch, k, max_length), pad_id, dtype="int32")
    # Only the first copy of each sentence is live at the start, so that the
    # K beams do not all pick the same first token.
    alive_log_probs = ops.tile(
        ops.convert_to_tensor([[0.0] + [NEG_INF] * (k - 1)], "float32"), (batch, 1)
    )  # (B, K)
    finished_tokens = ops.full((batch, k, max_length), pad_id, dtype="int32")
    finished_scores = ops.full((batch, k), NEG_INF, dtype="float32")
    # "hf": whether each sentence may still take finished hypotheses.
    improvable = ops.ones((batch,), dtype="bool")
    last = expand_to_beams(start_ids, k)  # (B*K,)
    # Batch offsets that turn a per-sentence beam index into a row of state.
    offsets = ops.expand_dims(ops.arange(batch, dtype="int32"), 1) * k  # (B, 1)

    def cond(loop):
        index, _, _, alive_log_probs, _, finished_scores, improvable, _ = loop
        if convention == "hf":
            return ops.logical_and(index < max_length, ops.any(improvable))
        best_alive = ops.max(alive_log_probs, axis=1) / penalty_at_max  # (B,)
        worst_finished = ops.min(finished_scores, axis=1)  # (B,)
        done = ops.all(worst_finished >= best_alive)
        return ops.logical_and(index < max_length, ops.logical_not(done))

    def body(loop):
        (index, last, alive_tokens, alive_log_probs, finished_tokens, finished_scores,
         improvable, state) = loop
        logits, state = step_fn(last, index, state)
        vocabulary = logits.shape[-1] or ops.shape(logits)[-1]
        log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
        log_probs = ops.reshape(log_probs, (batch, k, -1))  # (B, K, V)
        candidates = ops.expand_dims(alive_log_probs, -1) + log_probs  # (B, K, V)
        candidates = ops.reshape(candidates, (batch, -1))  # (B, K*V)
        num_candidates = min(2 * k, k * vocabulary) if isinstance(vocabulary, int) else 2 * k
        top_log_probs, top_index = ops.top_k(candidates, num_candidates)  # (B, 2K)
        top_index = ops.cast(top_index, "int32")
        origin = top_index // vocabulary  # (B, 2K) beam each candidate extends
        token = top_index % vocabulary  # (B, 2K)
        top_tokens = ops.take_along_axis(alive_tokens, ops.expand_dims(origin, 2), axis=1)
        top_tokens = _write_column(top_tokens, index, token)  # (B, 2K, L)

        # Finished: a top-K candidate that ends, or any top-K at max_length.
        in_top_k = ops.arange(num_candidates) < k  # (2K,)
        ends = ops.logical_or(ops.equal(token, end_id), index == max_length - 1)
        ends = ops.logical_and(ends, ops.expand_dims(in_top_k, 0))
        if convention == "hf":
            ends = ops.logical_and(ends, ops.expand_dims(improvable, 1))
        scores = top_log_probs / penalty(index + 1, alpha, convention)
        scores = ops.where(ends, scores, NEG_INF)
        # Finished entries first, so a tie keeps the earlier (shorter) one.
        pool_scores = ops.concatenate([finished_scores, scores], axis=1)  # (B, 3K)
        pool_tokens = ops.concatenate([finished_tokens, top_tokens], axis=1)
        finished_scores, keep = ops.top_k(pool_scores, k)  # (B, K)
        finished_tokens = ops.take_along_axis(
            pool_tokens, ops.expand_dims(ops.cast(keep, "int32"), 2), axis=1
        )

        # Alive: the best K candidates that did not end.
        live = ops.where(ops.equal(token, end_id), NEG_INF, top_log_probs)
        alive_log_probs, keep = ops.top_k(live, k)  # (B, K)
        keep = ops.cast(keep, "int32")
        alive_tokens = ops.take_along_axis(top_tokens, ops.expand_dims(keep, 2), axis=1)
        rows = ops.reshape(ops.take_along_axis(origin, keep, axis=1) + offsets, (-1,))
        state = keras.tree.map_structure(lambda x: ops.take(x, rows, axis=0), state)
        last = ops.reshape(ops.take_along_axis(token, keep, axis=1), (-1,))  # (B*K,)
        if convention == "hf":
            # Hugging Face's early-stopping heuristic, at the length reached.
            best_alive = alive_log_probs[:, 0] / penalty(index + 1, alpha, convention)
            improvable = ops.logical_and(
                improvable, best_alive > ops.min(finished_scores, axis=1))
        return (index + 1, last, alive_tokens, alive_log_probs, finished_tokens,
                finished_scores, improvable, state)

    loop = (ops.convert_to_tensor(0, "int32"), last, alive_tokens, alive_log_probs,
            finished_tokens, finished_scores, improvable, state)
    loop = _while(cond, body, loop)
    finished_tokens, finished_scores = loop[4], loop[5]
    if return_all_beams:
        return _mark_rows(broken, finished_tokens, finished_scores)
    return _mark_rows(broken, finished_tokens[:, 0], finished_scores[:, 0])


# === The Transformer ===


def default_max_length(model, source_ids, extra=50):
    """`S + extra` (the paper's input length + 50), capped by the model's
    `max_sequence_length`. S is the padded source width; with an unknown
    width (a graph with a free length) the cap itself."""
    cap = model.transformer_config.max_sequence_length
    width = source_ids.shape[1]
    if width is None:
        return cap
    return min(int(width) + extra, cap)


def _check_length(model, max_length):
    cap = model.transformer_config.max_sequence_length
    max_length = _check_max_length(max_length)
    if max_length > cap:
        # Learned positions past the table would silently be NaN (a traced
        # start index cannot raise); refuse up front.
        raise ValueError(
            f"`max_length` is longer than the model's position table "
            f"(max_sequence_length={cap}). Received: max_length={max_length}"
        )
    return max_length


def make_transformer_step_fn(model, encoder_output, source_mask, max_length, use_cache=True):
    """A `(step_fn, state)` pair decoding with `model` over a fixed encoder
    output (rows already repeated per hypothesis where needed).

    With `use_cache` (the default), each step runs the decoder on one token
    per hypothesis against the self-attention cache, with the cross-attention
    keys/values computed here once and closed over; the state is the list of
    self-attention caches. Without it, the state is the prefix `(N, L)` and
    each step re-runs the full decoder on it (what the cache saves; kept
    for tests and benchmarks). Either way the pad id gets no probability:
    it is never generated.
    """
    pad_id = model.transformer_config.pad_id

    def no_padding(logits):
        # Padding is never an output: a generated pad id would be masked out
        # as input on the next steps (and the prefix would differ between the
        # cached and recomputed paths).
        vocabulary = ops.shape(logits)[-1]
        is_pad = ops.equal(ops.arange(vocabulary, dtype="int32"), pad_id)
        return ops.where(ops.expand_dims(is_pad, 0), ops.cast(NEG_INF, logits.dtype), logits)

    if not use_cache:
        prefix = ops.full((ops.shape(encoder_output)[0], max_length), pad_id, dtype="int32")

        def recompute(token_ids, index, prefix):
            prefix = _write_column(prefix, index, ops.cast(token_ids, "int32"))
            logits = model.decode(prefix, encoder_output, source_mask)  # (N, L, V)
            # Causal attention: position `index` sees only the prefix.
            at = ops.equal(ops.arange(max_length, dtype="int32"), index)
            logits = ops.sum(ops.where(ops.reshape(at, (1, -1, 1)), logits, 0.0), axis=1)
            return no_padding(logits), prefix

        return recompute, prefix

    initial = model.init_decoding_state(encoder_output, source_mask, max_length)
    constants = {"cross_caches": initial["cross_caches"], "source_mask": source_mask}

    def step_fn(token_ids, index, self_caches):
        logits, new = model.decode_step(token_ids, index, dict(constants, self_caches=self_caches))
        return no_padding(logits), new["self_caches"]

    return step_fn, initial["self_caches"]


def _prepare(model, source_ids, max_length, start_id):
    # Where Python runs (concrete ids), an id the model cannot read is an
    # error naming it, checked before the int32 cast (which would wrap an
    # int64 id); inside a compiled search such a row is marked -2 / NaN
    # (`_mark_invalid`).
    concrete = concrete_value(source_ids)
    if concrete is not None and hasattr(model, "input_specs"):
        spec = model.input_specs().get("source_ids")
        if spec is not None:
            check_ids("source_ids", concrete, spec)
    source_ids = ops.convert_to_tensor(source_ids, "int32")
    if max_length is None:
        max_length = default_max_length(model, source_ids)
    max_length = _check_length(model, max_length)
    start = ops.zeros((ops.shape(source_ids)[0],), dtype="int32")
    return source_ids, max_length, start


INVALID_ID = -2


def _mark_invalid(encoder_output, tokens, scores=None):
    """Rows whose encoder output is not finite (the model makes it NaN for an
    id outside the vocabulary, or a source past a learned position table:
    nothing can raise inside a compiled search) get tokens of -2 and a NaN
    score, never a plausible translation."""
    broken = ops.logical_not(ops.all(ops.isfinite(encoder_output), axis=(1, 2)))  # (B,)
    return _mark_rows(broken, tokens, scores)


def transformer_greedy_search(
    model, source_ids, start_id, end_id, max_length=None, use_cache=True
):
    """Greedy translation of `source_ids (B, S)` with a `Transformer`.

    Returns `(B, max_length)` int32 tokens (see the module docstring; a
    sentence with an id outside the vocabulary, or past a learned position
    table, gets tokens of -2). `use_cache=False` re-runs the decoder on the whole prefix at each step
    (same tokens, slower)."""
    source_ids, max_length, start = _prepare(model, source_ids, max_length, start_id)
    encoder_output, source_mask = model.encode(source_ids)
    step_fn, state = make_transformer_step_fn(
        model, encoder_output, source_mask, max_length, use_cache
    )
    tokens = greedy_search(
        step_fn, state, start + start_id, max_length, end_id,
        pad_id=model.transformer_config.pad_id,
    )
    return _mark_invalid(encoder_output, tokens)


def transformer_beam_search(
    model,
    source_ids,
    start_id,
    end_id,
    beam_width=4,
    alpha=0.6,
    max_length=None,
    return_all_beams=False,
    use_cache=True,
    length_penalty="gnmt",
):
    """Beam-search translation of `source_ids (B, S)` with a `Transformer`.

    The encoder runs once on the B sentences; its output and the
    cross-attention keys/values are repeated K times and closed over (never
    reordered); only the self-attention caches follow the hypotheses.

    Returns `(tokens (B, max_length), scores (B,))` (see `beam_search`;
    `length_penalty="hf"` follows Hugging Face's convention). A sentence
    with an id outside the vocabulary, or past a learned position table,
    gets tokens of -2 and a NaN score.
    """
    source_ids, max_length, start = _prepare(model, source_ids, max_length, start_id)
    k = check_positive_int("beam_width", beam_width)
    encoder_output, source_mask = model.encode(source_ids)
    step_fn, state = make_transformer_step_fn(
        model,
        expand_to_beams(encoder_output, k),
        expand_to_beams(source_mask, k),
        max_length,
        use_cache,
    )
    tokens, scores = beam_search(
        step_fn, state, start + start_id, max_length, end_id, beam_width=k, alpha=alpha,
        pad_id=model.transformer_config.pad_id, return_all_beams=return_all_beams,
        length_penalty=length_penalty,
    )
    return _mark_invalid(encoder_output, tokens, scores)


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerTranslator(keras.Model):
    """A `Transformer` with its decoding loop: `source_ids (B, S)` in,
    `(tokens (B, max_length), scores (B,))` out.

    `predict` compiles the whole search (one graph loop); a SavedModel of it
    serves beam search from source ids (`keras_attn.export`). With
    `beam_width=None` it decodes greedily (scores are then zeros).

    Args:
        transformer: a `Transformer`.
        start_id: the first decoder input token.
        end_id: the end token.
        beam_width: K, or None for greedy search.
        alpha: length penalty exponent.
        max_length: tokens to generate at most; None: `S + 50` capped by the
            model's `max_sequence_length`.
        use_cache: decode with the key/value caches (False re-runs the
            decoder on the whole prefix each step: same tokens, slower; for
            benchmarks).
        length_penalty: `"gnmt"` (default) or `"hf"` (Hugging Face's
            convention, for imported Marian models; see `beam_search`).
    """

    def __init__(
        self,
        transformer,
        start_id,
        end_id,
        beam_width=4,
        alpha=0.6,
        max_length=None,
        use_cache=True,
        length_penalty="gnmt",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if length_penalty not in LENGTH_PENALTIES:
            raise ValueError(f"`length_penalty` must be one of {LENGTH_PENALTIES}. "
                             f"Received: length_penalty={length_penalty!r}")
        self.length_penalty = length_penalty
        self.transformer = transformer
        self.start_id = int(start_id)
        self.end_id = int(end_id)
        self.beam_width = check_positive_int("beam_width", beam_width, allow_none=True)
        self.alpha = float(alpha)
        self.max_length = check_positive_int("max_length", max_length, allow_none=True)
        self.use_cache = bool(use_cache)

    def call(self, source_ids):
        if self.beam_width is None:
            tokens = transformer_greedy_search(
                self.transformer, source_ids, self.start_id, self.end_id,
                self.max_length, use_cache=self.use_cache,
            )
            return tokens, ops.zeros((ops.shape(tokens)[0],), "float32")
        return transformer_beam_search(
            self.transformer, source_ids, self.start_id, self.end_id,
            beam_width=self.beam_width, alpha=self.alpha, max_length=self.max_length,
            use_cache=self.use_cache, length_penalty=self.length_penalty,
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "transformer": keras.saving.serialize_keras_object(self.transformer),
                "start_id": self.start_id,
                "end_id": self.end_id,
                "beam_width": self.beam_width,
                "alpha": self.alpha,
                "max_length": self.max_length,
                "use_cache": self.use_cache,
                "length_penalty": self.length_penalty,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["transformer"] = keras.saving.deserialize_keras_object(config["transformer"])
        return cls(**config)
