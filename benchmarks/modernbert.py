"""ModernBERT: keras_attn's against transformers' own, same weights, on the
CPU, in one process. Prints a table of ratios (never run as a test).

Run:  python benchmarks/modernbert.py [--quick] [--threads 1,2]
      (keras_attn on the Keras backend of KERAS_BACKEND, TensorFlow by
      default; transformers on PyTorch)

transformers' `ModernBertModel` with random weights is written with
`save_pretrained` and read back by `keras_attn.convert.load_hf`, so both
sides compute the same function (their outputs are compared first, and the
largest difference is printed). Each row times a forward pass (inference)
and a training step (forward, backward and Adam on the mean of the last
hidden state: a loss that reaches every weight) of both, in alternating
pairs after warm-up (`_stats.time_pair`): the ratio is the median of the
rounds' keras_attn / transformers ratios (< 1.00 = keras_attn faster) with
a 95% interval and a verdict. keras_attn runs compiled (`jit_compile=True`:
XLA on TensorFlow and JAX; PyTorch runs eagerly), transformers eagerly with
its default attention (`sdpa`), once per `torch.set_num_threads` of
`--threads` (a row each: on a busy two-core machine one thread was 6x faster
than two for transformers; its best row is the fair peer).

Rows are 512 tokens long, so the local blocks' 128-token window and the
rotary positions both matter; `--quick` keeps ModernBERT-base's width and
heads with 4 of its 22 layers (2 global, 2 local), one row and fewer rounds.
"""

import argparse
import os
import statistics
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _stats import paired_ratio  # noqa: E402
from _stats import time_pair  # noqa: E402


def peer_model(num_layers, path):
    """transformers' ModernBertModel of ModernBERT-base's shape with
    `num_layers` blocks, random weights, saved to `path`."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.ModernBertConfig(num_hidden_layers=num_layers)  # base otherwise
    model = transformers.ModernBertModel(config)
    model.save_pretrained(path)
    return model


def keras_fns(model, ids, mask):
    """(inference, train step) of the keras_attn backbone, compiled."""
    inputs = {"token_ids": ids, "padding_mask": mask}
    model.compile(optimizer=keras.optimizers.Adam(1e-5), loss="mse", jit_compile=True)
    outputs = model.predict_on_batch(inputs)
    target = np.zeros_like(outputs["sequence_output"] if isinstance(outputs, dict) else outputs)

    class MeanOfLastState(keras.Model):  # the peer's loss: mean of the last hidden state
        def __init__(self, backbone):
            super().__init__()
            self.backbone = backbone

        def call(self, x):
            out = self.backbone(x)
            return out["sequence_output"] if isinstance(out, dict) else out

    trainer = MeanOfLastState(model)
    trainer.compile(optimizer=keras.optimizers.Adam(1e-5),
                    loss=lambda y, p: keras.ops.mean(p) + 0.0 * keras.ops.mean(y),
                    jit_compile=True)
    return (lambda: model.predict_on_batch(inputs),
            lambda: trainer.train_on_batch(inputs, target))


def peer_fns(model, ids, mask):
    import torch

    input_ids = torch.tensor(ids, dtype=torch.long)
    attention_mask = torch.tensor(mask, dtype=torch.long)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)

    def infer():
        model.eval()
        with torch.no_grad():
            return model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def train():
        model.train()
        optimizer.zero_grad()
        loss = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state.mean()
        loss.backward()
        optimizer.step()

    return infer, train


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 layers, batch 1, fewer rounds")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--threads", default="1,2", help="PyTorch thread counts, a row each")
    args = parser.parse_args(argv)
    import torch

    from keras_attn.convert import load_hf

    threads = [int(t) for t in args.threads.split(",")]
    layers = args.layers or (4 if args.quick else 22)
    batch = 1 if args.quick else args.batch
    repeats = args.repeats or (6 if args.quick else 15)
    print(f"keras {keras.__version__} ({keras.backend.backend()}), torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, torch threads {threads}; ModernBERT-base width, "
          f"{layers} layers, batch {batch} x {args.length} tokens", flush=True)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 50000, (batch, args.length)).astype("int32")
    mask = np.ones_like(ids)
    mask[-1, args.length * 3 // 4:] = 0  # the last row padded
    with tempfile.TemporaryDirectory() as path:
        peer = peer_model(layers, path)
        ours = load_hf(path)
    peer_infer, peer_train = peer_fns(peer, ids, mask)
    ours_infer, ours_train = keras_fns(ours, ids, mask)
    # The same function: compared on the real tokens before any training step.
    got = ours_infer()
    got = np.asarray(got["sequence_output"] if isinstance(got, dict) else got)
    want = peer_infer().numpy()
    real = mask.astype(bool)
    print(f"max |keras_attn - transformers| over real tokens: "
          f"{np.abs(got[real] - want[real]).max():.2e}", flush=True)
    table = []
    for count in threads:
        torch.set_num_threads(count)
        for what, ours_fn, peer_fn in (("inference", ours_infer, peer_infer),
                                       ("train step", ours_train, peer_train)):
            ours_times, peer_times = time_pair(ours_fn, peer_fn, repeats)
            ratio, lo, hi, verdict = paired_ratio(ours_times, peer_times)
            table.append((what, count, statistics.median(ours_times) * 1e3,
                          statistics.median(peer_times) * 1e3, ratio, lo, hi, verdict))
            print(f"{what}, torch threads {count}: {table[-1][2]:.0f} ms vs "
                  f"{table[-1][3]:.0f} ms", flush=True)
    print()
    print("| measure | torch threads | keras_attn ms | transformers ms | ratio | 95% interval "
          "| verdict |")
    print("|---|---|---|---|---|---|---|")
    for what, count, a, b, ratio, lo, hi, verdict in table:
        print(f"| {what} | {count} | {a:.0f} | {b:.0f} | {ratio:.3f} | {lo:.3f}-{hi:.3f} "
              f"| {verdict} |")


if __name__ == "__main__":
    main()
