"""Serving on this machine's CPU: keras_attn's artifacts beside Hugging Face
transformers on PyTorch, same shapes and the same weights, in one process.
Prints a table of ratios (never run as a test).

Run:  python benchmarks/serving.py [--rows bert,vit] [--batches 1,8] [--rounds 10]
      python benchmarks/serving.py --smoke      (tiny shapes: checks the script)
      python benchmarks/serving.py --int8       (adds the int8 exports, ONNX and
                                                 LiteRT `precision="int8"`, and
                                                 transformers under PyTorch's dynamic
                                                 int8: their agreement is printed,
                                                 not required)
      python benchmarks/serving.py --peer-threads 1,2 --no-compile
      (TensorFlow backend: the SavedModel, ONNX and LiteRT exports need it)

Rows: BERT-base shapes (12 layers, 768 wide, 12 heads, vocabulary 30522) as a
sequence classifier at length 128, and ViT-B/16 at 224 pixels with 1000
classes; batch 1 (latency) and batch 8 (throughput). keras_attn serves each
model four ways: the Keras model (`predict_on_batch`, XLA), the SavedModel
of `keras_attn.export` (`tf.saved_model.load`), ONNX Runtime and LiteRT
(`keras_attn.export.Artifact`, float32). The peer is the same model in
transformers (`BertForSequenceClassification`, `ViTForImageClassification`
under `torch.inference_mode`), written from the Keras weights by
`keras_attn.convert.save_hf_bert` / `save_hf_vit`, so every runtime computes
the same function: the script checks that the probabilities agree (1e-3)
before timing anything. transformers runs eager at each of `--peer-threads`
and under `torch.compile` (inductor) at `--threads`; the fastest of these
(the median of its rounds) is "transformers' best", the peer every ratio is
taken against. With `--int8`, transformers quantized by PyTorch's dynamic
int8 (`torch.ao.quantization.quantize_dynamic` of every `nn.Linear`) is
timed too, a row beside the int8 artifacts (not a candidate for the best
float peer).

Each round calls every runtime once, in an order rotated from round to
round, so a change in the machine's load hits all of them alike; a row's
ratio is the median of the rounds' runtime / peer ratios with its 95%
interval (`_stats.py`), "faster" / "slower" only when the whole interval is
below / above 1.00. keras_attn's runtimes get `--threads` (default: the
machine's cores).

Every call's process CPU time is recorded beside its wall time: a row's
"cores used" (CPU s / wall s, median) is printed, and a row that kept more
cores busy than its threads, or whose rate (a lower bound of its FLOPs: two
per weight of every projection, per token) exceeds this machine's float32
matrix-product rate at its threads (`_flops.cpu_matmul_peak`), is refused
rather than written (`_stats.checked_row`): the 2026-11-28 figures failed
both checks (benchmarks/RESULTS.md's correction).
"""

import re

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _flops import cpu_matmul_peak  # noqa: E402
from _stats import checked_row  # noqa: E402
from _stats import paired_ratio  # noqa: E402
from _stats import time_rounds_with_cpu  # noqa: E402

PEER = "transformers"  # the prefix of every peer's name
INT8_PEER = "transformers, PyTorch dynamic int8"


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def bert_row(smoke, tmp):
    import torch
    import transformers

    from keras_attn.convert import save_hf_bert
    from keras_attn.models.bert import BertSequenceClassifier
    from keras_attn.models.bert import build_bert

    sizes = dict(num_layers=2, hidden_dim=32, num_heads=2, intermediate_dim=64,
                 vocabulary_size=100) if smoke else {}
    length = 16 if smoke else 128
    keras.utils.set_random_seed(0)
    model = BertSequenceClassifier(build_bert("bert_base", **sizes), num_classes=2)
    vocabulary = model.backbone.bert_config.vocabulary_size
    save_hf_bert(model, os.path.join(tmp, "hf_bert"))
    peer = transformers.BertForSequenceClassification.from_pretrained(
        os.path.join(tmp, "hf_bert")).eval()

    def make_inputs(batch):
        rng = np.random.default_rng(batch)
        ids = rng.integers(5, vocabulary, (batch, length)).astype("int32")
        ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP], no padding: a full length
        return {"token_ids": ids, "segment_ids": np.zeros_like(ids),
                "padding_mask": np.ones_like(ids)}

    def peer_fn(inputs, module):
        tensors = {"input_ids": torch.from_numpy(inputs["token_ids"].astype("int64")),
                   "token_type_ids": torch.from_numpy(inputs["segment_ids"].astype("int64")),
                   "attention_mask": torch.from_numpy(inputs["padding_mask"].astype("int64"))}

        def call():
            with torch.inference_mode():
                return softmax(module(**tensors).logits.numpy())
        return call

    title = (f"BERT-base shapes, sequence classifier, length {length}" if not smoke
             else "BERT (smoke sizes)")
    return title, model, "text", make_inputs, peer, peer_fn


def vit_row(smoke, tmp):
    import torch
    import transformers

    from keras_attn.convert import save_hf_vit
    from keras_attn.models.vit import build_vit

    sizes = dict(num_layers=2, hidden_dim=32, num_heads=2, intermediate_dim=64,
                 image_size=32, num_classes=10) if smoke else dict(num_classes=1000)
    keras.utils.set_random_seed(0)
    model = build_vit("vit_base_16", **sizes)
    # The head starts at zero (every answer uniform, so any two runtimes
    # would agree): random, so that the agreement check checks something.
    rng = np.random.default_rng(0)
    for variable in model.weights:
        if variable.path.startswith("classifier/"):
            variable.assign(rng.normal(0, 0.05, variable.shape).astype(variable.dtype))
    size = model.vit_config.image_size
    save_hf_vit(model, os.path.join(tmp, "hf_vit"))
    peer = transformers.ViTForImageClassification.from_pretrained(
        os.path.join(tmp, "hf_vit")).eval()

    def make_inputs(batch):
        images = np.random.default_rng(batch).integers(0, 256, (batch, size, size, 3))
        return {"images": images.astype("uint8")}

    def peer_fn(inputs, module):
        # transformers' ViT takes normalised channels-first pixels: the
        # rescaling our model does inside ((x / 127.5) - 1) is done here,
        # once, outside the timed call.
        pixels = torch.from_numpy(
            (inputs["images"].astype("float32") / 127.5 - 1.0).transpose(0, 3, 1, 2).copy())

        def call():
            with torch.inference_mode():
                return softmax(module(pixel_values=pixels).logits.numpy())
        return call

    title = "ViT-B/16, 224 pixels, 1000 classes" if not smoke else "ViT (smoke sizes)"
    return title, model, "image", make_inputs, peer, peer_fn


ROWS = {"bert": bert_row, "vit": vit_row}


# The exports timed: (format, precision) -> the runtime's name in the table.
ARTIFACTS = {("onnx", "float32"): "ONNX Runtime", ("litert", "float32"): "LiteRT"}
INT8_ARTIFACTS = {("onnx", "int8"): "ONNX Runtime int8", ("litert", "int8"): "LiteRT int8"}


def export_all(model, kind, tmp, int8):
    """`{(format, precision): directory}` of `model`'s exports (TensorFlow
    backend): the SavedModel, ONNX and LiteRT, and with `int8` the int8
    ONNX and LiteRT."""
    from keras_attn.export import export_image_classifier
    from keras_attn.export import export_text_classifier

    paths = {}
    for format, precision in [("saved_model", "float32"), *ARTIFACTS,
                              *(INT8_ARTIFACTS if int8 else ())]:
        path = os.path.join(tmp, f"{kind}_{format}_{precision}")
        start = time.perf_counter()
        if kind == "image":
            export_image_classifier(model, path, format=format, precision=precision)
        else:
            import keras_hub

            vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [
                f"w{i}" for i in range(model.backbone.bert_config.vocabulary_size - 5)]
            tokenizer = keras_hub.tokenizers.WordPieceTokenizer(vocabulary=vocabulary)
            export_text_classifier(model, tokenizer, path, format=format, precision=precision)
        print(f"  exported {format} {precision} in {time.perf_counter() - start:.0f} s",
              flush=True)
        paths[format, precision] = path
    return paths


def peers(peer, peer_fn, inputs, peer_threads, threads, compiled, int8):
    """`{name: () -> probabilities}`: transformers eager at each thread
    count, under `torch.compile` (`compiled`, built once per row), and with
    `int8` PyTorch's dynamic int8."""
    import torch

    def at(call, n):
        def run():
            torch.set_num_threads(n)
            return call()
        return run

    fns = {f"{PEER}, eager, {n} thread{'s' if n > 1 else ''}": at(peer_fn(inputs, peer), n)
           for n in peer_threads}
    if compiled is not None:
        fns[f"{PEER}, torch.compile, {threads} threads"] = at(peer_fn(inputs, compiled), threads)
    if int8 is not None:
        fns[INT8_PEER] = at(peer_fn(inputs, int8), threads)
    return fns


def threads_of(name, default):
    """The threads a runtime's name states ("..., 1 thread"), else `default`."""
    match = re.search(r"(\d+) threads?\b", name)
    return int(match.group(1)) if match else default


def flops_lower_bound(model, inputs):
    """Two FLOPs per weight of every projection (Dense and convolution
    kernels) per token: a lower bound of a forward pass (the attention's
    scores and the embeddings left out)."""
    weights = sum(int(np.prod(w.shape)) for w in model.weights
                  if w.path.endswith("kernel") and len(w.shape) >= 2)
    if "images" in inputs:
        config = model.vit_config
        tokens = len(inputs["images"]) * ((config.image_size // config.patch_size) ** 2 + 1)
    else:
        tokens = int(np.asarray(inputs["token_ids"]).size)
    return 2.0 * weights * tokens


def runtimes(model, kind, paths, inputs, threads):
    """`{name: () -> probabilities}` of keras_attn's runtimes for one batch
    of inputs."""
    import tensorflow as tf

    from keras_attn.export import Artifact

    model.compile(jit_compile=True)
    if kind == "image":
        keras_inputs = inputs["images"].astype("float32")
    else:
        keras_inputs = inputs

    def keras_call():
        return softmax(np.asarray(model.predict_on_batch(keras_inputs), "float32"))

    loaded = tf.saved_model.load(paths["saved_model", "float32"])
    if kind == "image":
        tensors = [tf.constant(inputs["images"])]
        endpoint = loaded.serve
    else:
        tensors = [tf.constant(inputs[name]) for name in ("token_ids", "segment_ids",
                                                           "padding_mask")]
        endpoint = loaded.serve_ids

    def saved_model_call():
        return endpoint(*tensors).numpy()

    def artifact_call(path):
        artifact = Artifact(path, num_threads=threads)
        return lambda: artifact(**inputs)["probabilities"]

    fns = {"Keras (XLA)": keras_call, "SavedModel": saved_model_call}
    for key, name in {**ARTIFACTS, **INT8_ARTIFACTS}.items():
        if key in paths:
            fns[name] = artifact_call(paths[key])
    return fns, loaded


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--peer-threads", default=None,
                        help="transformers' eager thread counts (default: 1 up to --threads)")
    parser.add_argument("--no-compile", action="store_true",
                        help="leave transformers under torch.compile out")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, 2 rounds")
    parser.add_argument("--int8", action="store_true",
                        help="also the int8 exports (ONNX, LiteRT) and PyTorch's dynamic int8")
    args = parser.parse_args(argv)
    if keras.backend.backend() != "tensorflow":
        raise SystemExit("The exports need the TensorFlow backend (KERAS_BACKEND=tensorflow).")
    import tensorflow as tf
    import torch

    peer_threads = ([int(n) for n in args.peer_threads.split(",")] if args.peer_threads
                    else list(range(1, args.threads + 1)))
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    rounds = 2 if args.smoke else args.rounds
    batches = [int(b) for b in args.batches.split(",")]
    print(f"keras {keras.__version__}, tensorflow {tf.__version__}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, {args.threads} threads per keras_attn runtime, "
          f"transformers eager at {peer_threads} threads"
          f"{'' if args.no_compile else f' and compiled at {args.threads}'}", flush=True)
    table, summary = [], []
    peaks = {n: cpu_matmul_peak(n) for n in sorted(set(peer_threads) | {args.threads})}
    print("float32 matrix product on this machine: " + ", ".join(
        f"{n} thread(s) {peak / 1e9:.0f} GFLOP/s" for n, peak in peaks.items()), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.rows.split(","):
            title, model, kind, make_inputs, peer, peer_fn = ROWS[key](args.smoke, tmp)
            print(f"{title}: {model.count_params():,} parameters", flush=True)
            paths = export_all(model, kind, tmp, args.int8)
            compiled = None if args.no_compile else torch.compile(peer)
            int8_peer = (torch.ao.quantization.quantize_dynamic(
                peer, {torch.nn.Linear}, dtype=torch.qint8) if args.int8 else None)
            for batch in batches:
                inputs = make_inputs(batch)
                fns, _ = runtimes(model, kind, paths, inputs, args.threads)
                peer_fns = peers(peer, peer_fn, inputs, peer_threads, args.threads, compiled,
                                 int8_peer)
                start = time.perf_counter()
                expected = next(iter(peer_fns.values()))()
                for name, fn in {**fns, **peer_fns}.items():  # the same function everywhere
                    got = np.asarray(fn())  # (the compiled peer compiles here)
                    gap = float(np.abs(got - expected).max())
                    if "int8" in name:  # not the same function: how far it is, reported
                        agree = float((got.argmax(-1) == expected.argmax(-1)).mean())
                        print(f"  batch {batch}: {name} vs float transformers: max difference "
                              f"{gap:.2e}, top class the same on {agree:.0%} of rows",
                              flush=True)
                    elif gap > 1e-3:
                        raise RuntimeError(f"{name} differs from {PEER} by {gap:.2e}")
                print(f"  batch {batch}: checked in {time.perf_counter() - start:.0f} s",
                      flush=True)
                times, cpu = time_rounds_with_cpu({**fns, **peer_fns}, rounds)
                median = {name: statistics.median(t) for name, t in times.items()}
                best_peer = min((n for n in peer_fns if n != INT8_PEER), key=median.get)
                flops = flops_lower_bound(model, inputs)
                for name in [*fns, *peer_fns]:
                    threads = threads_of(name, args.threads)
                    row = checked_row(name, threads, times[name], cpu[name], flops,
                                      peaks.get(threads))
                    ratio, lo, hi, verdict = paired_ratio(times[name], times[best_peer])
                    table.append((title, batch, name, median[name] * 1e3, row["cores_used"],
                                  row["flops_per_second"] / 1e9, ratio, lo, hi,
                                  "" if name == best_peer else verdict))
                for label, names in (("float", [n for n in fns if "int8" not in n]),
                                     ("any precision", list(fns))):
                    best = min(names, key=median.get)
                    ratio = paired_ratio(times[best], times[best_peer])
                    summary.append((title, batch, label, best, best_peer, ratio))
                print(f"  batch {batch}: fastest keras_attn runtime "
                      f"{min(fns, key=median.get)}, fastest peer {best_peer}", flush=True)
    print()
    print("| model | batch | runtime | ms per batch | cores used | GFLOP/s (at least) "
          "| vs transformers' best | 95% interval | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    for title, batch, name, ms, cores, gflops, ratio, lo, hi, verdict in table:
        print(f"| {title} | {batch} | {name} | {ms:.1f} | {cores:.2f} | {gflops:.0f} "
              f"| {ratio:.3f} | {lo:.3f}-{hi:.3f} | {verdict} |")
    print()
    print("| model | batch | keras_attn's best | transformers' best | time ratio (95%) "
          "| speed-up |")
    print("|---|---|---|---|---|---|")
    for title, batch, label, best, best_peer, (ratio, lo, hi, _) in summary:
        print(f"| {title} | {batch} | {best} ({label}) | {best_peer} | {ratio:.3f} "
              f"({lo:.3f}-{hi:.3f}) | {1 / ratio:.2f}x |")


if __name__ == "__main__":
    main()
