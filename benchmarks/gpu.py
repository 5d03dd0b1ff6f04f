"""GPU benchmarks: keras_attn (JAX backend, bf16) side by side with keras-hub
on JAX, Hugging Face transformers and timm on PyTorch, in one call.

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
  target tokens/s (label-smoothed cross-entropy, shared 37k vocabulary).
- `attention`: the attention op alone, forward + backward, head dim 64,
  16 heads, 16k tokens per batch, lengths 512-8192: TFLOP/s of the fused
  path (`keras.ops.dot_product_attention`, backend's choice and cuDNN flash
  forced) against the explicit `softmax(QK^T)V` path.
- `memory`: BERT-base at length 512: the largest batch that fits on the
  device without and with rematerialisation of each transformer block
  (`build_bert(..., remat=True)`), read off XLA's compiled memory analysis and then
  checked by running that batch.

Training steps on JAX are one jitted function over the models'
`stateless_call` and the optimizer's `stateless_apply` with donated
buffers, the data already on the device; PyTorch peers run the usual eager
loop (`--torch-compile` adds `torch.compile` rows). Throughput is the
median over 5 timed rounds of 10 steps each (2 of 2 with `--smoke`), after
a compiling call and one warm-up round.

MFU = model FLOPs per second / the device's dense bf16 peak, with the model
FLOPs per token 6N + 12 L d T (N parameters, L layers, d width, T length;
PaLM, Chowdhery et al. 2022, appendix B) of keras_attn's model, the same
figure for every implementation of a row, so MFU ratios are throughput
ratios. Attention FLOPs follow the FlashAttention benchmark convention:
4 B N T^2 H forward, 2.5 times that backward.

Prints a progress line per run and a markdown table last; with `--out DIR`
also writes `gpu_results.json` and `gpu_table.md` there.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from _flops import attention_flops  # noqa: E402
from _flops import dense_bf16_peak  # noqa: E402
from _flops import transformer_flops_per_token  # noqa: E402

CASES = ("bert128", "bert512", "vit", "transformer_big", "attention", "memory")


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
            "attention": dict(lengths=(64, 128), tokens=256, heads=2, head_dim=16),
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
        "attention": dict(lengths=(512, 1024, 2048, 4096, 8192), tokens=16384, heads=16,
                          head_dim=64),
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
    if impl == "keras_attn":
        model = build_keras_attn_bert(cfg)
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
            "parameters": int(model.count_params()), "loss": loss}


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
            "parameters": int(model.count_params()), "loss": loss}


def run_transformer_jax(impl, smoke):
    keras = _jax_setup()
    import jax.numpy as jnp

    from keras_attn.models.transformer import build_transformer

    s = sizes(smoke)
    cfg = s["transformer"]
    batch, length = s["transformer_batch"]
    rng = np.random.default_rng(0)
    v = cfg["vocabulary_size"]
    source = jnp.asarray(rng.integers(3, v, (batch, length)).astype("int32"))
    target = jnp.asarray(rng.integers(3, v, (batch, length)).astype("int32"))
    labels = jnp.asarray(rng.integers(3, v, (batch, length)).astype("int32"))
    keras.utils.set_random_seed(0)
    model = build_transformer("transformer_big", max_sequence_length=max(length, 256), **cfg)

    def loss_fn(y, logits):
        return _sparse_ce(y, logits, label_smoothing=0.1)

    step, state = make_jax_train_step(model, loss_fn)
    seconds, loss = time_jax_steps(step, state, [source, target], labels, s["steps"], s["rounds"])
    return {"seconds_per_step": seconds, "batch": batch, "length": length,
            "parameters": int(model.count_params()), "loss": loss}


def run_attention_jax(smoke):
    keras = _jax_setup()
    import jax
    import jax.numpy as jnp

    from keras_attn.layers.scaled_dot_product_attention import fused_dot_product_attention
    from keras_attn.layers.scaled_dot_product_attention import scaled_dot_product_attention

    s = sizes(smoke)
    a = s["attention"]
    n, h = a["heads"], a["head_dim"]
    paths = {
        "explicit": lambda q, k, v: scaled_dot_product_attention(q, k, v),
        "fused (backend's choice)": lambda q, k, v: fused_dot_product_attention(q, k, v),
        "fused (cuDNN flash forced)": lambda q, k, v: fused_dot_product_attention(
            q, k, v, flash_attention=True),
    }
    rows = []
    for length in a["lengths"]:
        batch = max(1, a["tokens"] // length)
        key = jax.random.PRNGKey(length)
        q, k, v = (jax.random.normal(kk, (batch, length, n, h), "bfloat16")
                   for kk in jax.random.split(key, 3))
        flops = attention_flops(batch, n, length, h, backward=True)
        for name, fn in paths.items():
            def loss(q, k, v, fn=fn):
                return jnp.sum(fn(q, k, v).astype("float32"))

            grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
            try:
                jax.block_until_ready(grad(q, k, v))
                times = []
                for _ in range(s["rounds"] + 1):
                    start = time.perf_counter()
                    for _ in range(s["steps"]):
                        out = grad(q, k, v)
                    jax.block_until_ready(out)
                    times.append((time.perf_counter() - start) / s["steps"])
                seconds = statistics.median(times[1:])
                rows.append({"length": length, "batch": batch, "path": name,
                             "seconds": seconds, "tflops": flops / seconds / 1e12})
            except Exception as e:  # noqa: BLE001 - recorded, not hidden
                rows.append({"length": length, "batch": batch, "path": name,
                             "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"})
            print(f"  attention T={length} {name}: "
                  f"{rows[-1].get('tflops', rows[-1].get('error'))}", flush=True)
    return {"rows": rows}


def _compiled_bytes(step, state, x, y):
    analysis = step.lower(state, x, y).compile().memory_analysis()
    return (analysis.argument_size_in_bytes + analysis.output_size_in_bytes
            - analysis.alias_size_in_bytes + analysis.temp_size_in_bytes)


def run_memory_jax(remat, smoke, limit_bytes=None):
    """Largest BERT-base length-512 batch that fits: memory(B) from XLA's
    memory analysis at two batch sizes, a straight line through them, then
    one real step at the predicted batch (stepping down 10% on OOM)."""
    keras = _jax_setup()
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

    def data(batch):
        x, labels, _, _ = _bert_inputs(rng, batch, length, cfg["vocabulary_size"], jnp)
        return x, {"mlm": labels, "nsp": jnp.zeros((batch,), "int32")}

    # Each attempt below starts from a fresh device copy: the step donates
    # its state, so a failed attempt may leave the buffers it was given
    # deleted.
    import jax

    host_state = jax.tree.map(np.asarray, state)
    b1, b2 = s["memory_batches"]
    m1, m2 = (_compiled_bytes(step, state, *data(b)) for b in (b1, b2))
    per_example = (m2 - m1) / (b2 - b1)
    fixed = m1 - per_example * b1
    result = {"remat": remat, "bytes_at": {b1: m1, b2: m2}, "per_example_bytes": per_example,
              "fixed_bytes": fixed, "limit_bytes": limit_bytes}
    if not limit_bytes:
        return result
    batch = int((0.97 * limit_bytes - fixed) // per_example)
    batch = max(8, batch - batch % 8) if not smoke else max(1, batch)
    for _ in range(4):
        try:
            x, y = data(batch)
            state = jax.tree.map(jnp.asarray, host_state)
            seconds, _ = time_jax_steps(step, state, x, y, 1, 1)
            result.update(largest_batch=batch, seconds_per_step=seconds)
            return result
        except Exception as e:  # noqa: BLE001 - an OOM steps the batch down
            if "RESOURCE_EXHAUSTED" not in str(e) and "Out of memory" not in str(e):
                raise
            batch = int(batch * 0.9)
    result["largest_batch"] = None
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
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    forward = torch.compile(model) if compile_model else model

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = forward(**inputs).loss
        loss.backward()
        optimizer.step()

    seconds = _time_torch(step, s["steps"], s["rounds"], device)
    return {"seconds_per_step": seconds, "batch": batch, "length": length,
            "parameters": sum(p.numel() for p in model.parameters()),
            "peak_bytes": _torch_peak(device)}


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
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    forward = torch.compile(model) if compile_model else model
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_fn(forward(images), labels)
        loss.backward()
        optimizer.step()

    seconds = _time_torch(step, s["steps"], s["rounds"], device)
    return {"seconds_per_step": seconds, "batch": batch,
            "parameters": sum(p.numel() for p in model.parameters()),
            "peak_bytes": _torch_peak(device)}


# === One run in a subprocess ===


def run_one(spec, smoke):
    """Runs one `case:impl` and returns its result dict (device, peak memory)."""
    case, impl = spec.split(":")
    compile_model = impl.endswith("+compile")
    base = impl.replace("+compile", "")
    if base in ("transformers", "timm"):
        import torch

        device = _torch_device()
        name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
        if case.startswith("bert"):
            result = run_bert_torch(case, smoke, compile_model)
        else:
            result = run_vit_torch(smoke, compile_model)
        import importlib.metadata as md

        result.update(device=name, software=f"torch {torch.__version__}, "
                      f"{base} {md.version(base)}")
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
    elif case == "attention":
        result = run_attention_jax(smoke)
    elif case == "memory":
        # A CPU has no device memory limit: --smoke pretends to have 64 MiB.
        result = run_memory_jax(base == "remat", smoke, None if not smoke else 2**26)
    else:
        raise ValueError(f"Unknown case {case!r}")
    software = f"keras {keras.__version__}, jax {jax.__version__}"
    if base == "keras_hub":
        import keras_hub

        software += f", keras-hub {keras_hub.__version__}"
    result.update(device=kind, software=software, peak_bytes=_peak_bytes(device))
    return result


PLAN = {
    "bert128": ["keras_attn", "keras_hub", "transformers"],
    "bert512": ["keras_attn", "keras_hub", "transformers"],
    "vit": ["keras_attn", "keras_hub", "timm"],
    "transformer_big": ["keras_attn"],
    "attention": ["keras_attn"],
    "memory": ["no_remat", "remat"],
}


def launch(spec, smoke, timeout):
    """Runs `spec` in a fresh Python; returns its result or its error."""
    env = dict(os.environ, KERAS_BACKEND="jax", XLA_PYTHON_CLIENT_PREALLOCATE="false",
               TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, os.path.abspath(__file__), "--run", spec] + (["--smoke"] if smoke else [])
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("  "):
            print(line, flush=True)
    marker = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not marker:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        # The exception's own line: "ModuleNotFoundError: No module named ...".
        errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception|Exhausted)\b", line)]
        message = errors[-1] if errors else (lines[-1] if lines else f"exit {proc.returncode}")
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
    for case in ("bert128", "bert512", "vit", "transformer_big"):
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
            else:
                unit, per_step, flops_step = "target tokens/s", batch * r["length"], None
            rate = per_step / r["seconds_per_step"]
            peak = dense_bf16_peak(r.get("device", ""))
            mfu = f"{flops_step / r['seconds_per_step'] / peak:.1%}" if peak and flops_step else "n/a"
            vs = ""
            if impl != "keras_attn" and "seconds_per_step" in ours:
                vs = f"{ours['seconds_per_step'] / r['seconds_per_step']:.2f}"
            lines.append(f"| {case} | {impl} | {rate:,.0f} {unit} | {mfu} | {vs} | "
                         f"{_gib(r.get('peak_bytes'))} | batch {batch}, {r['parameters']:,} params |")
    att = results.get("attention:keras_attn")
    if att:
        lines += ["", "| attention length | batch | path | TFLOP/s fwd+bwd |", "|---|---|---|---|"]
        for row in att.get("rows", []):
            value = f"{row['tflops']:.3g}" if "tflops" in row else f"failed: {row['error']}"
            lines.append(f"| {row['length']} | {row['batch']} | {row['path']} | {value} |")
        if "error" in att:
            lines.append(f"| all | | | not measured: {att['error']} |")
    mem = [(k, v) for k, v in results.items() if k.startswith("memory:")]
    if mem:
        lines += ["", "| BERT-base length 512 | per example MiB | fixed GiB | largest batch | s/step there |",
                  "|---|---|---|---|---|"]
        for key, r in mem:
            if "error" in r:
                lines.append(f"| {key.split(':')[1]} | | | not measured: {r['error']} | |")
                continue
            step = f"{r['seconds_per_step']:.3f}" if r.get("seconds_per_step") else ""
            lines.append(f"| {key.split(':')[1]} | {r['per_example_bytes'] / 2**20:.1f} | "
                         f"{r['fixed_bytes'] / 2**30:.2f} | {r.get('largest_batch')} | {step} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, any device")
    parser.add_argument("--torch-compile", action="store_true",
                        help="also time the PyTorch peers under torch.compile")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per run")
    parser.add_argument("--out", help="folder for gpu_results.json and gpu_table.md")
    parser.add_argument("--run", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        try:
            result = run_one(args.run, args.smoke)
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
    for case in cases:
        impls = list(PLAN[case])
        if args.torch_compile:
            impls += [f"{i}+compile" for i in impls if i in ("transformers", "timm")]
        for impl in impls:
            spec = f"{case}:{impl}"
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
