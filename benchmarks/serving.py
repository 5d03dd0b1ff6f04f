"""Serving on this machine's CPU: keras_attn's artifacts beside Hugging Face
transformers on PyTorch, same shapes and the same weights, in one process.
Prints a table of ratios (never run as a test).

Run:  python benchmarks/serving.py [--rows bert,vit] [--batches 1,32] [--rounds 10]
      python benchmarks/serving.py --smoke      (tiny shapes: checks the script)
      python benchmarks/serving.py --int8       (adds the ONNX export quantized by
                                                 onnxruntime's quantize_dynamic: its
                                                 agreement is printed, not required)
      (TensorFlow backend: the SavedModel, ONNX and LiteRT exports need it)

Rows: BERT-base shapes (12 layers, 768 wide, 12 heads, vocabulary 30522) as a
sequence classifier at length 128, and ViT-B/16 at 224 pixels with 1000
classes; batch 1 (latency) and batch 32 (throughput). keras_attn serves each
model four ways: the Keras model (`predict_on_batch`, XLA), the SavedModel
of `keras_attn.export` (`tf.saved_model.load`), ONNX Runtime and LiteRT
(`keras_attn.export.Artifact`, float32). The peer is the same model in
transformers (`BertForSequenceClassification`, `ViTForImageClassification`,
eager PyTorch under `torch.inference_mode`), written from the Keras weights
by `keras_attn.convert.save_hf_bert` / `save_hf_vit`, so every runtime
computes the same function: the script checks that the probabilities agree
(1e-3) before timing anything.

Each round calls every runtime once, in an order rotated from round to
round, so a change in the machine's load hits all of them alike; a row's
ratio is the median of the rounds' runtime / peer ratios with its 95%
interval (`_stats.py`), "faster" / "slower" only when the whole interval is
below / above 1.00. Every runtime gets the machine's cores (`--threads`).
"""

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
from _stats import paired_ratio  # noqa: E402
from _stats import time_rounds  # noqa: E402

PEER = "transformers (PyTorch)"


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

    def peer_fn(inputs):
        tensors = {"input_ids": torch.from_numpy(inputs["token_ids"].astype("int64")),
                   "token_type_ids": torch.from_numpy(inputs["segment_ids"].astype("int64")),
                   "attention_mask": torch.from_numpy(inputs["padding_mask"].astype("int64"))}

        def call():
            with torch.inference_mode():
                return softmax(peer(**tensors).logits.numpy())
        return call

    title = (f"BERT-base shapes, sequence classifier, length {length}" if not smoke
             else "BERT (smoke sizes)")
    return title, model, "text", make_inputs, peer_fn


def vit_row(smoke, tmp):
    import torch
    import transformers

    from keras_attn.convert import save_hf_vit
    from keras_attn.models.vit import build_vit

    sizes = dict(num_layers=2, hidden_dim=32, num_heads=2, intermediate_dim=64,
                 image_size=32, num_classes=10) if smoke else dict(num_classes=1000)
    keras.utils.set_random_seed(0)
    model = build_vit("vit_base_16", **sizes)
    size = model.vit_config.image_size
    save_hf_vit(model, os.path.join(tmp, "hf_vit"))
    peer = transformers.ViTForImageClassification.from_pretrained(
        os.path.join(tmp, "hf_vit")).eval()

    def make_inputs(batch):
        images = np.random.default_rng(batch).integers(0, 256, (batch, size, size, 3))
        return {"images": images.astype("uint8")}

    def peer_fn(inputs):
        # transformers' ViT takes normalised channels-first pixels: the
        # rescaling our model does inside ((x / 127.5) - 1) is done here,
        # once, outside the timed call.
        pixels = torch.from_numpy(
            (inputs["images"].astype("float32") / 127.5 - 1.0).transpose(0, 3, 1, 2).copy())

        def call():
            with torch.inference_mode():
                return softmax(peer(pixel_values=pixels).logits.numpy())
        return call

    title = "ViT-B/16, 224 pixels, 1000 classes" if not smoke else "ViT (smoke sizes)"
    return title, model, "image", make_inputs, peer_fn


ROWS = {"bert": bert_row, "vit": vit_row}


def export_all(model, kind, tmp):
    """The three exported directories of `model` (TensorFlow backend)."""
    from keras_attn.export import export_image_classifier
    from keras_attn.export import export_text_classifier

    paths = {}
    for format in ("saved_model", "onnx", "litert"):
        path = os.path.join(tmp, f"{kind}_{format}")
        start = time.perf_counter()
        if kind == "image":
            export_image_classifier(model, path, format=format)
        else:
            import keras_hub

            vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [
                f"w{i}" for i in range(model.backbone.bert_config.vocabulary_size - 5)]
            tokenizer = keras_hub.tokenizers.WordPieceTokenizer(vocabulary=vocabulary)
            export_text_classifier(model, tokenizer, path, format=format)
        print(f"  exported {format} in {time.perf_counter() - start:.0f} s", flush=True)
        paths[format] = path
    return paths


INT8 = "ONNX Runtime int8"


def quantize_onnx(paths, tmp):
    """onnxruntime's dynamic int8 quantization (`quantize_dynamic`: int8
    weights, activations quantized per call) of the ONNX export, as a
    file beside it: a serving-side option, not one of `keras_attn.export`'s
    precisions."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic

    file = os.path.join(tmp, os.path.basename(paths["onnx"]) + "_int8.onnx")
    quantize_dynamic(os.path.join(paths["onnx"], "model.onnx"), file,
                     weight_type=QuantType.QInt8)
    return file


def runtimes(model, kind, paths, inputs, peer_call, threads, int8=None):
    """`{name: () -> probabilities}` for one batch of inputs (with `int8`,
    the quantized ONNX file, its row too)."""
    import tensorflow as tf

    from keras_attn.export import Artifact

    model.compile(jit_compile=True)
    if kind == "image":
        keras_inputs = inputs["images"].astype("float32")
    else:
        keras_inputs = inputs

    def keras_call():
        return softmax(np.asarray(model.predict_on_batch(keras_inputs), "float32"))

    loaded = tf.saved_model.load(paths["saved_model"])
    if kind == "image":
        tensors = [tf.constant(inputs["images"])]
        endpoint = loaded.serve
    else:
        tensors = [tf.constant(inputs[name]) for name in ("token_ids", "segment_ids",
                                                           "padding_mask")]
        endpoint = loaded.serve_ids

    def saved_model_call():
        return endpoint(*tensors).numpy()

    artifacts = {f: Artifact(paths[f], num_threads=threads) for f in ("onnx", "litert")}

    def artifact_call(format):
        return lambda: artifacts[format](**inputs)["probabilities"]

    fns = {"Keras (XLA)": keras_call, "SavedModel": saved_model_call,
           "ONNX Runtime": artifact_call("onnx"), "LiteRT": artifact_call("litert")}
    if int8:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        session = onnxruntime.InferenceSession(int8, options,
                                               providers=["CPUExecutionProvider"])
        fns[INT8] = lambda: session.run(["probabilities"], inputs)[0]
    fns[PEER] = peer_call
    return fns, loaded


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, 2 rounds")
    parser.add_argument("--int8", action="store_true",
                        help="also the ONNX export quantized by onnxruntime's quantize_dynamic")
    args = parser.parse_args(argv)
    if keras.backend.backend() != "tensorflow":
        raise SystemExit("The exports need the TensorFlow backend (KERAS_BACKEND=tensorflow).")
    import tensorflow as tf
    import torch

    torch.set_num_threads(args.threads)
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    rounds = 2 if args.smoke else args.rounds
    batches = [int(b) for b in args.batches.split(",")]
    print(f"keras {keras.__version__}, tensorflow {tf.__version__}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, {args.threads} threads per runtime", flush=True)
    table = []
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.rows.split(","):
            title, model, kind, make_inputs, peer_fn = ROWS[key](args.smoke, tmp)
            print(f"{title}: {model.count_params():,} parameters", flush=True)
            paths = export_all(model, kind, tmp)
            int8 = quantize_onnx(paths, tmp) if args.int8 else None
            for batch in batches:
                inputs = make_inputs(batch)
                fns, _ = runtimes(model, kind, paths, inputs, peer_fn(inputs), args.threads,
                                  int8)
                expected = fns[PEER]()
                for name, fn in fns.items():  # the same function everywhere
                    got = np.asarray(fn())
                    gap = float(np.abs(got - expected).max())
                    if name == INT8:  # not the same function: how far it is, reported
                        agree = float((got.argmax(-1) == expected.argmax(-1)).mean())
                        print(f"  batch {batch}: {INT8} vs {PEER}: max difference "
                              f"{gap:.2e}, top class the same on {agree:.0%} of rows",
                              flush=True)
                    elif gap > 1e-3:
                        raise RuntimeError(f"{name} differs from {PEER} by {gap:.2e}")
                times = time_rounds(fns, rounds)
                for name in fns:
                    ratio, lo, hi, verdict = paired_ratio(times[name], times[PEER])
                    table.append((title, batch, name, statistics.median(times[name]) * 1e3,
                                  ratio, lo, hi, "" if name == PEER else verdict))
                best = min(fns, key=lambda name: statistics.median(times[name]))
                print(f"  batch {batch}: fastest {best}", flush=True)
    print()
    print(f"| model | batch | runtime | ms per batch | vs {PEER} | 95% interval | verdict |")
    print("|---|---|---|---|---|---|---|")
    for title, batch, name, ms, ratio, lo, hi, verdict in table:
        print(f"| {title} | {batch} | {name} | {ms:.1f} | {ratio:.3f} | {lo:.3f}-{hi:.3f} "
              f"| {verdict} |")


if __name__ == "__main__":
    main()
