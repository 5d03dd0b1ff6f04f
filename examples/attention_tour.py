"""A tour of attention: positional encodings and the heads of a small encoder.

What it does: builds a 2-block Transformer encoder from keras_attn layers
(embedding * sqrt(d) + sinusoidal positions, post-norm blocks), teaches it in a
few seconds to read a sentence backwards (output i = input word T-1-i, a task
that can only be solved by attending to the mirrored position), runs it on one
English sentence and writes two kinds of PNG:

  positional_encoding.png   the sinusoid table, positions x dimensions
  attention_block_<k>.png   the attention map of every head of block k

Run:     python examples/attention_tour.py [--output out/attention_tour]
Expect:  under a minute on a laptop CPU; the reversal accuracy printed at the
         end is ~1.00 and the last block's heads show the anti-diagonal.
         `--smoke` trains a few steps only (used by the test suite).
         Measured 2026-11-26 after the initialisation fix (issue 38): reversal
         accuracy 1.00, 54 s on a loaded 2-core machine; every head of the
         last block shows the anti-diagonal (docs/attention_tour_block_1.png).
"""

import argparse
import os
import time

from keras_attn._base.quiet_tensorflow import import_tensorflow_quietly

# Before Keras: TensorFlow's C++ start-up notices (absl, oneDNN, CUDA) held back.
import_tensorflow_quietly()

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_attn import layers  # noqa: E402
from keras_attn import viz  # noqa: E402

SENTENCE = (
    "every word of the sentence looks at every other word and "
    "takes what it needs from them"
)
# Training words: the sentence's own words plus a few others, so that the
# model learns a rule over positions rather than one sentence.
EXTRA_WORDS = "a an the model reads writes keys values queries heads layers".split()


def build_encoder(vocabulary_size, length, hidden_dim=64, num_heads=4, num_layers=2):
    """Token ids (B, T) -> per-position word logits, plus each block's scores."""
    token_ids = keras.Input((length,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(vocabulary_size, hidden_dim, name="token_embedding")(token_ids)
    x = x * float(np.sqrt(hidden_dim))  # the paper scales embeddings by sqrt(d)
    x = x + layers.SinusoidalPositionalEncoding(name="positions")(x)
    all_scores = []
    for k in range(num_layers):
        x, scores = layers.TransformerBlock(
            num_heads=num_heads,
            intermediate_dim=4 * hidden_dim,
            dropout=0.0,
            name=f"block_{k}",
        )(x, return_attention_scores=True)
        all_scores.append(scores)
    logits = keras.layers.Dense(vocabulary_size, name="word_logits")(x)
    training_model = keras.Model(token_ids, logits, name="reverser")
    inspection_model = keras.Model(token_ids, [logits] + all_scores, name="reverser_with_scores")
    return training_model, inspection_model


def reversal_data(rng, vocabulary_size, length, count):
    ids = rng.integers(0, vocabulary_size, size=(count, length)).astype("int32")
    return ids, ids[:, ::-1].copy()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", default="out/attention_tour", help="directory for the PNGs")
    parser.add_argument("--steps", type=int, default=600, help="training steps")
    parser.add_argument("--smoke", action="store_true", help="a few steps only")
    args = parser.parse_args(argv)
    if args.smoke:
        print("--smoke: a few steps on a sliver of the data, to check that the example "
              "runs; the numbers printed below are not its results.", flush=True)
    steps = 5 if args.smoke else args.steps
    start = time.time()
    keras.utils.set_random_seed(0)

    words = SENTENCE.split()
    vocabulary = sorted(set(words) | set(EXTRA_WORDS))
    word_id = {w: i for i, w in enumerate(vocabulary)}
    length = len(words)
    training_model, inspection_model = build_encoder(len(vocabulary), length)
    training_model.compile(
        optimizer=keras.optimizers.Adam(2e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    rng = np.random.default_rng(0)
    x, y = reversal_data(rng, len(vocabulary), length, 64 * steps)
    epochs = 1 if args.smoke else 6
    print(f"Training a {training_model.count_params():,}-parameter encoder to reverse "
          f"{length}-word sequences ({steps} steps of 64)...")
    training_model.fit(x, y, batch_size=64, epochs=epochs, steps_per_epoch=max(1, steps // epochs), verbose=2)

    sentence_ids = np.array([[word_id[w] for w in words]], "int32")
    logits, *block_scores = inspection_model.predict(sentence_ids, verbose=0)
    predicted = [vocabulary[i] for i in logits[0].argmax(-1)]
    accuracy = float(np.mean(np.array(predicted) == np.array(words[::-1])))
    print("input:   ", " ".join(words))
    print("reversed:", " ".join(predicted))
    print(f"reversal accuracy on the sentence: {accuracy:.2f}")

    os.makedirs(args.output, exist_ok=True)
    table_path = os.path.join(args.output, "positional_encoding.png")
    viz.plot_positional_encoding(
        layers.sinusoidal_positional_encoding(100, 128),
        path=table_path,
        title="PE(pos, 2k) = sin(pos / 10000^(2k/d)), PE(pos, 2k+1) = cos(...), d = 128",
    )
    written = [table_path]
    for k, scores in enumerate(block_scores):
        path = os.path.join(args.output, f"attention_block_{k}.png")
        viz.plot_attention_heads(scores[0], words, path=path, title=f"block {k}: who attends to whom")
        written.append(path)
    print(f"done in {time.time() - start:.0f}s; plots:")
    for path in written:
        print("  ", os.path.abspath(path))
    return accuracy


if __name__ == "__main__":
    main()
