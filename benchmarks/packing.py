"""Packed against padded BERT pretraining on the CPU: real (non-padding)
tokens per second of training, with keras-hub's BERT on the same padded
batches as the peer, all in one process (issue 42). Never run as a test
(tests/test_benchmarks.py runs --smoke and looks at the output's structure,
never at a time).

Run:  python benchmarks/packing.py [--preset bert_mini] [--lengths 128,512]
                                   [--rounds 10] [--smoke]
      (TensorFlow backend; about 15 minutes for bert_mini on 2 busy cores)

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
(`_stats.time_rounds`). A round's ratio of real tokens per second is
`(real tokens of a's batch / a's time) / (real tokens of b's batch / b's
time)`; the reported ratio is the median over the rounds with its 95%
distribution-free interval (`_stats.median_interval`). Absolute times are
in the JSON for the record, never claims: the machine is shared.

Padding fractions are over all the examples drawn (`--examples`), not only
the timed batch: padded to the row, padded to each batch's longest example
(what a length-bucketing pipeline could reach at best without packing), and
packed.

Results go to benchmarks/results/packing.json (`--output`).
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
from _stats import time_rounds  # noqa: E402

CLS, SEP, PAD = 2, 3, 0
MASK_RATE = 0.15
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
    model.compile(optimizer=keras.optimizers.Adam(1e-4), jit_compile=True)
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
                  jit_compile=True)
    return model


def _step(model, batch):
    x, y, weight = batch

    def step():
        model.train_on_batch(x, y, sample_weight=weight)

    return step


def _ratio(values):
    median, lo, hi = median_interval(values)
    return {"median": median, "low": lo, "high": hi}


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
    times = time_rounds(steps, rounds, warmup=2)
    real = {"padded": int(padded[0]["padding_mask"].sum()),
            "packed": int(packed[0]["padding_mask"].sum())}
    real["keras_hub"] = real["padded"]
    per_second = {name: [real[name] / t for t in times[name]] for name in steps}

    def ratio(a, b):
        return _ratio([x / y for x, y in zip(per_second[a], per_second[b])])

    return {
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
        "median_step_seconds": {name: statistics.median(times[name]) for name in steps},
        "real_tokens_per_second_ratio": {
            "packed_vs_padded": ratio("packed", "padded"),
            "padded_vs_keras_hub": ratio("padded", "keras_hub"),
            "packed_vs_keras_hub": ratio("packed", "keras_hub"),
        },
    }


def table(results):
    lines = ["| length | batch | padding: padded to length / to longest / packed | real tokens "
             "per batch padded / packed | packed / padded | padded / keras-hub | "
             "packed / keras-hub |", "|---|---|---|---|---|---|---|"]
    for row in results["rows"]:
        pad, real = row["padding"], row["real_tokens_per_batch"]
        ratios = [row["real_tokens_per_second_ratio"][key]
                  for key in ("packed_vs_padded", "padded_vs_keras_hub", "packed_vs_keras_hub")]
        cells = " | ".join(f"{r['median']:.2f} ({r['low']:.2f}-{r['high']:.2f})" for r in ratios)
        lines.append(f"| {row['length']} | {row['batch']} | {pad['padded_to_length']:.1%} / "
                     f"{pad['padded_to_longest']:.1%} / {pad['packed']:.1%} | {real['padded']} / "
                     f"{real['packed']} | {cells} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="bert_mini")
    parser.add_argument("--lengths", default="128,512")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--examples", type=int, default=4000,
                        help="examples drawn per length (packed together)")
    parser.add_argument("--vocabulary", type=int, default=30522)
    parser.add_argument("--output", default=os.path.join(HERE, "results", "packing.json"))
    parser.add_argument("--smoke", action="store_true",
                        help="a one-layer 16-wide model, rows of 64, 1 round")
    args = parser.parse_args(argv)
    if keras.backend.backend() != "tensorflow":
        raise SystemExit("Run it on the TensorFlow backend (KERAS_BACKEND=tensorflow).")
    import keras_hub
    import tensorflow as tf

    if args.smoke:
        sizes, lengths, rounds = ("bert_tiny", SMOKE_SIZES), [64], 1
        examples, vocabulary = 200, 100
    else:
        sizes, lengths, rounds = (args.preset, {}), [int(n) for n in args.lengths.split(",")], \
            args.rounds
        examples, vocabulary = args.examples, args.vocabulary
    results = {
        "what": "real (non-padding) tokens per second of BERT pretraining steps (masked LM + "
                "next sentence, Adam, XLA), packed against padded, and keras-hub's BERT on the "
                "padded batches; ratios are medians over rounds with 95% intervals",
        "preset": sizes[0], "overrides": sizes[1], "vocabulary": vocabulary,
        "distribution": "log-normal lengths, median 0.3 x length, sigma 0.9, clipped to "
                        "[8, length] (Krell et al. 2021, figure 1: Wikipedia BERT data)",
        "rounds": rounds, "smoke": args.smoke,
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}",
        "versions": {"keras": keras.__version__, "keras_hub": keras_hub.__version__,
                     "tensorflow": tf.__version__, "python": platform.python_version()},
        "command": "python benchmarks/packing.py " + " ".join(argv if argv is not None
                                                               else sys.argv[1:]),
        "rows": [],
    }
    for length in lengths:
        batch = max(1, BATCH_TOKENS // length) if not args.smoke else 4
        print(f"length {length}, batch {batch}: timing {rounds} rounds", flush=True)
        results["rows"].append(run_length(sizes, length, batch, rounds, examples, vocabulary))
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)
    print(table(results))
    print(f"written to {args.output}")
    return results


if __name__ == "__main__":
    main()
