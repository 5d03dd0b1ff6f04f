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

`--kernel-module` checks and times the kernel module instead
(`keras_attn/ops/kernels.py`, issue 61): `attend` with right-padded
masks through its own dispatch (which must name "jax_lengths" and call
cuDNN's fused attention on a GPU), forced to each of its kernels, and
today's route, each against the explicit reference (outputs and gradients
on the rows that count; bf16 within 0.03 / 4% of the largest gradient, the
first device run's noise being 0.0156 / 1.5-2%). It writes
gpu_kernel_module.json / .md with a verdict and exits 1 when a check fails:

    KERAS_BACKEND=jax python3 benchmarks/gpu_kernels.py --kernel-module --out $OUT
"""

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="128,512,2048")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--kernel-module", action="store_true",
                        help="check and time the attention kernels of keras_attn/ops/kernels.py")
    args = parser.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import jax
    import jax.numpy as jnp
    from jax._src.cudnn import fused_attention_stablehlo as cudnn

    sys.path.insert(0, HERE)
    from _flops import attention_flops
    from gpu import fused_kernels
    from gpu import time_jax_calls
    from keras_attn.ops import kernels as _kernels
    from keras_attn.ops.attention import fused_dot_product_attention
    from keras_attn.ops.attention import scaled_dot_product_attention

    heads, dim = (2, 8) if args.smoke else (12, 64)
    tokens = 256 if args.smoke else args.tokens
    steps, rounds = (1, 1) if args.smoke else (10, 5)
    dtype = "float32" if args.smoke else "bfloat16"
    scale = 1.0 / np.sqrt(dim)
    out_dir = args.out or os.path.join(HERE, "results")
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    stem = "gpu_kernel_module" if args.kernel_module else "gpu_kernels"
    info = {"device": str(jax.devices()[0].device_kind), "jax": jax.__version__,
            "platform": jax.devices()[0].platform}
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
        if args.kernel_module:
            keys = jnp.asarray(keep)  # (B, T), right-padded

            def attend(kernel=None, queries=False):
                return lambda q, k, v: _kernels.attend(
                    q, k, v, query_mask=keys if queries else None, key_mask=keys,
                    right_padded=True, kernel=kernel)

            chosen = _kernels.choose_kernel(q, k, v, key_mask=keys, right_padded=True)
            paths = {
                "today: keras.ops, padding as a bias": paths[
                    "today: keras.ops, padding as a bias"],
                f"attend, key mask (dispatch: {chosen})": (attend(), ref_padded),
                "attend, query + key masks (dispatch: {})".format(_kernels.choose_kernel(
                    q, k, v, query_mask=keys, key_mask=keys, right_padded=True)): (
                    attend(queries=True), ref_padded),
                "attend, key mask, forced jax_lengths": (attend("jax_lengths"), ref_padded),
                "attend, key mask, forced keras_ops": (attend("keras_ops"), ref_padded),
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
                seconds = time_jax_calls(compiled, (q, k, v), steps, rounds)
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
            if args.kernel_module:
                _judge(row, dtype, gpu=info["platform"] == "gpu")
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(os.path.join(out_dir, f"{stem}.json"), "w", encoding="utf-8") as h:
                json.dump({"info": info, "rows": rows}, h, indent=1)
    lines = ["| T | batch | path | kernel | ms (fwd+bwd) | TFLOP/s | max |out - ref| | "
             "max rel grad diff | notes |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        notes = r.get("error", "") or r.get("verdict", "")
        if "same_mask_twice" in r:
            notes = (f"same dropout mask on two calls: {r['same_mask_twice']}; "
                     f"mean |out| {r['mean_abs_out']:.4f}")
        lines.append(
            f"| {r['length']} | {r['batch']} | {r['path']} | {r.get('kernel', '')} | "
            f"{r.get('ms', float('nan')):.3f} | {r.get('tflops', float('nan')):.1f} | "
            f"{r.get('max_abs_out', '')} | {r.get('max_rel_grad', '')} | {notes} |")
    text = "\n".join(lines)
    failed = [r for r in rows if r.get("verdict", "ok") != "ok"]
    if args.kernel_module:
        text += f"\n\nkernel module: {len(rows) - len(failed)} of {len(rows)} rows ok"
    with open(os.path.join(out_dir, f"{stem}.md"), "w", encoding="utf-8") as h:
        h.write(f"{info}\n\n{text}\n")
    print(text)
    return 1 if failed else 0


def _judge(row, dtype, gpu):
    """`row["verdict"]`: "ok", or what failed: the outputs or gradients off
    the reference by more than `dtype`'s noise, an error, or (on a GPU) the
    dispatch not choosing "jax_lengths" or that kernel not compiling to
    cuDNN's fused attention."""
    out_tol, grad_tol = (0.03, 0.04) if dtype == "bfloat16" else (1e-4, 1e-4)
    problems = []
    if "error" in row:
        problems.append("error")
    elif "max_abs_out" in row:
        if not row["max_abs_out"] <= out_tol:
            problems.append(f"outputs off by {row['max_abs_out']:.3g} > {out_tol}")
        if not row["max_rel_grad"] <= grad_tol:
            problems.append(f"gradients off by {row['max_rel_grad']:.3g} > {grad_tol}")
    if gpu and "dispatch" in row["path"] and "jax_lengths" not in row["path"]:
        problems.append("the dispatch did not choose jax_lengths")
    if gpu and "jax_lengths" in row["path"] and "fmha" not in row.get("kernel", ""):
        problems.append("no cuDNN fused attention in the compiled step")
    row["verdict"] = "; ".join(problems) or "ok"


if __name__ == "__main__":
    sys.exit(main())
