"""CPU benchmarks: keras_attn side by side with keras-hub, same shapes and
weight counts, in one process. Prints a table of ratios (never run as a test).

Run:  python benchmarks/cpu.py [--quick] [--rows bert,mlm,vit,transformer,decoding]
      (TensorFlow backend by default; KERAS_BACKEND=jax works too)

Each row times a compiled training step (forward + backward + Adam) and a
compiled inference call of keras_attn and its peer in `--repeats` rounds
after warm-up. A round times both back to back, in alternating order, so a
change in the machine's load hits both sides alike; the ratio is the median
of the rounds' keras_attn / peer ratios (< 1.00 = faster), with a 95%
interval for it and a verdict: "faster" / "slower" only when the whole
interval is below / above 1.00, else "tie" (see `_stats.py`).

The `decoding` rows are the exception: one keras_attn Transformer (the
`transformer` row's model) decodes the same sources with its key/value
cache ("keras_attn" column) and by re-running the decoder on the whole
prefix ("peer" column), greedy and beam 4, and must give the same tokens;
tokens/s are printed as it runs. `benchmarks/decoding.py` does the same for
other sizes.
"""

import argparse
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _stats import paired_ratio  # noqa: E402
from _stats import time_pair  # noqa: E402


def _train_step_fn(model, inputs, targets, jit_compile, loss="mse"):
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss=loss, jit_compile=jit_compile)

    def step():
        model.train_on_batch(inputs, targets)

    return step


def _predict_fn(model, inputs, jit_compile):
    model.compile(jit_compile=jit_compile)

    def call():
        model.predict_on_batch(inputs)

    return call


def compare(name, ours, peer, inputs, targets_fn, repeats, jit_compile, loss="mse"):
    """Times training and inference of two models on the same inputs, in
    alternating pairs (see `_stats`)."""
    rows = []
    for what in ("train step", "inference"):
        fns = []
        for model in (ours, peer):
            if what == "train step":
                fns.append(_train_step_fn(model, inputs, targets_fn(model), jit_compile, loss))
            else:
                fns.append(_predict_fn(model, inputs, jit_compile))
        for fn in fns:  # compile both before timing either
            fn()
        ours_times, peer_times = time_pair(fns[0], fns[1], repeats)
        rows.append(_row(name, what, jit_compile, ours_times, peer_times))
    return rows


def _row(name, what, jit_compile, ours_times, peer_times):
    ratio, lo, hi, verdict = paired_ratio(ours_times, peer_times)
    return (name, what, jit_compile, statistics.median(ours_times) * 1e3,
            statistics.median(peer_times) * 1e3, ratio, lo, hi, verdict)


def bert_models(quick):
    import keras_hub

    from keras_attn.models.bert import build_bert

    # bert_small shapes (4 layers, 512 wide, 8 heads), batch 8, length 128.
    # keras-hub's `dropout` also sets its attention dropout; ours is a
    # separate field, so both are 0 here (with attention dropout left at 0.1,
    # the train step also draws and applies a (B, N, T, S) dropout mask per
    # layer, +5.5% under XLA: the 1.07 measured before this was fixed).
    ours = build_bert("bert_small", dropout=0.0, attention_dropout=0.0)
    peer = keras_hub.models.BertBackbone(
        vocabulary_size=30522, num_layers=4, num_heads=8, hidden_dim=512,
        intermediate_dim=2048, dropout=0.0,
    )
    rng = np.random.default_rng(0)
    inputs = {
        "token_ids": rng.integers(1, 30522, (8, 128)).astype("int32"),
        "segment_ids": np.zeros((8, 128), "int32"),
        "padding_mask": np.ones((8, 128), "int32"),
    }
    return ours, peer, inputs


MLM_SHAPE = dict(batch=16, length=128, masked=20, vocabulary_size=30522)


def mlm_models(quick):
    import keras_hub

    from keras_attn.models.bert import BertPretrainer
    from keras_attn.models.bert import build_bert

    # Masked-LM pretraining, bert_mini shapes (4 layers, 256 wide, 4 heads;
    # 11M parameters, most of them the tied token embedding that is also the
    # decoder), batch 16 x 128, 20 predicted positions a row; the step is
    # sparse cross-entropy over the vocabulary (see `MLM_LOSS`). Ours is the
    # masked-LM output of `BertPretrainer` (its NSP head left out: the peer
    # has none), the peer keras-hub's `BertMaskedLM`; dropout 0 on both.
    b, t, p, v = (MLM_SHAPE[k] for k in ("batch", "length", "masked", "vocabulary_size"))
    pretrainer = BertPretrainer(build_bert("bert_mini", dropout=0.0, attention_dropout=0.0))
    names = ("token_ids", "segment_ids", "padding_mask", "mask_positions")
    ours = keras.Model({k: pretrainer.input[k] for k in names}, pretrainer.output["mlm"])
    peer = keras_hub.models.BertMaskedLM(keras_hub.models.BertBackbone(
        vocabulary_size=v, num_layers=4, num_heads=4, hidden_dim=256,
        intermediate_dim=1024, dropout=0.0,
    ))
    rng = np.random.default_rng(0)
    inputs = {
        "token_ids": rng.integers(1, v, (b, t)).astype("int32"),
        "segment_ids": np.zeros((b, t), "int32"),
        "padding_mask": np.ones((b, t), "int32"),
        "mask_positions": np.sort(rng.permuted(np.tile(np.arange(t), (b, 1)), axis=1)[:, :p], 1)
        .astype("int32"),
    }
    return ours, peer, inputs


MLM_LOSS = (  # (loss, targets of a model): the masked tokens' original ids
    keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    lambda model: np.random.default_rng(1).integers(
        1, MLM_SHAPE["vocabulary_size"], (MLM_SHAPE["batch"], MLM_SHAPE["masked"])).astype("int32"),
)


def vit_models(quick):
    import keras_hub

    from keras_attn.models.vit import build_vit

    # ViT-S/16 shapes (384 wide, 6 heads, MLP 1536); 12 layers, 4 with --quick.
    layers = 4 if quick else 12
    ours = build_vit("vit_small_16", num_layers=layers, image_size=224)
    peer = keras_hub.models.ViTBackbone(
        image_shape=(224, 224, 3), patch_size=16, num_layers=layers, num_heads=6,
        hidden_dim=384, mlp_dim=1536,
    )
    images = np.random.default_rng(0).uniform(0, 255, (8, 224, 224, 3)).astype("float32")
    return ours, peer, images


def conformer_models(quick):
    from keras_attn.layers import ConformerBlock

    # A Conformer-S block (dim 144, 4 heads, kernel 32) on 2 s of 40 ms
    # frames; the peer is the same block without its convolution module's
    # counterpart: keras-hub has no Conformer, so the row compares against a
    # keras-hub TransformerEncoder of the same width (context, not a race).
    import keras_hub

    frames, width = 50, 144
    inputs = keras.Input((frames, width))
    ours = keras.Model(inputs, ConformerBlock(num_heads=4, kernel_size=32)(inputs))
    peer_in = keras.Input((frames, width))
    peer = keras.Model(
        peer_in,
        keras_hub.layers.TransformerEncoder(intermediate_dim=4 * width, num_heads=4)(peer_in),
    )
    x = np.random.default_rng(0).standard_normal((8, frames, width)).astype("float32")
    return ours, peer, x


TRANSFORMER_SHAPE = dict(vocabulary_size=8000, layers=2, batch=8, length=32)


def _transformer():
    from keras_attn.models.transformer import build_transformer

    shape = TRANSFORMER_SHAPE
    return build_transformer(
        "transformer_base", vocabulary_size=shape["vocabulary_size"],
        num_encoder_layers=shape["layers"], num_decoder_layers=shape["layers"],
        dropout=0.0, max_sequence_length=128,
    )


def transformer_models(quick):
    import keras_hub

    # transformer_base widths (D 512, d_ff 2048, 8 heads, post-norm, ReLU,
    # sinusoidal positions, shared vocabulary with the output projection
    # tied to the embedding), 2 + 2 layers, batch 8, source and target
    # length 32, vocabulary 8000, dropout 0.
    v, n, b, t = (TRANSFORMER_SHAPE[k] for k in ("vocabulary_size", "layers", "batch", "length"))
    width = 512
    ours = _transformer()
    # The peer, from keras-hub pieces with the same parameters one for one:
    # one tied ReversibleEmbedding for both sides and the logits (keras-hub's
    # TokenAndPositionEmbedding would add learned positions the paper's
    # model does not have), parameter-free SinePositionEncoding, and
    # TransformerEncoder / TransformerDecoder (post-norm, ReLU) blocks.
    embedding = keras_hub.layers.ReversibleEmbedding(v, width, tie_weights=True, name="embedding")
    positions = keras_hub.layers.SinePositionEncoding()

    def embed(ids):
        x = embedding(ids) * width**0.5
        return x + positions(x)

    source = keras.Input((None,), dtype="int32", name="source_ids")
    target = keras.Input((None,), dtype="int32", name="target_ids")
    source_mask, target_mask = ops.not_equal(source, 0), ops.not_equal(target, 0)
    x = embed(source)
    for _ in range(n):
        x = keras_hub.layers.TransformerEncoder(
            intermediate_dim=4 * width, num_heads=8, layer_norm_epsilon=1e-6,
        )(x, padding_mask=source_mask)
    y = embed(target)
    for _ in range(n):
        y = keras_hub.layers.TransformerDecoder(
            intermediate_dim=4 * width, num_heads=8, layer_norm_epsilon=1e-6,
        )(y, x, decoder_padding_mask=target_mask, encoder_padding_mask=source_mask)
    peer = keras.Model([source, target], embedding(y, reverse=True))
    rng = np.random.default_rng(0)
    ids = [rng.integers(1, v, (b, t)).astype("int32") for _ in range(2)]
    return ours, peer, ids


def decoding_rows(repeats, jit_compile):
    """Transformer decoding, with the key/value cache ("keras_attn") vs
    re-running the decoder on the whole prefix ("peer"), same model (the
    Transformer row's), same tokens; greedy and beam 4, 32 steps each."""
    from keras_attn.models.transformer.decoding import TransformerTranslator

    v, b, t = (TRANSFORMER_SHAPE[k] for k in ("vocabulary_size", "batch", "length"))
    keras.utils.set_random_seed(0)
    model = _transformer()
    source = np.random.default_rng(0).integers(3, v, (b, t)).astype("int32")
    rows = []
    for beam in (None, 4):
        fns, outputs = [], []
        for use_cache in (True, False):
            # end_id=-1 is never emitted: every sentence runs all t steps.
            translator = TransformerTranslator(
                model, start_id=1, end_id=-1, beam_width=beam, max_length=t, use_cache=use_cache,
            )
            translator.compile(jit_compile=jit_compile)
            outputs.append(translator.predict_on_batch(source)[0])
            fns.append(lambda tr=translator: tr.predict_on_batch(source))
        if not np.array_equal(outputs[0], outputs[1]):
            raise RuntimeError("cached and uncached decoding gave different tokens")
        # The uncached beam search takes seconds: one warm-up call each.
        cached, recomputed = time_pair(fns[0], fns[1], repeats, warmup=1)
        a, c = statistics.median(cached), statistics.median(recomputed)
        what = f"{'greedy' if beam is None else f'beam {beam}'}, {t} tokens"
        rows.append(_row(DECODING_TITLE, what, jit_compile, cached, recomputed))
        print(f"  {what}, XLA {'on' if jit_compile else 'off'}: {b * t / a:.0f} tokens/s "
              f"with the cache, {b * t / c:.0f} recomputing the prefix", flush=True)
    return rows


def attention_models(quick):
    from keras_attn.layers import MultiHeadAttention

    length, width = (128, 512)
    inputs = keras.Input((length, width))
    ours = keras.Model(inputs, MultiHeadAttention(num_heads=8)(inputs, use_causal_mask=True))
    peer_in = keras.Input((length, width))
    peer = keras.Model(
        peer_in,
        keras.layers.MultiHeadAttention(num_heads=8, key_dim=64)(peer_in, peer_in, use_causal_mask=True),
    )
    x = np.random.default_rng(0).standard_normal((8, length, width)).astype("float32")
    return ours, peer, x


ROWS = {
    "bert": ("BERT encoder, bert_small shapes, B8 T128 (vs keras-hub BertBackbone)", bert_models),
    "mlm": (
        "BERT masked LM, bert_mini shapes (11M), B16 T128, 20 masked, Adam, sparse CE "
        "(vs keras-hub BertMaskedLM)",
        mlm_models,
    ),
    "attention": ("MHA, causal, B8 T128 D512 (vs keras.layers.MultiHeadAttention)", attention_models),
    "vit": ("ViT-S/16 shapes, batch 8 (vs keras-hub ViTBackbone)", vit_models),
    "conformer": ("Conformer-S block, B8 T50 (vs keras-hub TransformerEncoder)", conformer_models),
    "transformer": (
        "Transformer enc-dec, base widths, 2+2 layers, B8 S=T=32, V 8000 "
        "(vs keras-hub TransformerEncoder/Decoder)",
        transformer_models,
    ),
    "decoding": None,  # see decoding_rows
}
DECODING_TITLE = (
    "Transformer decoding, same model, B8 (cache vs recomputing the prefix; "
    "ms per batch)"
)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="fewer layers and repeats")
    parser.add_argument("--xla", default="both", choices=("on", "off", "both"))
    args = parser.parse_args(argv)
    repeats = 6 if args.quick else args.repeats
    xla_modes = {"on": [True], "off": [False], "both": [True, False]}[args.xla]
    print(f"keras {keras.__version__}, backend {keras.backend.backend()}, "
          f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    table = []
    for key in args.rows.split(","):
        if key == "decoding":
            for jit in xla_modes:
                print(f"{DECODING_TITLE}, XLA {'on' if jit else 'off'}", flush=True)
                table += decoding_rows(repeats, jit)
            continue
        title, make = ROWS[key]
        for jit in xla_modes:
            ours, peer, inputs = make(args.quick)
            print(f"{title}, XLA {'on' if jit else 'off'}: "
                  f"{ours.count_params():,} vs {peer.count_params():,} parameters", flush=True)

            def targets(model, inputs=inputs):
                out = model.predict_on_batch(inputs)
                return {k: np.zeros_like(v) for k, v in out.items()} if isinstance(out, dict) else np.zeros_like(out)

            if key == "mlm":
                table += compare(title, ours, peer, inputs, MLM_LOSS[1], repeats, jit,
                                 loss=MLM_LOSS[0])
                continue
            table += compare(title, ours, peer, inputs, targets, repeats, jit)
    print()
    print("| case | measure | XLA | keras_attn ms | peer ms | ratio | 95% interval | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    for name, what, jit, a, b, ratio, lo, hi, verdict in table:
        print(f"| {name} | {what} | {'on' if jit else 'off'} | {a:.1f} | {b:.1f} "
              f"| {ratio:.3f} | {lo:.3f}-{hi:.3f} | {verdict} |")


if __name__ == "__main__":
    main()
