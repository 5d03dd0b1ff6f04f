"""Packed against padded BERT pretraining and translation on the CPU: real
(non-padding) tokens per second of training, with keras-hub's BERT (or its
encoder and decoder blocks) on the same padded batches as the peer, one
process a run (issue 42). Never run as a test (tests/test_benchmarks.py runs
--smoke and looks at the output's structure, never at a time).

Run:  python benchmarks/packing.py [--tasks bert,translation]
                                   [--preset bert_mini] [--lengths 128,512]
                                   [--rounds 10] [--smoke]
      (TensorFlow backend; about 15 minutes for bert_mini on 2 busy cores)

On the GPU machine (JAX, no TensorFlow there; ../shared/gpu/README.md):
      KERAS_BACKEND=jax python benchmarks/packing.py --tasks bert
          --preset bert_base --lengths 512 --batch-tokens 32768
          --dtype-policy mixed_bfloat16 --rounds 5
      (64 rows of 512 a step, the batch of gpu.py's bert512 case)

BERT (`--tasks bert`; the JSON's top-level keys)
------------------------------------------------
The examples' lengths are log-normal around a median of 0.3 x the row
(sigma 0.9, clipped to [8, row]), the distribution tests/data/test_packing.py
packs: about 60% of a batch padded to the row is padding, as Krell et al.
("Efficient Sequence Packing without Cross-contamination", Graphcore 2021,
arXiv:2107.02027, figure 1) report for BERT's Wikipedia data ("more than
half" at 512). Each example is `[CLS] A [SEP] B [SEP]`-shaped (random ids;
the time of a step does not depend on them) with 15% of its other tokens to
predict.

Three training steps (masked LM + next sentence, Adam, XLA) run on batches
of the same shape, `batch` rows of `length` tokens:

- `padded`: keras_attn's `BertPretrainer`, one example per row, padded to
  the row (the zoo's padded pipeline);
- `packed`: the same model and weights on rows packed by
  `keras_attn.data.pack_sequences` (best-fit decreasing), with
  `packed_segment_ids` / `positions` and one NSP target per example;
- `keras_hub`: `keras_hub.models.BertBackbone` + `keras_hub.layers.
  MaskedLMHead` (tied to its token embedding) + a next-sentence `Dense` on
  the pooled output, of the same sizes, on the `padded` batches.

Each round times the three once, the order rotated by one each round
(`_stats.time_rounds_with_cpu`: each call's CPU time beside its wall time;
the table prints the cores each side kept busy). A round's ratio of real
tokens per second is `(real tokens of a's batch / a's time) / (real tokens
of b's batch / b's time)`; the reported ratio is the median over the rounds with its 95%
distribution-free interval (`_stats.median_interval`). Absolute times are
in the JSON for the record, never claims: the machine is shared.

Padding fractions are over all the examples drawn (`--examples`), not only
the timed batch: padded to the row, padded to each batch's longest example
(what a length-bucketing pipeline could reach at best without packing), and
packed.

Translation (`--tasks translation`; the JSON's `"translation"` key)
-------------------------------------------------------------------
The same measure for keras_attn's `Transformer` (keras_attn.models.
transformer, `transformer_base` cut to bert_mini's sizes: hidden 256,
feed-forward 1024, 4 heads, 2 encoder + 2 decoder blocks, dropout 0.1, one
37,000-token vocabulary shared and tied as in the paper's WMT14 En-De
setup), teacher-forced token cross-entropy (label smoothing 0, the mean
over real target tokens), Adam, XLA. A row is 128 source and 128 target
tokens, 16 rows a step (2,048 tokens a side). Real tokens are the
non-padding source plus target tokens.

- `padded`: one sentence pair per row, both sides padded to 128;
- `packed`: the same model and weights on pairs packed in step by
  `pack_sequences(sources, 128, targets=...)` (segment k of a target row is
  the translation of segment k of its source row), with the four packed
  inputs `source_segment_ids`, `source_positions`, `target_segment_ids`,
  `target_positions`; labels packed beside the target inputs;
- `keras_hub`: keras-hub's `TransformerEncoder` / `TransformerDecoder`
  blocks (post-norm, LayerNorm epsilon 1e-6, ReLU) on a tied
  `ReversibleEmbedding` scaled by sqrt(256) plus `SinePositionEncoding`,
  dropout 0.1: the same sizes and parameter count (13,158,400), on the
  `padded` batches with the same loss (plain cross-entropy over the
  non-padding labels).

The WMT-like lengths: English source sentences log-normal with a mean of
22.4 tokens and sigma 0.6 (median 18.7, 99th percentile 76, 0.07% clipped
at 128), German targets = source x 0.935 x exp(N(0, 0.15)), rounded, both
clipped to [1, 128]. Where the numbers come from: newstest2014 En-De has
3,003 sentences with 67,337 English and 62,964 German reference words
(sacreBLEU's counts in Helsinki-NLP's opus-mt-tc-big-gmw-gmw
benchmark_results.txt on Hugging Face): 22.4 English words a sentence and
a German/English length ratio of 0.935. The WMT14 de-en training split on
Hugging Face (wmt/wmt14 dataset card: 4,508,785 pairs, 1,358,406,800
bytes, about 150 bytes a side) is of the same order. The two sigmas are
not fitted (the sources give means only): 0.6 is a choice (a 99th
percentile of 76), 0.15 a modest spread of the translation ratio. The
lengths are words, not BPE tokens; a 37k BPE splits a few more tokens a
sentence, so real WMT rows hold a little less padding than these.

Results go to benchmarks/results/packing.json (`--output`). A run of one
task keeps the other task's results already in that file.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(1, ROOT)
from _stats import median_interval  # noqa: E402
from _stats import checked_row  # noqa: E402
from _stats import time_rounds_with_cpu  # noqa: E402

CLS, SEP, PAD = 2, 3, 0
MASK_RATE = 0.15
# Every model's steps run compiled by XLA, as measured; `--smoke` turns it off
# (main): XLA's compiles were most of a smoke run (85 s of it on 2 cores), whose
# timings nobody reads; the batches and rows it checks are the same without.
JIT_COMPILE = True
BATCH_TOKENS = 2048  # rows x length per step, at every length
SMOKE_SIZES = dict(num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32)


def wikipedia_like(count, length, seed=0):
    """Example lengths log-normal around 0.3 x `length` (sigma 0.9), clipped
    to [8, length] (see the module docstring)."""
    rng = np.random.default_rng(seed)
    lengths = np.round(rng.lognormal(np.log(0.3 * length), 0.9, count))
    return np.clip(lengths, 8, length).astype("int64")


def make_examples(lengths, vocabulary, seed=1):
    """Per example `(L, 2)`: token ids `[CLS] ... [SEP] ... [SEP]` and
    sentence ids (A, then B from the middle)."""
    rng = np.random.default_rng(seed)
    examples = []
    for n in lengths:
        tokens = rng.integers(5, vocabulary, n)
        middle = n // 2
        tokens[0], tokens[middle - 1], tokens[-1] = CLS, SEP, SEP
        examples.append(np.stack([tokens, (np.arange(n) >= middle)], axis=1).astype("int32"))
    return examples


def padding_fractions(lengths, length, batch, packed_segment_ids):
    """The share of padding steps: padded to the row, padded to each
    batch's longest example, and packed."""
    lengths = np.asarray(lengths)
    longest = sum(batch_lengths.max() * len(batch_lengths)
                  for batch_lengths in np.array_split(lengths, np.ceil(len(lengths) / batch)))
    return {
        "padded_to_length": float(1 - lengths.sum() / (len(lengths) * length)),
        "padded_to_longest": float(1 - lengths.sum() / longest),
        "packed": float(np.mean(packed_segment_ids == 0)),
    }


def _mask(token_ids, real, predictions, vocabulary, rng):
    """Masked-LM inputs of a batch: 15% of the real, non-special tokens
    (at most `predictions` a row) replaced by [MASK] (id 4)."""
    rows = len(token_ids)
    positions = np.zeros((rows, predictions), "int32")
    labels = np.zeros((rows, predictions), "int32")
    weights = np.zeros((rows, predictions), "float32")
    masked = token_ids.copy()
    for r in range(rows):
        candidates = np.flatnonzero(real[r] & (token_ids[r] != CLS) & (token_ids[r] != SEP))
        chosen = np.sort(candidates[rng.random(len(candidates)) < MASK_RATE][:predictions])
        positions[r, :len(chosen)] = chosen
        labels[r, :len(chosen)] = token_ids[r, chosen]
        weights[r, :len(chosen)] = 1.0
        masked[r, chosen] = 4
    return masked, positions, labels, weights


def make_batches(examples, length, batch, vocabulary, seed=0):
    """`(padded, packed, packed_segment_ids of every packed row, max_segments)`:
    each batch `(x, y, sample_weight)` of `batch` rows; the padded batch
    holds the first `batch` examples, the packed one the first `batch`
    packed rows of all the examples."""
    from keras_attn.data import pack_sequences

    rng = np.random.default_rng(seed)
    predictions = round(length * MASK_RATE) + 4

    padded_tokens = np.full((batch, length, 2), PAD, "int32")
    for r, example in enumerate(examples[:batch]):
        padded_tokens[r, :len(example)] = example
    real = np.zeros((batch, length), bool)
    for r, example in enumerate(examples[:batch]):
        real[r, :len(example)] = True
    masked, positions, labels, weights = _mask(padded_tokens[..., 0], real, predictions,
                                               vocabulary, rng)
    padded = (
        {"token_ids": masked, "segment_ids": padded_tokens[..., 1],
         "padding_mask": real.astype("int32"), "mask_positions": positions},
        {"mlm": labels, "nsp": rng.integers(0, 2, batch).astype("int32")},
        {"mlm": weights, "nsp": np.ones(batch, "float32")},
    )

    packed_all = pack_sequences(examples, length, buffer_size=len(examples), seed=seed)
    max_segments = packed_all["example_ids"].shape[1]
    rows = {key: value[:batch] for key, value in packed_all.items()}
    segment_ids = rows["segment_ids"]
    masked, positions, labels, weights = _mask(rows["inputs"][..., 0], segment_ids > 0,
                                               predictions, vocabulary, rng)
    present = (rows["example_ids"] >= 0).astype("float32")
    packed = (
        {"token_ids": masked, "segment_ids": rows["inputs"][..., 1],
         "padding_mask": (segment_ids > 0).astype("int32"), "mask_positions": positions,
         "packed_segment_ids": segment_ids, "positions": rows["positions"]},
        {"mlm": labels, "nsp": rng.integers(0, 2, present.shape).astype("int32")},
        {"mlm": weights, "nsp": present},
    )
    return padded, packed, packed_all["segment_ids"], max_segments


def keras_attn_model(sizes, vocabulary, length, max_segments):
    from keras_attn.models.bert import BertPretrainer
    from keras_attn.models.bert import build_bert

    preset, overrides = sizes
    backbone = build_bert(preset, vocabulary_size=vocabulary, max_sequence_length=length,
                          **overrides)
    model = BertPretrainer(backbone, max_segments=max_segments)
    model.compile(optimizer=keras.optimizers.Adam(1e-4), jit_compile=JIT_COMPILE)
    return model


def keras_hub_model(config, vocabulary, length):
    """keras-hub's BERT of the same sizes with a tied masked-LM head and a
    next-sentence head."""
    import keras_hub

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=vocabulary, num_layers=config.num_layers, num_heads=config.num_heads,
        hidden_dim=config.hidden_dim, intermediate_dim=config.intermediate_dim,
        dropout=config.dropout, max_sequence_length=length)
    inputs = {name: keras.Input((None,), dtype="int32", name=name)
              for name in ("token_ids", "segment_ids", "padding_mask", "mask_positions")}
    outputs = backbone({name: inputs[name]
                        for name in ("token_ids", "segment_ids", "padding_mask")})
    mlm = keras_hub.layers.MaskedLMHead(
        token_embedding=backbone.token_embedding, intermediate_activation="gelu",
        name="mlm_head")(outputs["sequence_output"], mask_positions=inputs["mask_positions"])
    nsp = keras.layers.Dense(2, name="nsp")(outputs["pooled_output"])
    model = keras.Model(inputs, {"mlm": mlm, "nsp": nsp})

    def loss():
        return keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="mean_with_sample_weight")

    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss={"mlm": loss(), "nsp": loss()},
                  jit_compile=JIT_COMPILE)
    return model


def attention_kernels(model, x):
    """The fused attention kernels that `model`'s compiled forward pass on
    `x` calls (JAX only: the custom calls of the compiled program, as
    gpu.py reads them); None on other backends, [] where attention is XLA's
    own ops."""
    if keras.backend.backend() != "jax":
        return None
    import jax

    from gpu import fused_kernels

    def forward(trainable, non_trainable, x):
        return model.stateless_call(trainable, non_trainable, x, training=True)[0]

    compiled = jax.jit(forward).lower(
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables], x).compile()
    return fused_kernels(compiled.as_text())


def _step(model, batch):
    x, y, weight = batch

    def step():
        model.train_on_batch(x, y, sample_weight=weight)

    return step


def _ratio(values):
    median, lo, hi = median_interval(values)
    return {"median": median, "low": lo, "high": hi}


def _speeds(steps, rounds, real):
    """Times `steps` (`packed`, `padded`, `keras_hub`, on `real[name]` real
    tokens a batch) in rotated rounds: the median step seconds and the
    real tokens/s ratios of the rounds."""
    times, cpu = time_rounds_with_cpu(steps, rounds, warmup=2)
    per_second = {name: [real[name] / t for t in times[name]] for name in steps}
    # Every side steps in this one process, on the same runtime's thread
    # pools: equal threads by construction. Each call's CPU time is kept
    # beside its wall time (cores used = CPU s / wall s); a side that kept
    # more cores busy than the process may use is refused (checked_row).
    # No FLOP/s check: padded-to-longest batches change shape batch by batch.
    threads = len(os.sched_getaffinity(0))

    def ratio(a, b):
        return _ratio([x / y for x, y in zip(per_second[a], per_second[b])])

    return {
        "median_step_seconds": {name: statistics.median(times[name]) for name in steps},
        "median_step_cpu_seconds": {name: statistics.median(cpu[name]) for name in steps},
        "cores_used": {name: checked_row(name, threads, times[name], cpu[name])["cores_used"]
                       for name in steps},
        "threads": threads,
        "real_tokens_per_second_ratio": {
            "packed_vs_padded": ratio("packed", "padded"),
            "padded_vs_keras_hub": ratio("padded", "keras_hub"),
            "packed_vs_keras_hub": ratio("packed", "keras_hub"),
        },
    }


def run_length(sizes, length, batch, rounds, examples_count, vocabulary, seed=0):
    """One row of the table: padding fractions, real tokens per batch, the
    medians of the step times and real tokens/s ratios."""
    from keras_attn.models.bert import get_bert_config

    preset, overrides = sizes
    config = get_bert_config(preset, **overrides)
    lengths = wikipedia_like(examples_count, length, seed)
    examples = make_examples(lengths, vocabulary, seed + 1)
    padded, packed, all_packed_ids, max_segments = make_batches(
        examples, length, batch, vocabulary, seed)
    keras.utils.set_random_seed(seed)
    ours_padded = keras_attn_model(sizes, vocabulary, length, max_segments)
    ours_packed = keras_attn_model(sizes, vocabulary, length, max_segments)
    ours_packed.set_weights(ours_padded.get_weights())
    peer = keras_hub_model(config, vocabulary, length)
    steps = {"packed": _step(ours_packed, packed), "padded": _step(ours_padded, padded),
             "keras_hub": _step(peer, padded)}
    real = {"padded": int(padded[0]["padding_mask"].sum()),
            "packed": int(packed[0]["padding_mask"].sum())}
    speeds = _speeds(steps, rounds, dict(real, keras_hub=real["padded"]))
    kernels = {"padded": attention_kernels(ours_padded, padded[0]),
               "packed": attention_kernels(ours_packed, packed[0])}
    return {
        "attention_kernels": kernels,
        "length": length,
        "batch": batch,
        "examples": examples_count,
        "max_segments": int(max_segments),
        "padding": padding_fractions(lengths, length, batch, all_packed_ids),
        "real_tokens_per_batch": {"padded": real["padded"], "packed": real["packed"]},
        "examples_per_batch": {"padded": batch,
                               "packed": int((np.asarray(packed[2]["nsp"]) > 0).sum())},
        "parameters": {"keras_attn": ours_padded.count_params(),
                       "keras_hub": peer.count_params()},
        **speeds,
    }


BOS = 1  # the target start token; PAD (0) pads both sides and the labels
TRANSLATION_SIZES = dict(hidden_dim=256, intermediate_dim=1024, num_heads=4,
                         num_encoder_layers=2, num_decoder_layers=2)
SMOKE_TRANSLATION_SIZES = dict(hidden_dim=16, intermediate_dim=32, num_heads=2,
                               num_encoder_layers=1, num_decoder_layers=1)
# newstest2014 En-De: 67,337 English / 62,964 German words in 3,003 sentences
WMT_SOURCE_MEAN, WMT_SOURCE_SIGMA = 67337 / 3003, 0.6
WMT_RATIO, WMT_RATIO_SIGMA = 62964 / 67337, 0.15


def wmt_like(count, length, seed=0):
    """`(source lengths, target lengths)`: sources log-normal with a mean of
    22.4 and sigma 0.6, targets source x 0.935 x exp(N(0, 0.15)), both
    rounded and clipped to [1, `length`] (see the module docstring)."""
    rng = np.random.default_rng(seed)
    mu = np.log(WMT_SOURCE_MEAN) - WMT_SOURCE_SIGMA ** 2 / 2  # the log-normal's mean is 22.4
    sources = np.clip(np.round(rng.lognormal(mu, WMT_SOURCE_SIGMA, count)), 1, length)
    ratios = WMT_RATIO * np.exp(rng.normal(0.0, WMT_RATIO_SIGMA, count))
    targets = np.clip(np.round(sources * ratios), 1, length)
    return sources.astype("int64"), targets.astype("int64")


def make_pairs(source_lengths, target_lengths, vocabulary, seed=1):
    """Per pair: source ids `(S,)` and target `(T, 2)`: the decoder's input
    (BOS, y_1 .. y_{T-1}) beside the labels (y_1 .. y_T), random ids."""
    rng = np.random.default_rng(seed)
    sources, targets = [], []
    for n, m in zip(source_lengths, target_lengths):
        sources.append(rng.integers(BOS + 1, vocabulary, n).astype("int32"))
        labels = rng.integers(BOS + 1, vocabulary, m).astype("int32")
        targets.append(np.stack([np.concatenate([[BOS], labels[:-1]]), labels], axis=1))
    return sources, targets


def pair_padding_fractions(source_lengths, target_lengths, length, batch, packed):
    """`padding_fractions` of both sides together, and of each side."""
    sides = {"source": padding_fractions(source_lengths, length, batch, packed["segment_ids"]),
             "target": padding_fractions(target_lengths, length, batch,
                                         packed["target_segment_ids"])}
    real = int(np.sum(source_lengths) + np.sum(target_lengths))
    # Each side's steps, from its fraction and its real tokens.
    steps = {key: sum(np.sum(lengths) / (1 - sides[side][key])
                      for side, lengths in (("source", source_lengths),
                                            ("target", target_lengths)))
             for key in ("padded_to_length", "padded_to_longest")}
    both_packed = np.concatenate([packed["segment_ids"], packed["target_segment_ids"]], axis=1)
    return {"padded_to_length": float(1 - real / steps["padded_to_length"]),
            "padded_to_longest": float(1 - real / steps["padded_to_longest"]),
            "packed": float(np.mean(both_packed == 0)), **sides}


def make_translation_batches(sources, targets, length, batch, seed=0):
    """`(padded, packed, all packed rows)`, each batch `(x, labels)` of
    `batch` rows: the padded one holds the first `batch` pairs, the packed
    one the first `batch` packed rows of all the pairs."""
    from keras_attn.data import pack_sequences

    source_ids = np.full((batch, length), PAD, "int32")
    target = np.full((batch, length, 2), PAD, "int32")
    for r in range(batch):
        source_ids[r, :len(sources[r])] = sources[r]
        target[r, :len(targets[r])] = targets[r]
    padded = ({"source_ids": source_ids, "target_ids": target[..., 0]}, target[..., 1])

    packed_all = pack_sequences(sources, length, targets=targets, target_row_length=length,
                                buffer_size=len(sources), seed=seed, pad_value=PAD)
    rows = {key: value[:batch] for key, value in packed_all.items()}
    packed = ({"source_ids": rows["inputs"], "target_ids": rows["targets"][..., 0],
               "source_segment_ids": rows["segment_ids"], "source_positions": rows["positions"],
               "target_segment_ids": rows["target_segment_ids"],
               "target_positions": rows["target_positions"]},
              rows["targets"][..., 1])
    return padded, packed, packed_all


def transformer_model(sizes, vocabulary, length):
    from keras_attn.models.transformer import build_transformer

    model = build_transformer("transformer_base", vocabulary_size=vocabulary, pad_id=PAD,
                              max_sequence_length=length, **sizes)
    # Plain cross-entropy over the real target tokens, as the peer's; no metric.
    model.compile(optimizer=keras.optimizers.Adam(1e-4), label_smoothing=0.0, metrics=None,
                  jit_compile=JIT_COMPILE)
    return model


def keras_hub_transformer(sizes, vocabulary, dropout=0.1):
    """keras-hub's encoder and decoder blocks of the same sizes, post-norm as
    the paper, on one tied embedding scaled by sqrt(hidden) plus sinusoids."""
    import keras_hub

    hidden = sizes["hidden_dim"]
    inputs = {name: keras.Input((None,), dtype="int32", name=name)
              for name in ("source_ids", "target_ids")}
    embedding = keras_hub.layers.ReversibleEmbedding(vocabulary, hidden, tie_weights=True,
                                                     name="token_embedding")
    sines = keras_hub.layers.SinePositionEncoding()

    def embed(ids):
        x = embedding(ids) * float(np.sqrt(hidden))
        return keras.layers.Dropout(dropout)(x + sines(x))

    def block(kind):
        return kind(intermediate_dim=sizes["intermediate_dim"], num_heads=sizes["num_heads"],
                    dropout=dropout, activation="relu", layer_norm_epsilon=1e-6)

    source_mask = keras.ops.not_equal(inputs["source_ids"], PAD)
    target_mask = keras.ops.not_equal(inputs["target_ids"], PAD)
    x = embed(inputs["source_ids"])
    for _ in range(sizes["num_encoder_layers"]):
        x = block(keras_hub.layers.TransformerEncoder)(x, padding_mask=source_mask)
    y = embed(inputs["target_ids"])
    for _ in range(sizes["num_decoder_layers"]):
        y = block(keras_hub.layers.TransformerDecoder)(
            y, x, decoder_padding_mask=target_mask, encoder_padding_mask=source_mask)
    model = keras.Model(inputs, embedding(y, reverse=True))
    model.compile(optimizer=keras.optimizers.Adam(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True, reduction="mean_with_sample_weight"),
                  jit_compile=JIT_COMPILE)
    return model


def _translation_step(model, batch, weighted, losses, name):
    x, labels = batch
    # The peer's loss skips padding by sample weight; ours skips pad_id labels itself.
    weight = (labels != PAD).astype("float32") if weighted else None

    def step():
        # A bad packing is NaN inside a compiled step: the last loss is kept to check.
        losses[name] = float(np.asarray(model.train_on_batch(x, labels, sample_weight=weight)))

    return step


def run_translation(sizes, length, batch, rounds, examples_count, vocabulary, seed=0):
    """The translation row: as `run_length`, for sentence pairs."""
    source_lengths, target_lengths = wmt_like(examples_count, length, seed)
    sources, targets = make_pairs(source_lengths, target_lengths, vocabulary, seed + 1)
    padded, packed, packed_all = make_translation_batches(sources, targets, length, batch, seed)
    keras.utils.set_random_seed(seed)
    ours_padded = transformer_model(sizes, vocabulary, length)
    ours_packed = transformer_model(sizes, vocabulary, length)
    ours_packed.set_weights(ours_padded.get_weights())
    peer = keras_hub_transformer(sizes, vocabulary)
    losses = {}
    steps = {"packed": _translation_step(ours_packed, packed, False, losses, "packed"),
             "padded": _translation_step(ours_padded, padded, False, losses, "padded"),
             "keras_hub": _translation_step(peer, padded, True, losses, "keras_hub")}
    by_side = {
        "source": {"padded": int((padded[0]["source_ids"] != PAD).sum()),
                   "packed": int((packed[0]["source_segment_ids"] > 0).sum())},
        "target": {"padded": int((padded[1] != PAD).sum()),
                   "packed": int((packed[0]["target_segment_ids"] > 0).sum())},
    }
    real = {name: by_side["source"][name] + by_side["target"][name]
            for name in ("padded", "packed")}
    speeds = _speeds(steps, rounds, dict(real, keras_hub=real["padded"]))
    if not all(np.isfinite(list(losses.values()))):
        raise SystemExit(f"A training step's loss is not finite: {losses}")
    return {
        "length": length,
        "target_length": length,
        "batch": batch,
        "examples": examples_count,
        "max_segments": int(packed_all["example_ids"].shape[1]),
        "mean_lengths": {"source": float(source_lengths.mean()),
                         "target": float(target_lengths.mean())},
        "padding": pair_padding_fractions(source_lengths, target_lengths, length, batch,
                                          packed_all),
        "real_tokens_per_batch": {"padded": real["padded"], "packed": real["packed"]},
        "real_tokens_per_batch_by_side": by_side,
        "examples_per_batch": {"padded": batch,
                               "packed": int((packed_all["example_ids"][:batch] >= 0).sum())},
        "last_loss": losses,
        "parameters": {"keras_attn": ours_padded.count_params(),
                       "keras_hub": peer.count_params()},
        **speeds,
    }


def table(rows):
    lines = ["| length | batch | padding: padded to length / to longest / packed | real tokens "
             "per batch padded / packed | packed / padded | padded / keras-hub | "
             "packed / keras-hub | cores used packed / padded / keras-hub |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        pad, real = row["padding"], row["real_tokens_per_batch"]
        ratios = [row["real_tokens_per_second_ratio"][key]
                  for key in ("packed_vs_padded", "padded_vs_keras_hub", "packed_vs_keras_hub")]
        cells = " | ".join(f"{r['median']:.2f} ({r['low']:.2f}-{r['high']:.2f})" for r in ratios)
        cores = " / ".join(f"{row['cores_used'][key]:.2f}"
                           for key in ("packed", "padded", "keras_hub"))
        lines.append(f"| {row['length']} | {row['batch']} | {pad['padded_to_length']:.1%} / "
                     f"{pad['padded_to_longest']:.1%} / {pad['packed']:.1%} | {real['padded']} / "
                     f"{real['packed']} | {cells} | {cores} |")
    return "\n".join(lines)


def _device():
    """The accelerator the backend computes on ("cpu" where there is none)."""
    if keras.backend.backend() == "jax":
        import jax

        device = jax.devices()[0]
        return "cpu" if device.platform == "cpu" else device.device_kind
    return "cpu"


def _run_record(args, argv, rounds):
    """Where and how a task's rows were measured."""
    import keras_hub

    backend = keras.backend.backend()
    versions = {"keras": keras.__version__, "keras_hub": keras_hub.__version__,
                "python": platform.python_version()}
    if backend == "tensorflow":
        import tensorflow as tf

        versions["tensorflow"] = tf.__version__
    elif backend == "jax":
        import jax

        versions["jax"] = jax.__version__
    return {
        "rounds": rounds, "smoke": args.smoke, "jit_compile": JIT_COMPILE,
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}",
        "backend": backend, "device": _device(), "batch_tokens": args.batch_tokens,
        "dtype_policy": keras.config.dtype_policy().name,
        "versions": versions,
        "command": "python benchmarks/packing.py " + " ".join(argv if argv is not None
                                                               else sys.argv[1:]),
    }


def run_bert(args, argv):
    if args.smoke:
        sizes, lengths, rounds = ("bert_tiny", SMOKE_SIZES), [64], 1
        examples, vocabulary = 200, 100
    else:
        overrides = {} if args.attention_dropout is None else {
            "attention_dropout": args.attention_dropout}
        sizes, lengths, rounds = (args.preset, overrides), \
            [int(n) for n in args.lengths.split(",")], \
            args.rounds
        examples, vocabulary = args.examples, args.vocabulary
    results = {
        "what": "real (non-padding) tokens per second of BERT pretraining steps (masked LM + "
                "next sentence, Adam, XLA), packed against padded, and keras-hub's BERT on the "
                "padded batches; ratios are medians over rounds with 95% intervals",
        "preset": sizes[0], "overrides": sizes[1], "vocabulary": vocabulary,
        "distribution": "log-normal lengths, median 0.3 x length, sigma 0.9, clipped to "
                        "[8, length] (Krell et al. 2021, figure 1: Wikipedia BERT data)",
        **_run_record(args, argv, rounds),
        "rows": [],
    }
    for length in lengths:
        batch = max(1, args.batch_tokens // length) if not args.smoke else 4
        print(f"length {length}, batch {batch}: timing {rounds} rounds", flush=True)
        results["rows"].append(run_length(sizes, length, batch, rounds, examples, vocabulary))
        # Each row as it is measured: a run cut off still leaves its rows.
        print("ROW " + json.dumps(results["rows"][-1]), flush=True)
    print(table(results["rows"]))
    return results


def run_translation_task(args, argv):
    if args.smoke:
        sizes, length, batch, rounds = SMOKE_TRANSLATION_SIZES, 32, 4, 1
        examples, vocabulary = 200, 100
    else:
        sizes, length, rounds = TRANSLATION_SIZES, args.translation_length, args.rounds
        batch = max(1, args.batch_tokens // length)
        examples, vocabulary = args.examples, args.translation_vocabulary
    results = {
        "what": "real (non-padding, source + target) tokens per second of Transformer "
                "training steps (teacher-forced cross-entropy, Adam, XLA), packed against "
                "padded, and keras-hub's TransformerEncoder/Decoder on the padded batches; "
                "ratios are medians over rounds with 95% intervals",
        "preset": "transformer_base", "overrides": sizes, "dropout": 0.1,
        "vocabulary": vocabulary,
        "distribution": "WMT-like: source lengths log-normal, mean 22.4, sigma 0.6; target = "
                        "source x 0.935 x exp(N(0, 0.15)); both rounded, clipped to [1, length] "
                        "(means from newstest2014 En-De: 67,337 English and 62,964 German "
                        "words in 3,003 sentences; the sigmas are chosen, not fitted)",
        **_run_record(args, argv, rounds),
        "rows": [],
    }
    if args.note:
        results["note"] = args.note
    print(f"translation, rows of {length}, batch {batch}: timing {rounds} rounds", flush=True)
    start_load = os.getloadavg()
    results["rows"].append(run_translation(sizes, length, batch, rounds, examples, vocabulary))
    # The machine's load (1, 5, 15 minutes) when the timing began and ended.
    results["load_average"] = {"start": start_load, "end": os.getloadavg()}
    print(table(results["rows"]))
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="bert,translation",
                        help="comma-separated: bert, translation")
    parser.add_argument("--preset", default="bert_mini")
    parser.add_argument("--lengths", default="128,512")
    parser.add_argument("--translation-length", type=int, default=128,
                        help="steps of a source row and of a target row")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--examples", type=int, default=4000,
                        help="examples drawn per length (packed together)")
    parser.add_argument("--vocabulary", type=int, default=30522)
    parser.add_argument("--translation-vocabulary", type=int, default=37000)
    parser.add_argument("--output", default=os.path.join(HERE, "results", "packing.json"))
    parser.add_argument("--note", default="",
                        help="recorded with the translation results (e.g. what else ran)")
    parser.add_argument("--batch-tokens", type=int, default=BATCH_TOKENS,
                        help="rows x length of a step (2048: the CPU runs; 32768 on a GPU)")
    parser.add_argument("--attention-dropout", type=float, default=None,
                        help="keras_attn BERT's attention dropout (default: the preset's "
                             "0.1); 0 lets attention take the fused kernel")
    parser.add_argument("--dtype-policy", default=None,
                        help="Keras dtype policy for every model, e.g. mixed_bfloat16 on a GPU")
    parser.add_argument("--smoke", action="store_true",
                        help="one-layer 16-wide models, rows of 64 (BERT) and 32 "
                             "(translation), 1 round")
    args = parser.parse_args(argv)
    global JIT_COMPILE
    JIT_COMPILE = not args.smoke
    tasks = args.tasks.split(",")
    if not tasks or set(tasks) - {"bert", "translation"}:
        parser.error(f"Invalid value for argument `--tasks`: bert and/or translation. "
                     f"Received: --tasks={args.tasks}")
    if keras.backend.backend() not in ("tensorflow", "jax"):
        raise SystemExit("Run it on the TensorFlow backend (the CPU rows) or JAX (the GPU "
                         f"machine); KERAS_BACKEND={keras.backend.backend()}.")
    if args.batch_tokens < 1:
        parser.error(f"Invalid value for argument `--batch-tokens`: a positive number of "
                     f"tokens. Received: --batch-tokens={args.batch_tokens}")
    if args.dtype_policy:
        keras.config.set_dtype_policy(args.dtype_policy)

    # A task not run keeps its results already in the file.
    results = {}
    if os.path.exists(args.output):
        with open(args.output, encoding="utf-8") as handle:
            results = json.load(handle)
    if "bert" in tasks:
        translation = results.get("translation")
        results = run_bert(args, argv)
        if translation is not None:
            results["translation"] = translation
    if "translation" in tasks:
        results["translation"] = run_translation_task(args, argv)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)
    print(f"written to {args.output}")
    return results


if __name__ == "__main__":
    main()
