"""GPU benchmarks: keras_attn (JAX backend, bf16) side by side with keras-hub
on JAX and the PyTorch libraries users train with (Hugging Face
transformers, timm, torchaudio), eager and under `torch.compile`, in one call.

Run on the lent H100 / H200 (see ../shared/gpu/README.md for the wheels and
the command prefix):

    python benchmarks/gpu.py --out $OUT                 # every case
    python benchmarks/gpu.py --cases bert128,attention  # some of them
    python benchmarks/gpu.py --smoke                    # tiny sizes, any device

Cases (each implementation runs in its own subprocess, so its peak device
memory is its own and JAX and PyTorch never share an allocator):

- `bert128`, `bert512`: BERT-base masked-LM training (forward, backward,
  AdamW) at length 128 / 512 with 15% of positions predicted: sequences/s
  and MFU for keras_attn's `BertPretrainer`, keras-hub's `BertMaskedLM` (JAX)
  and transformers' `BertForMaskedLM` (PyTorch, bf16 autocast, SDPA
  attention). Dropout 0.1 everywhere, attention dropout included, as BERT
  is trained.
- `vit`: ViT-B/16 classifier training at 224 x 224, 1000 classes: images/s
  for keras_attn, keras-hub's `ViTImageClassifier` and timm's
  `vit_base_patch16_224` (bf16 autocast). No dropout on any side.
- `transformer_big`: the Transformer big encoder-decoder training step,
  target tokens/s (label-smoothed cross-entropy, shared 37k vocabulary),
  against transformers' `MarianMTModel` with the same sizes (post-norm,
  sinusoidal positions, tied embeddings, ReLU, dropout 0.3) and the same
  token ids.
- `conformer_large`: Conformer (L) (17 blocks of width 512, 8 heads,
  kernel 31) with CTC on 32 utterances of 16 s of 80-bin log-mel features
  (1,600 frames, 100 labels each): utterances/s against torchaudio's
  `Conformer` between the same two-convolution 4x subsampling and linear
  CTC head written in PyTorch. SpecAugment off on our side (the peer has
  none); torchaudio's blocks have no relative positions, ours do; dropout
  0.1 on both, which torchaudio's single `dropout` also applies to the
  attention probabilities and the conformer_large preset does not
  (`attention_dropout=0.0`, its default).
- `attention`: the attention op alone, forward + backward, head dim 64,
  16 heads, 16k tokens per batch, at BERT's 128 and 512, ViT-B/16's 197 and
  577 (224 and 384 pixels) and 1024-8192: TFLOP/s of the fused path
  (`fused_dot_product_attention`: backend's choice, and cuDNN flash
  forced), of the fused path without padding where the length is not a
  multiple of the kernel's 8, and of the explicit `softmax(QK^T)V` path,
  each with the fused kernels its compiled program calls (cuDNN's custom
  calls), or "XLA ops" where none.
- `modernbert`: ModernBERT-base masked-LM training at length 1,024
  (a 128-token window in two blocks of three, global attention in the
  third; 30% of positions predicted, ModernBERT's masking rate; logits
  over the whole vocabulary at every position on both sides, as
  `ModernBertForMaskedLM` computes them by default): tokens/s and MFU for
  keras_attn's `ModernBertMaskedLM` against transformers'
  `ModernBertForMaskedLM` (bf16 autocast, SDPA attention). No dropout on
  either side (the release's).
- `modernbert_inference`: the ModernBERT-base backbone's forward pass at
  ModernBERT's longest rows, 8,192 tokens (tokens/s, MFU of a third of a
  training step's FLOPs), against transformers' `ModernBertModel` (bf16
  autocast, SDPA, `no_grad`). Both ModernBERT cases count the PaLM FLOPs
  with every block's attention over the whole row: both sides compute a
  local block as full attention under a banded mask.
- `memory`: BERT-base at length 512: the largest batch that fits on the
  device without and with rematerialisation of each transformer block
  (`build_bert(..., remat=True)`), read off XLA's compiled memory analysis
  at two batches, the predicted batch's own analysis checked, then that
  compiled step run (`largest_fitting_batch`); each compile's seconds are
  in the table.

Training steps on JAX are one jitted function over the models'
`stateless_call` and the optimizer's `stateless_apply` with donated
buffers, the data already on the device; PyTorch peers run the usual
loop, eager and under `torch.compile` (its first step, where it compiles,
is reported apart; `--no-torch-compile` skips those runs). Throughput is
the median over 5 timed rounds of 10 steps each (2 of 2 with `--smoke`),
after a compiling call and one warm-up round.

MFU = model FLOPs per second / the device's dense bf16 peak, with the model
FLOPs per token 6N + 12 L d T (N parameters, L layers, d width, T length;
PaLM, Chowdhery et al. 2022, appendix B) of keras_attn's model, the same
figure for every implementation of a row, so MFU ratios are throughput
ratios. Attention FLOPs follow the FlashAttention benchmark convention:
4 B N T^2 H forward, 2.5 times that backward.

Prints each run's progress as it comes and a markdown table last; with
`--out DIR` also writes `gpu_results.json` and `gpu_table.md` there. A run
past `--timeout` is stopped and reported with the last thing it printed.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from _flops import attention_flops  # noqa: E402
from _flops import dense_bf16_peak  # noqa: E402
from _flops import transformer_flops_per_token  # noqa: E402

CASES = ("bert128", "bert512", "vit", "transformer_big", "conformer_large", "modernbert",
         "modernbert_inference", "attention", "memory")


# === Sizes ===


def sizes(smoke):
    """Full sizes, or tiny ones that check the whole harness on any device."""
    if smoke:
        return {
            "bert": dict(vocabulary_size=1000, num_layers=2, num_heads=2, hidden_dim=64,
                         intermediate_dim=128, max_sequence_length=64),
            "bert_batch": {"bert128": (4, 32), "bert512": (2, 64)},
            "vit": dict(image_size=32, patch_size=8, hidden_dim=64, num_layers=2, num_heads=2,
                        intermediate_dim=128, num_classes=10),
            "vit_batch": 4,
            "transformer": dict(vocabulary_size=500, hidden_dim=64, intermediate_dim=128,
                                num_heads=2, num_encoder_layers=1, num_decoder_layers=1),
            "transformer_batch": (4, 16),
            "conformer": dict(num_layers=2, hidden_dim=64, num_heads=2, kernel_size=15,
                              num_mel_bins=40, vocabulary_size=31),
            "conformer_batch": (2, 200, 20),
            "modernbert": dict(vocabulary_size=1000, num_layers=3, num_heads=2, hidden_dim=64,
                               intermediate_dim=96, local_window=16, pad_id=0),
            "modernbert_batch": {"modernbert": (2, 64), "modernbert_inference": (2, 128)},
            # 17 is not a multiple of the kernel's 8: the padded path runs too.
            "attention": dict(lengths=(17, 64), tokens=256, heads=2, head_dim=16),
            "memory_batches": (2, 4),
            "steps": 2, "rounds": 2,
        }
    return {
        "bert": dict(vocabulary_size=30522, num_layers=12, num_heads=12, hidden_dim=768,
                     intermediate_dim=3072, max_sequence_length=512),
        "bert_batch": {"bert128": (256, 128), "bert512": (64, 512)},
        "vit": dict(image_size=224, patch_size=16, hidden_dim=768, num_layers=12, num_heads=12,
                    intermediate_dim=3072, num_classes=1000),
        "vit_batch": 256,
        # About the paper's 25k target tokens per step.
        "transformer": dict(vocabulary_size=37000, hidden_dim=1024, intermediate_dim=4096,
                            num_heads=16, num_encoder_layers=6, num_decoder_layers=6),
        "transformer_batch": (192, 128),
        # Gulati et al. 2020, Table 1, Conformer (L); kernel 31, not the
        # paper's 32: torchaudio's Conformer takes odd kernels only.
        "conformer": dict(num_layers=17, hidden_dim=512, num_heads=8, kernel_size=31,
                          num_mel_bins=80, vocabulary_size=1023),
        # (utterances, frames of 10 ms: 16 s, labels an utterance: about
        # six word pieces a second).
        "conformer_batch": (32, 1600, 100),
        # The modernbert_base preset's sizes, written out for the PyTorch
        # peer (whose process imports no Keras); (rows, tokens): 16k tokens
        # a training step, 32k a forward pass.
        "modernbert": dict(vocabulary_size=50368, num_layers=22, num_heads=12, hidden_dim=768,
                           intermediate_dim=1152, local_window=128, pad_id=50283),
        "modernbert_batch": {"modernbert": (16, 1024), "modernbert_inference": (4, 8192)},
        # BERT's 128 and 512, ViT-B/16's 197 (224 px) and 577 (384 px), and
        # the long lengths of the FlashAttention benchmark.
        "attention": dict(lengths=(128, 197, 512, 577, 1024, 2048, 4096, 8192), tokens=16384,
                          heads=16, head_dim=64),
        "memory_batches": (16, 32),
        "steps": 10, "rounds": 5,
    }


# === JAX side (runs in a subprocess with KERAS_BACKEND=jax) ===


def _jax_setup():
    os.environ["KERAS_BACKEND"] = "jax"
    import keras

    keras.config.set_dtype_policy("mixed_bfloat16")
    return keras


def _device_info():
    import jax

    device = jax.local_devices()[0]
    return device, getattr(device, "device_kind", str(device))


def _peak_bytes(device):
    stats = device.memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def _trainable(model):
    """Trainable parameters, as the PyTorch runs count theirs (a Conformer's
    batch-norm statistics are weights to Keras, buffers to PyTorch)."""
    return int(sum(np.prod(v.shape) for v in model.trainable_weights))


def make_jax_train_step(model, loss_fn, learning_rate=1e-4):
    """A jitted `(state, x, y) -> (loss, state)` training step of a Keras
    model on JAX, with AdamW, and the initial state."""
    import jax
    import keras

    optimizer = keras.optimizers.AdamW(learning_rate)
    optimizer.build(model.trainable_variables)

    def compute_loss(trainable, non_trainable, x, y):
        outputs, non_trainable = model.stateless_call(trainable, non_trainable, x, training=True)
        return loss_fn(y, outputs), non_trainable

    grad_fn = jax.value_and_grad(compute_loss, has_aux=True)

    def step(state, x, y):
        trainable, non_trainable, optimizer_variables = state
        (loss, non_trainable), grads = grad_fn(trainable, non_trainable, x, y)
        trainable, optimizer_variables = optimizer.stateless_apply(
            optimizer_variables, grads, trainable
        )
        return loss, (trainable, non_trainable, optimizer_variables)

    state = (
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables],
        [v.value for v in optimizer.variables],
    )
    return jax.jit(step, donate_argnums=0), state


def time_jax_steps(step, state, x, y, steps, rounds):
    """Median seconds per step over `rounds` rounds of `steps` steps, after a
    compile call and one warm-up round. Returns (seconds, final loss)."""
    import jax

    loss, state = step(state, x, y)  # compile
    jax.block_until_ready(loss)
    times = []
    for r in range(rounds + 1):
        start = time.perf_counter()
        for _ in range(steps):
            loss, state = step(state, x, y)
        jax.block_until_ready((loss, state))
        if r:  # round 0 warms up
            times.append((time.perf_counter() - start) / steps)
    return statistics.median(times), float(loss)


def _sparse_ce(labels, logits, label_smoothing=0.0):
    from keras import ops

    logits = ops.cast(logits, "float32")
    log_probs = ops.log_softmax(logits, axis=-1)
    picked = ops.take_along_axis(log_probs, ops.expand_dims(labels, -1), axis=-1)[..., 0]
    loss = -picked
    if label_smoothing:
        loss = (1 - label_smoothing) * loss - label_smoothing * ops.mean(log_probs, axis=-1)
    return ops.mean(loss)


def _bert_inputs(np_rng, batch, length, vocab, jnp):
    predictions = max(1, round(0.15 * length))
    token_ids = np_rng.integers(5, vocab, (batch, length)).astype("int32")
    positions = np.sort(
        np.stack([np_rng.choice(length, predictions, replace=False) for _ in range(batch)]), axis=1
    ).astype("int32")
    labels = np.take_along_axis(token_ids, positions, axis=1)
    x = {
        "token_ids": jnp.asarray(token_ids),
        "segment_ids": jnp.zeros((batch, length), "int32"),
        "padding_mask": jnp.ones((batch, length), "int32"),
        "mask_positions": jnp.asarray(positions),
    }
    return x, jnp.asarray(labels), token_ids, positions


def build_keras_attn_bert(cfg, remat=False):
    from keras_attn.models.bert import BertPretrainer
    from keras_attn.models.bert import build_bert

    # remat=True rematerialises each transformer block (keras.RematScope).
    return BertPretrainer(build_bert("bert_base", remat=remat, **cfg))


def run_bert_jax(impl, case, smoke):
    keras = _jax_setup()
    import jax.numpy as jnp

    s = sizes(smoke)
    cfg = s["bert"]
    batch, length = s["bert_batch"][case]
    rng = np.random.default_rng(0)
    x, labels, _, _ = _bert_inputs(rng, batch, length, cfg["vocabulary_size"], jnp)
    keras.utils.set_random_seed(0)
    if impl in ("keras_attn", "keras_attn_no_attention_dropout"):
        # The second: attention dropout 0, so that attention takes the fused
        # kernel (keras.ops.dot_product_attention has no dropout), with the
        # padding mask of every BERT batch.
        extra = {"attention_dropout": 0.0} if impl != "keras_attn" else {}
        model = build_keras_attn_bert({**cfg, **extra})
        y = {"mlm": labels, "nsp": jnp.zeros((batch,), "int32")}

        def loss_fn(y, out):
            return _sparse_ce(y["mlm"], out["mlm"]) + _sparse_ce(y["nsp"], out["nsp"])
    else:
        import keras_hub

        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=cfg["vocabulary_size"], num_layers=cfg["num_layers"],
            num_heads=cfg["num_heads"], hidden_dim=cfg["hidden_dim"],
            intermediate_dim=cfg["intermediate_dim"], dropout=0.1,
            max_sequence_length=cfg["max_sequence_length"],
        )
        model = keras_hub.models.BertMaskedLM(backbone, preprocessor=None)
        y = labels

        def loss_fn(y, out):
            return _sparse_ce(y, out)

    step, state = make_jax_train_step(model, loss_fn)
    seconds, loss = time_jax_steps(step, state, x, y, s["steps"], s["rounds"])
    return {"seconds_per_step": seconds, "batch": batch, "length": length,
            "parameters": _trainable(model), "loss": loss}


def run_vit_jax(impl, smoke):
    keras = _jax_setup()
    import jax.numpy as jnp

    s = sizes(smoke)
    cfg, batch = s["vit"], s["vit_batch"]
    rng = np.random.default_rng(0)
    images = jnp.asarray(
        rng.uniform(0, 255, (batch, cfg["image_size"], cfg["image_size"], 3)).astype("float32")
    )
    labels = jnp.asarray(rng.integers(0, cfg["num_classes"], (batch,)).astype("int32"))
    keras.utils.set_random_seed(0)
    if impl == "keras_attn":
        from keras_attn.models.vit import build_vit

        model = build_vit("vit_base_16", **cfg)
    else:
        import keras_hub

        backbone = keras_hub.models.ViTBackbone(
            image_shape=(cfg["image_size"], cfg["image_size"], 3), patch_size=cfg["patch_size"],
            num_layers=cfg["num_layers"], num_heads=cfg["num_heads"],
            hidden_dim=cfg["hidden_dim"], mlp_dim=cfg["intermediate_dim"],
        )
        model = keras_hub.models.ViTImageClassifier(
            backbone, num_classes=cfg["num_classes"], preprocessor=None, activation=None,
        )
    step, state = make_jax_train_step(model, _sparse_ce)
    seconds, loss = time_jax_steps(step, state, images, labels, s["steps"], s["rounds"])
    return {"seconds_per_step": seconds, "batch": batch,
            "parameters": _trainable(model), "loss": loss}


def _transformer_data(smoke, xp):
    """Source ids, target ids and labels `(B, T)` (ids 3..V-1: no padding,
    start or end id), the same for every implementation."""
    s = sizes(smoke)
    batch, length = s["transformer_batch"]
    v = s["transformer"]["vocabulary_size"]
    rng = np.random.default_rng(0)
    return tuple(xp.asarray(rng.integers(3, v, (batch, length)).astype("int32"))
                 for _ in range(3))


def run_transformer_jax(impl, smoke):
    keras = _jax_setup()
    import jax.numpy as jnp

    from keras_attn.models.transformer import build_transformer

    s = sizes(smoke)
    cfg = s["transformer"]
    batch, length = s["transformer_batch"]
    source, target, labels = _transformer_data(smoke, jnp)
    keras.utils.set_random_seed(0)
    model = build_transformer("transformer_big", max_sequence_length=max(length, 256), **cfg)

    def loss_fn(y, logits):
        return _sparse_ce(y, logits, label_smoothing=0.1)

    step, state = make_jax_train_step(model, loss_fn)
    seconds, loss = time_jax_steps(step, state, [source, target], labels, s["steps"], s["rounds"])
    return {"seconds_per_step": seconds, "batch": batch, "length": length,
            "parameters": _trainable(model), "loss": loss}


def _conformer_data(smoke, xp):
    """Log-mel features `(B, T, mels)`, their lengths and CTC labels in
    1..V: the same arrays for every implementation."""
    s = sizes(smoke)
    cfg = s["conformer"]
    batch, frames, labels_per = s["conformer_batch"]
    rng = np.random.default_rng(0)
    features = rng.normal(size=(batch, frames, cfg["num_mel_bins"])).astype("float32")
    lengths = np.full((batch,), frames, "int32")
    labels = rng.integers(1, cfg["vocabulary_size"] + 1, (batch, labels_per)).astype("int32")
    return xp.asarray(features), xp.asarray(lengths), xp.asarray(labels)


def run_conformer_jax(smoke):
    keras = _jax_setup()
    import jax.numpy as jnp
    from keras import ops

    from keras_attn.models.conformer import build_conformer

    s = sizes(smoke)
    cfg = s["conformer"]
    features, lengths, labels = _conformer_data(smoke, jnp)
    keras.utils.set_random_seed(0)
    # SpecAugment off: the peer has none, and it is not what is timed.
    model = build_conformer("conformer_large", input_type="features", freq_mask_count=0,
                            time_mask_count=0, **cfg)

    def loss_fn(y, out):
        label_lengths = ops.sum(ops.cast(y > 0, "int32"), axis=1)
        return ops.mean(ops.ctc_loss(y, ops.cast(out["logits"], "float32"), label_lengths,
                                     out["logit_lengths"], mask_index=0))

    step, state = make_jax_train_step(model, loss_fn)
    x = {"features": features, "feature_length": lengths}
    seconds, loss = time_jax_steps(step, state, x, labels, s["steps"], s["rounds"])
    return {"seconds_per_step": seconds, "batch": int(features.shape[0]),
            "length": int(features.shape[1]), "parameters": _trainable(model),
            "loss": loss}


def _modernbert_inputs(case, smoke):
    """`(token_ids, labels, weights)` `(B, T)` NumPy arrays, the same for
    every implementation: ids past the special ones, a label and weight 1
    at 30% of the positions (ModernBERT's masking rate), 0 elsewhere."""
    s = sizes(smoke)
    batch, length = s["modernbert_batch"][case]
    vocab = s["modernbert"]["vocabulary_size"]
    rng = np.random.default_rng(0)
    # Below the released vocabulary's special ids (50,280 on).
    token_ids = rng.integers(5, min(vocab, 50280), (batch, length)).astype("int32")
    weights = (rng.random((batch, length)) < 0.3).astype("float32")
    labels = np.where(weights > 0, token_ids, 0).astype("int32")
    return token_ids, labels, weights


def _masked_ce(labels, weights, logits):
    """Cross-entropy over the positions of weight 1 (float32)."""
    from keras import ops

    log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
    picked = ops.take_along_axis(log_probs, ops.expand_dims(labels, -1), axis=-1)[..., 0]
    return -ops.sum(picked * weights) / ops.maximum(ops.sum(weights), 1.0)


def time_jax_calls(fn, args, steps, rounds):
    """Median seconds per call of a jitted `fn(*args)`, after a compiling
    call and one warm-up round."""
    import jax

    jax.block_until_ready(fn(*args))  # compile
    times = []
    for r in range(rounds + 1):
        start = time.perf_counter()
        for _ in range(steps):
            out = fn(*args)
        jax.block_until_ready(out)
        if r:
            times.append((time.perf_counter() - start) / steps)
    return statistics.median(times)


def run_modernbert_jax(case, smoke):
    """keras_attn's `ModernBertMaskedLM` training step (`modernbert`) or
    its backbone's jitted forward pass (`modernbert_inference`)."""
    keras = _jax_setup()
    import jax
    import jax.numpy as jnp

    from keras_attn.models.modernbert import ModernBertMaskedLM
    from keras_attn.models.modernbert import build_modernbert

    s = sizes(smoke)
    token_ids, labels, weights = _modernbert_inputs(case, smoke)
    batch, length = token_ids.shape
    x = {"token_ids": jnp.asarray(token_ids), "padding_mask": jnp.ones((batch, length), "int32")}
    keras.utils.set_random_seed(0)
    backbone = build_modernbert("modernbert_base", **s["modernbert"])
    result = {"batch": batch, "length": length}
    if case == "modernbert_inference":
        def forward(trainable, non_trainable, x):
            out, _ = backbone.stateless_call(trainable, non_trainable, x, training=False)
            return out["sequence_output"]

        args = ([v.value for v in backbone.trainable_variables],
                [v.value for v in backbone.non_trainable_variables], x)
        seconds = time_jax_calls(jax.jit(forward), args, s["steps"], s["rounds"])
        return dict(result, seconds_per_step=seconds, parameters=_trainable(backbone))
    model = ModernBertMaskedLM(backbone)
    y = (jnp.asarray(labels), jnp.asarray(weights))

    def loss_fn(y, logits):
        return _masked_ce(y[0], y[1], logits)

    step, state = make_jax_train_step(model, loss_fn)
    seconds, loss = time_jax_steps(step, state, x, y, s["steps"], s["rounds"])
    return dict(result, seconds_per_step=seconds, parameters=_trainable(model), loss=loss)


def fused_kernels(compiled_text):
    """The fused attention kernels a compiled XLA program calls: its custom
    calls whose target names cuDNN's attention (`__cudnn$fmha...`) or a
    flash kernel. Empty when attention is XLA's own dots and softmax."""
    targets = set(re.findall(r'custom_call_target="([^"]+)"', compiled_text))
    return sorted(t for t in targets if re.search(r"fmha|flash|attention", t, re.IGNORECASE))


def run_attention_jax(smoke):
    _jax_setup()
    import jax
    import jax.numpy as jnp

    from keras_attn.ops.attention import KERNEL_LENGTH_MULTIPLE
    from keras_attn.ops.attention import fused_dot_product_attention
    from keras_attn.ops.attention import scaled_dot_product_attention

    s = sizes(smoke)
    a = s["attention"]
    n, h = a["heads"], a["head_dim"]
    # The dispatch pads to the kernel's multiple on a GPU only; these rows
    # force it, so that a CPU smoke run takes the padded path too.
    m = KERNEL_LENGTH_MULTIPLE
    paths = {
        "explicit": lambda q, k, v: scaled_dot_product_attention(q, k, v),
        "fused (backend's choice)": lambda q, k, v: fused_dot_product_attention(
            q, k, v, length_multiple=m),
        "fused (cuDNN flash forced)": lambda q, k, v: fused_dot_product_attention(
            q, k, v, flash_attention=True, length_multiple=m),
        # What the dispatch did before it padded (Keras falls back when
        # cuDNN refuses the length): only where the length needs padding.
        "fused, not padded": lambda q, k, v: fused_dot_product_attention(
            q, k, v, length_multiple=1),
    }
    rows = []
    for length in a["lengths"]:
        batch = max(1, a["tokens"] // length)
        key = jax.random.PRNGKey(length)
        q, k, v = (jax.random.normal(kk, (batch, length, n, h), "bfloat16")
                   for kk in jax.random.split(key, 3))
        # A key-padding mask (B, 1, 1, S) as a BERT batch gives: the second
        # half of the batch padded over its last eighth.
        keep = np.ones((batch, 1, 1, length), bool)
        keep[batch // 2:, ..., length - max(1, length // 8):] = False
        paths["fused, key padding mask"] = lambda q, k, v, keep=jnp.asarray(keep): (
            fused_dot_product_attention(q, k, v, mask=keep, length_multiple=m))
        flops = attention_flops(batch, n, length, h, backward=True)
        for name, fn in paths.items():
            if name == "fused, not padded" and length % m == 0:
                continue

            def loss(q, k, v, fn=fn):
                return jnp.sum(fn(q, k, v).astype("float32"))

            row = {"length": length, "batch": batch, "path": name}
            try:
                # Which kernel ran, as the compiled program says it.
                compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile()
                kernels = fused_kernels(compiled.as_text())
                row["kernel"] = ", ".join(kernels) if kernels else "XLA ops (no fused kernel)"
                jax.block_until_ready(compiled(q, k, v))
                times = []
                for _ in range(s["rounds"] + 1):
                    start = time.perf_counter()
                    for _ in range(s["steps"]):
                        out = compiled(q, k, v)
                    jax.block_until_ready(out)
                    times.append((time.perf_counter() - start) / s["steps"])
                seconds = statistics.median(times[1:])
                row.update(seconds=seconds, tflops=flops / seconds / 1e12)
            except Exception as e:  # noqa: BLE001 - recorded, not hidden
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            rows.append(row)
            print(f"  attention T={length} {name}: "
                  f"{row.get('tflops', row.get('error'))} [{row.get('kernel', '')}]", flush=True)
    return {"rows": rows}


def _compiled_bytes(compiled):
    """Device bytes a compiled step needs, from XLA's memory analysis."""
    analysis = compiled.memory_analysis()
    return (analysis.argument_size_in_bytes + analysis.output_size_in_bytes
            - analysis.alias_size_in_bytes + analysis.temp_size_in_bytes)


def _is_oom(error):
    return "RESOURCE_EXHAUSTED" in str(error) or "Out of memory" in str(error)


def largest_fitting_batch(compile_at, run, limit_bytes, batches, deadline=None, multiple=8,
                          headroom=0.97, log=print):
    """The largest batch whose training step fits in `limit_bytes`.

    `compile_at(batch) -> (compiled, bytes)` compiles the step for a batch
    and reads XLA's memory analysis; `run(compiled, batch) -> seconds` runs
    that compiled step (raising on an out-of-memory error).

    memory(B) is a straight line through the two `batches`; the predicted
    batch is compiled, and checked against the limit by its own analysis
    before it runs: a prediction that does not fit steps down by the line
    through what it measured, without running (each attempt costs a compile,
    40-60 s for BERT-base on an H100, more with rematerialisation; the run
    that stepped down 10% per out-of-memory run, recompiling each time, did
    not finish in 275 s). The step that runs is the one compiled, never a
    second compile. With `deadline` (a `time.time()`), no compile starts
    that would end after it: the result then says why it stopped.
    """
    b1, b2 = batches
    compiled_bytes, compile_seconds = {}, {}

    def compile_timed(batch):
        start = time.time()
        compiled, used = compile_at(batch)
        compile_seconds[batch] = time.time() - start
        compiled_bytes[batch] = used
        log(f"  batch {batch}: compiled in {compile_seconds[batch]:.1f} s, "
            f"{used / 2**30:.2f} GiB")
        return compiled, used

    compile_timed(b1)
    compile_timed(b2)
    m1, m2 = compiled_bytes[b1], compiled_bytes[b2]
    per_example = (m2 - m1) / (b2 - b1)
    fixed = m1 - per_example * b1
    result = {"bytes_at": compiled_bytes, "compile_seconds": compile_seconds,
              "per_example_bytes": per_example, "fixed_bytes": fixed,
              "limit_bytes": limit_bytes, "largest_batch": None}
    if not limit_bytes:
        return result
    if per_example <= 0:
        result["stopped"] = f"memory does not grow with the batch ({m1} -> {m2} bytes)"
        return result

    def round_down(batch):
        batch = int(batch)
        return batch - batch % multiple if batch >= multiple else max(1, batch)

    target = headroom * limit_bytes
    batch = round_down((target - fixed) / per_example)
    result["predicted_batch"] = batch
    tried = set()
    while batch >= 1 and batch not in tried:
        tried.add(batch)
        expected = max(compile_seconds.values())
        if deadline is not None and time.time() + 1.5 * expected > deadline:
            result["stopped"] = (f"out of time before compiling batch {batch} "
                                 f"(a compile took {expected:.0f} s)")
            return result
        compiled, used = compile_timed(batch)
        if used > target:
            # Step down along the line through this batch's own analysis.
            slope = (used - fixed) / batch
            batch = round_down(min((target - fixed) / slope, 0.95 * batch))
            continue
        try:
            seconds = run(compiled, batch)
        except Exception as e:  # noqa: BLE001 - only an OOM steps down
            if not _is_oom(e):
                raise
            log(f"  batch {batch}: out of memory when run")
            batch = round_down(0.9 * batch)
            continue
        result.update(largest_batch=batch, seconds_per_step=seconds)
        return result
    result["stopped"] = "no batch fitted"
    return result


def run_memory_jax(remat, smoke, limit_bytes=None, deadline=None):
    """Largest BERT-base length-512 batch that fits (`largest_fitting_batch`)."""
    keras = _jax_setup()
    import jax
    import jax.numpy as jnp

    s = sizes(smoke)
    cfg = s["bert"]
    length = s["bert_batch"]["bert512"][1]
    device, _ = _device_info()
    if limit_bytes is None:
        limit_bytes = (device.memory_stats() or {}).get("bytes_limit")
    keras.utils.set_random_seed(0)
    model = build_keras_attn_bert(cfg, remat=remat)

    def loss_fn(y, out):
        return _sparse_ce(y["mlm"], out["mlm"]) + _sparse_ce(y["nsp"], out["nsp"])

    step, state = make_jax_train_step(model, loss_fn)
    rng = np.random.default_rng(0)
    # Each run starts from a fresh device copy: the step donates its
    # state, so a failed run may leave the buffers it was given deleted.
    host_state = jax.tree.map(np.asarray, state)
    del state

    def data(batch):
        x, labels, _, _ = _bert_inputs(rng, batch, length, cfg["vocabulary_size"], jnp)
        return x, {"mlm": labels, "nsp": jnp.zeros((batch,), "int32")}

    def compile_at(batch):
        x, y = data(batch)
        shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                              (host_state, x, y))
        compiled = step.lower(*shapes).compile()
        return compiled, _compiled_bytes(compiled)

    def run(compiled, batch):
        x, y = data(batch)
        state = jax.tree.map(jnp.asarray, host_state)
        return time_jax_steps(compiled, state, x, y, 1, 1)[0]

    result = largest_fitting_batch(compile_at, run, limit_bytes, s["memory_batches"],
                                   deadline=deadline,
                                   log=lambda line: print(line.replace("  ", "  memory: ", 1),
                                                          flush=True))
    result["remat"] = remat
    return result


# === PyTorch side ===


def _torch_device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _time_torch(step, steps, rounds, device):
    import torch

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    step()
    sync()
    times = []
    for r in range(rounds + 1):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        if r:
            times.append((time.perf_counter() - start) / steps)
    return statistics.median(times)


def _torch_peak(device):
    import torch

    return torch.cuda.max_memory_allocated() if device.type == "cuda" else None


def _torch_train(model, compute_loss, smoke, compile_model):
    """Times AdamW training steps of a PyTorch model under bf16 autocast:
    `compute_loss(forward)` is the loss of one batch through `forward`
    (the model, or the model under `torch.compile`)."""
    import torch

    s = sizes(smoke)
    device = _torch_device()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    forward = torch.compile(model) if compile_model else model

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = compute_loss(forward)
        loss.backward()
        optimizer.step()
        return loss

    compile_start = time.perf_counter()
    loss = step()  # torch.compile compiles here
    first_step = time.perf_counter() - compile_start
    seconds = _time_torch(step, s["steps"], s["rounds"], device)
    return {"seconds_per_step": seconds, "first_step_seconds": first_step,
            "loss": float(loss.detach().float()),
            # Trainable ones, as Keras's count_params of the peer's model
            # (Marian keeps its sinusoidal tables as frozen parameters).
            "parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "peak_bytes": _torch_peak(device)}


def run_bert_torch(case, smoke, compile_model=False):
    import torch
    import transformers

    s = sizes(smoke)
    cfg = s["bert"]
    batch, length = s["bert_batch"][case]
    device = _torch_device()
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=cfg["vocabulary_size"], hidden_size=cfg["hidden_dim"],
        num_hidden_layers=cfg["num_layers"], num_attention_heads=cfg["num_heads"],
        intermediate_size=cfg["intermediate_dim"],
        max_position_embeddings=cfg["max_sequence_length"], attn_implementation="sdpa",
    )
    model = transformers.BertForMaskedLM(config).to(device).train()
    rng = np.random.default_rng(0)
    _, _, token_ids, positions = _bert_inputs(rng, batch, length, cfg["vocabulary_size"], np)
    labels = np.full_like(token_ids, -100)
    np.put_along_axis(labels, positions, np.take_along_axis(token_ids, positions, 1), 1)
    inputs = {
        "input_ids": torch.as_tensor(token_ids, device=device),
        "token_type_ids": torch.zeros((batch, length), dtype=torch.long, device=device),
        "attention_mask": torch.ones((batch, length), dtype=torch.long, device=device),
        "labels": torch.as_tensor(labels, dtype=torch.long, device=device),
    }
    result = _torch_train(model, lambda forward: forward(**inputs).loss, smoke, compile_model)
    return dict(result, batch=batch, length=length)


def run_vit_torch(smoke, compile_model=False):
    import timm
    import torch

    s = sizes(smoke)
    cfg, batch = s["vit"], s["vit_batch"]
    device = _torch_device()
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_base_patch16_224", pretrained=False, num_classes=cfg["num_classes"],
        img_size=cfg["image_size"], patch_size=cfg["patch_size"], embed_dim=cfg["hidden_dim"],
        depth=cfg["num_layers"], num_heads=cfg["num_heads"],
        mlp_ratio=cfg["intermediate_dim"] / cfg["hidden_dim"],
    ).to(device).train()
    images = torch.rand((batch, 3, cfg["image_size"], cfg["image_size"]), device=device)
    labels = torch.randint(0, cfg["num_classes"], (batch,), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()
    result = _torch_train(model, lambda forward: loss_fn(forward(images), labels), smoke,
                          compile_model)
    return dict(result, batch=batch)


def run_marian_torch(smoke, compile_model=False):
    """transformers' `MarianMTModel` at keras_attn's `transformer_big`
    sizes: post-norm, sinusoidal positions, scaled and shared embeddings
    tied to the output layer, ReLU, dropout 0.3; the same label-smoothed
    (0.1) cross-entropy over the same token ids."""
    import torch
    import transformers

    s = sizes(smoke)
    cfg = s["transformer"]
    batch, length = s["transformer_batch"]
    device = _torch_device()
    torch.manual_seed(0)
    config = transformers.MarianConfig(
        vocab_size=cfg["vocabulary_size"], d_model=cfg["hidden_dim"],
        encoder_layers=cfg["num_encoder_layers"], decoder_layers=cfg["num_decoder_layers"],
        encoder_attention_heads=cfg["num_heads"], decoder_attention_heads=cfg["num_heads"],
        encoder_ffn_dim=cfg["intermediate_dim"], decoder_ffn_dim=cfg["intermediate_dim"],
        activation_function="relu", dropout=0.3, attention_dropout=0.0, activation_dropout=0.0,
        max_position_embeddings=max(length, 256), scale_embedding=True,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        pad_token_id=0, eos_token_id=2, decoder_start_token_id=1, forced_eos_token_id=2,
        attn_implementation="sdpa",
    )
    model = transformers.MarianMTModel(config).to(device).train()
    source, target, labels = (t.long().to(device) for t in _transformer_data(smoke, torch))
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)

    def compute_loss(forward):
        logits = forward(input_ids=source, decoder_input_ids=target).logits
        return loss_fn(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))

    result = _torch_train(model, compute_loss, smoke, compile_model)
    return dict(result, batch=batch, length=length)


def _torch_conformer_ctc(cfg):
    """torchaudio's `Conformer` between the front and back ends keras_attn's
    `ConformerCTC` has, written the same way in PyTorch: two 3x3 stride-2
    convolutions with ReLU over (time, mel) and a linear projection to the
    model width, input dropout, then a linear CTC head over V + 1 classes
    (0 the blank). torchaudio's blocks use absolute-position-free
    self-attention where ours have relative positions (Transformer-XL)."""
    import torch
    from torchaudio.models import Conformer

    d = cfg["hidden_dim"]

    class ConformerCTC(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Sequential(
                torch.nn.Conv2d(1, d, 3, stride=2), torch.nn.ReLU(),
                torch.nn.Conv2d(d, d, 3, stride=2), torch.nn.ReLU(),
            )
            freq = cfg["num_mel_bins"]
            for _ in range(2):
                freq = (freq - 3) // 2 + 1
            self.projection = torch.nn.Linear(d * freq, d)
            self.dropout = torch.nn.Dropout(0.1)
            self.encoder = Conformer(
                input_dim=d, num_heads=cfg["num_heads"], ffn_dim=4 * d,
                num_layers=cfg["num_layers"], depthwise_conv_kernel_size=cfg["kernel_size"],
                dropout=0.1,
            )
            self.head = torch.nn.Linear(d, cfg["vocabulary_size"] + 1)

        def forward(self, features, lengths):
            x = self.conv(features.unsqueeze(1))  # (B, C, T', F')
            b, c, t, f = x.shape
            x = self.dropout(self.projection(x.permute(0, 2, 1, 3).reshape(b, t, c * f)))
            for _ in range(2):
                lengths = torch.div(lengths - 3, 2, rounding_mode="floor") + 1
            x, lengths = self.encoder(x, lengths)
            return self.head(x), lengths

    return ConformerCTC()


def run_conformer_torch(smoke, compile_model=False):
    import torch

    s = sizes(smoke)
    cfg = s["conformer"]
    device = _torch_device()
    torch.manual_seed(0)
    model = _torch_conformer_ctc(cfg).to(device).train()
    features, lengths, labels = (t.to(device) for t in _conformer_data(smoke, torch))
    lengths, labels = lengths.long(), labels.long()
    label_lengths = (labels > 0).sum(1)
    # Per-utterance losses averaged over the batch, as keras_attn's step
    # (the "mean" reduction would also divide each by its label length).
    ctc = torch.nn.CTCLoss(blank=0, reduction="none")

    def compute_loss(forward):
        logits, logit_lengths = forward(features, lengths)
        log_probs = logits.float().log_softmax(-1).transpose(0, 1)  # (T', B, V + 1)
        return ctc(log_probs, labels, logit_lengths, label_lengths).mean()

    result = _torch_train(model, compute_loss, smoke, compile_model)
    return dict(result, batch=int(features.shape[0]), length=int(features.shape[1]))


def run_modernbert_torch(case, smoke, compile_model=False):
    """transformers' `ModernBertForMaskedLM` training step (`modernbert`)
    or `ModernBertModel`'s forward pass (`modernbert_inference`) at
    keras_attn's sizes, on the same token ids and masked positions."""
    import torch
    import transformers

    s = sizes(smoke)
    cfg = s["modernbert"]
    token_ids, labels, weights = _modernbert_inputs(case, smoke)
    batch, length = token_ids.shape
    device = _torch_device()
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        vocab_size=cfg["vocabulary_size"], hidden_size=cfg["hidden_dim"],
        num_hidden_layers=cfg["num_layers"], num_attention_heads=cfg["num_heads"],
        intermediate_size=cfg["intermediate_dim"], global_attn_every_n_layers=3,
        local_attention=cfg["local_window"], max_position_embeddings=8192,
        pad_token_id=cfg["pad_id"], bos_token_id=1, eos_token_id=2, cls_token_id=1,
        sep_token_id=2, attn_implementation="sdpa")
    inputs = {"input_ids": torch.as_tensor(token_ids, dtype=torch.long, device=device),
              "attention_mask": torch.ones((batch, length), dtype=torch.long, device=device)}
    if case == "modernbert_inference":
        model = transformers.ModernBertModel(config).to(device).eval()
        forward = torch.compile(model) if compile_model else model

        def call():
            with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
                return forward(**inputs).last_hidden_state

        start = time.perf_counter()
        call()  # torch.compile compiles here
        first = time.perf_counter() - start
        seconds = _time_torch(call, s["steps"], s["rounds"], device)
        return {"seconds_per_step": seconds, "first_step_seconds": first, "batch": batch,
                "length": length, "parameters": sum(p.numel() for p in model.parameters()),
                "peak_bytes": _torch_peak(device)}
    model = transformers.ModernBertForMaskedLM(config).to(device).train()
    targets = torch.as_tensor(np.where(weights > 0, labels, -100), dtype=torch.long,
                              device=device)
    result = _torch_train(model, lambda forward: forward(**inputs, labels=targets).loss, smoke,
                          compile_model)
    return dict(result, batch=batch, length=length)


# === One run in a subprocess ===

TORCH_PEERS = {"transformers": "transformers", "timm": "timm", "marian": "transformers",
               "torchaudio": "torchaudio"}


def run_one(spec, smoke, deadline=None):
    """Runs one `case:impl` and returns its result dict (device, peak memory)."""
    case, impl = spec.split(":")
    compile_model = impl.endswith("+compile")
    base = impl.replace("+compile", "")
    if base in TORCH_PEERS:
        import importlib.metadata as md

        import torch

        device = _torch_device()
        name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
        if case.startswith("bert"):
            result = run_bert_torch(case, smoke, compile_model)
        elif case == "vit":
            result = run_vit_torch(smoke, compile_model)
        elif case == "transformer_big":
            result = run_marian_torch(smoke, compile_model)
        elif case == "conformer_large":
            result = run_conformer_torch(smoke, compile_model)
        elif case.startswith("modernbert"):
            result = run_modernbert_torch(case, smoke, compile_model)
        else:
            raise ValueError(f"No PyTorch peer for case {case!r}")
        package = TORCH_PEERS[base]
        result.update(device=name, software=f"torch {torch.__version__}, "
                      f"{package} {md.version(package)}")
        return result
    keras = _jax_setup()
    import jax

    device, kind = _device_info()
    if case.startswith("bert"):
        result = run_bert_jax(base, case, smoke)
    elif case == "vit":
        result = run_vit_jax(base, smoke)
    elif case == "transformer_big":
        result = run_transformer_jax(base, smoke)
    elif case == "conformer_large":
        result = run_conformer_jax(smoke)
    elif case.startswith("modernbert"):
        result = run_modernbert_jax(case, smoke)
    elif case == "attention":
        result = run_attention_jax(smoke)
    elif case == "memory":
        # A CPU has no device memory limit: --smoke pretends to have 64 MiB.
        result = run_memory_jax(base == "remat", smoke, None if not smoke else 2**26,
                                deadline=deadline)
    else:
        raise ValueError(f"Unknown case {case!r}")
    software = f"keras {keras.__version__}, jax {jax.__version__}"
    if base == "keras_hub":
        import keras_hub

        software += f", keras-hub {keras_hub.__version__}"
    result.update(device=kind, software=software, peak_bytes=_peak_bytes(device))
    return result


PLAN = {
    "bert128": ["keras_attn", "keras_attn_no_attention_dropout", "keras_hub", "transformers"],
    "bert512": ["keras_attn", "keras_hub", "transformers"],
    "vit": ["keras_attn", "keras_hub", "timm"],
    "transformer_big": ["keras_attn", "marian"],
    "conformer_large": ["keras_attn", "torchaudio"],
    "modernbert": ["keras_attn", "transformers"],
    "modernbert_inference": ["keras_attn", "transformers"],
    "attention": ["keras_attn"],
    "memory": ["no_remat", "remat"],
}


def plan(cases, torch_compile=True):
    """The `case:impl` runs of `cases`, each PyTorch peer eager and, with
    `torch_compile`, under `torch.compile` too (what its users train with)."""
    specs = []
    for case in cases:
        for impl in PLAN[case]:
            specs.append(f"{case}:{impl}")
            if torch_compile and impl in TORCH_PEERS:
                specs.append(f"{case}:{impl}+compile")
    return specs


def _progress(line):
    return line.startswith("  ")


def launch(spec, smoke, timeout):
    """Runs `spec` in a fresh Python and returns its result or its error.
    Its progress lines (two leading spaces) are printed as they come, and a
    run that times out says how far it got. The run is told its deadline
    (`memory` stops starting compiles that would pass it)."""
    env = dict(os.environ, KERAS_BACKEND="jax", XLA_PYTHON_CLIENT_PREALLOCATE="false",
               TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1",
               GPU_BENCH_DEADLINE=str(time.time() + timeout - 15))
    cmd = [sys.executable, os.path.abspath(__file__), "--run", spec] + (["--smoke"] if smoke else [])
    start = time.perf_counter()
    lines = []
    with tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)

        def read():
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                if _progress(line):
                    print(line, end="", flush=True)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            reader.join(10)
            done = [line.strip() for line in lines if _progress(line)]
            return {"error": f"timed out after {timeout} s"
                    + (f"; last: {done[-1]}" if done else "; nothing printed")}
        reader.join(30)
        stderr.seek(0)
        err = stderr.read()
    marker = [line for line in lines if line.startswith("RESULT ")]
    if proc.returncode != 0 or not marker:
        out = (err or "\n".join(lines)).strip().splitlines()
        # The exception's own line: "ModuleNotFoundError: No module named ...".
        errors = [line for line in out if re.match(r"^[\w.]*(Error|Exception|Exhausted)\b", line)]
        message = errors[-1] if errors else (out[-1] if out else f"exit {proc.returncode}")
        return {"error": message.replace("|", "/")[:300]}
    result = json.loads(marker[-1][len("RESULT "):])
    result["wall_seconds"] = time.perf_counter() - start
    return result


# === Table ===


def _gib(n):
    return f"{n / 2**30:.1f}" if n else "n/a"


def table(results, smoke):
    """Markdown rows from the runs' results."""
    lines = ["| case | implementation | throughput | MFU | keras_attn time / this | peak GiB | notes |",
             "|---|---|---|---|---|---|---|"]
    s = sizes(smoke)
    for case in ("bert128", "bert512", "vit", "transformer_big", "conformer_large",
                 "modernbert", "modernbert_inference"):
        runs = {k.split(":")[1]: v for k, v in results.items() if k.split(":")[0] == case}
        if not runs:
            continue
        ours = runs.get("keras_attn", {})
        for impl, r in runs.items():
            if "error" in r:
                lines.append(f"| {case} | {impl} | not measured | | | | {r['error']} |")
                continue
            batch = r["batch"]
            if case.startswith("bert"):
                cfg = s["bert"]
                unit, per_step = "sequences/s", batch
                flops_step = batch * r["length"] * transformer_flops_per_token(
                    ours.get("parameters", r["parameters"]), cfg["num_layers"],
                    cfg["hidden_dim"], r["length"])
            elif case == "vit":
                cfg = s["vit"]
                tokens = (cfg["image_size"] // cfg["patch_size"]) ** 2 + 1
                unit, per_step = "images/s", batch
                flops_step = batch * tokens * transformer_flops_per_token(
                    ours.get("parameters", r["parameters"]), cfg["num_layers"],
                    cfg["hidden_dim"], tokens)
            elif case.startswith("modernbert"):
                # The PaLM count with every block's attention over the whole
                # row (both sides compute the local blocks as masked full
                # attention); a forward pass is a third of a training step.
                cfg = s["modernbert"]
                unit, per_step = "tokens/s", batch * r["length"]
                flops_step = per_step * transformer_flops_per_token(
                    ours.get("parameters", r["parameters"]), cfg["num_layers"],
                    cfg["hidden_dim"], r["length"])
                if case == "modernbert_inference":
                    flops_step /= 3
            elif case == "transformer_big":
                unit, per_step, flops_step = "target tokens/s", batch * r["length"], None
            else:
                unit, per_step, flops_step = "utterances/s", batch, None
            rate = per_step / r["seconds_per_step"]
            peak = dense_bf16_peak(r.get("device", ""))
            mfu = f"{flops_step / r['seconds_per_step'] / peak:.1%}" if peak and flops_step else "n/a"
            vs = ""
            if impl != "keras_attn" and "seconds_per_step" in ours:
                vs = f"{ours['seconds_per_step'] / r['seconds_per_step']:.2f}"
            notes = f"batch {batch}, {r['parameters']:,} params"
            if "first_step_seconds" in r:
                notes += f", first step {r['first_step_seconds']:.0f} s"
            lines.append(f"| {case} | {impl} | {rate:,.0f} {unit} | {mfu} | {vs} | "
                         f"{_gib(r.get('peak_bytes'))} | {notes} |")
    att = results.get("attention:keras_attn")
    if att:
        lines += ["", "| attention length | batch | path | TFLOP/s fwd+bwd "
                  "| kernel (compiled program) |", "|---|---|---|---|---|"]
        for row in att.get("rows", []):
            value = f"{row['tflops']:.3g}" if "tflops" in row else f"failed: {row['error']}"
            lines.append(f"| {row['length']} | {row['batch']} | {row['path']} | {value} | "
                         f"{row.get('kernel', '')} |")
        if "error" in att:
            lines.append(f"| all | | | not measured: {att['error']} | |")
    mem = [(k, v) for k, v in results.items() if k.startswith("memory:")]
    if mem:
        lines += ["", "| BERT-base length 512 | per example MiB | fixed GiB | largest batch | "
                  "s/step there | compiles (batch: s) |", "|---|---|---|---|---|---|"]
        for key, r in mem:
            if "error" in r:
                lines.append(f"| {key.split(':')[1]} | | | not measured: {r['error']} | | |")
                continue
            step = f"{r['seconds_per_step']:.3f}" if r.get("seconds_per_step") else ""
            largest = r.get("largest_batch")
            if largest is None:
                largest = f"none: {r.get('stopped', 'no device memory limit')}"
            compiles = ", ".join(f"{b}: {t:.0f}" for b, t in r.get("compile_seconds", {}).items())
            lines.append(f"| {key.split(':')[1]} | {r['per_example_bytes'] / 2**20:.1f} | "
                         f"{r['fixed_bytes'] / 2**30:.2f} | {largest} | {step} | {compiles} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, any device")
    parser.add_argument("--no-torch-compile", action="store_true",
                        help="skip the PyTorch peers' torch.compile runs")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per run")
    parser.add_argument("--out", help="folder for gpu_results.json and gpu_table.md")
    parser.add_argument("--run", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        deadline = os.environ.get("GPU_BENCH_DEADLINE")
        try:
            result = run_one(args.run, args.smoke, float(deadline) if deadline else None)
        except Exception:
            traceback.print_exc()
            sys.exit(1)
        print("RESULT " + json.dumps(result), flush=True)
        return
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in PLAN]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {list(PLAN)}")
    results = {}
    for spec in plan(cases, torch_compile=not args.no_torch_compile):
        print(f"{time.strftime('%H:%M:%S')} {spec} ...", flush=True)
        results[spec] = launch(spec, args.smoke, args.timeout)
        r = results[spec]
        print(f"{time.strftime('%H:%M:%S')} {spec}: "
              + (r["error"] if "error" in r else
                 f"{r.get('seconds_per_step', 0) * 1e3:.1f} ms/step, "
                 f"{r.get('wall_seconds', 0):.0f} s wall"), flush=True)
    text = table(results, args.smoke)
    print()
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gpu_results.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
        with open(os.path.join(args.out, "gpu_table.md"), "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
