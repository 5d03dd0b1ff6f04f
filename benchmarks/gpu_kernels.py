"""What the attention kernel module of issue 61 could reach on a JAX GPU:
cuDNN's fused attention in the forms `keras.ops.dot_product_attention`
cannot ask for, beside the route the layers take today.

`keras.ops.dot_product_attention` hands JAX's cuDNN kernel a mask only as a
dense bias and has no attention dropout, so BERT (attention dropout 0.1)
takes the explicit path and packed rows pay for a `(B, 1, T, T)` bias. JAX
has, besides: sequence lengths (`jax.nn.dot_product_attention(...,
query_seq_lengths=, key_value_seq_lengths=)`, public), and in its cuDNN
module (`jax._src.cudnn.fused_attention_stablehlo`, private) dropout and
packed segments (`q_offsets` / `kv_offsets`). Each path here is timed
forward + backward (bf16, 16k tokens a batch, 12 heads of 64) and checked
against the explicit `keras_attn` reference on the same inputs (outputs and
gradients on the rows that count). For the dropout form it also records
whether two calls of one compiled step draw the same dropout mask (the
private API takes its seed as a static int).

    KERAS_BACKEND=jax python3 benchmarks/gpu_kernels.py --out $OUT

On a CPU every cuDNN path reports its error; `--smoke` shrinks the sizes.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _time(compiled, args, steps, rounds):
    import jax

    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(rounds + 1):
        start = time.perf_counter()
        for _ in range(steps):
            out = compiled(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) / steps)
    return statistics.median(times[1:])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="128,512,2048")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import jax
    import jax.numpy as jnp
    from jax._src.cudnn import fused_attention_stablehlo as cudnn

    sys.path.insert(0, HERE)
    from _flops import attention_flops
    from gpu import fused_kernels
    from keras_attn.layers.scaled_dot_product_attention import fused_dot_product_attention
    from keras_attn.layers.scaled_dot_product_attention import scaled_dot_product_attention

    heads, dim = (2, 8) if args.smoke else (12, 64)
    tokens = 256 if args.smoke else args.tokens
    steps, rounds = (1, 1) if args.smoke else (10, 5)
    dtype = "float32" if args.smoke else "bfloat16"
    scale = 1.0 / np.sqrt(dim)
    out_dir = args.out or os.path.join(HERE, "results")
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    info = {"device": str(jax.devices()[0].device_kind), "jax": jax.__version__}
    print(info, flush=True)

    def dropout(probs, rate, key):
        keep = jax.random.bernoulli(key, 1.0 - rate, probs.shape)
        return jnp.where(keep, probs / (1.0 - rate), 0.0).astype(probs.dtype)

    for length in [int(x) for x in args.lengths.split(",")]:
        if args.smoke:
            length = min(length, 32)
        batch = max(2, tokens // length)
        key = jax.random.PRNGKey(length)
        q, k, v = (jax.random.normal(kk, (batch, length, heads, dim), dtype)
                   for kk in jax.random.split(key, 3))
        # Padding as a BERT batch has it: every row's own length, 60-100%.
        rng = np.random.default_rng(length)
        lens = rng.integers(int(0.6 * length), length + 1, size=batch).astype("int32")
        lens[0] = length
        keep = np.arange(length)[None, :] < lens[:, None]  # (B, T)
        pad_mask = jnp.asarray(keep[:, None, None, :])
        lens_j = jnp.asarray(lens)
        # Packing: each row holds four segments of a quarter of the row.
        seg_len = length // 4
        segments = np.repeat(np.arange(4), seg_len)[None, :].repeat(batch, 0)
        seg_mask = jnp.asarray(segments[:, None, :, None] == segments[:, None, None, :])
        seqlen = jnp.full((batch, 4), seg_len, "int32")
        offsets = jnp.asarray(np.concatenate([np.arange(4) * seg_len, [-1]])[None, :]
                              .repeat(batch, 0).astype("int32"))
        # (B, M + 1): each segment's start, then -1 (JAX's docstring: "[[0, 1,
        # 2, -1], [0, 1, -1, -1]]" for rows of 3 and 2 one-token segments). The
        # first device run (2026-11-28) ended each row with its length instead
        # and got wrong values: this is the form to measure next.
        dkey = jax.random.PRNGKey(7)

        def ref_padded(q, k, v):
            return scaled_dot_product_attention(q, k, v, mask=pad_mask)

        def ref_packed(q, k, v):
            return scaled_dot_product_attention(q, k, v, mask=seg_mask)

        paths = {
            "today: keras.ops, no mask": (lambda q, k, v: fused_dot_product_attention(
                q, k, v, length_multiple=8), None),
            "today: keras.ops, padding as a bias": (lambda q, k, v: fused_dot_product_attention(
                q, k, v, mask=pad_mask, length_multiple=8), ref_padded),
            "today: explicit + dropout 0.1": (lambda q, k, v: jnp.einsum(
                "bnts,bsnh->btnh", dropout(jax.nn.softmax(jnp.einsum(
                    "btnh,bsnh->bnts", q, k) * scale + jnp.where(pad_mask, 0.0, -1e9), -1),
                    0.1, dkey), v), None),
            "today: keras.ops, packed as a (B,1,T,T) bias": (
                lambda q, k, v: fused_dot_product_attention(
                    q, k, v, mask=seg_mask, length_multiple=8), ref_packed),
            "jax.nn cudnn, sequence lengths": (lambda q, k, v: jax.nn.dot_product_attention(
                q, k, v, query_seq_lengths=lens_j, key_value_seq_lengths=lens_j,
                implementation="cudnn"), ref_padded),
            "cudnn (private), sequence lengths + dropout 0.1": (
                lambda q, k, v: cudnn.dot_product_attention(
                    q, k, v, q_seqlen=lens_j, kv_seqlen=lens_j, scale=scale,
                    mask_type=cudnn.MaskType.PADDING, dropout_rate=0.1), None),
            "cudnn (private), sequence lengths, dropout 0": (
                lambda q, k, v: cudnn.dot_product_attention(
                    q, k, v, q_seqlen=lens_j, kv_seqlen=lens_j, scale=scale,
                    mask_type=cudnn.MaskType.PADDING), ref_padded),
            "cudnn (private), packed segments (offsets)": (
                lambda q, k, v: cudnn.dot_product_attention(
                    q, k, v, q_seqlen=seqlen, kv_seqlen=seqlen, q_offsets=offsets,
                    kv_offsets=offsets, scale=scale, mask_type=cudnn.MaskType.PADDING),
                ref_packed),
        }
        valid = jnp.asarray(keep)[:, :, None, None]
        flops = attention_flops(batch, heads, length, dim, backward=True)
        for name, (fn, reference) in paths.items():
            row = {"length": length, "batch": batch, "path": name}

            def loss(q, k, v, fn=fn):
                out = fn(q, k, v).astype("float32")
                # Padded query rows do not count (their answer differs by
                # design between the forms).
                if reference is ref_padded:
                    out = jnp.where(valid, out, 0.0)
                return jnp.sum(out * out)

            try:
                grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
                compiled = grad.lower(q, k, v).compile()
                kernels = fused_kernels(compiled.as_text())
                row["kernel"] = ", ".join(kernels) if kernels else "XLA ops"
                seconds = _time(compiled, (q, k, v), steps, rounds)
                row.update(ms=seconds * 1e3, tflops=flops / seconds / 1e12)
                if reference is not None:
                    def ref_loss(q, k, v, reference=reference):
                        out = reference(q, k, v).astype("float32")
                        if reference is ref_padded:
                            out = jnp.where(valid, out, 0.0)
                        return jnp.sum(out * out)
                    value, grads = compiled(q, k, v)
                    ref_value, ref_grads = jax.jit(jax.value_and_grad(
                        ref_loss, argnums=(0, 1, 2)))(q, k, v)
                    out = fn(q, k, v).astype("float32")
                    ref_out = reference(q, k, v).astype("float32")
                    if reference is ref_padded:
                        out, ref_out = jnp.where(valid, out, 0), jnp.where(valid, ref_out, 0)
                    row["max_abs_out"] = float(jnp.max(jnp.abs(out - ref_out)))
                    row["max_rel_grad"] = max(float(
                        jnp.max(jnp.abs(g.astype("float32") - r.astype("float32")))
                        / (jnp.max(jnp.abs(r.astype("float32"))) + 1e-12))
                        for g, r in zip(grads, ref_grads))
                if name.startswith("cudnn") and "dropout 0.1" in name:
                    forward = jax.jit(fn)
                    a, b = forward(q, k, v), forward(q, k, v)
                    row["same_mask_twice"] = bool(jnp.all(a == b))
                    q2 = q * 1.0001
                    c = forward(q2, k, v)
                    row["mean_abs_out"] = float(jnp.mean(jnp.abs(a.astype("float32"))))
                    row["differs_on_new_input"] = bool(jnp.any(a != c))
            except Exception as e:  # noqa: BLE001 - recorded, not hidden
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(os.path.join(out_dir, "gpu_kernels.json"), "w", encoding="utf-8") as h:
                json.dump({"info": info, "rows": rows}, h, indent=1)
    lines = ["| T | batch | path | kernel | ms (fwd+bwd) | TFLOP/s | max |out - ref| | "
             "max rel grad diff | notes |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        notes = r.get("error", "")
        if "same_mask_twice" in r:
            notes = (f"same dropout mask on two calls: {r['same_mask_twice']}; "
                     f"mean |out| {r['mean_abs_out']:.4f}")
        lines.append(
            f"| {r['length']} | {r['batch']} | {r['path']} | {r.get('kernel', '')} | "
            f"{r.get('ms', float('nan')):.3f} | {r.get('tflops', float('nan')):.1f} | "
            f"{r.get('max_abs_out', '')} | {r.get('max_rel_grad', '')} | {notes} |")
    text = "\n".join(lines)
    with open(os.path.join(out_dir, "gpu_kernels.md"), "w", encoding="utf-8") as h:
        h.write(f"{info}\n\n{text}\n")
    print(text)


if __name__ == "__main__":
    main()
